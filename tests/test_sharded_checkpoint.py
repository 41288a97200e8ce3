"""Sharded (DCP) checkpoints with real gloo process groups: written at one world size, loaded at another,
in a directory and on object storage (moto's S3 server)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from spotrun.elastic import wrapping
from spotrun.elastic.checkpoint import files, remote, remote_sharded, sharded

STEP, SAMPLES_SEEN = 7, 84


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model() -> nn.Module:
    torch.manual_seed(0)
    # Odd sizes, so the shards of world 3 and of world 2 or 4 cut each tensor at different rows.
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def _trained(parallel: wrapping.Parallel) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = wrapping.fully_shard_model(_model(), parallel) if wrapping.is_fsdp(parallel) else _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer


def _full(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, object]]:
    """The whole (unsharded) model and optimizer state, on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": dict(model_state), "optimizer": dict(optim_state)}


def _modules(location: str | Path) -> tuple[ModuleType, ModuleType]:
    """(the store: newest_valid, prune; the sharded writer: save, load) for a directory or a bucket URL."""
    store = remote.module_for(location)
    return store, remote_sharded if store is remote else sharded


def _worker(rank: int, world: int, port: int, location: str, out: str, parallel: str, mode: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    store, writer = _modules(location)
    try:
        model, optimizer = _trained(parallel)
        ckpt = location if store is remote else Path(location)
        if mode == "save":
            # FSDP averages the ranks' gradients; plain replicas (DDP's) must see the same data to stay equal.
            torch.manual_seed(1 + rank if parallel == "fsdp" else 1)
            for _ in range(3):  # a few real steps, so Adam's moments are not zero
                model(torch.randn(4, 5)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optimizer": optim_state}
            if parallel == "ddp":  # as the trainer saves a replica: each rank its part
                state = sharded.replica_part(state, rank, world)
            staged = sharded.stage(state, sharded.stager())
            group = dist.new_group(backend="gloo")
            manifest = writer.save(ckpt, STEP, world, staged, SAMPLES_SEEN, group)
            assert (manifest is not None) == (rank == 0)
            full = _full(model, optimizer)
            if rank == 0:
                torch.save(full, Path(out) / "expected.pt")
        else:
            manifest = store.newest_valid(ckpt)
            assert manifest is not None and manifest.step == STEP and manifest.samples_seen == SAMPLES_SEEN
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optimizer": optim_state}
            writer.load(manifest, state)
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
            full = _full(model, optimizer)
            if rank == 0:
                torch.save(full, Path(out) / f"loaded-{world}.pt")
        # Every rank done with its collectives before any tears the group down (as the trainer's
        # finish() does): a peer closing its gloo pairs under a pending op aborts the process.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(world: int, location: str | Path, out: Path, parallel: str, mode: str) -> None:
    mp.start_processes(_worker, args=(world, _free_port(), str(location), str(out), parallel, mode), nprocs=world)


def _assert_equal(expected: object, got: object, where: str = "") -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict) and set(got) == set(expected), where
        for key in expected:
            _assert_equal(expected[key], got[key], f"{where}/{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            _assert_equal(e, g, f"{where}[{i}]")
    elif torch.is_tensor(expected):
        assert torch.is_tensor(got) and torch.equal(expected, got), where
    else:
        assert expected == got, where


@pytest.mark.slow
@pytest.mark.parametrize("where", ["directory", "s3"])
@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_written_at_world_3_loads_at_world_2_and_4_with_equal_state(
    tmp_path: Path, parallel: str, where: str, request: pytest.FixtureRequest
) -> None:
    location = tmp_path / "ckpt" if where == "directory" else request.getfixturevalue("url")
    store, _ = _modules(location)
    _run(3, location, tmp_path, parallel, "save")
    manifest = store.newest_valid(location)
    assert isinstance(manifest, files.ShardedManifest) and manifest.world_size == 3
    written = {name.rsplit("/", 1)[-1] for name in manifest.files}  # on S3 under the writer's own dir
    assert sharded.METADATA_FILE in written
    assert manifest.bytes == sum(size for size, _ in manifest.files.values())
    if parallel == "fsdp":  # every rank wrote its own shard
        assert {f"__{rank}_0.distcp" for rank in range(3)} <= written
    expected = torch.load(tmp_path / "expected.pt", weights_only=False)
    assert expected["optimizer"]["state"], "the optimizer state should not be empty"
    for world in (2, 4):
        _run(world, location, tmp_path, parallel, "load")
        _assert_equal(expected, torch.load(tmp_path / f"loaded-{world}.pt", weights_only=False), f"world {world}")


def test_a_corrupt_shard_makes_the_checkpoint_invalid_and_the_previous_one_is_used(tmp_path: Path) -> None:
    state = {"w": torch.arange(6.0)}
    older = sharded.save_alone(tmp_path, 1, 1, state, 12)
    newer = sharded.save_alone(tmp_path, 2, 1, {"w": torch.arange(6.0) + 1}, 24)
    assert sharded.save_alone(tmp_path, 2, 1, {"w": torch.zeros(6)}, 24) == newer, "an existing step is kept"
    shard = next(name for name in newer.files if name.endswith(".distcp"))
    Path(newer.path, shard).write_bytes(b"torn write")
    warnings: list[str] = []
    assert files.newest_valid(tmp_path, warn=warnings.append) == older
    assert len(warnings) == 1 and "step-000000002" in warnings[0]
    loaded = {"w": torch.zeros(6)}
    sharded.load(older, loaded)
    assert torch.equal(loaded["w"], torch.arange(6.0))
    assert files.prune(tmp_path, keep=1) == [2], "a corrupt checkpoint does not count towards keep"
    assert files.steps(tmp_path) == [1]


def test_staging_copies_to_host_and_reuses_its_buffers() -> None:
    weight = torch.arange(4.0)
    stager = sharded.stager()
    first = sharded.stage({"w": weight}, stager)["w"]
    assert torch.equal(first, weight) and first.data_ptr() != weight.data_ptr(), "staging must copy"
    weight.add_(1)  # training goes on: the staged copy does not change
    assert torch.equal(first, torch.arange(4.0))
    second = sharded.stage({"w": weight}, stager)["w"]
    assert torch.equal(second, weight) and second.data_ptr() == first.data_ptr(), "the host buffer is reused"


def test_replica_part_spreads_every_tensor_once_over_the_ranks() -> None:
    state = {
        "model": {f"w{i}": torch.zeros(10 * (i + 1)) for i in range(7)},
        "optimizer": {
            "state": {"w0": {"exp_avg": torch.zeros(5), "step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 1}],
        },
    }
    parts = [sharded.replica_part(state, rank, 3) for rank in range(3)]
    names = lambda part: [*part["model"], *(f"o.{k}" for k in part["optimizer"]["state"].get("w0", {}))]  # noqa: E731
    owned = [name for part in parts for name in names(part)]
    assert sorted(owned) == sorted([*state["model"], "o.exp_avg", "o.step"]), "a tensor written twice or never"
    sizes = [sum(t.numel() for t in part["model"].values()) for part in parts]
    assert max(sizes) - min(sizes) <= 40, f"unbalanced: {sizes}"
    assert all(part["optimizer"]["param_groups"] == [{"lr": 1}] for part in parts), "plain values go to every rank"
    assert parts == [sharded.replica_part(state, rank, 3) for rank in range(3)], "not deterministic"
    assert sharded.replica_part(state, 0, 1)["model"].keys() == state["model"].keys()
