"""The trainer's choice of wrapper: DDP or FSDP2, and the optimizer built after sharding."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from spotrun.elastic import wrapping


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    """A real one-rank gloo process group (FSDP2 needs one, even alone)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def test_parallel_names_a_wrapper_or_is_refused() -> None:
    assert wrapping.is_fsdp("ddp") is False
    assert wrapping.is_fsdp("fsdp") is True
    assert wrapping.is_fsdp(lambda model: None) is True
    with pytest.raises(ValueError, match="parallel must be"):
        wrapping.is_fsdp("zero3")  # type: ignore[arg-type]


def test_an_optimizer_built_before_fsdp_sharding_is_refused_and_a_factory_is_called_after() -> None:
    model = _model()
    built = torch.optim.SGD(model.parameters(), lr=0.1)
    assert wrapping.build_optimizer(built, model, fsdp=False) is built
    with pytest.raises(ValueError, match="optimizer factory"):
        wrapping.build_optimizer(built, model, fsdp=True)
    made = wrapping.build_optimizer(lambda params: torch.optim.Adam(params, lr=0.01), model, fsdp=True)
    assert isinstance(made, torch.optim.Adam)
    assert [p for g in made.param_groups for p in g["params"]] == list(model.parameters())


def test_fsdp_shards_each_child_with_parameters_then_the_root(group: None) -> None:
    model = wrapping.fully_shard_model(_model(), "fsdp")
    assert isinstance(model, FSDPModule)
    assert [isinstance(child, FSDPModule) for child in model.children()] == [True, False, True]


def test_a_shard_callable_chooses_the_units_and_the_root_is_sharded_after_it(group: None) -> None:
    model = wrapping.fully_shard_model(_model(), lambda m: fully_shard(m[0]))
    assert isinstance(model, FSDPModule)
    assert [isinstance(child, FSDPModule) for child in model.children()] == [True, False, False]
