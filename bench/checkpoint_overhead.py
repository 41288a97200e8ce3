"""Periodic async checkpoint overhead: the same training with and without periodic checkpoints,
measured in the same run, in interleaved rounds (drift in machine load hits both alike; the best
round of each counts).

Cases (`--case`):
  quickstart  the quickstart CNN (0.6 MB of state), one process (world 1), checkpoints every 20
              and every 100 steps against none. Goal: steady-state overhead <= 3 %.
  large       an MLP trained with Adam (bench/_scale_train.py's make_model, hidden 2816, 7 layers:
              47.8 M parameters, 574 MB of state with Adam's two moments) at world 2: two real
              processes on the CPU over gloo (one thread each), under DDP and under FSDP2, global
              batch 16, async checkpoints every 100 steps (keep 2) against none. The timed window is
              the 200 steps after 20 warm-up ones (two checkpoints, at 100 and 200) and ends once the
              last background write is done, so it holds the whole cost of both. Goals (issue 15):
              overhead <= 3 % of step time; peak RSS (the max over ranks of ru_maxrss) <= 1.3 x the
              peak without checkpoints; the slowest step in the window <= 10 % over the median step
              (`worst_step_stretch_pct`: a checkpoint never stretches a step by more).
  all         both.

`spotrun` = seconds per step with checkpoints, `baseline` = without (bench/_format.py's lines; the
large case's are rank 0's wall time over the window / its steps). Times and step stretches are the
best round's (outside load only ever slows a run), peak RSS the highest round's.
Run: .venv/bin/python bench/checkpoint_overhead.py [--case quickstart|large|all] [--steps N] [--rounds N]
(`--steps`: total steps of each run, the first 20 untimed; default 600 quickstart, 220 large).
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes" / "quickstart"))
from _format import emit

if TYPE_CHECKING:
    from multiprocessing.queues import SimpleQueue

WARMUP = 20  # untimed steps at the start of every run
QUICKSTART_INTERVALS = (20, 100)
LARGE_HIDDEN, LARGE_LAYERS = 2816, 7
LARGE_WORLD, LARGE_BATCH, LARGE_EVERY = 2, 16, 100
LARGE_PARALLEL = ("ddp", "fsdp")
DEFAULTS = {"quickstart": (600, 3), "large": (WARMUP + 2 * LARGE_EVERY, 2)}  # case -> (steps, rounds)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _time_steps(steps: int, every: int | None, directory: Path) -> float:
    import torch
    import train  # the quickstart model and data
    from torch import nn

    from spotrun.elastic.trainer import ElasticTrainer

    images, labels = train.make_data(3000)
    model = train.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    trainer = ElasticTrainer(
        model,
        optimizer,
        total_steps=steps,
        global_batch=48,
        dataset_len=3000,
        checkpoint_dir=directory,
        every_steps=every or 10**9,
        keep=2,
    )
    start = None
    for step, idx in trainer.batches():
        if step == WARMUP + 1:  # after warm-up, and after the first periodic checkpoint was started
            start = time.perf_counter()
        loss = loss_fn(trainer.model(images[idx]), labels[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trainer.step_done(loss.item())
    took = (time.perf_counter() - start) / (steps - WARMUP)
    trainer._writer.wait()
    import torch.distributed as dist

    dist.destroy_process_group()
    return took


def run_quickstart(steps: int, rounds: int) -> None:
    """The quickstart CNN in this process (world 1); prints one line per interval."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch

    torch.set_num_threads(1)
    timings: dict[int | None, list[float]] = {None: [], **{every: [] for every in QUICKSTART_INTERVALS}}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):  # interleaved, so drift in machine load hits all alike
            for every in timings:
                timings[every].append(_time_steps(steps, every, Path(tmp) / f"{every}-{round_}"))
    baseline = min(timings[None])
    for every in QUICKSTART_INTERVALS:
        best = min(timings[every])
        emit(
            "checkpoint_overhead",
            f"every {every} steps",
            "s/step",
            best,
            baseline,
            overhead_pct=round(100 * (best / baseline - 1), 2),
            goal_overhead_pct=3.0,
        )


@dataclass(frozen=True)
class LargeRun:
    """One run of the large case at world 2: rank 0's timings, the peak RSS over the ranks."""

    params: int
    seconds_per_step: float
    stretch_pct: float  # the slowest step in the window over the median one
    peak_rss_mb: float


def _large_rank(
    rank: int, port: int, parallel: str, every: int | None, steps: int, directory: str, results: SimpleQueue
) -> None:
    """One rank of a large run (torch.multiprocessing's spawn target): trains, then puts
    (rank, parameters, seconds per step, stretch %, peak RSS MB) on `results`; the timings are rank 0's."""
    world = str(LARGE_WORLD)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=world)
    os.environ["LOCAL_RANK"] = str(rank)  # both ranks on this machine
    import torch
    from _scale_train import CLASSES, INPUTS, SAMPLES, make_model
    from torch import nn

    from spotrun.elastic.trainer import ElasticTrainer

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, INPUTS, generator=generator)
    y = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    model = make_model(LARGE_HIDDEN, LARGE_LAYERS)
    count = sum(p.numel() for p in model.parameters())  # before FSDP2 shards them
    trainer = ElasticTrainer(
        model,
        lambda params: torch.optim.Adam(params, lr=1e-4),  # a factory: FSDP2 builds it after sharding
        parallel=parallel,
        total_steps=steps,
        global_batch=LARGE_BATCH,
        dataset_len=SAMPLES,
        checkpoint_dir=directory,
        every_steps=every,
        keep=2,
    )
    loss_fn = nn.CrossEntropyLoss()
    marks = []  # the end of every step from the last warm-up one on
    for step, idx in trainer.batches():
        loss = loss_fn(trainer.model(x[idx]), y[idx])
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        trainer.step_done(loss.item())
        if step >= WARMUP:
            marks.append(time.perf_counter())
    trainer._writer.wait()  # inside the window: a write still running is part of the cost
    took = (time.perf_counter() - marks[0]) / (steps - WARMUP)
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    stretch = 100 * (max(gaps) / statistics.median(gaps) - 1)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # KiB on Linux
    results.put((rank, count, took, stretch, peak_mb))
    # As the trainer's own exits do: freeing the DDP reducer and the gloo groups at the end of this
    # frame can deadlock (a gloo thread freeing a pending work's tensors waits for the GIL held here).
    sys.stdout.flush()
    os._exit(0)


def _large_run(parallel: str, every: int | None, steps: int, directory: Path) -> LargeRun:
    """Spawn the ranks of one large run and wait for them. Blocking; raises if a rank fails."""
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").SimpleQueue()
    args = (_free_port(), parallel, every, steps, str(directory), results)
    mp.spawn(_large_rank, args=args, nprocs=LARGE_WORLD, join=True)
    ranks = sorted(results.get() for _ in range(LARGE_WORLD))
    _, params, took, stretch, _ = ranks[0]
    return LargeRun(params, took, stretch, max(peak for *_, peak in ranks))


def run_large(steps: int, rounds: int) -> None:
    """The large MLP at world 2 under DDP and FSDP2; prints one line per parallelism."""
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks, read before torch loads
    runs: dict[tuple[str, int | None], list[LargeRun]] = {
        (parallel, every): [] for parallel in LARGE_PARALLEL for every in (None, LARGE_EVERY)
    }
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):  # interleaved, so drift in machine load hits all alike
            for parallel, every in runs:
                runs[parallel, every].append(
                    _large_run(parallel, every, steps, Path(tmp) / f"{parallel}-{every}-{round_}")
                )
    for parallel in LARGE_PARALLEL:
        ours, theirs = runs[parallel, LARGE_EVERY], runs[parallel, None]
        best, baseline = min(r.seconds_per_step for r in ours), min(r.seconds_per_step for r in theirs)
        params = ours[0].params
        peak, baseline_peak = max(r.peak_rss_mb for r in ours), max(r.peak_rss_mb for r in theirs)
        emit(
            "checkpoint_overhead",
            f"large {parallel} every {LARGE_EVERY} steps",
            "s/step",
            best,
            baseline,
            overhead_pct=round(100 * (best / baseline - 1), 2),
            goal_overhead_pct=3.0,
            peak_rss_mb=round(peak, 1),
            baseline_peak_rss_mb=round(baseline_peak, 1),
            rss_ratio=round(peak / baseline_peak, 3),
            goal_rss_ratio=1.3,
            # the best round, as for the times: outside load only ever stretches a step more
            worst_step_stretch_pct=round(min(r.stretch_pct for r in ours), 1),
            baseline_worst_step_stretch_pct=round(min(r.stretch_pct for r in theirs), 1),
            goal_step_stretch_pct=10,
            params=params,
            state_mb=round(params * 12 / 1e6, 1),  # fp32 weights + Adam's two moments
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("quickstart", "large", "all"), default="quickstart")
    parser.add_argument("--steps", type=int, help="total steps per run, the first 20 untimed (default per case)")
    parser.add_argument(
        "--rounds", type=int, help="interleaved rounds; the best counts (default 3 quickstart, 2 large)"
    )
    args = parser.parse_args()
    cases = {"quickstart": run_quickstart, "large": run_large}
    for case, run in cases.items():
        if args.case in (case, "all"):
            steps, rounds = DEFAULTS[case]
            run(args.steps or steps, args.rounds or rounds)


if __name__ == "__main__":
    main()
