"""Elastic training across real local VMs: real sshd, real etcd, real torchrun with our rendezvous.

Every rank of the test job prints one `STEP n WORLD w RANK r T t ...` line per completed step, so
a test sees exactly which steps ran, at which world size, and whether any step ran twice.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from local_recipe import SHARED_STEPS_ENV, local_recipe
from polling import wait_until

from spotrun.controller.bootstrap import QuietReporter
from spotrun.controller.daemon import stop_daemon
from spotrun.controller.loop import Controller
from spotrun.state import clusterfile
from spotrun.state.control_plane import connect_endpoints

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "trainer_scripts"


def steps_run(steps: int, delay: float) -> str:
    """The run command of tests/trainer_scripts/steps.py."""
    return f"python steps.py --steps {steps} --delay {delay} --samples 500 --batch 24"


class Job:
    """One training cluster of the test, with helpers to read what its ranks did."""

    def __init__(self, home: Path, name: str, recipe: Path) -> None:
        self.home, self.name, self.recipe = home, name, recipe

    def up(self, *, controller: bool) -> None:
        from spotrun.client.up import up

        up(self.recipe, reporter_factory=QuietReporter)
        if not controller:
            stop_daemon(self.name)

    def logs(self) -> list[Path]:
        """Per-node step logs in the cluster's shared directory: they outlive terminated VMs."""
        return sorted((self.home / "local" / "shared" / self.name / "steps").glob("*.log"))

    def train_logs(self) -> list[Path]:
        return sorted((self.home / "local" / "vms").glob("*/home/.spotrun/train.log"))

    def steps(self, rank: int | None = 0) -> list[tuple[float, int, int]]:
        """(time, step, world) of every completed step of `rank` (None: every rank), in time order."""
        rows = []
        for log in self.logs():
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("STEP "):
                    parts = line.split()
                    if rank is None or int(parts[5]) == rank:
                        rows.append((float(parts[7]), int(parts[1]), int(parts[3])))
        return sorted(rows)

    def losses(self) -> list[float]:
        return [
            float(line.split()[9])
            for log in self.logs()
            for line in log.read_text(errors="replace").splitlines()
            if line.startswith("STEP ") and line.split()[5] == "0"
        ]

    def wait(self, check, timeout: float = 90.0, what: str = "condition") -> None:
        if not wait_until(check, timeout, 0.2):
            tail = "\n".join(log.read_text(errors="replace")[-1500:] for log in self.train_logs())
            raise AssertionError(f"{what} not reached in {timeout:.0f} s; train logs:\n{tail}")

    def at_world(self, world: int, after: float = 0.0) -> bool:
        return any(w == world and t > after for t, _, w in self.steps())

    def finished(self, steps: int) -> bool:
        return any(s == steps for _, s, _ in self.steps())

    def duplicates(self) -> list[int]:
        seen = [s for _, s, _ in self.steps()]
        return sorted({s for s in seen if seen.count(s) > 1})

    def node_of_rank0(self) -> str:
        newest = max(self.logs(), key=lambda log: max((t for t, *_ in self._rank0(log)), default=0.0))
        return newest.stem

    def _rank0(self, log: Path) -> list[tuple[float, int, int]]:
        return [
            (float(p[7]), int(p[1]), int(p[3]))
            for p in (line.split() for line in log.read_text().splitlines() if line.startswith("STEP "))
            if p[5] == "0"
        ]


@pytest.fixture
def job_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, etcd_server):
    from spotrun.client.down import down

    home = tmp_path / "home"
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(SCRIPTS / "steps.py", work / "steps.py")
    jobs: list[Job] = []

    def make(name: str, *, target: int = 3, steps: int = 300, delay: float = 0.03, workers: int | None = None) -> Job:
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(
            local_recipe(
                name,
                target=target,
                workers=workers,
                run=steps_run(steps, delay),
                env=SHARED_STEPS_ENV,
                checkpoint={"every_steps": 25, "keep": 3},
                endpoint=etcd_server.endpoint,
            )
        )
        job = Job(home, name, recipe)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        if job.name in clusterfile.names():
            down(job.name, purge=True)


def _node_ids(job: Job) -> list[str]:
    return sorted(p.stem for p in job.logs())


def test_three_nodes_train_to_the_end_and_loss_falls(job_factory) -> None:
    job = job_factory("e2e-train", steps=150, delay=0.01)
    job.up(controller=False)
    job.wait(lambda: job.finished(150), what="step 150")
    assert job.at_world(3)
    assert job.duplicates() == []
    losses = job.losses()
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 / 5, "the loss must fall"


@pytest.mark.parametrize("notice", [10.0, 0.0], ids=["notice", "hard-kill"])
def test_preempted_node_leaves_survivors_training_without_lost_steps(job_factory, notice: float) -> None:
    from spotrun.client.nodes import preempt

    job = job_factory(f"e2e-pre-{int(notice)}", steps=400)
    job.up(controller=False)  # no replacement: the survivors must go on at world size 2
    job.wait(lambda: job.at_world(3) and job.steps()[-1][1] > 40, what="training at world 3")
    victim = next(n for n in _node_ids(job) if n != job.node_of_rank0())
    preempt(job.name, victim, notice)
    job.wait(lambda: job.at_world(2), what="world size 2")
    job.wait(lambda: job.finished(400), timeout=120, what="step 400")
    assert job.duplicates() == [], "a completed step ran twice"
    assert [s for _, s, _ in job.steps()] == list(range(1, 401))


@pytest.mark.parametrize("notice", [10.0, 0.0], ids=["notice", "hard-kill"])
def test_two_workers_per_vm_lose_no_step_when_a_vm_goes(job_factory, notice: float) -> None:
    from spotrun.client.nodes import preempt

    job = job_factory(f"e2e-w2-{int(notice)}", steps=300, workers=2)
    job.up(controller=False)
    job.wait(lambda: job.at_world(6) and job.steps()[-1][1] > 40, what="training at world 6 (3 VMs x 2 workers)")
    at_six = {rank for rank in range(6) if any(w == 6 for _, _, w in job.steps(rank))}
    assert at_six == set(range(6)), "every worker of the three VMs trains"
    victim = next(n for n in _node_ids(job) if n != job.node_of_rank0())
    preempt(job.name, victim, notice)
    job.wait(lambda: job.at_world(4), what="world size 4 (2 VMs x 2 workers)")
    job.wait(lambda: job.finished(300), timeout=120, what="step 300")
    assert job.duplicates() == [], "a completed step ran twice"
    assert [s for _, s, _ in job.steps()] == list(range(1, 301))


def test_rank0_node_preempted_job_continues(job_factory) -> None:
    from spotrun.client.nodes import preempt

    job = job_factory("e2e-rank0", steps=300)
    job.up(controller=False)
    job.wait(lambda: job.at_world(3) and job.steps()[-1][1] > 40, what="training at world 3")
    kill_at = time.time()
    preempt(job.name, job.node_of_rank0(), 0.0)
    job.wait(lambda: job.at_world(2, after=kill_at), what="world size 2 after losing rank 0")
    job.wait(lambda: job.finished(300), timeout=120, what="step 300")
    assert job.duplicates() == []


def test_fourth_node_joins_without_lost_steps(job_factory) -> None:
    from spotrun.controller.scaling import set_target

    job = job_factory("e2e-join", steps=400)
    job.up(controller=False)
    job.wait(lambda: job.at_world(3) and job.steps()[-1][1] > 40, what="training at world 3")
    record = clusterfile.load(job.name)
    with connect_endpoints(record.endpoints, record.tls) as store:
        set_target(store, job.name, 4)
        Controller(job.name, store).reconcile_once()  # launches and bootstraps the 4th node
    job.wait(lambda: job.at_world(4), what="world size 4")
    job.wait(lambda: job.finished(400), timeout=120, what="step 400")
    assert job.duplicates() == []


def test_corrupt_newest_checkpoint_falls_back_and_says_so(job_factory) -> None:
    from spotrun.client.down import down

    job = job_factory("e2e-corrupt", target=2, steps=60, delay=0.01)
    job.up(controller=False)
    job.wait(lambda: job.finished(60), what="step 60")
    shared = job.home / "local" / "shared" / job.name / "checkpoints"
    # The final checkpoint lands just after the last step's line: wait for it (renamed in whole).
    job.wait(lambda: (shared / "step-000000060").is_dir(), timeout=30, what="the final checkpoint")
    newest = sorted(shared.glob("step-*"))[-1]
    assert newest.name == "step-000000060"
    (newest / "__0_0.distcp").write_bytes(b"torn write")  # rank 0's shard of the sharded checkpoint
    down(job.name)  # keeps the shared directory (checkpoints) unless purged
    job.recipe.write_text(job.recipe.read_text().replace("--steps 60", "--steps 80"))
    job.up(controller=False)
    job.wait(lambda: job.finished(80), what="step 80")
    text = "\n".join(log.read_text(errors="replace") for log in job.train_logs())
    assert "step-000000060" in text and "corrupt" in text
    assert "resumed from step 50" in text


def test_up_attach_streams_events_until_the_job_finishes(job_factory) -> None:
    import os
    import subprocess
    import sys

    job = job_factory("e2e-attach", target=2, steps=40, delay=0.01)
    result = subprocess.run(
        [sys.executable, "-m", "spotrun", "up", str(job.recipe), "--attach"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    finished = [line for line in result.stdout.splitlines() if " finished " in line]
    assert len(finished) == 2 and "training job finished" in finished[-1]
    assert job.finished(40)
    logs = subprocess.run(
        [sys.executable, "-m", "spotrun", "logs", job.name, "-n", "200"], capture_output=True, text=True, timeout=60
    )
    assert logs.returncode == 0, logs.stderr
    prefixed = [line for line in logs.stdout.splitlines() if line.startswith("[e2e-attach-") and " STEP 40 " in line]
    assert prefixed, logs.stdout[-1500:]
