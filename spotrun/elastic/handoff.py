"""Live recovery: after a re-formation, survivors keep their step and joiners get it from them.

Every rank tells which step its node's host-memory snapshot holds (spotrun.elastic.checkpoint.memory;
-1 for none: a joiner, a node whose snapshot is older). All ranks agree on the newest step; the ranks
that hold it load it locally, and each of the others receives the whole state over the process group
from one of them (point to point, survivors shared out round robin, so N joiners cost N transfers
spread over the survivors, not a broadcast to everyone). Nothing is read from storage or hashed on
this path, so a recovery costs one host copy per survivor and one network copy per joiner.

DDP replicas only: every rank holds the whole state. Tensors travel on their own device's backend
(CUDA tensors over NCCL, CPU ones over gloo: the trainer's `cpu:gloo,cuda:nccl` group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from spotrun.elastic import tensortree


@dataclass(frozen=True)
class Plan:
    """Who holds the newest step and who receives it: `sources` hold `step` already; each rank in
    `receives` gets it from `receives[rank]`. `step` is -1 when no rank holds a snapshot; `durable`
    is the newest durable checkpoint's step as rank 0 listed it (-1: none)."""

    step: int
    sources: tuple[int, ...]
    receives: dict[int, int]
    durable: int = -1


def plan(held: list[int], durable: int = -1) -> Plan:
    """The handoff for `held[rank]` = the step rank's snapshot holds (-1: none). Pure."""
    best = max(held, default=-1)
    if best < 0:
        return Plan(-1, (), {}, durable)
    sources = tuple(rank for rank, step in enumerate(held) if step == best)
    needy = [rank for rank, step in enumerate(held) if step != best]
    return Plan(best, sources, {rank: sources[i % len(sources)] for i, rank in enumerate(needy)}, durable)


def agree(held: int, durable: int, world_size: int) -> Plan:
    """Every rank passes the step its snapshot holds and what it knows of the newest durable step (rank
    0 lists the storage, the others pass -1); every rank gets the same Plan. Collective (one
    all_gather of two integers per rank) when world_size > 1."""
    mine = torch.tensor([held, durable], dtype=torch.long)
    if world_size == 1:
        return plan([held], durable)
    gathered = [torch.zeros(2, dtype=torch.long) for _ in range(world_size)]
    dist.all_gather(gathered, mine)
    return plan([int(t[0]) for t in gathered], max(int(t[1]) for t in gathered))


def send(state: dict[str, Any], dst: int) -> None:
    """Send `state` (nested dicts/lists of tensors and plain values) to rank `dst`. Blocking."""
    skeleton, tensors = tensortree.split(state)
    dist.send_object_list([skeleton, [t.is_cuda for t in tensors]], dst=dst)
    for tensor in tensors:
        dist.send(tensor.contiguous(), dst=dst)


def receive(src: int, device: torch.device) -> dict[str, Any]:
    """The state rank `src` sends with `send`; its CUDA tensors land on `device`, CPU ones on the CPU."""
    box: list[Any] = [None, None]
    dist.recv_object_list(box, src=src)
    skeleton, on_cuda = box
    tensors = []
    for meta, cuda in zip(tensortree.placeholders(skeleton), on_cuda, strict=True):
        tensor = torch.empty(meta.shape, dtype=meta.dtype, device=device if cuda else "cpu")
        dist.recv(tensor, src=src)
        tensors.append(tensor)
    joined: dict[str, Any] = tensortree.join(skeleton, iter(tensors))
    return joined
