"""Object storage behind one tiny interface, through libcloud's storage drivers.

`open_store("s3://bucket/some/prefix")` returns an `ObjectStore` (put a file, get bytes,
download to a file, list names under a prefix, delete) and the prefix. This is the only module
that imports libcloud's storage drivers (spotrun/elastic/remote_checkpoint.py builds checkpoints
on top of it). Every libcloud exception is translated here into ProviderError; a missing object
is `None` / False, never an exception.

Schemes, credentials and endpoint overrides:
- `s3://bucket/prefix`: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials, as
  the aws provider reads them), region from $AWS_REGION / $AWS_DEFAULT_REGION (us-east-1),
  endpoint from $SPOTRUN_S3_ENDPOINT_URL (moto, MinIO, any S3-compatible store).
  Tested against moto's S3 server.
- `gs://bucket/prefix`: the service-account key in $GOOGLE_APPLICATION_CREDENTIALS and its
  project (libcloud's GoogleStorageDriver). Not tested here (no local GCS server).
- `azure://container/prefix`: $AZURE_STORAGE_ACCOUNT and $AZURE_STORAGE_KEY, endpoint from
  $SPOTRUN_AZURE_BLOB_ENDPOINT_URL (e.g. Azurite). Not tested here.
A driver holds one HTTP connection: an ObjectStore belongs to one thread.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from spotrun.errors import ProviderError

SCHEMES = ("s3", "gs", "azure")
_COLLAPSED = re.compile(r"^(s3|gs|azure):/(?!/)")


def is_remote(location: str | os.PathLike[str]) -> bool:
    """Whether `location` names object storage (also after Path() collapsed '//' into '/')."""
    return bool(re.match(r"^(s3|gs|azure):/", str(location)))


def normalize(location: str | os.PathLike[str]) -> str:
    """`location` as a URL with '//' and no trailing slash (Path('s3://b/p') is 's3:/b/p')."""
    return _COLLAPSED.sub(r"\1://", str(location)).rstrip("/")


@dataclass
class ObjectStore:
    """One bucket (container) of one object store; see the module docstring."""

    scheme: str
    bucket: str
    driver: Any
    _container: Any = None

    def url(self, name: str) -> str:
        return f"{self.scheme}://{self.bucket}/{name}"

    def container(self) -> Any:
        if self._container is None:
            self._container = self._call("open bucket", lambda: self.driver.get_container(self.bucket))
        return self._container

    def put_file(self, name: str, path: Path) -> None:
        """Upload the file at `path` as object `name` (one PUT: the object appears whole or not)."""
        self._call(
            f"upload {name}", lambda: self.driver.upload_object(str(path), self.container(), name, verify_hash=False)
        )

    def download(self, name: str, path: Path) -> bool:
        """Download object `name` to `path`; False when it does not exist."""
        from libcloud.storage.types import ObjectDoesNotExistError

        try:
            obj = self.driver.get_object(self.bucket, name)
            return bool(self.driver.download_object(obj, str(path), overwrite_existing=True, delete_on_failure=True))
        except ObjectDoesNotExistError:
            return False
        except Exception as exc:
            raise ProviderError(f"cannot download {self.url(name)}: {type(exc).__name__}: {exc}") from exc

    def get_bytes(self, name: str) -> bytes | None:
        """The content of object `name`, or None when it does not exist."""
        from libcloud.storage.types import ObjectDoesNotExistError

        try:
            obj = self.driver.get_object(self.bucket, name)
            return b"".join(self.driver.download_object_as_stream(obj))
        except ObjectDoesNotExistError:
            return None
        except Exception as exc:
            raise ProviderError(f"cannot read {self.url(name)}: {type(exc).__name__}: {exc}") from exc

    def names(self, prefix: str) -> list[str]:
        """Names of every object under `prefix`."""
        return [
            obj.name
            for obj in self._call(
                f"list {prefix}", lambda: list(self.driver.iterate_container_objects(self.container(), prefix=prefix))
            )
        ]

    def delete(self, name: str) -> None:
        """Delete object `name`; a missing one is fine."""
        from libcloud.storage.types import ObjectDoesNotExistError

        try:
            self.driver.delete_object(self.driver.get_object(self.bucket, name))
        except ObjectDoesNotExistError:
            return
        except Exception as exc:
            raise ProviderError(f"cannot delete {self.url(name)}: {type(exc).__name__}: {exc}") from exc

    def _call(self, what: str, fn: Any) -> Any:
        from libcloud.storage.types import ContainerDoesNotExistError

        try:
            return fn()
        except ContainerDoesNotExistError as exc:
            raise ProviderError(
                f"bucket {self.scheme}://{self.bucket} does not exist",
                hint="create it first, or fix the checkpoint URL",
            ) from exc
        except ProviderError:
            raise
        except Exception as exc:  # libcloud's errors share no useful base class
            raise ProviderError(
                f"object storage: cannot {what} in {self.scheme}://{self.bucket}: "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            ) from exc


def open_store(location: str | os.PathLike[str]) -> tuple[ObjectStore, str]:
    """(store, prefix without trailing slash) for `location`, e.g. s3://bucket/runs/a.
    Cheap: no request until the first operation. Raises ProviderError for an unknown scheme or
    missing credentials (naming what to set)."""
    url = normalize(location)
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.netloc:
        raise ProviderError(
            f"checkpoint location {str(location)!r} is not an object storage URL",
            hint="use s3://bucket/prefix, gs://bucket/prefix or azure://container/prefix",
        )
    driver = _DRIVERS[parts.scheme]()
    return ObjectStore(parts.scheme, parts.netloc, driver), parts.path.strip("/")


def _s3() -> Any:
    from libcloud.storage.drivers.s3 import S3StorageDriver
    from spotrun.providers.aws.provider import credentials

    key, secret, token = credentials()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = os.environ.get("SPOTRUN_S3_ENDPOINT_URL")
    if endpoint:
        parts = urlsplit(endpoint)
        secure = parts.scheme != "http"
        return S3StorageDriver(
            key,
            secret,
            secure=secure,
            host=parts.hostname,
            port=parts.port or (443 if secure else 80),
            region=region,
            token=token,
        )
    return S3StorageDriver(key, secret, region=region, token=token)


def _gs() -> Any:
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


def _azure() -> Any:
    from libcloud.storage.drivers.azure_blobs import AzureBlobsStorageDriver

    account, key = os.environ.get("AZURE_STORAGE_ACCOUNT"), os.environ.get("AZURE_STORAGE_KEY")
    if not account or not key:
        raise ProviderError(
            "no Azure storage credentials for azure:// checkpoints",
            hint="set AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY",
        )
    endpoint = os.environ.get("SPOTRUN_AZURE_BLOB_ENDPOINT_URL")
    if endpoint:
        parts = urlsplit(endpoint)
        secure = parts.scheme != "http"
        return AzureBlobsStorageDriver(
            account, key, secure=secure, host=parts.hostname, port=parts.port or (443 if secure else 80)
        )
    return AzureBlobsStorageDriver(account, key)


_DRIVERS = {"s3": _s3, "gs": _gs, "azure": _azure}
