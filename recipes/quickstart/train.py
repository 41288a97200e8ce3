"""Quickstart job: a small CNN learns to tell generated shapes apart (circle, square, cross).

The images are drawn from a seed, so nothing is downloaded and every node sees the same data.
spotrun's ElasticTrainer makes the loop survive preemptions: it resumes from the newest
checkpoint, re-shards the data for the current world size and checkpoints when the node agent
asks. Run it under spotrun (`spotrun up recipes/quickstart.yaml`), or alone for a smoke test:

    SPOTRUN_CHECKPOINT_DIR=/tmp/ckpt torchrun --nproc-per-node 2 train.py --steps 50
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

from spotrun.elastic.trainer import ElasticTrainer

SIZE = 24
CLASSES = ("circle", "square", "cross")


def draw(kind: int, gen: torch.Generator) -> torch.Tensor:
    """One noisy SIZE x SIZE image of a shape with random centre and radius."""
    r = 3 + 5 * torch.rand(1, generator=gen).item()
    cx, cy = (r + (SIZE - 2 * r) * torch.rand(2, generator=gen)).tolist()
    ys, xs = torch.meshgrid(
        torch.arange(SIZE, dtype=torch.float32), torch.arange(SIZE, dtype=torch.float32), indexing="ij"
    )
    dx, dy = xs - cx, ys - cy
    if kind == 0:
        shape = (dx**2 + dy**2).sqrt() <= r
    elif kind == 1:
        shape = (dx.abs() <= r * 0.8) & (dy.abs() <= r * 0.8)
    else:
        shape = ((dx.abs() <= r * 0.25) & (dy.abs() <= r)) | ((dy.abs() <= r * 0.25) & (dx.abs() <= r))
    return shape.float() + 0.3 * torch.randn(SIZE, SIZE, generator=gen)


def make_data(count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(len(CLASSES), (count,), generator=gen)
    images = torch.stack([draw(int(k), gen) for k in labels]).unsqueeze(1)
    return images, labels


def make_model() -> nn.Module:
    torch.manual_seed(0)  # identical initial weights on every rank
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (SIZE // 4) ** 2, 64),
        nn.ReLU(),
        nn.Linear(64, len(CLASSES)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=48, help="global batch, split across the nodes")
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    torch.set_num_threads(1)
    images, labels = make_data(args.samples)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    with ElasticTrainer(
        model, optimizer, total_steps=args.steps, global_batch=args.batch, dataset_len=args.samples
    ) as trainer:
        for step, idx in trainer.batches():
            x, y = images[idx].to(trainer.device), labels[idx].to(trainer.device)  # cuda:LOCAL_RANK or cpu
            logits = trainer.model(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            trainer.step_done(loss.item())
            if trainer.rank == 0 and (step % args.log_every == 0 or step == args.steps):
                accuracy = (logits.argmax(1) == y).float().mean().item()
                print(f"step {step} world {trainer.world_size} loss {loss.item():.4f} acc {accuracy:.2f}", flush=True)
    if math.isnan(loss.item()):
        raise SystemExit("loss became NaN")


if __name__ == "__main__":
    main()
