"""S3 object storage (`s3://bucket/prefix`) for providers/storage.py, through libcloud's S3 driver.

Credentials as the aws provider reads them (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or
~/.aws/credentials: aws/credentials.py, which imports neither libcloud nor the EC2 provider),
region from $AWS_REGION / $AWS_DEFAULT_REGION (us-east-1), endpoint from $SPOTRUN_S3_ENDPOINT_URL
(moto, MinIO, any S3-compatible store). Tested against moto's S3 server.

Multipart uploads (`MULTIPART`, driven in parallel by providers/storage.py), so an object may
exceed S3's 5 GB single-PUT limit. libcloud 3.9's S3 driver has CreateMultipartUpload
(`_initiate_multipart`), CompleteMultipartUpload (`_commit_multipart`) and ListMultipartUploads
(`ex_iterate_multipart_uploads`), used as they are. What it lacks is sent as raw requests
signed by the driver's own connection: UploadPart of one chosen part number (libcloud only
streams a whole file through one sequential loop of fixed 5 MiB parts, `upload_object_via_stream`)
and an AbortMultipartUpload that takes an upload already gone (404) as done.
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any

from spotrun.providers.aws.credentials import keys
from spotrun.providers.storage import Upload, endpoint_options

from spotrun.errors import ProviderError


def driver() -> Any:
    """A libcloud S3StorageDriver (no request yet). Raises ProviderError without credentials."""
    from libcloud.storage.drivers.s3 import S3StorageDriver

    key, secret, token = keys()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = os.environ.get("SPOTRUN_S3_ENDPOINT_URL")
    options = endpoint_options(endpoint) if endpoint else {}
    return S3StorageDriver(key, secret, region=region, token=token, **options)


class S3Multipart:
    """S3's multipart upload calls (providers.storage.Multipart). Each call blocks on one request
    and raises on failure (ProviderError or libcloud's errors, which ObjectStore translates)."""

    min_part_bytes = 5 * 2**20  # S3 refuses smaller parts, except the last
    max_parts = 10_000

    def start(self, driver: Any, container: Any, name: str) -> str:
        upload_id: str = driver._initiate_multipart(
            container, name, headers={"Content-Type": "application/octet-stream"}
        )
        return upload_id

    def put_part(self, driver: Any, container: Any, name: str, upload_id: str, number: int, data: bytes) -> str:
        """Upload part `number` (from 1); returns its ETag. Content-MD5 lets S3 refuse a part
        damaged on the way."""
        digest = base64.b64encode(hashlib.md5(data).digest()).decode()
        response = driver.connection.request(
            driver._get_object_path(container, name),
            method="PUT",
            data=data,
            headers={"Content-Length": str(len(data)), "Content-MD5": digest},
            params={"uploadId": upload_id, "partNumber": number},
        )
        if response.status != 200:
            raise ProviderError(f"S3 refused part {number} of {name}: HTTP {response.status} {response.body[:200]!r}")
        etag: str = response.headers["etag"].replace('"', "")
        return etag

    def complete(self, driver: Any, container: Any, name: str, upload_id: str, parts: list[tuple[int, str]]) -> None:
        driver._commit_multipart(container, name, upload_id, parts)

    def abort(self, driver: Any, container: Any, name: str, upload_id: str) -> None:
        response = driver.connection.request(
            driver._get_object_path(container, name), method="DELETE", params={"uploadId": upload_id}
        )
        if response.status not in (204, 404):  # 404: aborted or completed already
            raise ProviderError(f"S3 cannot abort the upload of {name}: HTTP {response.status}")

    def pending(self, driver: Any, container: Any, prefix: str) -> list[Upload]:
        return [
            Upload(u.key, u.id, u.created_at) for u in driver.ex_iterate_multipart_uploads(container, prefix=prefix)
        ]


MULTIPART = S3Multipart()
