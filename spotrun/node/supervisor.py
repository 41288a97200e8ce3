"""The node agent's training side: run the elastic launcher, ask for checkpoints, publish progress.

The agent talks to its workers only through two small files (workers must not share the
agent's gRPC connection, and a file costs one stat() per step):
- the control file: `{"seq": n, "reason": ...}`; a higher seq asks for an agreed checkpoint
  at the next step boundary, after which every worker exits with EXIT_REFORM;
- the progress file: the trainer's latest step, throughput, loss and newest checkpoint.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from spotrun import log
from spotrun.elastic import PEER_LOST_FILE_ENV, served_path
from spotrun.state.records import CheckpointRecord, Progress

_log = log.get("supervisor")

RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True)
class TrainSpec:
    """What the launcher needs, taken from the recipe in etcd."""

    run: str
    nnodes: str  # "MIN:MAX"
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    checkpoint_dir: Path | str | None = None  # a shared directory, or an object-store URL
    every_steps: int | None = None
    every_seconds: float | None = None
    keep: int = 3
    local_addr: str | None = None  # how the other nodes reach this one (rank 0 hosts the store)
    expected_nodes: int | None = None  # the cluster's target: the first rendezvous round waits for it


class ControlFile:
    """Writes "checkpoint now" requests for the trainer; seq only grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def request(self, reason: str) -> int:
        with self._lock:
            try:
                seq = int(json.loads(self.path.read_text()).get("seq", 0)) + 1
            except (OSError, ValueError):
                seq = 1
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"seq": seq, "reason": reason, "at": time.time()}))
            os.replace(tmp, self.path)
            return seq

    def withdraw(self, reason: str) -> bool:
        """Mark the newest request served if it is the only one pending and was made for `reason`
        (a join whose node got into a re-formation anyway): workers starting now then skip a
        checkpoint-and-restart that would admit nobody. True if withdrawn."""
        served = served_path(self.path)  # the trainer's record
        with self._lock:
            try:
                newest = json.loads(self.path.read_text())
                done = int(served.read_text()) if served.exists() else 0
            except (OSError, ValueError):
                return False
            if newest.get("reason") != reason or int(newest.get("seq", 0)) != done + 1:
                return False
            tmp = served.with_name(f".{served.name}.agent")
            tmp.write_text(str(done + 1))
            os.replace(tmp, served)
            return True


class Launcher:
    """Supervises `python -m spotrun.elastic.launcher`: restarts it while the node should train."""

    def __init__(
        self,
        cluster: str,
        node: str,
        endpoints: list[str],
        spec: TrainSpec,
        state_dir: Path,
        on_exit,
        *,
        standby: bool = False,
    ) -> None:
        self.cluster, self.node, self.endpoints, self.spec = cluster, node, endpoints, spec
        self.state_dir = state_dir
        # A warm spare's launcher waits outside the job while this file exists (see activate()).
        self.standby_file = state_dir / "standby"
        if standby:
            self.standby_file.touch()
        else:
            self.standby_file.unlink(missing_ok=True)
        self.control = ControlFile(state_dir / "control.json")
        self.progress_path = state_dir / "progress.json"
        self.log_path = state_dir / "train.log"
        self._on_exit = on_exit
        self._proc: subprocess.Popen[bytes] | None = None
        self._leaving = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="launcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def parked(self) -> bool:
        return self.standby_file.exists()

    def activate(self) -> bool:
        """A warm spare joins the training job now; False if it was not parked."""
        try:
            self.standby_file.unlink()
        except FileNotFoundError:
            return False
        return True

    def leave(self) -> None:
        """Leave gracefully: the launcher removes this node at the next rendezvous and exits 0."""
        self._leaving.set()
        self._signal(signal.SIGUSR1)

    def stop(self, timeout: float = 10.0) -> None:
        """Leave now (SIGTERM to the launcher) and stop supervising."""
        self._stopped.set()
        self._signal(signal.SIGTERM)
        self._thread.join(timeout)

    @property
    def leaving(self) -> bool:
        return self._leaving.is_set()

    def _signal(self, sig: int) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def _argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "spotrun.elastic.launcher",
            "--cluster",
            self.cluster,
            "--node",
            self.node,
            "--nnodes",
            self.spec.nnodes,
            "--run-id",
            self.cluster,
            "--standby-file",
            str(self.standby_file),
        ]
        for endpoint in self.endpoints:
            argv += ["--etcd", endpoint]
        if self.spec.local_addr:
            argv += ["--local-addr", self.spec.local_addr]
        if self.spec.expected_nodes:
            argv += ["--rdzv-conf", f"expected_nodes={self.spec.expected_nodes}"]
        return argv + ["--", *shlex.split(self.spec.run)]

    def _env(self) -> dict[str, str]:
        # PYTHONSAFEPATH: `-m` must not import a `spotrun` directory from the workdir.
        env = {
            **os.environ,
            **self.spec.env,
            "PYTHONSAFEPATH": "1",
            "SPOTRUN_CONTROL_FILE": str(self.control.path),
            "SPOTRUN_PROGRESS_FILE": str(self.progress_path),
            "SPOTRUN_CLUSTER": self.cluster,
            PEER_LOST_FILE_ENV: str(self.state_dir / "peer_lost"),
            "SPOTRUN_NODE_ID": self.node,
            "SPOTRUN_CHECKPOINT_KEEP": str(self.spec.keep),
        }
        optional = {
            "SPOTRUN_CHECKPOINT_DIR": self.spec.checkpoint_dir,
            "SPOTRUN_CHECKPOINT_EVERY_STEPS": self.spec.every_steps,
            "SPOTRUN_CHECKPOINT_EVERY_SECONDS": self.spec.every_seconds,
        }
        env.update({k: str(v) for k, v in optional.items() if v is not None})
        return env

    def _loop(self) -> None:
        attempt = 0
        while not self._stopped.is_set():
            started = time.monotonic()
            with open(self.log_path, "ab") as out:
                self._proc = subprocess.Popen(
                    self._argv(),
                    cwd=self.spec.workdir,
                    env=self._env(),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            if self._leaving.is_set():  # asked to leave while it was starting
                self._signal(signal.SIGUSR1)
            code = self._proc.wait()
            finished = self._on_exit(code, self._leaving.is_set() or self._stopped.is_set())
            if finished or self._leaving.is_set() or self._stopped.is_set():
                return
            attempt = 0 if time.monotonic() - started > 60 else attempt + 1
            delay = RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)]
            _log.warning("launcher exited; restarting", extra=log.kv(code=code, in_s=delay))
            if self._stopped.wait(delay):
                return


class ProgressPublisher:
    """Copies the trainer's progress file into etcd (progress, and checkpoints as they appear)."""

    def __init__(self, store, cluster: str, node: str, path: Path) -> None:
        self.store, self.cluster, self.node, self.path = store, cluster, node, path
        self._last_step: int | None = None
        self._last_checkpoint: int | None = None

    def publish_once(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if data.get("step") is not None and data["step"] != self._last_step:
            self.store.put_progress(
                self.cluster,
                Progress(
                    node=self.node,
                    step=int(data["step"]),
                    samples_per_s=float(data.get("samples_per_s") or 0.0),
                    world_size=int(data.get("world_size") or 0),
                    heartbeat_at=float(data.get("heartbeat_at") or time.time()),
                    loss=data.get("loss"),
                ),
            )
            self._last_step = data["step"]
        checkpoint = data.get("checkpoint")
        if checkpoint and checkpoint.get("step") != self._last_checkpoint:
            self.store.put_checkpoint(
                self.cluster,
                CheckpointRecord(
                    step=int(checkpoint["step"]),
                    path=checkpoint["path"],
                    bytes=int(checkpoint["bytes"]),
                    sha256=checkpoint["sha256"],
                    written_at=float(checkpoint["written_at"]),
                    seconds=float(checkpoint.get("seconds") or 0.0),
                ),
            )
            self._last_checkpoint = checkpoint["step"]
