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
belongs to one thread (a multipart upload gives each of its own threads a driver of its own).

Large files: a scheme module that has a `MULTIPART` (a `Multipart`, today only S3's) gets
parallel multipart uploads for files over the part size: the parts are read from the file by
at most `Transfer.in_flight` threads at a time (memory stays at in_flight x part size), and the
object appears only when every part is complete; on any failure the upload is aborted. The
part size and the parts in flight come from $SPOTRUN_STORAGE_PART_BYTES (64 MiB) and
$SPOTRUN_STORAGE_PARTS_IN_FLIGHT (4). gs:// and azure:// keep the one libcloud upload call:
a single GCS upload takes up to 5 TiB, and libcloud already sends Azure blobs in 4 MiB blocks.
Downloads are streamed to disk in chunks by libcloud's `download_object`, never held whole;
`get_bytes` is for small objects (manifests).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from spotrun.providers import storage_schemes

from spotrun.errors import ProviderError

_log = logging.getLogger("spotrun.storage")
_T = TypeVar("_T")

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


@dataclass(frozen=True)
class Transfer:
    """How large files move: parts of `part_bytes` (the last may be shorter), at most
    `in_flight` of them on the wire at once, each tried `attempts` times."""

    part_bytes: int = 64 * 2**20
    in_flight: int = 4
    attempts: int = 3

    @classmethod
    def from_env(cls) -> Transfer:
        """From $SPOTRUN_STORAGE_PART_BYTES and $SPOTRUN_STORAGE_PARTS_IN_FLIGHT (defaults where
        unset). Raises ProviderError for a value that is not a positive integer."""
        default = cls()
        return cls(
            _positive("SPOTRUN_STORAGE_PART_BYTES", default.part_bytes),
            _positive("SPOTRUN_STORAGE_PARTS_IN_FLIGHT", default.in_flight),
        )


def _positive(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ProviderError(f"{name}={raw!r} is not a positive integer", hint=f"unset it for {default}")
    return int(raw)


@dataclass(frozen=True)
class Upload:
    """A multipart upload that was started and neither completed nor aborted: invisible as an
    object, but its parts are stored (and billed) until it is aborted."""

    name: str
    id: str
    started: str


class Multipart(Protocol):
    """One store's multipart upload calls (see providers/aws/storage.py). Every call blocks,
    takes the thread's own driver and raises on failure; `complete` makes the object appear whole."""

    min_part_bytes: int  # every part but the last must be at least this large
    max_parts: int

    def start(self, driver: Any, container: Any, name: str) -> str: ...

    def put_part(self, driver: Any, container: Any, name: str, upload_id: str, number: int, data: bytes) -> str: ...

    def complete(
        self, driver: Any, container: Any, name: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> None: ...

    def abort(self, driver: Any, container: Any, name: str, upload_id: str) -> None: ...

    def pending(self, driver: Any, container: Any, prefix: str) -> list[Upload]: ...


@dataclass
class ObjectStore:
    """One bucket (container) of one object store; see the module docstring."""

    scheme: str
    bucket: str
    driver: Any
    _container: Any = None
    module: ModuleType | None = None  # the scheme's storage module: builds drivers, may have MULTIPART

    def url(self, name: str) -> str:
        return f"{self.scheme}://{self.bucket}/{name}"

    def container(self) -> Any:
        if self._container is None:
            self._container = self._call("open bucket", lambda: self.driver.get_container(self.bucket))
        return self._container

    @property
    def multipart(self) -> Multipart | None:
        return getattr(self.module, "MULTIPART", None)

    def put_file(self, name: str, path: Path, transfer: Transfer | None = None) -> None:
        """Upload the file at `path` as object `name`; the object appears whole or not at all.
        A file over the part size goes as a parallel multipart upload where the store has one
        (see the module docstring); a failed one is aborted. Raises ProviderError."""
        transfer = transfer or Transfer.from_env()
        multipart = self.multipart
        if multipart is None or path.stat().st_size <= transfer.part_bytes:
            self._call(
                f"upload {name}",
                lambda: self.driver.upload_object(str(path), self.container(), name, verify_hash=False),
            )
            return
        self._put_multipart(multipart, name, path, transfer)

    def _put_multipart(self, multipart: Multipart, name: str, path: Path, transfer: Transfer) -> None:
        size = path.stat().st_size
        part_bytes = max(transfer.part_bytes, multipart.min_part_bytes, -(-size // multipart.max_parts))
        container = self.container()
        upload_id = self._call(f"start upload of {name}", lambda: multipart.start(self.driver, container, name))
        local = threading.local()  # one driver (one HTTP connection) per upload thread

        def send(number: int) -> str:
            if not hasattr(local, "driver"):
                local.driver = self._new_driver()
            with path.open("rb") as f:
                f.seek((number - 1) * part_bytes)
                data = f.read(part_bytes)
            return self._retry(
                f"upload part {number} of {name}",
                transfer.attempts,
                lambda: multipart.put_part(local.driver, container, name, upload_id, number, data),
            )

        try:
            count = -(-size // part_bytes)
            with ThreadPoolExecutor(max_workers=transfer.in_flight, thread_name_prefix="spotrun-upload") as pool:
                futures = [pool.submit(send, number) for number in range(1, count + 1)]
                wait(futures, return_when=FIRST_EXCEPTION)
                failed = next((f for f in futures if f.done() and f.exception() is not None), None)
                if failed is not None:
                    pool.shutdown(cancel_futures=True)  # parts not yet started are not sent
                    failed.result()  # raises that part's ProviderError
            etags = [(number, future.result()) for number, future in enumerate(futures, 1)]
            self._call(
                f"complete upload of {name}", lambda: multipart.complete(self.driver, container, name, upload_id, etags)
            )
        except BaseException:
            # Best effort: an upload that cannot be aborted here (or whose writer is killed) is
            # invisible as an object anyway, and left to a later `pending_uploads` sweep.
            try:
                multipart.abort(self.driver, container, name, upload_id)
            except Exception as exc:
                _log.warning("cannot abort the upload of %s: %s", self.url(name), exc)
            raise

    def _new_driver(self) -> Any:
        return self.module.driver() if self.module is not None else self.driver

    def _retry(self, what: str, attempts: int, fn: Callable[[], _T]) -> _T:
        for attempt in range(1, attempts):
            try:
                return fn()
            except Exception as exc:
                # A part is the retryable unit: a network blip costs one part, not the whole file.
                _log.info("%s failed (%s: %s); retrying", what, type(exc).__name__, exc)
                time.sleep(0.5 * 2**attempt)
        result: _T = self._call(what, fn)
        return result

    def pending_uploads(self, prefix: str) -> list[Upload]:
        """Multipart uploads under `prefix` that were never completed nor aborted ([] for a
        store without multipart uploads). Raises ProviderError."""
        multipart = self.multipart
        if multipart is None:
            return []
        return self._call(
            f"list uploads under {prefix}", lambda: multipart.pending(self.driver, self.container(), prefix)
        )

    def abort_upload(self, upload: Upload) -> None:
        """Abort `upload`, freeing its stored parts; one already gone is fine. Raises ProviderError."""
        multipart = self.multipart
        if multipart is not None:
            self._call(
                f"abort upload of {upload.name}",
                lambda: multipart.abort(self.driver, self.container(), upload.name, upload.id),
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
        return list(self.sizes(prefix))

    def sizes(self, prefix: str) -> dict[str, int]:
        """Name -> size in bytes of every object under `prefix` (one listing, no object is read)."""
        return {
            obj.name: int(obj.size)
            for obj in self._call(
                f"list {prefix}", lambda: list(self.driver.iterate_container_objects(self.container(), prefix=prefix))
            )
        }

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
    module = importlib.import_module(storage_schemes()[parts.scheme] + ".storage")
    return ObjectStore(parts.scheme, parts.netloc, module.driver(), module=module), parts.path.strip("/")
