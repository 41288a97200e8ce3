"""GCP credentials: the caller's service-account key, and what a head VM's controller needs.

Standard library only (no libcloud, no GCE provider).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from spotrun.providers.base import environ_matching

from spotrun.errors import ProviderError

# The environment the provider reads, by name or (ending in '_') prefix; the key file named by
# $GOOGLE_APPLICATION_CREDENTIALS travels as a file.
ENV = ("GOOGLE_CLOUD_PROJECT", "SPOTRUN_GCP_")
KEY_FILE = "gcp-credentials.json"  # the key's name in a head VM's secrets dir


def service_account(credentials_file: str | None = None) -> dict[str, Any]:
    """The service-account key from `credentials_file` or $GOOGLE_APPLICATION_CREDENTIALS.

    Raises ProviderError naming what to set when it is missing, unreadable or not a service key."""
    path = credentials_file or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if not path:
        raise ProviderError(
            "no GCP credentials found", hint="set GOOGLE_APPLICATION_CREDENTIALS to a service-account JSON key file"
        )
    try:
        data = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as exc:
        raise ProviderError(
            f"cannot read GCP credentials {path}: {exc}",
            hint="set GOOGLE_APPLICATION_CREDENTIALS to a service-account JSON key file",
        ) from exc
    if data.get("type") != "service_account" or not data.get("client_email") or not data.get("private_key"):
        raise ProviderError(
            f"GCP credentials {path} are not a service-account key",
            hint="create one with `gcloud iam service-accounts keys create` and point "
            "GOOGLE_APPLICATION_CREDENTIALS at it",
        )
    return data


def head_env(secrets_dir: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """(environment, files) a head VM's controller needs to call GCP: this machine's GCP
    variables, and the key file of $GOOGLE_APPLICATION_CREDENTIALS (if set), which goes to
    `secrets_dir` on the head, where the variable then points. Raises ProviderError when that
    file cannot be read."""
    env = environ_matching(ENV, os.environ)
    files: dict[str, bytes] = {}
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path:
        try:
            files[KEY_FILE] = Path(path).read_bytes()
        except OSError as exc:
            raise ProviderError(f"cannot read GOOGLE_APPLICATION_CREDENTIALS: {exc}") from exc
        env["GOOGLE_APPLICATION_CREDENTIALS"] = f"{secrets_dir}/{KEY_FILE}"
    return env, files
