"""Azure credentials: the caller's service principal, and what a head VM's controller needs.

Standard library only (no libcloud, no ARM provider).
"""

from __future__ import annotations

import os

from spotrun.providers.base import environ_matching

from spotrun.errors import ProviderError

# The environment the provider reads, by (ending in '_') prefix.
ENV = ("AZURE_", "SPOTRUN_AZURE_")
PRINCIPAL_VARS = ("AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_SUBSCRIPTION_ID")


def service_principal() -> tuple[str, str, str, str]:
    """(tenant, client id, client secret, subscription) from the AZURE_* environment, as
    azure-identity's EnvironmentCredential reads them.

    Raises ProviderError naming every variable that is missing."""
    values = {name: os.environ.get(name, "").strip() for name in PRINCIPAL_VARS}
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise ProviderError(
            "no Azure credentials found",
            hint=f"set {', '.join(missing)} (a service principal: `az ad sp create-for-rbac`)",
        )
    return (
        values["AZURE_TENANT_ID"],
        values["AZURE_CLIENT_ID"],
        values["AZURE_CLIENT_SECRET"],
        values["AZURE_SUBSCRIPTION_ID"],
    )


def head_env(secrets_dir: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """(environment, files) a head VM's controller needs to call Azure: this machine's AZURE_*
    and SPOTRUN_AZURE_* variables (the service principal among them); no files."""
    del secrets_dir  # Azure ships no files
    return environ_matching(ENV, os.environ), {}
