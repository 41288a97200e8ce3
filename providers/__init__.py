"""Cloud providers behind spotrun's own small protocol, installed as `spotrun.providers`.

`_REGISTRY` below is the one list of provider names: recipe validation, `spotrun prices`, the
head VM, `spotrun simulate` and the node agent take the names, and every fact about a provider,
from it and from the provider's package. Adding a provider is one `_REGISTRY` entry plus its
package `providers/<name>/` (listed in pyproject.toml's `packages`, like every package spotrun
installs), whose `__init__.py` only re-exports the names every provider package has:

- the provider class (`LocalProvider`, `AwsProvider`, ...), imported on first use
  (`base.lazy_attribute`): building a provider is the only thing that loads its module;
- `catalog`: what it offers: `FEATURES` (a frozenset of `Feature`), `ZONE_SUFFIX` (a zone's name
  is its region's plus this, e.g. "a" for us-east-1a; None where zones are not named after
  regions), and its static shapes or prices;
- `credentials`: how it finds the caller's credentials, and `head_env(secrets_dir)`: the
  (environment, files) a head VM's controller needs to call it;
- `notices`: `LEAD_S`, the lead time of its preemption notices, and `PROTOCOL`, the
  `NoticeSpec` its VMs speak (None for local, whose VMs speak the clouds' protocols).

An entry that names object storage schemes also has a `storage` module in its package, whose
`driver()` returns the libcloud storage driver for them (providers/storage.py routes by scheme).

Importing this package or a provider package loads no cloud SDK and no provider class.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from spotrun.providers.base import (
    Feature,
    Instance,
    InstanceState,
    LaunchSpec,
    NoticeProtocol,
    NoticeSpec,
    Offer,
    Provider,
    supports,
)

from spotrun.errors import ProviderError

__all__ = [
    "DEFAULT_NOTICE_PROTOCOL",
    "Feature",
    "Instance",
    "InstanceState",
    "LaunchSpec",
    "NoticeProtocol",
    "NoticeSpec",
    "Offer",
    "Provider",
    "get_provider",
    "has_feature",
    "known_providers",
    "notice_protocols",
    "provider_package",
    "storage_schemes",
    "supports",
    "with_feature",
]


@dataclass(frozen=True)
class _Entry:
    package: str  # imported for any fact about the provider (cheap)
    provider_class: str  # re-exported lazily by the package; imported when a provider is built
    storage_schemes: tuple[str, ...] = ()  # URL schemes its package's `storage` module serves


# In the order users see them listed ("one of: local, aws, gcp, azure").
_REGISTRY: dict[str, _Entry] = {
    "local": _Entry("spotrun.providers.local", "LocalProvider"),
    "aws": _Entry("spotrun.providers.aws", "AwsProvider", ("s3",)),
    "gcp": _Entry("spotrun.providers.gcp", "GcpProvider", ("gs",)),
    "azure": _Entry("spotrun.providers.azure", "AzureProvider", ("azure",)),
}

# The protocol a VM's agent watches when nobody named one (and the local VMs' default dialect).
DEFAULT_NOTICE_PROTOCOL: NoticeProtocol = "aws"


def known_providers() -> list[str]:
    """Names `get_provider` accepts, in registry order."""
    return list(_REGISTRY)


def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        raise ProviderError(f"unknown provider {name!r}", hint=f"known providers: {', '.join(known_providers())}")
    return _REGISTRY[name]


def provider_package(name: str) -> ModuleType:
    """The package of provider `name` (its catalog, credentials, notices; see the module
    docstring). Cheap: no SDK, no provider class. Raises ProviderError for an unknown name."""
    return importlib.import_module(_entry(name).package)


def get_provider(name: str, **config: Any) -> Provider:
    """Build the provider called `name` with its keyword `config` (cheap; no cloud call).

    Raises ProviderError for an unknown name (listing the known ones) or a provider whose
    module or SDK cannot be imported (naming the missing package).
    """
    entry = _entry(name)
    try:
        cls = getattr(importlib.import_module(entry.package), entry.provider_class)
    except ImportError as exc:
        raise ProviderError(f"provider {name!r} cannot be loaded: {exc}", hint="install the package it names") from exc
    return cls(**config)


def has_feature(name: str, feature: Feature) -> bool:
    """Whether provider `name` offers `feature` (read from its package; no provider is built).
    Raises ProviderError for an unknown name."""
    return feature in provider_package(name).catalog.FEATURES


def with_feature(feature: Feature) -> list[str]:
    """The providers that offer `feature`, in registry order."""
    return [name for name in _REGISTRY if has_feature(name, feature)]


def notice_protocols() -> list[NoticeProtocol]:
    """The providers whose VMs speak a notice protocol of their own, in registry order."""
    return [name for name in _REGISTRY if provider_package(name).notices.PROTOCOL is not None]


def storage_schemes() -> dict[str, str]:
    """{URL scheme: the package whose `storage` module serves it}, e.g. {"s3": "spotrun.providers.aws"}.
    Imports nothing."""
    return {scheme: entry.package for entry in _REGISTRY.values() for scheme in entry.storage_schemes}
