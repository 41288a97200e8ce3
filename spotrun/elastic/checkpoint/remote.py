"""Atomic, checksummed checkpoints on object storage (s3://, gs://, azure://), same API as checkpoint.py.

A cloud run needs checkpoints a replacement VM in another zone (or cloud) can find, so they live
in a bucket. Same guarantees as the local directory, by other means, since an object store has
no rename:

- Layout: `<prefix>/step-000000120/state-<writer id>.pt` and `<prefix>/step-000000120/manifest.json`.
- Publish order: the state object is uploaded first, under a name unique to this writer (the
  "temp name"), and the manifest last. A checkpoint exists only when its manifest exists and
  the state object it names has the manifest's size and sha256. One PUT is atomic per object,
  so a reader sees a whole manifest or none; a writer that dies after the state upload leaves a
  step without manifest, which `newest_valid` skips with a warning.
- Two survivors writing the same step never mix: each manifest names its own state object, so
  whichever manifest lands last points at a whole state.
- `write` is idempotent: a step that already verifies is kept.
- Large state objects go up as parallel multipart uploads (providers/storage.py): an
  unfinished one is no object at all, so a writer killed mid-upload leaves at most a step
  without its state or manifest. `write` of step N aborts the unfinished uploads of every
  older step (their writers are dead or superseded), never those of step N itself, which
  another survivor may be writing right now.

Functions mirror spotrun/elastic/checkpoint.py (`write`, `verify`, `steps`, `newest_valid`,
`prune`, `load_state`; `Manifest.path` is the step's URL), so the trainer picks the module by the
scheme of SPOTRUN_CHECKPOINT_DIR: `module_for(location)`. Locations may be given as str or as a
Path (which collapses "s3://" into "s3:/"; both work). Object I/O goes through
spotrun.providers.storage (libcloud's storage drivers); credentials and endpoint overrides
(SPOTRUN_S3_ENDPOINT_URL) are described there. Blocking; storage errors raise ProviderError,
except in `verify`/`newest_valid`, where an unreadable checkpoint is just not valid.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from spotrun.elastic.checkpoint import files as checkpoint
from spotrun.elastic.checkpoint.files import MANIFEST_FILE, Manifest, sha256
from spotrun.errors import ProviderError

_log = logging.getLogger("spotrun.checkpoint")

_PREFIX = "step-"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")  # "scheme:/", also after Path() collapsed "//"


@dataclass(frozen=True)
class RemoteManifest(Manifest):
    """A Manifest whose `path` is the step's URL; `state` names the state object in that step."""

    state: str = ""


def module_for(location: str | os.PathLike[str]) -> ModuleType:
    """This module for an object storage URL, else the local spotrun.elastic.checkpoint.files.

    A location without a URL scheme is a directory at once: forked training workers with a
    local checkpoint dir never import provider code."""
    if not _URL.match(str(location)):
        return checkpoint
    from spotrun.providers.storage import is_remote

    return sys.modules[__name__] if is_remote(location) else checkpoint


def _name(step: int) -> str:
    return f"{_PREFIX}{step:09d}"


def _key(prefix: str, *parts: str) -> str:
    return "/".join(p for p in (prefix, *parts) if p)


def _split(url: str | os.PathLike[str]) -> tuple[Any, str]:
    from spotrun.providers.storage import open_store

    return open_store(url)


# State files `verify` downloaded, kept for `load_state` of the same manifest (no 2nd download).
_verified: dict[tuple[str, str, str], Path] = {}


def write(
    url: str | os.PathLike[str], step: int, world_size: int, save: Callable[[Path], None], samples_seen: int = 0
) -> RemoteManifest:
    """Write checkpoint `step` under `url`: `save(path)` writes the state into a local temp file,
    which is uploaded as this writer's state object; then the manifest is uploaded last.
    Idempotent: a step that already verifies is kept. Raises ProviderError on storage errors."""
    store, prefix = _split(url)
    step_key = _key(prefix, _name(step))
    existing = _verify(store, step_key)
    if existing is not None:
        return existing
    _abort_stale_uploads(store, prefix, step)
    state_name = f"state-{uuid.uuid4().hex[:12]}.pt"
    with tempfile.TemporaryDirectory(prefix="spotrun-ckpt-") as tmp:
        state = Path(tmp) / state_name
        save(state)
        manifest = RemoteManifest(
            step,
            world_size,
            state.stat().st_size,
            sha256(state),
            time.time(),
            store.url(step_key),
            samples_seen,
            state_name,
        )
        store.put_file(_key(step_key, state_name), state)  # 1: the state, under our own name
        manifest_file = Path(tmp) / MANIFEST_FILE
        manifest_file.write_text(json.dumps(asdict(manifest), indent=2))
        store.put_file(_key(step_key, MANIFEST_FILE), manifest_file)  # 2: publish
    return manifest


def verify(path: str | os.PathLike[str]) -> RemoteManifest | None:
    """The manifest of a whole, uncorrupted checkpoint at the step URL `path`, else None.
    Downloads and hashes the state object (kept for `load_state`)."""
    try:
        store, step_key = _split(path)
        return _verify(store, step_key)
    except ProviderError:
        return None


def _verify(store: Any, step_key: str) -> RemoteManifest | None:
    try:
        raw = store.get_bytes(_key(step_key, MANIFEST_FILE))
        if raw is None:
            return None
        data = json.loads(raw)
        manifest = RemoteManifest(**{**data, "path": store.url(step_key)})
        if not manifest.state or "/" in manifest.state:
            return None
        fd, tmp = tempfile.mkstemp(prefix="spotrun-ckpt-", suffix=".pt")
        os.close(fd)
        local = Path(tmp)
        keep = False
        try:
            if not store.download(_key(step_key, manifest.state), local):
                return None
            if local.stat().st_size != manifest.bytes or sha256(local) != manifest.sha256:
                return None
            cache_key = (manifest.path, manifest.state, manifest.sha256)
            old = _verified.pop(cache_key, None)
            if old is not None:
                old.unlink(missing_ok=True)
            _verified[cache_key] = local
            keep = True
            return manifest
        finally:
            if not keep:
                local.unlink(missing_ok=True)
    except (OSError, ValueError, TypeError, ProviderError):
        return None


def _step_of(prefix: str, name: str) -> int | None:
    """The step of object (or upload) `name` under `prefix`, None for a name of no step."""
    part = name[len(prefix) :].lstrip("/").split("/", 1)[0] if prefix else name.split("/", 1)[0]
    if part.startswith(_PREFIX) and part[len(_PREFIX) :].isdigit():
        return int(part[len(_PREFIX) :])
    return None


def _abort_stale_uploads(store: Any, prefix: str, step: int) -> None:
    """Abort the unfinished multipart uploads of steps before `step` (see the module docstring).
    Best effort: a store that refuses (say, a policy without ListMultipartUploads) only warns,
    since a leftover upload costs storage but never makes a checkpoint look whole."""
    try:
        for upload in store.pending_uploads(_key(prefix, _PREFIX)):
            old = _step_of(prefix, upload.name)
            if old is not None and old < step:
                _log.info("aborting the unfinished upload of %s (started %s)", store.url(upload.name), upload.started)
                store.abort_upload(upload)
    except ProviderError as exc:
        _log.warning("cannot clean up unfinished uploads under %s: %s", store.url(prefix), exc)


def steps(url: str | os.PathLike[str]) -> list[int]:
    """Steps that have any object under `url` (whole or not), newest first."""
    store, prefix = _split(url)
    found = {_step_of(prefix, name) for name in store.names(_key(prefix, _PREFIX))}
    return sorted((step for step in found if step is not None), reverse=True)


def newest_valid(url: str | os.PathLike[str], warn: Callable[[str], None] | None = None) -> RemoteManifest | None:
    """The newest checkpoint that verifies; each newer broken or partial one is reported through
    `warn`. None when there is none (or the bucket cannot be listed: that is warned too)."""
    warn = warn or _log.warning
    try:
        store, prefix = _split(url)
        candidates = steps(url)
    except ProviderError as exc:
        warn(f"cannot list checkpoints in {url}: {exc}")
        return None
    for step in candidates:
        manifest = _verify(store, _key(prefix, _name(step)))
        if manifest is not None:
            return manifest
        warn(
            f"checkpoint {_name(step)} in {url} is incomplete or corrupt (no manifest, or sha256 or size "
            "mismatch); falling back to the previous one"
        )
    return None


def prune(url: str | os.PathLike[str], keep: int) -> list[int]:
    """Delete every object of all but the newest `keep` steps; returns the steps removed."""
    store, prefix = _split(url)
    removed = []
    for step in steps(url)[keep:]:
        step_key = _key(prefix, _name(step))
        names = store.names(step_key + "/")
        # The manifest goes first, so a reader never sees a manifest without its state.
        for name in sorted(names, key=lambda n: not n.endswith("/" + MANIFEST_FILE)):
            store.delete(name)
        removed.append(step)
    return removed


def load_state(manifest: Manifest) -> Any:
    """The saved object of a verified checkpoint (torch is imported here). The state is
    re-checked against the manifest's sha256 after download. Raises ProviderError when it no
    longer matches (the step was rewritten or pruned meanwhile)."""
    import torch

    state_name = getattr(manifest, "state", "")
    local = _verified.pop((manifest.path, state_name, manifest.sha256), None)
    if local is None or not local.exists():
        fresh = verify(manifest.path)
        if fresh is None or fresh.sha256 != manifest.sha256:
            raise ProviderError(
                f"checkpoint {manifest.path} changed or vanished since it was verified",
                hint="resume again: the newest valid checkpoint will be picked",
            )
        local = _verified.pop((fresh.path, fresh.state, fresh.sha256))
    try:
        return torch.load(local, map_location="cpu", weights_only=False)
    finally:
        local.unlink(missing_ok=True)
