"""Google Cloud Storage (`gs://bucket/prefix`) for providers/storage.py, through libcloud's
GoogleStorageDriver: the service-account key in $GOOGLE_APPLICATION_CREDENTIALS and its project.
Not tested here (no local GCS server).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from spotrun.errors import ProviderError


def driver() -> Any:
    """A libcloud GoogleStorageDriver (no request yet). Raises ProviderError without a key."""
    from libcloud.storage.drivers.google_storage import GoogleStorageDriver

    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if not path:
        raise ProviderError(
            "no GCP credentials for gs:// checkpoints",
            hint="set GOOGLE_APPLICATION_CREDENTIALS to a service-account JSON key file",
        )
    try:
        account = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ProviderError(f"cannot read GCP credentials {path}: {exc}") from exc
    return GoogleStorageDriver(
        account.get("client_email", ""),
        account.get("private_key", ""),
        project=account.get("project_id"),
        auth_type="SA",
    )
