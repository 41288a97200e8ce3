"""Live recovery: after a re-formation, survivors keep their step and joiners get it from them.

Every rank tells which step its node's host-memory snapshot holds (spotrun.elastic.checkpoint.memory;
-1 for none: a joiner, a node whose snapshot is older). All ranks agree on the newest step; the ranks
that hold it load it locally, and the others receive it over the process group, point to point,
each tensor from one of the holders in turn, so the transfer runs over as many links at once as
there are holders (not a broadcast through one). Nothing is read from storage or hashed on this
path: a recovery costs one host copy per survivor and one network copy per joiner.

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
    """Who holds the newest step and who receives it: `sources` hold `step` already, `receivers` get
    it from them, each tensor from one source (round robin), so the transfer runs over as many
    links as there are sources. `step` is -1 when no rank holds a snapshot; `durable` is the newest
    durable checkpoint's step as rank 0 listed it (-1: none)."""

    step: int
    sources: tuple[int, ...]
    receivers: tuple[int, ...]
    durable: int = -1


def plan(held: list[int], durable: int = -1) -> Plan:
    """The handoff for `held[rank]` = the step rank's snapshot holds (-1: none). Pure."""
    best = max(held, default=-1)
    if best < 0:
        return Plan(-1, (), (), durable)
    sources = tuple(rank for rank, step in enumerate(held) if step == best)
    return Plan(best, sources, tuple(rank for rank, step in enumerate(held) if step != best), durable)


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


def send(state: dict[str, Any], handoff: Plan, me: int) -> None:
    """Source `me`'s share of `state` (nested dicts/lists of tensors and plain values) to every
    receiver: tensor i goes from sources[i % len(sources)]; the first source also sends the layout.
    Blocking until sent."""
    skeleton, tensors = tensortree.split(state)
    share = handoff.sources.index(me)
    pending = []
    for dst in handoff.receivers:
        if share == 0:
            dist.send_object_list([skeleton, [t.is_cuda for t in tensors]], dst=dst)
        for index in range(share, len(tensors), len(handoff.sources)):
            contiguous = tensors[index].contiguous()  # kept alive until its send completed
            pending.append((contiguous, dist.isend(contiguous, dst=dst, tag=index)))
    for _, work in pending:
        if work is not None:  # None only for a rank outside the group
            work.wait()


def receive(handoff: Plan, device: torch.device) -> dict[str, Any]:
    """The state the sources send with `send`, each tensor from its source, all links at once; CUDA
    tensors land on `device`, CPU ones on the CPU. Blocking."""
    box: list[Any] = [None, None]
    dist.recv_object_list(box, src=handoff.sources[0])
    skeleton, on_cuda = box
    tensors, pending = [], []
    for index, (meta, cuda) in enumerate(zip(tensortree.placeholders(skeleton), on_cuda, strict=True)):
        tensor = torch.empty(meta.shape, dtype=meta.dtype, device=device if cuda else "cpu")
        src = handoff.sources[index % len(handoff.sources)]
        pending.append(dist.irecv(tensor, src=src, tag=index))
        tensors.append(tensor)
    for work in pending:
        if work is not None:
            work.wait()
    joined: dict[str, Any] = tensortree.join(skeleton, iter(tensors))
    return joined
