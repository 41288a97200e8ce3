"""Azure ARM: spot offers, launches, notices, catalog (the names every provider package exports:
see providers/__init__.py)."""

from spotrun.providers.azure import catalog, credentials, notices
from spotrun.providers.base import lazy_attribute

__all__ = ["AzureProvider", "catalog", "credentials", "notices"]

__getattr__ = lazy_attribute(__name__, "AzureProvider", "spotrun.providers.azure.provider")
