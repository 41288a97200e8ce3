"""Atomic, checksummed checkpoints on object storage (s3://, gs://, azure://), same API as files.py.

A cloud run needs checkpoints a replacement VM in another zone (or cloud) can find, so they live
in a bucket. Same guarantees as the local directory, by other means, since an object store has
no rename:

- Layout: `<prefix>/step-000000120/state-<writer id>.pt` and `<prefix>/step-000000120/manifest.json`,
  or for a sharded checkpoint (remote_sharded.py) `<prefix>/step-000000120/shards-<writer id>/
  {.metadata, __0_0.distcp, ...}` and the manifest listing each of those objects (a
  ShardedManifest whose names are relative to the step).
- Publish order: the objects are uploaded first, under names unique to this writer (the "temp
  names"), and the manifest last. A checkpoint exists only when its manifest exists and every
  object it names has the manifest's size and sha256. One PUT is atomic per object, so a reader
  sees a whole manifest or none; a writer that dies before its manifest leaves a step without
  one, which `newest_valid` skips with a warning.
- Two survivors writing the same step never mix: each manifest names its own objects, so
  whichever manifest lands last points at a whole checkpoint.
- `write` is idempotent: a step that already verifies is kept.
- Large objects (a state, a shard) go up as parallel multipart uploads (providers/storage.py):
  an unfinished one is no object at all, so a writer killed mid-upload leaves at most a step
  without some objects or its manifest. A write of step N (`write`, remote_sharded's saves)
  aborts the unfinished uploads of every older step (their writers are dead or superseded),
  never those of step N itself, which another survivor may be writing right now.

Functions mirror spotrun/elastic/checkpoint/files.py (`write`, `publish`, `verify`, `steps`,
`newest_valid`, `prune`, `load_state`; `Manifest.path` is the step's URL), so the trainer picks the
module by the scheme of SPOTRUN_CHECKPOINT_DIR: `module_for(location)`. `verify` downloads and
hashes every object of a checkpoint (into a local temp dir, kept for the load that follows in
the same process); `prune` and the "step already there" check of a sharded save only compare the
listed sizes with the bucket's listing (no download). Locations may be given as str or as a
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
import shutil
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
from spotrun.elastic.checkpoint.files import MANIFEST_FILE, Manifest, ShardedManifest, sha256
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


# Local copies of the checkpoints `verify` downloaded (each a dir holding every object by its name),
# kept for the `load_state` / remote_sharded.load of the same manifest (no second download).
_verified: dict[tuple[str, str, tuple[str, ...]], Path] = {}


def _objects(manifest: Manifest) -> dict[str, tuple[int, str]]:
    """Name (relative to the step) -> (bytes, sha256) of every object checkpoint `manifest` consists of."""
    if isinstance(manifest, ShardedManifest):
        return manifest.files
    return {getattr(manifest, "state", ""): (manifest.bytes, manifest.sha256)}


def _cache_key(manifest: Manifest) -> tuple[str, str, tuple[str, ...]]:
    return manifest.path, manifest.sha256, tuple(sorted(_objects(manifest)))


def write(
    url: str | os.PathLike[str], step: int, world_size: int, save: Callable[[Path], None], samples_seen: int = 0
) -> Manifest:
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
        _put_manifest(store, step_key, manifest)  # 2: publish
    return manifest


def put(url: str | os.PathLike[str], step: int, name: str, path: Path) -> None:
    """Upload the local file `path` as object `name` of step `step` under `url` (a parallel
    multipart upload when it is large: see providers/storage.py). The object appears whole or
    not at all. Blocking; raises ProviderError."""
    store, prefix = _split(url)
    store.put_file(_key(prefix, _name(step), name), path)


def publish(
    url: str | os.PathLike[str], step: int, world_size: int, files: dict[str, tuple[int, str]], samples_seen: int = 0
) -> ShardedManifest:
    """Publish the sharded checkpoint `step` whose objects (`files`: name relative to the step ->
    bytes, sha256, computed by their writers) are all uploaded (`put`): uploads its manifest,
    last. Blocking; raises ProviderError. Another writer's manifest of the same step uploaded
    later replaces this one; each names its own whole set of objects."""
    store, prefix = _split(url)
    step_key = _key(prefix, _name(step))
    manifest = checkpoint.sharded_manifest(step, world_size, files, samples_seen, store.url(step_key))
    _put_manifest(store, step_key, manifest)
    return manifest


def _put_manifest(store: Any, step_key: str, manifest: Manifest) -> None:
    with tempfile.TemporaryDirectory(prefix="spotrun-ckpt-") as tmp:
        manifest_file = Path(tmp) / MANIFEST_FILE
        manifest_file.write_text(json.dumps(asdict(manifest), indent=2))
        store.put_file(_key(step_key, MANIFEST_FILE), manifest_file)


def _read(store: Any, step_key: str) -> Manifest | None:
    """The manifest of step `step_key` if it exists and parses (its objects are not checked).
    Raises ProviderError when it cannot be read."""
    raw = store.get_bytes(_key(step_key, MANIFEST_FILE))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        url = store.url(step_key)
        manifest = checkpoint.parse(data, url) if "files" in data else RemoteManifest(**{**data, "path": url})
    except (ValueError, TypeError):
        return None
    # Names are relative to the step: nothing may point outside it (they become local paths too).
    safe = all(part not in ("", ".", "..") for name in _objects(manifest) for part in name.split("/"))
    return manifest if safe else None


def verify(path: str | os.PathLike[str]) -> Manifest | None:
    """The manifest of a whole, uncorrupted checkpoint at the step URL `path`, else None.
    Downloads and hashes every object it lists (kept for `load_state` / remote_sharded.load)."""
    try:
        store, step_key = _split(path)
        return _verify(store, step_key)
    except ProviderError:
        return None


def _verify(store: Any, step_key: str) -> Manifest | None:
    try:
        manifest = _read(store, step_key)
        if manifest is None:
            return None
        local = Path(tempfile.mkdtemp(prefix="spotrun-ckpt-"))
        keep = False
        try:
            for name, (size, digest) in _objects(manifest).items():
                if not _download(store, step_key, name, size, digest, local):
                    return None
            old = _verified.pop(_cache_key(manifest), None)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            _verified[_cache_key(manifest)] = local
            keep = True
            return manifest
        finally:
            if not keep:
                shutil.rmtree(local, ignore_errors=True)
    except (OSError, ProviderError):
        return None


def _download(store: Any, step_key: str, name: str, size: int, digest: str, into: Path) -> bool:
    """Download object `name` of step `step_key` to `into`/`name`: True when it is there with
    `size` bytes and sha256 `digest`, else False (and no local file). Raises ProviderError."""
    local = into / name
    local.parent.mkdir(parents=True, exist_ok=True)
    if store.download(_key(step_key, name), local) and local.stat().st_size == size and sha256(local) == digest:
        return True
    local.unlink(missing_ok=True)
    return False


def take_verified(manifest: Manifest) -> Path | None:
    """The local dir `verify` downloaded checkpoint `manifest` into (every object under its name;
    the caller owns it now and removes it), or None when this process did not verify it."""
    local = _verified.pop(_cache_key(manifest), None)
    return local if local is not None and local.is_dir() else None


def fetch(manifest: ShardedManifest, name: str, into: Path) -> None:
    """Download object `name` of the verified sharded checkpoint `manifest` to `into`/`name`,
    checked against the manifest. Blocking. Raises ProviderError when it is missing or no longer
    matches (the step was rewritten or pruned meanwhile)."""
    store, step_key = _split(manifest.path)
    size, digest = manifest.files[name]
    if not _download(store, step_key, name, size, digest, into):
        raise _changed(manifest)


def _changed(manifest: Manifest) -> ProviderError:
    return ProviderError(
        f"checkpoint {manifest.path} changed or vanished since it was verified",
        hint="resume again: the newest valid checkpoint will be picked",
    )


def published(url: str | os.PathLike[str], step: int) -> Manifest | None:
    """The manifest of step `step` under `url` when it is published and every object it lists
    is in the bucket with its size (the bucket's listing is compared, nothing is downloaded or
    hashed), else None. Raises ProviderError."""
    store, prefix = _split(url)
    step_key = _key(prefix, _name(step))
    manifest = _read(store, step_key)
    return manifest if manifest is not None and _sizes_match(manifest, step_key, store.sizes(step_key + "/")) else None


def _sizes_match(manifest: Manifest, step_key: str, sizes: dict[str, int]) -> bool:
    """Whether every object `manifest` lists has its size in `sizes` (a listing: name -> bytes)."""
    return all(sizes.get(_key(step_key, name)) == size for name, (size, _) in _objects(manifest).items())


def _step_of(prefix: str, name: str) -> int | None:
    """The step of object (or upload) `name` under `prefix`, None for a name of no step."""
    part = name[len(prefix) :].lstrip("/").split("/", 1)[0] if prefix else name.split("/", 1)[0]
    if part.startswith(_PREFIX) and part[len(_PREFIX) :].isdigit():
        return int(part[len(_PREFIX) :])
    return None


def abort_stale_uploads(url: str | os.PathLike[str], step: int) -> None:
    """Before writing step `step` under `url`: abort the unfinished multipart uploads of older
    steps (see the module docstring). Best effort, as below."""
    store, prefix = _split(url)
    _abort_stale_uploads(store, prefix, step)


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


def newest_valid(url: str | os.PathLike[str], warn: Callable[[str], None] | None = None) -> Manifest | None:
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
    """Keep the newest `keep` whole-looking checkpoints (manifest and every object it lists with
    its size, from one listing: nothing is downloaded; a broken one does not count) and delete
    every object of every other step; returns the steps removed. Except a step without manifest
    that is newer than every whole one: its writer may be uploading it right now, so it is left
    for a prune after a newer checkpoint. Raises ProviderError."""
    store, prefix = _split(url)
    by_step: dict[int, dict[str, int]] = {}
    for name, size in store.sizes(_key(prefix, _PREFIX)).items():
        if (step := _step_of(prefix, name)) is not None:
            by_step.setdefault(step, {})[name] = size
    removed, kept = [], 0
    for step in sorted(by_step, reverse=True):
        step_key = _key(prefix, _name(step))
        manifest = _read(store, step_key)
        if manifest is not None and kept < keep and _sizes_match(manifest, step_key, by_step[step]):
            kept += 1
            continue
        if manifest is None and kept == 0:
            continue
        # The manifest goes first, so a reader never sees a manifest without its objects.
        for name in sorted(by_step[step], key=lambda n: not n.endswith("/" + MANIFEST_FILE)):
            store.delete(name)
        removed.append(step)
    return removed


def load_state(manifest: Manifest) -> Any:
    """The saved object of a verified single-state checkpoint (torch is imported here). The state
    is re-checked against the manifest's sha256 after download. Raises ProviderError when it no
    longer matches (the step was rewritten or pruned meanwhile), ValueError for a sharded one
    (remote_sharded.load reads those)."""
    import torch

    if isinstance(manifest, ShardedManifest):
        raise ValueError(f"checkpoint {manifest.path} is sharded (DCP): load it with remote_sharded.load")
    local = take_verified(manifest)
    if local is None:
        fresh = verify(manifest.path)
        if fresh is None or fresh.sha256 != manifest.sha256 or isinstance(fresh, ShardedManifest):
            raise _changed(manifest)
        manifest, local = fresh, take_verified(fresh)
        assert local is not None  # verify just kept it
    try:
        (state_name,) = _objects(manifest)
        return torch.load(local / state_name, map_location="cpu", weights_only=False)
    finally:
        shutil.rmtree(local, ignore_errors=True)
