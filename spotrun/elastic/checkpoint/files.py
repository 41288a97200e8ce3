"""Atomic, checksummed checkpoints in a directory every node can reach.

Layout: `<dir>/step-000000120/{state.pt, manifest.json}`, or for a sharded checkpoint (see
sharded.py) `<dir>/step-000000120/{.metadata, __0_0.distcp, __1_0.distcp, ..., manifest.json}`.
A checkpoint is written into a hidden temp directory and renamed into place, so a reader sees a
whole checkpoint or none. The manifest holds step, world size, bytes and sha256 of state.pt, or
of each file a sharded checkpoint consists of; a checkpoint whose manifest is missing or whose
files do not match it is skipped (with a warning) in favour of the previous one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_log = logging.getLogger("spotrun.checkpoint")

STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
_PREFIX = "step-"


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    bytes: int
    sha256: str
    written_at: float
    path: str
    samples_seen: int = 0


@dataclass(frozen=True)
class ShardedManifest(Manifest):
    """A checkpoint of several files (one or more per rank): name -> (bytes, sha256) of each, as
    computed by the rank that wrote it. `bytes` is their total, `sha256` the digest of this list."""

    files: dict[str, tuple[int, str]] = field(default_factory=dict)


def _name(step: int) -> str:
    return f"{_PREFIX}{step:09d}"


def step_path(directory: Path, step: int) -> Path:
    """Where checkpoint `step` lives in `directory` (whole or not)."""
    return directory / _name(step)


def sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (what a manifest records of its state file)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(directory: Path, step: int, world_size: int, save: Callable[[Path], None], samples_seen: int = 0) -> Manifest:
    """Write checkpoint `step` atomically; `save(path)` writes the state file (e.g. torch.save).

    Idempotent: if a valid checkpoint for `step` exists (another survivor wrote it), it is kept.
    Blocks until the data is on disk (fsync) and renamed into place.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / _name(step)
    if (existing := verify(final)) is not None:
        return existing
    tmp = temp_dir(directory, step)
    try:
        state = tmp / STATE_FILE
        save(state)
        with state.open("rb") as handle:
            os.fsync(handle.fileno())
        manifest = Manifest(
            step, world_size, state.stat().st_size, sha256(state), time.time(), str(final), samples_seen
        )
        return _publish(tmp, manifest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def temp_dir(directory: Path, step: int) -> Path:
    """A new hidden directory to write checkpoint `step` into (prune removes it if left behind)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".tmp-{_name(step)}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def publish(
    tmp: Path, step: int, world_size: int, files: dict[str, tuple[int, str]], samples_seen: int = 0
) -> Manifest:
    """Publish the sharded checkpoint written into `tmp` (a `temp_dir`) as step `step`: writes the
    manifest of `files` (name -> bytes, sha256, computed by their writers; nothing is re-hashed
    here) and renames the directory into place. Call once every file is written (fsynced).
    Idempotent: a valid checkpoint of the same step another writer published first is kept."""
    manifest = sharded_manifest(step, world_size, files, samples_seen, str(tmp.parent / _name(step)))
    try:
        return _publish(tmp, manifest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sharded_manifest(
    step: int, world_size: int, files: dict[str, tuple[int, str]], samples_seen: int, path: str
) -> ShardedManifest:
    """The manifest of a sharded checkpoint at `path` made of `files` (name -> bytes, sha256),
    written now: `bytes` is their total, `sha256` the digest of the sorted listing."""
    listing = sorted(files.items())
    digest = hashlib.sha256("".join(f"{name} {size} {sha}\n" for name, (size, sha) in listing).encode())
    total = sum(size for _, (size, _) in listing)
    return ShardedManifest(step, world_size, total, digest.hexdigest(), time.time(), path, samples_seen, dict(listing))


def _publish(tmp: Path, manifest: Manifest) -> Manifest:
    final = Path(manifest.path)
    (tmp / MANIFEST_FILE).write_text(json.dumps(asdict(manifest), indent=2))
    _fsync_dir(tmp)
    try:
        os.rename(tmp, final)
    except OSError:
        # Another survivor renamed the same step first: theirs is as good as ours.
        if (theirs := verify(final)) is None:
            raise
        return theirs
    _fsync_dir(final.parent)
    return manifest


def verify(path: Path) -> Manifest | None:
    """The manifest of a whole, uncorrupted checkpoint dir, else None. Reads and hashes its files."""
    manifest = _read(path)
    if manifest is None:
        return None
    for name, (size, digest) in _listing(manifest).items():
        try:
            if (path / name).stat().st_size != size or sha256(path / name) != digest:
                return None
        except OSError:
            return None
    return manifest


def _read(path: Path) -> Manifest | None:
    """The manifest of checkpoint dir `path` if it parses, else None (nothing else is checked)."""
    try:
        return parse(json.loads((path / MANIFEST_FILE).read_text()), str(path))
    except (OSError, ValueError):
        return None


def parse(data: Any, path: str) -> Manifest:
    """The manifest a manifest.json holds (`data`, parsed JSON), found at `path`: a ShardedManifest
    when it lists files, else a single-state Manifest. Raises ValueError for anything else."""
    try:
        if "files" in data:
            files = {str(name): (int(size), str(digest)) for name, (size, digest) in data["files"].items()}
            return ShardedManifest(**{**data, "path": path, "files": files})
        return Manifest(**{**data, "path": path})
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"not a checkpoint manifest: {exc}") from exc


def _listing(manifest: Manifest) -> dict[str, tuple[int, str]]:
    if isinstance(manifest, ShardedManifest):
        return manifest.files
    return {STATE_FILE: (manifest.bytes, manifest.sha256)}


def _looks_whole(path: Path) -> bool:
    """A cheap validity check for pruning: the manifest parses and every file has its size (no hashing)."""
    manifest = _read(path)
    if manifest is None:
        return False
    try:
        return all((path / name).stat().st_size == size for name, (size, _) in _listing(manifest).items())
    except OSError:
        return False


def steps(directory: Path) -> list[int]:
    """Steps of the checkpoint dirs present, newest first (whole or not)."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        if entry.name.startswith(_PREFIX) and entry.name[len(_PREFIX) :].isdigit():
            found.append(int(entry.name[len(_PREFIX) :]))
    return sorted(found, reverse=True)


def newest_valid(directory: Path, warn: Callable[[str], None] | None = None) -> Manifest | None:
    """The newest checkpoint that verifies; each newer broken one is reported through `warn`."""
    warn = warn or _log.warning
    for step in steps(directory):
        manifest = verify(directory / _name(step))
        if manifest is not None:
            return manifest
        warn(
            f"checkpoint {_name(step)} in {directory} is incomplete or corrupt (sha256 or size mismatch); "
            "falling back to the previous one"
        )
    return None


def prune(directory: Path, keep: int) -> list[int]:
    """Keep the newest `keep` valid-looking checkpoints (a broken one does not count) and delete
    every other one; returns the steps removed."""
    removed, kept = [], 0
    for step in steps(directory):
        if kept < keep and _looks_whole(directory / _name(step)):
            kept += 1
            continue
        shutil.rmtree(directory / _name(step), ignore_errors=True)
        removed.append(step)
    for stale in directory.glob(".tmp-*"):
        if time.time() - stale.stat().st_mtime > 600:  # a writer that died long ago
            shutil.rmtree(stale, ignore_errors=True)
    return removed


def load_state(manifest: Manifest) -> Any:
    """The saved object of a verified checkpoint (torch is imported here, not at module load)."""
    import torch

    return torch.load(Path(manifest.path) / STATE_FILE, map_location="cpu", weights_only=False)
