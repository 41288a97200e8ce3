"""Workers per VM: from the recipe candidate to the agent's command line, and exact data sharding
for any mix of nodes and workers per node."""

from __future__ import annotations

import pytest
import torch
from spotrun.providers.base import Instance, InstanceState

from spotrun.controller.provisioning import workers_for
from spotrun.elastic.trainer import ElasticTrainer
from spotrun.node.supervisor import Launcher, TrainSpec
from spotrun.recipe.schema import Recipe

RECIPE = Recipe.model_validate(
    {
        "name": "mixed",
        "resources": [
            {"provider": "local", "instance_type": "cpu-small"},
            {"provider": "local", "instance_type": "a100x8", "accelerators": "A100:8"},
            {"provider": "local", "instance_type": "a10gx4", "accelerators": "A10G:4"},
            {"provider": "local", "instance_type": "a100x8", "accelerators": "A100:8", "workers": 2},
        ],
        "nodes": {"min": 1, "max": 4},
        "run": "python train.py",
    }
)


def _instance(instance_type: str, key: str) -> Instance:
    return Instance(
        "vm-1", "mixed", "local", "z", instance_type, InstanceState.RUNNING, None, "127.0.0.1", 22, "u", "k", "",
        0.1, 0.4, 1.0, labels={"idempotency_key": key},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("instance_type", "key", "workers"),
    [
        ("cpu-small", "l-abc-c0", 1),  # a CPU candidate: one worker
        ("a100x8", "l-abc-c1", 8),  # one per accelerator
        ("a10gx4", "l-abc-c2", 4),
        ("a100x8", "l-abc-c3", 2),  # the same type, launched from the candidate that overrides
        ("a100x8", "l-abc-c9", 8),  # an index the recipe no longer has: the first candidate of the type
        ("a10gx4", "", 4),  # no launch key: found by type
        ("other", "l-abc-c1", 1),  # the index names another type: nothing fits
    ],
)
def test_workers_come_from_the_candidate_the_vm_was_launched_from(instance_type: str, key: str, workers: int) -> None:
    assert workers_for(RECIPE, _instance(instance_type, key)) == workers


def test_the_agent_hands_the_workers_to_the_launcher(tmp_path) -> None:
    spec = TrainSpec(run="python train.py", nnodes="1:4", workdir=tmp_path, workers=4)
    argv = Launcher("mixed", "vm-1", ["http://127.0.0.1:2379"], spec, tmp_path, lambda *_: True)._argv()
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert argv.index("--nproc-per-node") < argv.index("--")


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_the_agent_refuses_a_worker_count_below_one(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    from spotrun.node import agent

    with pytest.raises(SystemExit) as exited:
        agent.main(["--cluster", "c", "--node", "n", "--etcd", "http://127.0.0.1:1", "--workers", bad])
    assert exited.value.code == 2
    assert f"argument --workers: must be an integer >= 1, got {bad!r}" in capsys.readouterr().err


def _shard(rank: int, world: int, offset: int, global_batch: int, dataset_len: int) -> list[int]:
    """The trainer's own sharding for one rank, without a process group."""
    trainer = ElasticTrainer.__new__(ElasticTrainer)
    trainer.rank, trainer.world_size = rank, world
    trainer.global_batch, trainer.dataset_len, trainer.seed, trainer._orders = global_batch, dataset_len, 0, {}
    return trainer._indices(offset).tolist()


def _global_batch(offset: int, global_batch: int, dataset_len: int) -> list[int]:
    """The batch one process would see at `offset`: seeded epoch permutations."""
    out = []
    for position in range(offset, offset + global_batch):
        epoch, within = divmod(position, dataset_len)
        out.append(int(torch.randperm(dataset_len, generator=torch.Generator().manual_seed(epoch))[within]))
    return out


@pytest.mark.parametrize(
    "workers_per_node",
    [[1], [2, 2, 2], [8, 4], [4, 4, 4, 4], [3, 3, 3, 3, 3], [8, 8, 8, 8]],
    ids=lambda w: "+".join(map(str, w)),
)
@pytest.mark.parametrize("global_batch", [24, 20])
def test_all_ranks_together_take_exactly_the_global_batch(workers_per_node: list[int], global_batch: int) -> None:
    # torch elastic numbers ranks node-major: node 0's workers first, with per-node local world sizes.
    world, dataset_len = sum(workers_per_node), 50
    for step in range(6):  # crosses epoch boundaries (50 samples)
        offset = step * global_batch
        taken = [i for rank in range(world) for i in _shard(rank, world, offset, global_batch, dataset_len)]
        assert taken == _global_batch(offset, global_batch, dataset_len), (step, world)
