"""The node agent's training side: run the elastic launcher, ask for checkpoints, publish progress.

The agent talks to its workers only through small files (the control file to ask for an agreed
checkpoint, the progress file the trainer writes); spotrun.node.protocol defines them.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from spotrun import log
from spotrun.node import protocol
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
    workers: int = 1  # training workers on this node: torchrun's --nproc-per-node
    local_addr: str | None = None  # how the other nodes reach this one (rank 0 hosts the store)
    expected_nodes: int | None = None  # the cluster's target: the first rendezvous round waits for it


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
        self.files = protocol.NodeFiles(state_dir)
        # A snapshot left by an earlier agent may be of another job: never offer it to this one.
        shutil.rmtree(self.files.memory(self.node), ignore_errors=True)
        # A warm spare's launcher waits outside the job while this file exists (see activate()).
        if standby:
            self.files.standby.touch()
        else:
            self.files.standby.unlink(missing_ok=True)
        self.control = protocol.ControlWriter(self.files.control)
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
        return self.files.standby.exists()

    def activate(self) -> bool:
        """A warm spare joins the training job now; False if it was not parked."""
        try:
            self.files.standby.unlink()
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
            "--nproc-per-node",
            str(self.spec.workers),
            "--run-id",
            self.cluster,
            "--standby-file",
            str(self.files.standby),
        ]
        for endpoint in self.endpoints:
            argv += ["--etcd", endpoint]
        if self.spec.local_addr:
            argv += ["--local-addr", self.spec.local_addr]
        if self.spec.expected_nodes:
            argv += ["--rdzv-conf", f"expected_nodes={self.spec.expected_nodes}"]
        return [*argv, "--", *shlex.split(self.spec.run)]

    def _env(self) -> dict[str, str]:
        # PYTHONSAFEPATH: `-m` must not import a `spotrun` directory from the workdir.
        env = {
            **os.environ,
            **self.spec.env,
            "PYTHONSAFEPATH": "1",
            protocol.CONTROL_FILE_ENV: str(self.files.control),
            protocol.PROGRESS_FILE_ENV: str(self.files.progress),
            protocol.CLUSTER_ENV: self.cluster,
            protocol.PEER_LOST_FILE_ENV: str(self.files.peer_lost),
            protocol.NODE_ID_ENV: self.node,
            protocol.CHECKPOINT_KEEP_ENV: str(self.spec.keep),
            protocol.MEMORY_DIR_ENV: str(self.files.memory(self.node)),
        }
        optional = {
            protocol.CHECKPOINT_DIR_ENV: self.spec.checkpoint_dir,
            protocol.CHECKPOINT_EVERY_STEPS_ENV: self.spec.every_steps,
            protocol.CHECKPOINT_EVERY_SECONDS_ENV: self.spec.every_seconds,
        }
        env.update({k: str(v) for k, v in optional.items() if v is not None})
        return env

    def _loop(self) -> None:
        try:
            self._supervise()
        finally:  # the node trains no more: give its host memory back
            shutil.rmtree(self.files.memory(self.node), ignore_errors=True)

    def _supervise(self) -> None:
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
        """Publish what changed since the last call. Raises ControlPlaneError if etcd is unreachable."""
        report = protocol.read_progress(self.path)
        if report is None:
            return
        if report.step is not None and report.step != self._last_step:
            self.store.put_progress(
                self.cluster,
                Progress(
                    node=self.node,
                    step=report.step,
                    samples_per_s=report.samples_per_s,
                    world_size=report.world_size,
                    heartbeat_at=report.heartbeat_at,
                    loss=report.loss,
                ),
            )
            self._last_step = report.step
        checkpoint = report.checkpoint
        if checkpoint is not None and checkpoint.step != self._last_checkpoint:
            # CheckpointReport is CheckpointRecord's twin (the protocol may not import state/).
            self.store.put_checkpoint(self.cluster, CheckpointRecord(**dataclasses.asdict(checkpoint)))
            self._last_checkpoint = checkpoint.step
