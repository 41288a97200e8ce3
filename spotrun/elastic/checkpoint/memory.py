"""Host-memory snapshots: the state a node's workers leave behind for the next workers on that node.

Torch elastic re-forms a group by ending every worker and starting new ones, so a survivor's state
must outlive its process. A durable checkpoint (fsync, hash, a bucket) costs time that grows with
the model and sits on the recovery's critical path; a snapshot in host memory costs one copy. At an
agreed "checkpoint now" and after a peer died, local rank 0 of each node writes the replica it holds
(DDP: every rank holds the whole state) to the node's memory directory (tmpfs, `$SPOTRUN_MEMORY_DIR`,
private to the node's agent); the next workers on that node load it from there (mapped, not read).
Joiners have no snapshot: they receive the state from a survivor over the process group
(spotrun.elastic.handoff). The durable checkpoint is written afterwards, in the background.

Layout: `<dir>/step-000000120.pt` (a torch.save of the state, written under a temp name and renamed,
so a reader sees a whole snapshot or none). One snapshot per node: a new one replaces the older.
Not a durable checkpoint: gone with the VM, and no hash (it never leaves the machine that wrote it).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spotrun.node import protocol

_PREFIX, _SUFFIX = "step-", ".pt"
WAIT_POLL_S = 0.02


@dataclass(frozen=True)
class Snapshot:
    step: int
    path: Path


def directory() -> Path | None:
    """This node's memory directory from the environment the agent sets, or None (no snapshots: a
    script run outside spotrun's agent, or a recipe that sets SPOTRUN_LIVE_RECOVERY=0, say for a
    state larger than the VM's tmpfs)."""
    value = os.environ.get(protocol.MEMORY_DIR_ENV)
    if not value or os.environ.get(protocol.LIVE_RECOVERY_ENV, "1") == "0":
        return None
    return Path(value)


def newest(folder: Path | None) -> Snapshot | None:
    """The newest whole snapshot in `folder`, or None."""
    if folder is None or not folder.is_dir():
        return None
    found = []
    for entry in folder.iterdir():
        middle = entry.name[len(_PREFIX) : -len(_SUFFIX)]
        if entry.name.startswith(_PREFIX) and entry.name.endswith(_SUFFIX) and middle.isdigit():
            found.append(Snapshot(int(middle), entry))
    return max(found, key=lambda s: s.step, default=None)


def save(folder: Path, step: int, state: dict[str, Any]) -> Snapshot:
    """Write `state` (tensors on any device: torch.save copies them to host) as the node's snapshot of
    `step`, then delete older snapshots. Blocking; the directory is created private to the user."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    final = folder / f"{_PREFIX}{step:09d}{_SUFFIX}"
    tmp = folder / f".tmp-{os.getpid()}-{final.name}"
    torch.save(state, tmp)
    os.replace(tmp, final)
    for entry in folder.iterdir():
        if entry != final and (entry.name.startswith(_PREFIX) or entry.name.startswith(f".tmp-{os.getpid()}-")):
            entry.unlink(missing_ok=True)
    return Snapshot(step, final)


def load(snapshot: Snapshot) -> dict[str, Any]:
    """The state of `snapshot`, its tensors mapped from host memory (copied only when loaded into a
    model or moved to a device). weights_only: a snapshot holds tensors and plain values only."""
    state: dict[str, Any] = torch.load(snapshot.path, map_location="cpu", mmap=True, weights_only=True)
    return state


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
