"""Host-memory snapshots: the state a node's workers leave behind for the next workers on that node.

Torch elastic re-forms a group by ending every worker and starting new ones, so a survivor's state
must outlive its process. A durable checkpoint (fsync, hash, a bucket) costs time that grows with
the model and sits on the recovery's critical path; a snapshot in host memory costs one copy. At an
agreed "checkpoint now" and after a peer died, local rank 0 of each node copies the replica it holds
(DDP: every rank holds the whole state) into the node's memory directory (tmpfs, `$SPOTRUN_MEMORY_DIR`,
private to the node's agent); the next workers on that node map it from there. Joiners have no
snapshot: they receive the state from a survivor over the process group (spotrun.elastic.handoff).
The durable checkpoint is written afterwards, in the background.

Layout of a memory directory:
- `arena`: the tensors' bytes back to back (64-byte aligned), reused from snapshot to snapshot, so
  a snapshot is a memcpy into pages that already exist (no allocation, no page faults, no pickling:
  682 MB in about 0.05 s here, against 0.5 s for a torch.save into tmpfs). `reserve` grows and
  touches it ahead of time, off the critical path.
- `step-000000120.pt`: the header (a torch.save of the state with every tensor replaced by its meta
  twin, and each tensor's offset). It is removed before the arena is overwritten and written (temp
  name, rename) after the copy, so a snapshot exists exactly while its bytes are whole.
Not a durable checkpoint: gone with the VM, and not hashed (it never leaves the machine that wrote it).
"""

from __future__ import annotations

import math
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spotrun.elastic import tensortree
from spotrun.node import protocol

_PREFIX, _SUFFIX = "step-", ".pt"
ARENA_FILE = "arena"
ALIGN = 64
WAIT_POLL_S = 0.02
_TOUCH_BYTES = 64 << 20  # reserve() touches the arena in slices this big


@dataclass(frozen=True)
class Snapshot:
    step: int
    path: Path  # the header


def directory() -> Path | None:
    """This node's memory directory from the environment the agent sets, or None (no snapshots: a
    script run outside spotrun's agent, or a recipe that sets SPOTRUN_LIVE_RECOVERY=0, say for a
    state larger than the VM's tmpfs)."""
    value = os.environ.get(protocol.MEMORY_DIR_ENV)
    if not value or os.environ.get(protocol.LIVE_RECOVERY_ENV, "1") == "0":
        return None
    return Path(value)


def newest(folder: Path | None) -> Snapshot | None:
    """The node's whole snapshot in `folder`, or None."""
    if folder is None or not folder.is_dir():
        return None
    found = []
    for entry in folder.iterdir():
        middle = entry.name[len(_PREFIX) : -len(_SUFFIX)]
        if entry.name.startswith(_PREFIX) and entry.name.endswith(_SUFFIX) and middle.isdigit():
            found.append(Snapshot(int(middle), entry))
    return max(found, key=lambda s: s.step, default=None)


def layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Each tensor's byte offset in the arena, and the arena's size."""
    offsets, end = [], 0
    for tensor in tensors:
        offsets.append(end)
        end += math.ceil(tensor.numel() * tensor.element_size() / ALIGN) * ALIGN
    return offsets, end


def _prepare(folder: Path) -> None:
    """Create `folder` and its parent private to this user. /dev/shm is world-writable: a parent
    someone else made first (or a symlink) would expose the state, so it is refused (OSError)."""
    for path in (folder.parent, folder):
        path.mkdir(exist_ok=True, mode=0o700, parents=path is folder.parent)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise OSError(f"{path} is not a directory of this user: no host snapshot there")
        if info.st_mode & 0o077:
            os.chmod(path, 0o700)


_mapped: dict[Path, tuple[int, torch.Tensor]] = {}  # this process's mapping of each arena, by inode


def _arena(folder: Path, size: int) -> torch.Tensor:
    """The arena of at least `size` bytes, mapped shared (writes land in the file). One mapping per
    process, kept: a page mapped once is not faulted in again by the next snapshot (at 682 MB the
    faults alone cost about 0.25 s)."""
    path = folder / ARENA_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        inode = os.fstat(fd).st_ino
        known = _mapped.get(path)
        if known is not None and known[0] == inode and known[1].numel() >= size:
            return known[1]  # the same file (not one the agent removed and a writer made again)
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        size = max(size, os.fstat(fd).st_size, 1)
    finally:
        os.close(fd)
    arena = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
    _mapped[path] = (inode, arena)
    return arena


def room(folder: Path, size: int) -> bool:
    """Whether the memory directory is ours and its file system can hold an arena of `size` bytes (a
    full tmpfs would kill the writer with SIGBUS mid-copy, and a container's /dev/shm is often 64 MB)."""
    try:
        _prepare(folder)
    except OSError:
        return False
    arena = folder / ARENA_FILE
    have = arena.stat().st_size if arena.exists() else 0
    stats = os.statvfs(folder)
    return size - have <= stats.f_bavail * stats.f_frsize


def reserve(folder: Path, size: int) -> None:
    """Grow the arena to `size` bytes and touch every page, so the first snapshot is a plain copy.
    For a background thread (torch's copies run without the GIL); leaves any snapshot whole."""
    _prepare(folder)
    arena = _arena(folder, size)
    snapshot = newest(folder)
    keep = _read_header(snapshot)["bytes"] if snapshot is not None else 0
    for start in range(keep, size, _TOUCH_BYTES):  # pages past the snapshot's bytes: free to zero
        arena[start : min(size, start + _TOUCH_BYTES)].zero_()


def save(folder: Path, step: int, state: dict[str, Any]) -> Snapshot:
    """Copy `state` (tensors on any device) into the node's arena as the snapshot of `step`, replacing
    the previous one. Blocking; a crash half-way leaves no snapshot, never a torn one."""
    _prepare(folder)
    skeleton, tensors = tensortree.split(state)
    offsets, size = layout(tensors)
    for old in folder.glob(f"{_PREFIX}*{_SUFFIX}"):
        old.unlink(missing_ok=True)  # before the bytes change: a reader never maps a torn snapshot
    arena = _arena(folder, size)
    for tensor, offset in zip(tensors, offsets, strict=True):
        nbytes = tensor.numel() * tensor.element_size()
        arena[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
    header = folder / f"{_PREFIX}{step:09d}{_SUFFIX}"
    tmp = folder / f".tmp-{os.getpid()}-{header.name}"
    torch.save({"skeleton": skeleton, "offsets": offsets, "bytes": size, "step": step}, tmp)
    os.replace(tmp, header)
    return Snapshot(step, header)


def _read_header(snapshot: Snapshot) -> dict[str, Any]:
    header: dict[str, Any] = torch.load(snapshot.path, weights_only=True)
    return header


def load(snapshot: Snapshot) -> dict[str, Any]:
    """The state of `snapshot`, its tensors views of the arena: copy them out (into a model, to a
    device, a clone) before the next `save` reuses the arena. Raises OSError if the snapshot went
    meanwhile."""
    header = _read_header(snapshot)
    arena = _arena(snapshot.path.parent, header["bytes"])  # read only: loading copies out of it
    views = []
    for meta, offset in zip(tensortree.placeholders(header["skeleton"]), header["offsets"], strict=True):
        nbytes = meta.numel() * meta.element_size()
        views.append(arena[offset : offset + nbytes].view(meta.dtype).view(meta.shape))
    state: dict[str, Any] = tensortree.join(header["skeleton"], iter(views))
    return state


def snapshot_bytes(state: dict[str, Any]) -> int:
    """The arena size a snapshot of `state` needs."""
    return layout(tensortree.split(state)[1])[1]


def wait_for(folder: Path, step: int, timeout: float) -> bool:
    """Block until `folder` holds a snapshot of `step` or later (local rank 0 is writing it), at most
    `timeout` s; True when it does. Lets the node's other workers exit only once it is whole: the
    launcher stops the rest of a node's workers as soon as one of them exits."""
    deadline = time.monotonic() + timeout
    while True:
        found = newest(folder)
        if found is not None and found.step >= step:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(WAIT_POLL_S)


class Reserver:
    """Reserves the arena once, on a background thread; `wait()` before writing a snapshot."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, folder: Path, size: int) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=reserve, args=(folder, size), name="arena-reserve", daemon=True)
            self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
