"""The protocol between the node agent and its training workers: files, environment variables, exit codes.

The agent (spotrun.node.supervisor, no torch) runs `python -m spotrun.elastic.launcher`, whose
workers are forked from it and run the training script with spotrun.elastic.trainer. A forked
worker must not use gRPC (it hangs in a forked child), and a file costs one stat() per step, so
the two sides talk through small files in the agent's state directory (`NodeFiles`), whose paths
reach the workers in environment variables:

- control file ($SPOTRUN_CONTROL_FILE): the agent writes a `ControlRequest`; a higher `seq` asks for
  an agreed checkpoint at the next step boundary, after which every worker exits `ExitCode.REFORM`.
- served file (`served_path(control file)`): the newest seq acted upon; the trainer writes it before
  its workers exit, so workers started after a request (a node joining during a re-formation)
  still honour it, once. The agent writes it too, to withdraw a join request that became moot.
- progress file ($SPOTRUN_PROGRESS_FILE): local rank 0's trainer writes a `ProgressReport`; the
  agent publishes it to etcd.
- peer-lost file ($SPOTRUN_PEER_LOST_FILE): a worker whose peer died touches it
  (`mark_peer_lost`); the launcher's rendezvous handler reports the loss as it re-joins.
- standby file (the launcher's `--standby-file`): a warm spare waits outside the job while it exists.
- memory directory ($SPOTRUN_MEMORY_DIR, `NodeFiles.memory(node)`): host memory (tmpfs) where local rank 0
  leaves the node's state for the next workers (spotrun.elastic.checkpoint.memory); the agent
  removes it when the node stops training.

Every write replaces its file in one rename, so a reader never sees half of one. Stdlib only: the
agent and every forked training worker import this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# Set by the agent for the launcher and its workers.
CONTROL_FILE_ENV = "SPOTRUN_CONTROL_FILE"
PROGRESS_FILE_ENV = "SPOTRUN_PROGRESS_FILE"
PEER_LOST_FILE_ENV = "SPOTRUN_PEER_LOST_FILE"
CHECKPOINT_DIR_ENV = "SPOTRUN_CHECKPOINT_DIR"  # a directory or an object-store URL (s3://...)
CHECKPOINT_EVERY_STEPS_ENV = "SPOTRUN_CHECKPOINT_EVERY_STEPS"
CHECKPOINT_EVERY_SECONDS_ENV = "SPOTRUN_CHECKPOINT_EVERY_SECONDS"
CHECKPOINT_KEEP_ENV = "SPOTRUN_CHECKPOINT_KEEP"
CLUSTER_ENV = "SPOTRUN_CLUSTER"  # set by the agent and again by the launcher
NODE_ID_ENV = "SPOTRUN_NODE_ID"  # this node's id, as the agent (and a local VM's environment) sets it
# Set by the launcher for its workers.
NODE_ENV = "SPOTRUN_NODE"  # the same node id, under the name the launcher documents
MEMORY_DIR_ENV = "SPOTRUN_MEMORY_DIR"  # host memory (tmpfs) where a node's workers leave their state
LIVE_RECOVERY_ENV = "SPOTRUN_LIVE_RECOVERY"  # "0" in a recipe's env: recover through storage only
COLLECTIVE_TIMEOUT_ENV = "SPOTRUN_COLLECTIVE_TIMEOUT_S"  # the trainer's init_process_group timeout


class ExitCode(enum.IntEnum):
    """Exit codes that cross the protocol (a usage error of the launcher exits 2, argparse's code)."""

    OK = 0  # launcher: the job finished, or this node left as asked; the agent stops supervising it
    FAILED = 1  # launcher: workers failed for good or the rendezvous failed; the agent restarts it
    REFORM = 75  # worker: an agreed checkpoint was saved, or a peer died: re-form the group, not a failure


@dataclass(frozen=True)
class NodeFiles:
    """Where one node's protocol files live: all in the agent's state directory."""

    state_dir: Path

    @property
    def control(self) -> Path:
        return self.state_dir / "control.json"

    @property
    def progress(self) -> Path:
        return self.state_dir / "progress.json"

    @property
    def peer_lost(self) -> Path:
        return self.state_dir / "peer_lost"

    @property
    def standby(self) -> Path:
        return self.state_dir / "standby"

    def memory(self, node: str) -> Path:
        """Node `node`'s host-memory directory: on the VM's tmpfs (/dev/shm) where it has one, so a
        snapshot costs one copy, not a disk write. Named by node id, so two nodes never share one
        even where they share a /dev/shm (a local VM has its own; a plain host running two agents)."""
        shm = Path("/dev/shm")
        return (shm / f"spotrun-{os.getuid()}" if shm.is_dir() else self.state_dir / "memory") / node


def served_path(control_file: Path) -> Path:
    """Where the seq of the newest "checkpoint now" request acted upon is kept, beside the control file."""
    return control_file.with_name(control_file.name + ".served")


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` in one rename; the temp name is per process, so two writers never share it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_served(path: Path) -> int:
    """The seq last acted upon; 0 when none was (no file yet, or an unreadable one)."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


# -- control: the agent asks for "checkpoint now" ----------------------------------------------
class ControlCommand(str, enum.Enum):
    """Why the agent asks for a checkpoint now; the trainer does the same for each."""

    JOIN = "join"  # `node` waits to join: re-form the group with it
    LEAVE = "leave"  # `node` (this one) leaves: save its work first


@dataclass(frozen=True)
class ControlRequest:
    """The control file's content: the agent's newest request."""

    seq: int  # grows with each request; the trainer acts on one above the served seq
    command: ControlCommand
    node: str  # the node joining or leaving
    at: float  # when the agent asked, epoch seconds

    def to_json(self) -> str:
        return json.dumps({"seq": self.seq, "command": self.command.value, "node": self.node, "at": self.at})

    @classmethod
    def from_json(cls, text: str) -> ControlRequest:
        """Parse `to_json`'s output. Raises ValueError if `text` is no control request."""
        data = json.loads(text)
        try:
            return cls(int(data["seq"]), ControlCommand(data["command"]), str(data["node"]), float(data["at"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a control request: {text[:200]!r}") from exc


def _read_request(path: Path) -> ControlRequest | None:
    """The newest request; None when there is none (no file yet, or an unreadable one)."""
    try:
        return ControlRequest.from_json(path.read_text())
    except (OSError, ValueError):
        return None


class ControlWriter:
    """The agent's side of the control file. Thread-safe; the seq only grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._served = served_path(path)
        self._lock = threading.Lock()

    def request(self, command: ControlCommand, node: str) -> int:
        """Ask for an agreed checkpoint at the next step boundary; returns the request's seq."""
        with self._lock:
            previous = _read_request(self.path)
            # Above the served seq too, so a lost or unreadable control file cannot hide a request.
            seq = max(previous.seq if previous else 0, _read_served(self._served)) + 1
            _replace(self.path, ControlRequest(seq, command, node, time.time()).to_json())
            return seq

    def withdraw(self, command: ControlCommand, node: str) -> bool:
        """Mark the newest request served if it is the only one pending and was made for (`command`,
        `node`) (a join whose node got into a re-formation anyway): workers starting now then skip
        a checkpoint-and-restart that would admit nobody. True if withdrawn."""
        with self._lock:
            newest, done = _read_request(self.path), _read_served(self._served)
            if newest is None or (newest.command, newest.node) != (command, node) or newest.seq != done + 1:
                return False
            _replace(self._served, str(newest.seq))
            return True


class ControlReader:
    """The trainer's side of the control file: is a request pending that no worker has served yet?

    The served seq is read once, when the workers start: a request made before they started and
    not yet served is still pending for them.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime = 0.0
        self._served = served_path(path) if path else None
        self._baseline = _read_served(self._served) if self._served else 0

    def requested(self) -> bool:
        """True if a request newer than the baseline is pending. One stat() while the file is unchanged."""
        if self.path is None:
            return False
        try:
            if self.path.stat().st_mtime == self._mtime:
                return False  # the common case: one stat() per step, no read
        except OSError:
            return False
        return self._seq() > self._baseline

    def served(self) -> None:
        """Record that the newest request was acted upon (called before the workers exit)."""
        if self._served is not None:
            _replace(self._served, str(self._seq()))

    def _seq(self) -> int:
        try:
            self._mtime = self.path.stat().st_mtime if self.path else 0.0
        except OSError:
            return 0
        request = _read_request(self.path) if self.path else None
        return request.seq if request else 0


# -- progress: the trainer reports steps and checkpoints ----------------------------------------
@dataclass(frozen=True)
class CheckpointReport:
    """The newest checkpoint the trainer wrote (the agent publishes it as a CheckpointRecord)."""

    step: int
    path: str
    bytes: int
    sha256: str
    written_at: float
    seconds: float = 0.0  # how long writing it took


@dataclass(frozen=True)
class ProgressReport:
    """The progress file's content: local rank 0's newest step and checkpoint."""

    step: int | None = None  # None until this process completed a step
    world_size: int = 0
    samples_per_s: float = 0.0
    loss: float | None = None
    heartbeat_at: float = 0.0  # epoch seconds of the step
    checkpoint: CheckpointReport | None = None  # None until this process wrote one
    live_recovery: bool = False  # the state survives a re-formation in host memory (a leave saves nothing)
    step_s: float = 0.0  # the recent seconds per step (0: not measured yet)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProgressReport:
        """Parse `to_json`'s output. Raises ValueError if `text` is no progress report."""
        data = json.loads(text)
        try:
            checkpoint = data.pop("checkpoint", None)
            return cls(**data, checkpoint=CheckpointReport(**checkpoint) if checkpoint else None)
        except (AttributeError, TypeError) as exc:
            raise ValueError(f"not a progress report: {text[:200]!r}") from exc


def write_progress(path: Path, report: ProgressReport) -> None:
    """Replace the progress file with `report` (atomic). Raises OSError if it cannot be written."""
    _replace(path, report.to_json())


def read_progress(path: Path) -> ProgressReport | None:
    """The newest report; None when there is none yet (no file, or an unreadable one)."""
    try:
        return ProgressReport.from_json(path.read_text())
    except (OSError, ValueError):
        return None


# -- peer lost: a worker tells the launcher ------------------------------------------------------
def mark_peer_lost() -> None:
    """Tell the launcher that a peer died (touch $SPOTRUN_PEER_LOST_FILE), so its rendezvous handler
    reports the loss as it re-joins. Best effort: without the variable, or on an error, nothing."""
    path = os.environ.get(PEER_LOST_FILE_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path).touch()
