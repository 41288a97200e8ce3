"""bench/model_scale.py's training job: an MLP of a chosen size trained with Adam under ElasticTrainer.

Copied into the bench's workdir as `train.py`. `--hidden H --layers L`: 64 inputs, L hidden layers of
H units, 10 outputs (H=3072, L=7: 57 M parameters, 680 MB of state with Adam). The data are drawn
from a fixed seed on start-up (4096 x 64: nothing to load). Global rank 0 writes bench/_steps.py's
lines (STEP / BOOT / RANK, the format of bench/_bench_train.py), flushed, to stdout.
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from spotrun.elastic.trainer import ElasticTrainer  # noqa: E402

INPUTS, CLASSES, SAMPLES = 64, 10, 4096


def make_model(hidden: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    parts: list[nn.Module] = [nn.Linear(INPUTS, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        parts += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*parts, nn.Linear(hidden, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=48)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, INPUTS, generator=generator)
    y = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    t_data = time.time()
    model = make_model(args.hidden, args.layers)
    trainer = ElasticTrainer(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-4),
        total_steps=args.steps,
        global_batch=args.batch,
        dataset_len=SAMPLES,
    )
    say = lambda line: (sys.stdout.write(line + "\n"), sys.stdout.flush())  # noqa: E731
    say(f"RANK {trainer.rank} T0 {T0:.6f} TD {t_data:.6f} T1 {time.time():.6f}")
    rank0 = trainer.rank == 0
    if rank0:
        say(f"BOOT WORLD {trainer.world_size} T0 {T0:.6f} T1 {time.time():.6f} RESUMED {trainer.resumed_from}")
    loss_fn = nn.CrossEntropyLoss()
    with trainer:
        for step, idx in trainer.batches():
            loss = loss_fn(trainer.model(x[idx]), y[idx])
            trainer.optimizer.zero_grad()
            loss.backward()
            trainer.optimizer.step()
            if rank0:
                say(f"STEP {step} WORLD {trainer.world_size} T {time.time():.6f}")
            trainer.step_done(loss.item())


if __name__ == "__main__":
    main()
