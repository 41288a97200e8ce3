"""FSDP2 across real local VMs (sshd, etcd, torchrun): a preemption and a join reshard the checkpoint,
and the model ends exactly where an undisturbed run with the same data order ends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_training_e2e import SCRIPTS, Job, _node_ids, job_factory, steps_run

from spotrun.controller.loop import Controller
from spotrun.controller.scaling import set_target
from spotrun.state import clusterfile
from spotrun.state.control_plane import connect_endpoints

pytestmark = pytest.mark.slow

__all__ = ["job_factory"]  # the fixture, shared with tests/test_training_e2e.py

STEPS, DELAY = 400, 0.03
FSDP_ARGS = "--parallel fsdp --final /run/spotrun/shared/final.pt"  # the VMs see the shared dir there


def _undisturbed(tmp_path: Path, steps: int) -> dict[str, torch.Tensor]:
    """The final model of the same job run by one process from start to end (same data order)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "SPOTRUN_CHECKPOINT_DIR": str(tmp_path / "reference-ckpt"),
        "OMP_NUM_THREADS": "1",
    }
    final = tmp_path / "reference.pt"
    command = steps_run(steps, 0.0).split()[2:] + FSDP_ARGS.replace("/run/spotrun/shared/final.pt", str(final)).split()
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "steps.py"), *command], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return torch.load(final, weights_only=True)


def _train_text(job: Job) -> str:
    return "\n".join(log.read_text(errors="replace") for log in job.train_logs())


def test_fsdp_job_reshards_through_a_preemption_and_a_join_and_ends_like_an_undisturbed_run(
    job_factory, tmp_path: Path
) -> None:
    from spotrun.client.nodes import preempt

    job = _fsdp_job(job_factory, "e2e-fsdp", STEPS)
    job.up(controller=False)  # no replacement: the survivors go on at world size 2
    job.wait(lambda: job.at_world(3) and job.steps()[-1][1] > 40, what="training at world 3")
    victim = next(n for n in _node_ids(job) if n != job.node_of_rank0())
    preempt(job.name, victim, 10.0)
    job.wait(lambda: job.at_world(2) and job.steps()[-1][1] > 150, timeout=120, what="training at world size 2")
    assert "(saved at world size 3, now 2)" in _train_text(job), "world 2 did not resume from the world-3 checkpoint"

    record = clusterfile.load(job.name)
    with connect_endpoints(record.endpoints, record.tls) as store:
        set_target(store, job.name, 4)
        Controller(job.name, store).reconcile_once()  # launches and bootstraps the new nodes
    job.wait(lambda: job.at_world(4), timeout=120, what="world size 4")
    job.wait(lambda: job.finished(STEPS), timeout=120, what=f"step {STEPS}")
    assert job.duplicates() == [], "a completed step ran twice"
    assert [s for _, s, _ in job.steps()] == list(range(1, STEPS + 1))
    assert "now 4)" in _train_text(job), "world 4 did not resume from a checkpoint"

    _assert_like_undisturbed(job, tmp_path, STEPS)


def test_fsdp_hard_kill_resumes_from_the_newest_checkpoint_and_ends_like_an_undisturbed_run(
    job_factory, tmp_path: Path
) -> None:
    """A dead peer's shards are gone with it: the survivors leave without saving and the job
    replays from the newest periodic checkpoint (every 25 steps), with the same data."""
    from spotrun.client.nodes import preempt

    steps = 200
    job = _fsdp_job(job_factory, "e2e-fsdp-kill", steps)
    job.up(controller=False)
    job.wait(lambda: job.at_world(3) and job.steps()[-1][1] > 60, what="training at world 3")
    preempt(job.name, next(n for n in _node_ids(job) if n != job.node_of_rank0()), 0.0)
    job.wait(lambda: job.at_world(2), timeout=120, what="world size 2")
    job.wait(lambda: job.finished(steps), timeout=120, what=f"step {steps}")
    text = _train_text(job)
    assert "FSDP shards of the lost peer are gone" in text
    assert "(saved at world size 3, now 2)" in text
    assert sorted({s for _, s, _ in job.steps()}) == list(range(1, steps + 1))
    _assert_like_undisturbed(job, tmp_path, steps)


def _fsdp_job(job_factory, name: str, steps: int) -> Job:
    job = job_factory(name, steps=steps, delay=DELAY)
    run = steps_run(steps, DELAY)
    job.recipe.write_text(job.recipe.read_text().replace(run, f"{run} {FSDP_ARGS}"))
    return job


def _assert_like_undisturbed(job: Job, tmp_path: Path, steps: int) -> None:
    final = job.home / "local" / "shared" / job.name / "final.pt"
    job.wait(final.exists, timeout=30, what="the final model")
    got, expected = torch.load(final, weights_only=True), _undisturbed(tmp_path, steps)
    assert set(got) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(
            got[name], value, rtol=1e-4, atol=1e-5, msg=f"{name} differs from the undisturbed run"
        )
