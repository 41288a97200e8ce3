"""Azure Blob Storage (`azure://container/prefix`) for providers/storage.py, through libcloud's
AzureBlobsStorageDriver: $AZURE_STORAGE_ACCOUNT and $AZURE_STORAGE_KEY, endpoint from
$SPOTRUN_AZURE_BLOB_ENDPOINT_URL (e.g. Azurite). Not tested here.
"""

from __future__ import annotations

import os
from typing import Any

from spotrun.providers.storage import endpoint_options

from spotrun.errors import ProviderError


def driver() -> Any:
    """A libcloud AzureBlobsStorageDriver (no request yet). Raises ProviderError without the
    storage account's name and key."""
    from libcloud.storage.drivers.azure_blobs import AzureBlobsStorageDriver

    account, key = os.environ.get("AZURE_STORAGE_ACCOUNT"), os.environ.get("AZURE_STORAGE_KEY")
    if not account or not key:
        raise ProviderError(
            "no Azure storage credentials for azure:// checkpoints",
            hint="set AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY",
        )
    endpoint = os.environ.get("SPOTRUN_AZURE_BLOB_ENDPOINT_URL")
    return AzureBlobsStorageDriver(account, key, **(endpoint_options(endpoint) if endpoint else {}))
