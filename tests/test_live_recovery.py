"""Live recovery with real gloo groups: survivors resume from host memory, joiners get the state from
a survivor, nothing is read from or written to durable storage on the way (spotrun.elastic.handoff,
spotrun.elastic.checkpoint.memory)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from test_trainer import Group

from spotrun.elastic import handoff, tensortree
from spotrun.elastic.checkpoint import files as checkpoint
from spotrun.elastic.checkpoint import memory
from spotrun.node.protocol import ControlCommand, ControlWriter, ExitCode

MOMENTUM = ("--momentum", "0.9")


def test_plan_takes_the_newest_step_and_names_who_receives_it() -> None:
    out = handoff.plan([7, -1, 7, 5, -1], durable=3)
    assert out.step == 7 and out.sources == (0, 2) and out.durable == 3
    assert out.receivers == (1, 3, 4), "every rank without step 7 receives it"
    assert handoff.plan([-1, -1]).step == -1 and handoff.plan([-1, -1]).receivers == ()
    assert handoff.plan([4]).receivers == ()


def test_split_and_join_carry_nested_state() -> None:
    state = {"model": {"w": torch.arange(6.0).view(2, 3)}, "optimizer": {"param_groups": [{"betas": (0.9, 0.99)}]}}
    skeleton, tensors = tensortree.split(state)
    assert len(tensors) == 1 and skeleton["optimizer"] == state["optimizer"]
    assert [(p.shape, p.device.type) for p in tensortree.placeholders(skeleton)] == [(torch.Size([2, 3]), "meta")]
    joined = tensortree.join(skeleton, iter([t.clone() for t in tensors]))
    assert torch.equal(joined["model"]["w"], state["model"]["w"])
    assert joined["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)


def test_snapshot_replaces_the_older_one_in_the_same_arena(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    assert memory.newest(folder) is None and memory.newest(None) is None
    memory.save(folder, 5, {"w": torch.ones(3), "step": 5})
    memory.save(folder, 9, {"w": torch.full((3,), 2.0), "b": torch.arange(4, dtype=torch.int64), "step": 9})
    found = memory.newest(folder)
    assert found is not None and found.step == 9
    assert sorted(p.name for p in folder.iterdir()) == [memory.ARENA_FILE, found.path.name]
    state = memory.load(found)
    assert torch.equal(state["w"], torch.full((3,), 2.0)) and torch.equal(state["b"], torch.arange(4))
    assert state["step"] == 9
    assert oct(folder.stat().st_mode & 0o777) == "0o700" and oct(folder.parent.stat().st_mode & 0o777) == "0o700"


def test_a_snapshot_being_overwritten_is_never_offered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "mem"
    memory.save(folder, 5, {"w": torch.ones(1000)})
    (folder / ".tmp-123-step-000000009.pt").write_bytes(b"half")  # a header writer killed mid-write
    assert memory.newest(folder).step == 5

    # A writer killed while it copies into the arena: the old header went first, no new one came.
    def dying_arena(folder: Path, size: int) -> torch.Tensor:
        raise KeyboardInterrupt("killed mid-copy")

    monkeypatch.setattr(memory, "_arena", dying_arena)  # the crash is injected, the file system is real
    with pytest.raises(KeyboardInterrupt):
        memory.save(folder, 9, {"w": torch.zeros(1000)})
    assert memory.newest(folder) is None, "a snapshot whose bytes were being overwritten was offered"


def test_reserve_grows_the_arena_and_keeps_the_snapshot(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    memory.save(folder, 3, {"w": torch.full((16,), 7.0)})
    memory.reserve(folder, 1 << 20)
    assert (folder / memory.ARENA_FILE).stat().st_size == 1 << 20
    assert torch.equal(memory.load(memory.newest(folder))["w"], torch.full((16,), 7.0))
    assert memory.snapshot_bytes({"a": torch.zeros(3), "b": [torch.zeros(20, dtype=torch.float64)]}) == 64 + 192


def test_wait_for_returns_once_local_rank_zero_wrote_the_step(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    assert memory.wait_for(folder, 3, timeout=0.05) is False
    writer = threading.Timer(0.1, lambda: memory.save(folder, 3, {"step": 3}))
    writer.start()
    started = time.monotonic()
    assert memory.wait_for(folder, 3, timeout=10)
    assert time.monotonic() - started < 5
    writer.join()


def _final(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


@pytest.mark.slow
def test_agreed_checkpoint_goes_through_host_memory_and_a_joiner_receives_it(tmp_path: Path) -> None:
    mem = [tmp_path / f"mem-{n}" for n in ("a", "b", "c", "joiner")]
    first = Group(tmp_path, 3, 40, "first", memory=mem[:3], args=MOMENTUM)
    first.wait_for_step(10)
    ControlWriter(first.controls[2]).request(ControlCommand.LEAVE, "node-2")
    assert first.wait() == [ExitCode.REFORM] * 3
    done = first.steps(0)[-1]
    assert all(memory.newest(m) is not None and memory.newest(m).step == done for m in mem[:3])
    durable = checkpoint.newest_valid(tmp_path / "ckpt")
    assert durable is None or durable.step < done, "the agreed step went to storage on the critical path"

    # Node c left; a new node (no snapshot) joins: ranks 0 and 1 hold the step, rank 2 receives it.
    second = Group(
        tmp_path, 3, 40, "second", memory=[mem[0], mem[1], mem[3]], args=(*MOMENTUM, "--final", str(tmp_path / "f.pt"))
    )
    assert second.wait() == [0, 0, 0]
    assert second.steps(0)[0] == second.steps(2)[0] == done + 1
    assert first.steps(0) + second.steps(0) == list(range(1, 41)), "a step ran twice or was skipped"
    assert "(2 rank(s) held it, 1 received it" in second.logs[0].read_text()
    assert checkpoint.newest_valid(tmp_path / "ckpt").step == 40

    # The same job undisturbed: the same parameters (momentum included), within float tolerance.
    (tmp_path / "calm").mkdir()
    calm = Group(tmp_path / "calm", 3, 40, "calm", args=(*MOMENTUM, "--final", str(tmp_path / "calm.pt")))
    assert calm.wait() == [0, 0, 0]
    got, want = _final(tmp_path / "f.pt"), _final(tmp_path / "calm.pt")
    assert got.keys() == want.keys()
    assert all(torch.allclose(got[k], want[k], atol=1e-5) for k in want)


@pytest.mark.slow
def test_after_a_hard_kill_the_survivor_resumes_from_memory_whatever_rank_it_held(tmp_path: Path) -> None:
    mem = [tmp_path / "mem-a", tmp_path / "mem-b", tmp_path / "mem-new"]
    group = Group(tmp_path, 2, 400, "kill", memory=mem[:2], args=MOMENTUM)
    group.wait_for_step(8)
    os.killpg(group.procs[0].pid, signal.SIGKILL)  # global rank 0 dies
    assert group.procs[1].wait(60) == ExitCode.REFORM
    group.wait()
    survivor_last = group.steps(1)[-1]
    assert memory.newest(mem[1]).step == survivor_last
    durable = checkpoint.newest_valid(tmp_path / "ckpt")
    assert durable is None or durable.step < survivor_last

    # The survivor becomes rank 1 of the new group, the replacement rank 0: rank 0 receives.
    resumed = Group(tmp_path, 2, survivor_last + 3, "after", memory=[mem[2], mem[1]], args=MOMENTUM)
    assert resumed.wait() == [0, 0]
    assert resumed.steps(0) == [survivor_last + 1, survivor_last + 2, survivor_last + 3]
    assert "1 received it" in resumed.logs[0].read_text()


def test_the_background_writer_yields_the_cpu_to_training() -> None:
    from spotrun.elastic import trainer

    seen: list[int] = []
    before = os.getpriority(os.PRIO_PROCESS, 0)
    writer = trainer._AsyncWriter()
    writer.submit({}, lambda state: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    writer.wait()
    assert seen == [min(19, before + trainer.WRITER_NICE)]
    assert os.getpriority(os.PRIO_PROCESS, 0) == before, "the training thread keeps its priority"


def test_room_says_whether_the_arena_fits(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert memory.room(folder, 1 << 20)
    assert not memory.room(folder, free * 4), "an arena larger than the file system must be refused"
    memory.reserve(folder, 1 << 20)
    assert memory.room(folder, 1 << 20), "an arena that exists already needs no more room"


@pytest.mark.slow
def test_workers_the_launcher_stops_keep_their_step_in_memory(tmp_path: Path) -> None:
    """A re-formation torch's agent decides (a rendezvous round changed): SIGTERM to every worker."""
    mem = [tmp_path / "mem-a", tmp_path / "mem-b"]
    group = Group(tmp_path, 2, 400, "term", memory=mem, args=MOMENTUM)
    group.wait_for_step(8)
    for proc in group.procs:
        proc.send_signal(signal.SIGTERM)
    assert group.wait() == [ExitCode.REFORM] * 2
    last = group.steps(0)[-1]
    assert memory.newest(mem[0]).step == memory.newest(mem[1]).step == last
    resumed = Group(tmp_path, 2, last + 2, "again", memory=mem, args=MOMENTUM)
    assert resumed.wait() == [0, 0]
    assert resumed.steps(0) == [last + 1, last + 2], "a completed step was computed again"


def test_a_memory_directory_someone_else_could_read_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "shm").symlink_to(target)  # planted in a world-writable /dev/shm before us
    assert not memory.room(tmp_path / "shm" / "node", 1024)
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert memory.room(loose / "node", 1024)
    assert oct(loose.stat().st_mode & 0o777) == "0o700", "a parent of ours is made private"
