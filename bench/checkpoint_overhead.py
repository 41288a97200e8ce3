"""Periodic async checkpoint overhead: the quickstart CNN trained with and without periodic
checkpoints (every 20 and every 100 steps), same process, same data. Goal: steady-state overhead < 3 %.

`spotrun` = seconds per step with checkpoints, `baseline` = without. Run: .venv/bin/python bench/checkpoint_overhead.py
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes" / "quickstart"))
from _format import emit


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
        if step == 21:  # after warm-up, and after the first periodic checkpoint was started
            start = time.perf_counter()
        loss = loss_fn(trainer.model(images[idx]), labels[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trainer.step_done(loss.item())
    took = (time.perf_counter() - start) / (steps - 20)
    trainer._writer.wait()
    import torch.distributed as dist

    dist.destroy_process_group()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch

    torch.set_num_threads(1)
    intervals = (20, 100)
    timings: dict[int | None, list[float]] = {None: [], **{every: [] for every in intervals}}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):  # interleaved, so drift in machine load hits all alike
            for every in timings:
                timings[every].append(_time_steps(args.steps, every, Path(tmp) / f"{every}-{round_}"))
    baseline = min(timings[None])
    for every in intervals:
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


if __name__ == "__main__":
    main()
