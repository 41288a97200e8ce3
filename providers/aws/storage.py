"""S3 object storage (`s3://bucket/prefix`) for providers/storage.py, through libcloud's S3 driver.

Credentials as the aws provider reads them (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or
~/.aws/credentials: aws/credentials.py, which imports neither libcloud nor the EC2 provider),
region from $AWS_REGION / $AWS_DEFAULT_REGION (us-east-1), endpoint from $SPOTRUN_S3_ENDPOINT_URL
(moto, MinIO, any S3-compatible store). Tested against moto's S3 server.
"""

from __future__ import annotations

import os
from typing import Any

from spotrun.providers.aws.credentials import keys
from spotrun.providers.storage import endpoint_options


def driver() -> Any:
    """A libcloud S3StorageDriver (no request yet). Raises ProviderError without credentials."""
    from libcloud.storage.drivers.s3 import S3StorageDriver

    key, secret, token = keys()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = os.environ.get("SPOTRUN_S3_ENDPOINT_URL")
    options = endpoint_options(endpoint) if endpoint else {}
    return S3StorageDriver(key, secret, region=region, token=token, **options)
