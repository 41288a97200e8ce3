"""How the trainer spreads a model over the ranks: DDP replicas (the default) or FSDP2 shards.

A script chooses with ElasticTrainer's `parallel=`:
- "ddp": every rank holds the whole model; gradients are averaged (DistributedDataParallel).
- "fsdp": FSDP2 (`torch.distributed.fsdp.fully_shard`) on each direct child module that has
  parameters, then on the root: parameters, gradients and optimizer state are sharded.
- a callable `shard(model)` that applies `fully_shard` itself (per transformer block, say); the
  root is sharded after it if the callable did not.
FSDP2 replaces the parameters by sharded DTensors, so an optimizer must be built after sharding:
pass a factory (`lambda params: torch.optim.AdamW(params, lr=3e-4)`) and use `trainer.optimizer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal, TypeAlias

import torch
from torch import nn

Parallel: TypeAlias = Literal["ddp", "fsdp"] | Callable[[nn.Module], None]
OptimizerFactory: TypeAlias = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]


def is_fsdp(parallel: Parallel) -> bool:
    """True for FSDP2 ("fsdp" or a shard callable), False for "ddp"; raises ValueError otherwise."""
    if parallel == "ddp":
        return False
    if parallel == "fsdp" or callable(parallel):
        return True
    raise ValueError(f'parallel must be "ddp", "fsdp" or a callable applying fully_shard, not {parallel!r}')


def fully_shard_model(model: nn.Module, parallel: Parallel) -> nn.Module:
    """Shard `model` in place with FSDP2 as `parallel` says (see the module docstring); returns it.
    Collective-free; needs the default process group initialized."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if callable(parallel):
        parallel(model)
    else:
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
    if not isinstance(model, FSDPModule):
        fully_shard(model)
    return model


def build_optimizer(
    optimizer: torch.optim.Optimizer | OptimizerFactory, model: nn.Module, fsdp: bool
) -> torch.optim.Optimizer:
    """The optimizer the trainer steps: `optimizer` itself, or `optimizer(model.parameters())` for a
    factory, called after wrapping. Raises ValueError for an optimizer built before FSDP sharding
    (it would hold the unsharded parameters, which FSDP2 has replaced)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        if fsdp:
            raise ValueError(
                "with parallel='fsdp' pass an optimizer factory (lambda params: torch.optim.AdamW(params, ...)): "
                "the optimizer must be built after the model is sharded"
            )
        return optimizer
    return optimizer(model.parameters())
