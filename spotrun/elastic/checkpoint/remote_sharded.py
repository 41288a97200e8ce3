"""Sharded checkpoints through torch.distributed.checkpoint (DCP) on object storage (s3://, gs://, azure://).

The same functions as sharded.py (`save`, `save_alone`, `load`), for a checkpoint location that
is a bucket URL; the layout, the manifest and `newest_valid` / `prune` are remote.py's. On a
cloud a bucket is the only place every VM reaches, so this is what lets an FSDP job checkpoint
there at all, and a DDP job write one shard per rank instead of one rank's whole state.

How a save goes (every rank in parallel, nothing is ever read back to hash it):
1. rank 0 decides: the step is there already (published, every object with its size: nothing is
   written), or a new writer dir `shards-<id>` under the step, after aborting the unfinished
   uploads of older steps; one broadcast.
2. each rank writes its shard with DCP's own FileSystemWriter into a local staging dir on its VM
   (sharded.HashingWriter: the bytes are hashed on their way to disk); DCP's coordinator writes
   `.metadata` once every shard is written.
3. each rank uploads its own files to `<step>/shards-<id>/` (providers/storage.py: a parallel
   multipart upload read from the staged file part by part, so no single-PUT size limit and
   memory stays at parts in flight x part size), then removes its staging dir.
4. rank 0 gathers every rank's (name -> bytes, sha256) and uploads the manifest, last
   (remote.publish). A rank whose upload failed sends nothing: rank 0 then publishes nothing
   and raises, and the previous checkpoint stays the newest valid one. A writer killed anywhere
   before the manifest leaves a step without one (an unfinished multipart upload is no object),
   which `newest_valid` skips and the next save's rank 0 cleans up.

Why a local staging dir rather than a DCP StorageWriter streaming into the bucket: the write is
DCP's unchanged FileSystemWriter (the same as a directory's, with its fsync and its `.metadata`
rename), and the upload is the one multipart path that already retries a failed part and aborts
a failed upload; the cost is one shard's size of local disk per rank for the duration of a save
(VMs have it; $TMPDIR says where), and a local write that is fast next to the upload.

Loading (any world size, resharded by DCP): a FileSystemReader over a local dir that downloads
each file the first time DCP asks for it (`.metadata`, then only the shards holding what this
rank loads), checked against the manifest's size and sha256. Rank 0's `newest_valid` has
downloaded and verified the whole checkpoint already, and its load reads that copy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from spotrun.elastic.checkpoint import remote, sharded
from spotrun.elastic.checkpoint.files import Manifest, ShardedManifest
from spotrun.errors import ProviderError

_WRITER_DIR = "shards-"


def save(
    url: str | os.PathLike[str],
    step: int,
    world_size: int,
    state: dict[str, Any],
    samples_seen: int,
    group: dist.ProcessGroup,
) -> Manifest | None:
    """Write `state` (every rank's own, e.g. staged) as checkpoint `step` under `url`: collective
    on `group`, call on every rank of it. Blocks until rank 0 published it; returns the manifest
    on rank 0, None on the others. Idempotent: a published step is kept (nothing is written).
    Raises ProviderError when a rank cannot upload (on that rank, and on rank 0, which then
    publishes nothing), and what DCP or a collective raises (a peer gone)."""
    rank = dist.get_rank(group)
    root = dist.get_global_rank(group, 0)
    decision: list[str | None] = [None]
    error: ProviderError | None = None
    if rank == 0:
        try:
            decision[0] = _begin(url, step)
        except ProviderError as exc:
            error = exc  # the others learn "nothing to write" from the broadcast; rank 0 raises
    dist.broadcast_object_list(decision, src=root, group=group)
    if error is not None:
        raise error
    if decision[0] is None:
        return None
    mine: dict[str, tuple[int, str]] | None = None
    try:
        mine = _write_and_upload(url, step, decision[0], state, group)
    except ProviderError as exc:
        error = exc  # told to rank 0 (as None) before raising, so no rank waits for it in vain
    gathered: list[dict[str, tuple[int, str]] | None] | None = (
        [None] * dist.get_world_size(group) if rank == 0 else None
    )
    dist.gather_object(mine, gathered, dst=root, group=group)
    if error is not None:
        raise error
    if gathered is None:
        return None
    failed = [r for r, part in enumerate(gathered) if part is None]
    if failed:
        raise ProviderError(
            f"checkpoint step {step} in {url} is not published: rank(s) {failed} could not upload their shards",
            hint="see those ranks' errors; the previous checkpoint stays the newest valid one",
        )
    listing = {name: entry for part in gathered if part for name, entry in part.items()}
    return remote.publish(url, step, world_size, listing, samples_seen)


def save_alone(
    url: str | os.PathLike[str], step: int, world_size: int, state: dict[str, Any], samples_seen: int
) -> Manifest:
    """Write a complete `state` (a replica: DDP or a single process) as checkpoint `step` under
    `url` from this process alone, with no collective: the emergency save of a survivor whose
    peers died. Idempotent: a published step is kept. Raises ProviderError."""
    if (existing := remote.published(url, step)) is not None:
        return existing
    remote.abort_stale_uploads(url, step)
    listing = _write_and_upload(url, step, _new_writer_dir(), state, None)
    return remote.publish(url, step, world_size, listing, samples_seen)


def load(manifest: Manifest, state: dict[str, Any]) -> None:
    """Load the sharded checkpoint `manifest` (from remote.newest_valid) into `state` in place,
    resharded to whatever this rank holds. Collective on the default group when one is
    initialized: call on every rank with the same manifest. Downloads only the files this rank
    needs into a local temp dir (removed after). Raises ValueError for a checkpoint that is not
    sharded (a state.pt one: remote.load_state reads it), ProviderError when a file no longer
    matches the manifest."""
    if not isinstance(manifest, ShardedManifest):
        raise ValueError(f"checkpoint {manifest.path} is not a sharded (DCP) checkpoint")
    writer_dirs = {name.partition("/")[0] for name in manifest.files}
    if len(writer_dirs) != 1 or any(name.count("/") != 1 for name in manifest.files):
        raise ValueError(f"checkpoint {manifest.path} lists no single dir of shards: {sorted(manifest.files)}")
    local = remote.take_verified(manifest) or Path(tempfile.mkdtemp(prefix="spotrun-dcp-"))
    try:
        reader = _FetchingReader(manifest, local, writer_dirs.pop())
        dcp.load(state, storage_reader=reader, no_dist=not dist.is_initialized())
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _new_writer_dir() -> str:
    return f"{_WRITER_DIR}{uuid.uuid4().hex[:12]}"


def _begin(url: str | os.PathLike[str], step: int) -> str | None:
    """Rank 0's decision: None when step `step` is published already, else a new writer dir for
    it (after aborting the unfinished uploads of older steps). Raises ProviderError."""
    if remote.published(url, step) is not None:
        return None
    remote.abort_stale_uploads(url, step)
    return _new_writer_dir()


def _write_and_upload(
    url: str | os.PathLike[str], step: int, writer_dir: str, state: dict[str, Any], group: dist.ProcessGroup | None
) -> dict[str, tuple[int, str]]:
    """This rank's part of a save (`group` None: alone, no collective): DCP into a local staging
    dir, then each file written uploaded as `writer_dir`/name; returns name -> (bytes, sha256)."""
    staging = Path(tempfile.mkdtemp(prefix="spotrun-dcp-"))
    try:
        writer = sharded.HashingWriter(staging)
        dcp.save(state, storage_writer=writer, process_group=group, no_dist=group is None)
        listing = {}
        for name, entry in writer.fs.written.items():
            remote.put(url, step, f"{writer_dir}/{name}", staging / name)
            listing[f"{writer_dir}/{name}"] = entry
        return listing
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class _FetchingReader(dcp.FileSystemReader):
    """DCP's FileSystemReader over `local`/`writer_dir`, which downloads each file of `manifest`
    the first time DCP reads it (a file already there was verified when it was downloaded)."""

    def __init__(self, manifest: ShardedManifest, local: Path, writer_dir: str) -> None:
        super().__init__(local / writer_dir)
        self._manifest, self._local, self._writer_dir = manifest, local, writer_dir

    def _fetch(self, relative: str) -> None:
        name = f"{self._writer_dir}/{relative}"
        if name not in self._manifest.files:
            raise ValueError(f"checkpoint {self._manifest.path} does not list {name}")
        if not (self._local / name).exists():
            remote.fetch(self._manifest, name, self._local)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        self._fetch(sharded.METADATA_FILE)
        return super().read_metadata(*args, **kwargs)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        for relative in sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}):
            self._fetch(relative)
        return super().read_data(plan, planner)
