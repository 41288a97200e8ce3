"""Sharded checkpoints through torch.distributed.checkpoint (DCP), in a directory every node reaches.

Every rank writes its own shard (`__<rank>_0.distcp`) in parallel into one hidden temp directory;
DCP's coordinator (rank 0) writes `.metadata` once all shards are written. Each rank hashes the
bytes of its files as it writes them (nothing is read back); rank 0 gathers the hashes and
publishes the directory atomically with a manifest (files.publish), so the guarantees are
files.py's: a reader sees a whole checkpoint or none, the manifest proves it whole,
`files.newest_valid` falls back past a corrupt one, `files.prune` keeps K valid ones. A
checkpoint loads at any world size: DCP reshards each tensor (a DDP replica or an FSDP2 shard) to
what the loading ranks hold.

Saving is split so the training loop only pays for a host copy: `stage` copies the state dict to
host memory (on the calling thread, no second copy on the device), then `save` writes the staged
copy (on a background thread, collectives on a checkpoint-only process group so they never mix
with the training loop's). `save_alone` is the emergency save of one survivor, with no collective.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from spotrun.elastic.checkpoint import files
from spotrun.elastic.checkpoint.files import ShardedManifest

METADATA_FILE = ".metadata"


def stager() -> DefaultStager:
    """The stager of one training process, for every `stage`: it keeps its host buffers, so each save
    copies into the same memory (one host copy of the state, not a new one per save). Pinned memory
    when CUDA is there (a faster device-to-host copy). Not thread-safe: stage from one thread."""
    return DefaultStager(StagingOptions(torch.cuda.is_available(), False, False, False))


def stage(state: dict[str, Any], into: DefaultStager) -> dict[str, Any]:
    """A host-memory copy of `state` (tensors and DTensor shards), safe to write from another thread
    while training goes on. Blocking. The copy reuses `into`'s buffers: stage again only once the
    previous copy is written."""
    staged = into.stage(state)
    assert isinstance(staged, dict)  # synchronous staging returns the copy itself, not a future
    return staged


def replica_part(state: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """The part of a replicated state (DDP: every rank holds all of it) that `rank` writes: its tensors
    spread over the ranks by size (largest first, each to the least loaded rank), plain values on
    every rank (DCP keeps one copy). Every rank computes the same split, with no collective; a rank
    then stages and writes only its part (1/world of the state, not all of it), and a load at any
    world size reads each tensor wherever it was written."""
    leaves: list[tuple[tuple[str, ...], int]] = []

    def collect(node: dict[str, Any], path: tuple[str, ...]) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                collect(value, (*path, str(key)))
            elif torch.is_tensor(value):
                leaves.append(((*path, str(key)), value.numel() * value.element_size()))

    collect(state, ())
    load = [0] * world_size
    mine: set[tuple[str, ...]] = set()
    for path, size in sorted(leaves, key=lambda leaf: (-leaf[1], leaf[0])):
        owner = load.index(min(load))
        load[owner] += size
        if owner == rank:
            mine.add(path)

    def keep(node: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            here = (*path, str(key))
            if isinstance(value, dict):
                out[key] = keep(value, here)
            elif not torch.is_tensor(value) or here in mine:
                out[key] = value
        return out

    return keep(state, ())


def save(
    directory: Path, step: int, world_size: int, state: dict[str, Any], samples_seen: int, group: dist.ProcessGroup
) -> files.Manifest | None:
    """Write `state` (every rank's own, e.g. staged) as checkpoint `step`: collective on `group`,
    call on every rank of it. Blocks until rank 0 published it; returns the manifest on rank 0, None
    on the others. Idempotent: a step that already verifies is kept (nothing is written). Raises
    what DCP or a collective raises (a peer gone: DistBackendError or RuntimeError)."""
    rank = dist.get_rank(group)
    # Rank 0 decides where everyone writes (or that the step is there already): one broadcast.
    decision: list[str | None] = [None]
    if rank == 0:
        done = files.verify(files.step_path(directory, step)) is not None
        decision[0] = None if done else str(files.temp_dir(directory, step))
    dist.broadcast_object_list(decision, src=dist.get_global_rank(group, 0), group=group)
    if decision[0] is None:
        return None
    writer = HashingWriter(Path(decision[0]))
    dcp.save(state, storage_writer=writer, process_group=group)
    # dcp.save returned on every rank: every shard and .metadata are written and fsynced.
    mine = writer.fs.written
    gathered: list[dict[str, tuple[int, str]] | None] | None = (
        [None] * dist.get_world_size(group) if rank == 0 else None
    )
    dist.gather_object(mine, gathered, dst=dist.get_global_rank(group, 0), group=group)
    if gathered is None:
        return None
    listing = {name: entry for part in gathered if part for name, entry in part.items()}
    return files.publish(writer.directory, step, world_size, listing, samples_seen)


def save_alone(directory: Path, step: int, world_size: int, state: dict[str, Any], samples_seen: int) -> files.Manifest:
    """Write a complete `state` (a replica: DDP or a single process) as checkpoint `step` from this
    process alone, with no collective: the emergency save of a survivor whose peers died.
    Idempotent: when several survivors write the same step, the first published one is kept."""
    final = files.step_path(directory, step)
    if (existing := files.verify(final)) is not None:
        return existing
    writer = HashingWriter(files.temp_dir(directory, step))
    dcp.save(state, storage_writer=writer, no_dist=True)
    return files.publish(writer.directory, step, world_size, writer.fs.written, samples_seen)


def load(manifest: files.Manifest, state: dict[str, Any]) -> None:
    """Load checkpoint `manifest` into `state` in place (each tensor or DTensor shard is filled from
    whatever shards were saved, at whatever world size). Collective on the default group when one
    is initialized: call on every rank with the same manifest. Raises ValueError for a checkpoint
    that is not sharded (state.pt of an earlier version)."""
    if not isinstance(manifest, ShardedManifest):
        raise ValueError(f"checkpoint {manifest.path} is not a sharded (DCP) checkpoint")
    dcp.load(state, checkpoint_id=manifest.path, no_dist=not dist.is_initialized())


class _HashingFile:
    """A file being written whose bytes are hashed on their way to it (DCP only writes and tells)."""

    def __init__(self, raw: Any) -> None:
        self._raw, self.digest, self.size = raw, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        self.digest.update(data)
        self.size += memoryview(data).nbytes
        return int(self._raw.write(data))

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno (fsync), close
        return getattr(self._raw, name)


class _HashingFileSystem(FileSystem):
    """DCP's local file system, recording name -> (bytes, sha256) of every file written through it."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, tuple[int, str]] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        with super().create_stream(path, mode) as raw:
            if "w" not in mode:
                yield raw
                return
            hashing = _HashingFile(raw)
            yield hashing
        self.written[Path(path).name] = (hashing.size, hashing.digest.hexdigest())

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)  # .metadata is written under a temp name first
        if (entry := self.written.pop(Path(path).name, None)) is not None:
            self.written[Path(new_path).name] = entry


class HashingWriter(dcp.FileSystemWriter):
    """FileSystemWriter (one file per rank, fsynced) that hashes what it writes: see _HashingFileSystem."""

    fs: _HashingFileSystem

    def __init__(self, path: Path) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True)
        self.fs = _HashingFileSystem()
        self.directory = path
