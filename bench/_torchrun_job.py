"""bench/recovery.py's baseline: a plain `torchrun` job (c10d rendezvous, torch's defaults) of
host-process agents, each in its own session, with its step timeline and what its agents logged.

The job trains bench/_bench_train.py `--plain` (periodic checkpoints only) in its own workdir on
its own c10d port; agent b0 hosts the c10d store (`is_host=1`: all agents share 127.0.0.1, so the
host is named rather than inferred). Each agent's output is timestamped on arrival, which is what
the step lines' prefix and `agent_log` read.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from _steps import Line, Timeline
from _workdir import job_workdir


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class TorchrunNode:
    """One plain torchrun agent (a "VM"): its own session; output timestamped on arrival."""

    def __init__(self, name: str, work: Path, port: int, host: bool, args, logs: Path) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        self.joined_at: float | None = None  # its rendezvous join attempt, as torch logs it
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=recovery-baseline",
            "--nnodes=1:4",
            "--nproc-per-node=1",
            "--max-restarts=100",
            f"--rdzv-conf=is_host={int(host)}",
            "train.py",
            "--plain",
            "--delay",
            str(args.delay),
        ]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "SPOTRUN_CHECKPOINT_DIR": str(work / "checkpoints"),
            "SPOTRUN_CHECKPOINT_EVERY_STEPS": str(args.every),
            "SPOTRUN_CHECKPOINT_KEEP": "3",
            "LOGLEVEL": "INFO",
        }  # torch's elastic log level only: logs the rendezvous join time
        for k in ("SPOTRUN_CONTROL_FILE", "SPOTRUN_PROGRESS_FILE", "SPOTRUN_COLLECTIVE_TIMEOUT_S"):
            env.pop(k, None)
        self.started = time.time()
        self.proc = subprocess.Popen(
            argv,
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        with open(self.log, "w") as out:
            for raw in self.proc.stdout:
                now = time.time()
                text = raw.decode(errors="replace").rstrip("\n")
                if self.joined_at is None and "attempts to join" in text:
                    self.joined_at = now
                out.write(f"{now:.6f} {text}\n")
                out.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """Everything of this node at once: the agent's session and every worker it started."""
        pids = [self.proc.pid, *_descendants(self.proc.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class BaselineJob:
    """One plain-torchrun job of 3 agents (b0 hosts the c10d store), its own port and checkpoints."""

    def __init__(self, tmp: Path, data: Path, case: str, args) -> None:
        tag = case.replace(" ", "-")
        self.work = job_workdir(tmp / f"base-{tag}", data)
        self.logs = tmp / f"base-logs-{tag}"
        self.logs.mkdir()
        self.port, self.args = _free_port(), args
        self.nodes: dict[str, TorchrunNode] = {}
        self.timeline = Timeline(lambda: {n: node.log for n, node in self.nodes.items()})

    def start(self, name: str) -> TorchrunNode:
        self.nodes[name] = TorchrunNode(name, self.work, self.port, name == "b0", self.args, self.logs)
        return self.nodes[name]

    def start_three(self) -> bool:
        self.start("b0")
        time.sleep(1.0)  # the store host first
        self.start("b1")
        self.start("b2")
        return self.timeline.wait_steps(3, self.args.warm_steps, 180)

    def victim(self) -> str:
        self.timeline.refresh()
        rank0 = self.timeline.rank0_source()
        return sorted(n for n in self.nodes if n not in ("b0", rank0))[0]

    def dead(self, victim: str | None) -> bool:
        """The job cannot recover any more: its store host or every agent but the victim exited."""
        return not self.nodes["b0"].alive() or not any(n.alive() for name, n in self.nodes.items() if name != victim)

    def agent_log(self, after: float) -> dict:
        """What torchrun's agents logged after `after`: re-rendezvous rounds (as the store host saw
        them), worker-group failures and restarts for new nodes (all agents), and the error that
        ended the store host (else the newest error line)."""
        rounds, failed, new_nodes, counts, errors = 0, 0, 0, {}, []
        for name, node in self.nodes.items():
            try:
                lines = node.log.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                stamp, _, text = line.partition(" ")
                try:
                    at = float(stamp)
                except ValueError:
                    continue
                if at <= after:
                    continue
                if "Rendezvous complete for workers" in text and name == "b0":
                    rounds += 1
                elif "Worker group FAILED" in text:
                    failed += 1
                elif "new nodes from group_rank" in text:
                    new_nodes += 1
                elif "restart_count=" in text:
                    counts[name] = int(text.rsplit("restart_count=", 1)[1])
                elif text.startswith(("torch.distributed.", "RuntimeError", "TimeoutError")) or "Error:" in text[:60]:
                    errors.append((at, name, f"{name}: {text.strip()[:300]}"))
        ended = [e for e in errors if e[1] == "b0"] if not self.nodes["b0"].alive() else []
        error = max(ended or errors, default=None)
        return {
            "rendezvous_rounds": rounds,
            "worker_group_failures": failed,
            "restarts_for_new_nodes": new_nodes,
            "restart_counts": counts,
            "last_error": error[2] if error else None,
        }

    def wait_first(self, after: float, world: int, timeout: float, victim: str | None) -> tuple[Line | None, bool]:
        """The first step at `world` after `after`, or (None, died) when the bound passed or the job died."""
        deadline = time.monotonic() + timeout
        while True:
            self.timeline.refresh()
            found = self.timeline.first(after, world)
            if found is not None:
                return found, False
            if self.dead(victim):
                time.sleep(1.0)  # the last lines still in the pipes
                self.timeline.refresh()
                found = self.timeline.first(after, world)
                return found, found is None
            if time.monotonic() > deadline:
                return None, False
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.kill()
