"""Atomic, checksummed checkpoints in a directory every node can reach.

Layout: `<dir>/step-000000120/{state.pt, manifest.json}`. A checkpoint is written into a hidden
temp directory and renamed into place, so a reader sees a whole checkpoint or none. The manifest
holds step, world size, bytes and sha256 of state.pt; a checkpoint whose manifest is missing or
whose file does not match it is skipped (with a warning) in favour of the previous one.
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
from dataclasses import asdict, dataclass
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


def _name(step: int) -> str:
    return f"{_PREFIX}{step:09d}"


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
    tmp = directory / f".tmp-{_name(step)}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        state = tmp / STATE_FILE
        save(state)
        with state.open("rb") as handle:
            os.fsync(handle.fileno())
        manifest = Manifest(
            step, world_size, state.stat().st_size, sha256(state), time.time(), str(final), samples_seen
        )
        (tmp / MANIFEST_FILE).write_text(json.dumps(asdict(manifest), indent=2))
        _fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another survivor renamed the same step first: theirs is as good as ours.
            if verify(final) is None:
                raise
        _fsync_dir(directory)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify(path: Path) -> Manifest | None:
    """The manifest of a whole, uncorrupted checkpoint dir, else None. Reads and hashes the file."""
    try:
        data = json.loads((path / MANIFEST_FILE).read_text())
        manifest = Manifest(**{**data, "path": str(path)})
        state = path / STATE_FILE
        if state.stat().st_size != manifest.bytes or sha256(state) != manifest.sha256:
            return None
        return manifest
    except (OSError, ValueError, TypeError):
        return None


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
    """Delete all but the newest `keep` valid-looking checkpoints; returns the steps removed."""
    removed = []
    for step in steps(directory)[keep:]:
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
