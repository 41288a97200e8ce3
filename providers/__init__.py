"""Cloud providers behind spotrun's own small protocol, installed as `spotrun.providers`.

`get_provider("local")` imports the provider's module on first use, so importing this package
never loads a cloud SDK. A new provider adds one line to `_REGISTRY`.
"""

from __future__ import annotations

import importlib
from typing import Any

from spotrun.providers.base import (
    Instance,
    InstanceState,
    LaunchSpec,
    NoticeProtocol,
    Offer,
    Provider,
    supports,
)

from spotrun.errors import ProviderError

__all__ = [
    "Instance",
    "InstanceState",
    "LaunchSpec",
    "NoticeProtocol",
    "Offer",
    "Provider",
    "get_provider",
    "known_providers",
    "supports",
]

# name -> (module, class); the module is imported only when that provider is asked for.
_REGISTRY: dict[str, tuple[str, str]] = {
    "local": ("spotrun.providers.local.provider", "LocalProvider"),
    "aws": ("spotrun.providers.aws.provider", "AwsProvider"),
    "gcp": ("spotrun.providers.gcp.provider", "GcpProvider"),
    "azure": ("spotrun.providers.azure.provider", "AzureProvider"),
}


def known_providers() -> list[str]:
    """Names `get_provider` accepts, sorted."""
    return sorted(_REGISTRY)


def get_provider(name: str, **config: Any) -> Provider:
    """Build the provider called `name` with its keyword `config` (cheap; no cloud call).

    Raises ProviderError for an unknown name (listing the known ones) or a provider whose
    module or SDK cannot be imported (naming the missing package).
    """
    if name not in _REGISTRY:
        raise ProviderError(f"unknown provider {name!r}", hint=f"known providers: {', '.join(known_providers())}")
    module_name, class_name = _REGISTRY[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProviderError(f"provider {name!r} cannot be loaded: {exc}", hint="install the package it names") from exc
    return getattr(module, class_name)(**config)
