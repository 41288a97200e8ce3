"""Google Compute Engine: spot offers, launches, notices, catalog (the names every provider
package exports: see providers/__init__.py)."""

from spotrun.providers.base import lazy_attribute
from spotrun.providers.gcp import catalog, credentials, notices

__all__ = ["GcpProvider", "catalog", "credentials", "notices"]

__getattr__ = lazy_attribute(__name__, "GcpProvider", "spotrun.providers.gcp.provider")
