"""Tiny real training job for the quickstart recipe: an MLP fit to a seeded synthetic regression.

Runs on CPU with the gloo backend under torchrun, which sets RANK, WORLD_SIZE, MASTER_ADDR...:

    torchrun --nproc-per-node 2 train.py --steps 200

Each rank trains on its own shard of the same seeded dataset; DistributedDataParallel averages
the gradients, so every rank holds the same model. Without torchrun it runs as a single process.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def make_data(samples: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y = sin(x @ w) + noise, identical on every rank because the generator is seeded."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    w = torch.randn(features, 1, generator=gen)
    y = torch.sin(x @ w) + 0.05 * torch.randn(samples, 1, generator=gen)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps to run")
    parser.add_argument("--batch", type=int, default=64, help="batch size per rank")
    parser.add_argument("--log-every", type=int, default=20, help="print the loss every N steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world_size > 1
    if distributed:
        dist.init_process_group("gloo")  # MASTER_ADDR/PORT or the rendezvous come from torchrun

    torch.manual_seed(args.seed)  # same initial weights on every rank
    x, y = make_data(4096, 16, args.seed)
    x, y = x[rank::world_size], y[rank::world_size]  # this rank's shard

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.MSELoss()
    gen = torch.Generator().manual_seed(args.seed + rank)

    for step in range(1, args.steps + 1):
        idx = torch.randint(0, x.shape[0], (args.batch,), generator=gen)
        loss = loss_fn(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        optimizer.step()
        if step % args.log_every == 0 or step == args.steps:
            reported = loss.detach().clone()
            if distributed:
                dist.all_reduce(reported)
                reported /= world_size
            if rank == 0:
                print(f"step {step} loss {reported.item():.4f} world_size {world_size}", flush=True)

    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
