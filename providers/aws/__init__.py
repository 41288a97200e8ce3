"""AWS EC2: spot offers, launches, notices, catalog (the names every provider package exports:
see providers/__init__.py)."""

from spotrun.providers.aws import catalog, credentials, notices
from spotrun.providers.base import lazy_attribute

__all__ = ["AwsProvider", "catalog", "credentials", "notices"]

__getattr__ = lazy_attribute(__name__, "AwsProvider", "spotrun.providers.aws.provider")
