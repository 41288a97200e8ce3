"""Object storage behind one tiny interface, through libcloud's storage drivers.

`open_store("s3://bucket/some/prefix")` returns an `ObjectStore` (put a file, get bytes,
download to a file, list names under a prefix, delete) and the prefix. Each URL scheme is served
by the `storage` module of the provider package the registry names for it (s3:// by
providers/aws/storage.py, gs:// by gcp/, azure:// by azure/): that module builds the libcloud
driver from its cloud's credentials and endpoint overrides (see each module's docstring), and it
is imported only when its scheme is used, so reading S3 credentials loads neither the EC2
provider nor libcloud's compute drivers. spotrun/elastic/checkpoint/remote.py builds checkpoints
on top of this. Every libcloud exception is translated here into ProviderError; a missing object
is `None` / False, never an exception. A driver holds one HTTP connection: an ObjectStore
belongs to one thread.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from spotrun.providers import storage_schemes

from spotrun.errors import ProviderError

SCHEMES = tuple(storage_schemes())
_COLLAPSED = re.compile(rf"^({'|'.join(SCHEMES)}):/(?!/)")
_REMOTE = re.compile(rf"^({'|'.join(SCHEMES)}):/")


def is_remote(location: str | os.PathLike[str]) -> bool:
    """Whether `location` names object storage (also after Path() collapsed '//' into '/')."""
    return bool(_REMOTE.match(str(location)))


def normalize(location: str | os.PathLike[str]) -> str:
    """`location` as a URL with '//' and no trailing slash (Path('s3://b/p') is 's3:/b/p')."""
    return _COLLAPSED.sub(r"\1://", str(location)).rstrip("/")


def endpoint_options(url: str) -> dict[str, Any]:
    """The `secure`, `host` and `port` arguments of a libcloud storage driver for an endpoint
    override such as http://127.0.0.1:5000 (the scheme's default port when the URL has none)."""
    parts = urlsplit(url)
    secure = parts.scheme != "http"
    return {"secure": secure, "host": parts.hostname, "port": parts.port or (443 if secure else 80)}


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
    driver = importlib.import_module(storage_schemes()[parts.scheme] + ".storage").driver()
    return ObjectStore(parts.scheme, parts.netloc, driver), parts.path.strip("/")
