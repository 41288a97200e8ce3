"""A state (nested dicts, lists and tuples of tensors and plain values) taken apart and put back.

`split` replaces every tensor by a "meta" tensor (shape and dtype, no data) and returns the tensors
in traversal order; `join` puts tensors back in that order. The skeleton is small and safe to
pickle or to torch.save (weights_only loads it), so the tensors can travel or be stored apart: over
the process group (spotrun.elastic.handoff) or in a host-memory arena (checkpoint.memory).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def split(value: Any) -> tuple[Any, list[torch.Tensor]]:
    """(skeleton, tensors): `value` with each tensor replaced by its meta twin, and the tensors."""
    tensors: list[torch.Tensor] = []

    def walk(item: Any) -> Any:
        if torch.is_tensor(item):
            tensors.append(item.detach())
            return torch.empty(item.shape, dtype=item.dtype, device="meta")
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return type(item)(walk(v) for v in item)
        return item

    return walk(value), tensors


def placeholders(skeleton: Any) -> list[torch.Tensor]:
    """The meta tensors of `skeleton`, in the order `split` returned their tensors."""
    found: list[torch.Tensor] = []

    def walk(item: Any) -> None:
        if torch.is_tensor(item):
            found.append(item)
        elif isinstance(item, dict):
            for v in item.values():
                walk(v)
        elif isinstance(item, (list, tuple)):
            for v in item:
                walk(v)

    walk(skeleton)
    return found


def join(skeleton: Any, tensors: Iterator[torch.Tensor]) -> Any:
    """The inverse of `split`: each meta tensor replaced by the next of `tensors`."""
    if torch.is_tensor(skeleton):
        return next(tensors)
    if isinstance(skeleton, dict):
        return {k: join(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(join(v, tensors) for v in skeleton)
    return skeleton
