"""The local provider: real sshd VMs on loopback with emulated cloud metadata endpoints (the
names every provider package exports: see providers/__init__.py)."""

from spotrun.providers.base import lazy_attribute
from spotrun.providers.local import catalog, credentials, notices

__all__ = ["LocalProvider", "catalog", "credentials", "notices"]

__getattr__ = lazy_attribute(__name__, "LocalProvider", "spotrun.providers.local.provider")
