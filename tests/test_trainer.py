"""ElasticTrainer with real gloo process groups: agreed checkpoints, emergency saves, re-sharding."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from spotrun.elastic.checkpoint import files as checkpoint
from spotrun.node.protocol import ControlCommand, ControlWriter, ExitCode, read_progress

SCRIPT = Path(__file__).parent / "trainer_scripts" / "steps.py"
BATCH, SAMPLES = 12, 50


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Group:
    """`world` ranks of the test job as plain processes (what torchrun would start)."""

    def __init__(
        self,
        tmp: Path,
        world: int,
        steps: int,
        tag: str,
        location: str | None = None,
        args: tuple[str, ...] = (),
        memory: list[Path] | None = None,
    ) -> None:
        """`location`: the checkpoint dir or URL (tmp/ckpt by default); `args`: more arguments for steps.py;
        `memory[rank]`: that rank's node memory directory (host snapshots), as the agent sets it."""
        self.tmp, self.world, self.tag = tmp, world, tag
        port = _free_port()
        self.logs = [tmp / f"{tag}-rank{r}.log" for r in range(world)]
        self.controls = [tmp / f"control-{r}.json" for r in range(world)]
        self.procs = []
        for rank in range(world):
            env = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": "0",
                "SPOTRUN_CHECKPOINT_DIR": location or str(tmp / "ckpt"),
                "SPOTRUN_CONTROL_FILE": str(self.controls[rank]),
                "SPOTRUN_PROGRESS_FILE": str(tmp / f"progress-{rank}.json"),
                "SPOTRUN_COLLECTIVE_TIMEOUT_S": "30",
                "OMP_NUM_THREADS": "1",
            }
            if memory is not None:
                env["SPOTRUN_MEMORY_DIR"] = str(memory[rank])
            with open(self.logs[rank], "w") as out:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(SCRIPT),
                            "--steps",
                            str(steps),
                            "--batch",
                            str(BATCH),
                            "--samples",
                            str(SAMPLES),
                            *args,
                        ],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def steps(self, rank: int) -> list[int]:
        return [int(line.split()[1]) for line in self.logs[rank].read_text().splitlines() if line.startswith("STEP ")]

    def wait_for_step(self, step: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not (self.steps(0) and self.steps(0)[-1] >= step):
            assert time.monotonic() < deadline, self.logs[0].read_text()
            time.sleep(0.02)

    def wait(self, timeout: float = 60) -> list[int]:
        try:
            return [proc.wait(timeout) for proc in self.procs]
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)


def _expected_indices(step: int) -> list[int]:
    """The global batch of `step` (1-based) as a single process would see it: seeded epoch permutations."""
    out = []
    for position in range((step - 1) * BATCH, step * BATCH):
        epoch, within = divmod(position, SAMPLES)
        out.append(int(torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch))[within]))
    return out


def _batches(groups: list[Group]) -> dict[int, list[int]]:
    """step -> the sample indices all ranks of the run that completed it consumed, in rank order."""
    seen: dict[tuple[int, int], list[int]] = {}
    for group in groups:
        for log in group.logs:
            for line in log.read_text().splitlines():
                if line.startswith("STEP "):
                    _, step, _, _, _, rank, _, _, _, _, _, idx = line.split()
                    seen[(int(step), int(rank))] = [int(i) for i in idx.split(",")]
    by_step: dict[int, list[int]] = {}
    for (step, _rank), idx in sorted(seen.items()):
        by_step.setdefault(step, []).extend(idx)
    return by_step


@pytest.mark.slow
def test_agreed_checkpoint_then_resume_smaller_world_loses_nothing(tmp_path: Path) -> None:
    first = Group(tmp_path, 3, 40, "first")
    first.wait_for_step(10)
    ControlWriter(first.controls[2]).request(ControlCommand.LEAVE, "node-2")  # only rank 2's agent asks
    assert first.wait() == [ExitCode.REFORM] * 3
    done = [first.steps(r)[-1] for r in range(3)]
    assert len(set(done)) == 1, f"ranks stopped at different steps: {done}"
    manifest = checkpoint.newest_valid(tmp_path / "ckpt")
    assert manifest is not None and manifest.step == done[0] and manifest.world_size == 3

    second = Group(tmp_path, 2, 40, "second")
    assert second.wait() == [0, 0]
    assert second.steps(0)[0] == done[0] + 1, "resumed at the wrong step"
    all_steps = first.steps(0) + second.steps(0)
    assert all_steps == list(range(1, 41)), "a step ran twice or was skipped"
    assert "resumed from step" in second.logs[0].read_text()
    batches = _batches([first, second])
    assert all(batches[s] == _expected_indices(s) for s in range(1, 41)), "re-sharding changed the sample sequence"
    progress = read_progress(tmp_path / "progress-0.json")
    assert progress is not None and progress.checkpoint is not None
    assert progress.step == 40 and progress.world_size == 2 and progress.checkpoint.step == 40


@pytest.mark.slow
def test_hard_kill_survivor_saves_last_completed_step(tmp_path: Path) -> None:
    group = Group(tmp_path, 2, 400, "kill")
    group.wait_for_step(8)
    os.killpg(group.procs[1].pid, signal.SIGKILL)
    assert group.procs[0].wait(60) == ExitCode.REFORM
    group.wait()
    survivor_last = group.steps(0)[-1]
    manifest = checkpoint.newest_valid(tmp_path / "ckpt")
    assert manifest is not None and manifest.step == survivor_last
    assert "saving completed step" in group.logs[0].read_text()

    resumed = Group(tmp_path, 1, survivor_last + 3, "after")
    assert resumed.wait() == [0]
    assert resumed.steps(0) == [survivor_last + 1, survivor_last + 2, survivor_last + 3]


def test_non_zero_ranks_wait_for_the_store_to_listen_then_connect_at_once() -> None:
    import threading

    from spotrun.elastic.trainer import _wait_for_store

    port = _free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()

    threading.Thread(target=listen_later, daemon=True).start()
    started = time.monotonic()
    _wait_for_store("127.0.0.1", port, timeout=10.0)
    waited = time.monotonic() - started
    server.close()
    assert 0.25 <= waited < 5.0, f"returned after {waited:.2f} s: before the store listened, or far after"
    started = time.monotonic()
    _wait_for_store("127.0.0.1", _free_port(), timeout=0.2)  # nothing ever listens: gives up quietly
    assert time.monotonic() - started < 2.0
