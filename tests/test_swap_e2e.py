"""A noticed VM's swap with its replacement survives the replacement dying at any moment.

3 local VMs train with the controller on; one (never rank 0) gets a notice long enough that its
replacement can be hard-killed (`preempt(..., 0)` kills the whole VM) at each moment of the swap:
while it is bootstrapped (before its agent registers), while it joins (its launcher waits in the
rendezvous, the noticed node starts to leave for it), as the round with it forms (it is frozen the
moment it is a participant and killed once the round completed: it never writes its keys for that
round), and right after the swap (the noticed node has left). Training must never stop, the
noticed VM must be gone by its deadline, another replacement must be launched and train, no
completed step may run twice, and the cluster's events must say what happened.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import threading
import time
from pathlib import Path

import pytest
from polling import wait_until
from test_training_e2e import Job, job_factory  # noqa: F401  (the fixture is reused here)

from spotrun.state import clusterfile
from spotrun.state.control_plane import connect_endpoints
from spotrun.state.records import EventKind, NodeState
from spotrun.state.schema import RdzvPart, rdzv_key, rdzv_state_key

pytestmark = pytest.mark.slow

NOTICE_S = 25.0
MOMENTS = ("booting", "joining", "forming", "swapped")


def _replacements(store, job: Job, noticed: str) -> list[str]:
    return sorted(n.id for n in store.list_nodes(job.name) if n.extra.get("replaces") == noticed)


def _event(store, job: Job, kind: EventKind, node: str | None = None, text: str = "") -> bool:
    return any(
        e.kind == kind and (node is None or e.node == node) and text in e.message for e in store.list_events(job.name)
    )


def _history(store, job: Job, since: float = 0.0) -> str:
    """The cluster's events since `since`, one line each, for failure messages."""
    return "\n".join(f"{e.at:.2f} {e.kind} {e.message}" for e in store.list_events(job.name) if e.at >= since)


def _gone(job: Job, node: str) -> bool:
    from spotrun.providers.local.provider import LocalProvider

    return any(i.id == node and i.state.is_gone for i in LocalProvider(root=job.home / "local").instances(job.name))


def _moment_reached(store, job: Job, moment: str, noticed: str, replacement: str) -> bool:
    if moment == "booting":  # the controller is bootstrapping the VM; its agent has not registered yet
        record = store.get_node(job.name, replacement)
        return record is not None and record.state == NodeState.BOOTSTRAPPING
    if moment == "joining":  # its launcher is in the rendezvous: the noticed node leaves for it
        return _event(store, job, EventKind.READY, replacement)
    return _event(store, job, EventKind.LEAVE, noticed)  # swapped: the noticed node has left


def _recovers(job: Job, store, moment: str, noticed: str, first: str, killed_at: float, deadline: float) -> None:
    """What must hold after `first`, the replacement of `noticed`, was killed at `killed_at`."""
    step_at_kill = job.steps()[-1][1]
    job.wait(
        lambda: job.steps()[-1][1] > step_at_kill + 10 and job.steps()[-1][0] > killed_at,
        timeout=45,
        what="training going on after the kill",
    )
    lost = f"lost {first} (replacement of {noticed})"
    job.wait(lambda: _event(store, job, EventKind.LAUNCH, text=lost), timeout=30, what="a launch for the lost one")
    job.wait(lambda: _gone(job, noticed), timeout=max(1.0, deadline + 5 - time.time()), what="noticed VM gone")
    assert time.time() < deadline + 5, "the noticed VM was gone by its deadline"
    assert _event(store, job, EventKind.LEAVING, noticed), "the noticed node's leave is recorded"
    assert any(_event(store, job, kind, first) for kind in (EventKind.PREEMPTED, EventKind.TERMINATED)), (
        "the lost replacement is recorded"
    )
    if moment != "booting":  # it was in the rendezvous: the survivors went on without it
        assert job.at_world(2, after=killed_at), "the survivors trained at world 2"
    job.wait(lambda: job.at_world(3, after=max(killed_at, deadline)), timeout=90, what="world 3 again")
    latest = job.steps()[-1][1]
    job.wait(lambda: job.steps()[-1][1] > latest + 20, timeout=30, what="20 steps at world 3")
    assert not store.is_rdzv_member(job.name, first), "the dead replacement's membership is released"


def _launcher_pids(node: str) -> list[int]:
    """Host pids of `node`'s elastic launcher and its forks (a local VM's processes are visible
    from the host)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"spotrun.elastic.launcher" in argv and node.encode() in argv:
            pids.append(int(proc.name))
    assert pids, f"no launcher process of {node}"
    return pids


def _freeze_in_formed_round(store, job: Job, node: str) -> bool:
    """SIGSTOP `node`'s launcher the moment it is a participant of the rendezvous round being formed,
    then wait for the others to complete that round with it: it then writes none of its keys for
    that round (MASTER_ADDR, rank assignment), as if its VM died right as the round formed. True
    once a round completed with it (False: its lease ended first and the round formed without it).
    Call it before the node reaches the rendezvous."""
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous  # noqa: F401  (the state unpickles to it)

    alive_key = rdzv_key(job.name, job.name, RdzvPart.ALIVE, node)
    desc: list[str] = []
    frozen, formed = threading.Event(), threading.Event()

    def on_state(event) -> None:
        if event.kind != "put" or event.value is None:
            return
        if not desc:
            found = store.get(alive_key)
            if found is None:
                return
            desc.append(json.loads(found[0])["desc"])
        state = pickle.loads(event.value.split(b"\n", 1)[1])
        if desc[0] not in {repr(p) for p in state.participants}:
            return
        if not frozen.is_set():
            for pid in _launcher_pids(node):
                os.kill(pid, signal.SIGSTOP)
            frozen.set()
        if state.complete:
            formed.set()

    watch = store.watch_key(rdzv_state_key(job.name, job.name), on_state)
    try:
        assert frozen.wait(NOTICE_S), f"{node} never became a participant of a round"
        return formed.wait(5)
    finally:
        watch.cancel()


@pytest.mark.parametrize("moment", MOMENTS)
def test_replacement_dying_never_stops_training(job_factory, moment: str) -> None:
    from spotrun.client.nodes import preempt

    job = job_factory(f"swap-{moment}", steps=100000, delay=0.03)
    job.up(controller=True)
    job.wait(lambda: job.at_world(3) and job.steps()[-1][1] > 40, what="training at world 3")
    record = clusterfile.load(job.name)
    with connect_endpoints(record.endpoints, record.tls) as store:
        noticed = next(p.node for p in store.list_progress(job.name) if p.node != job.node_of_rank0())
        deadline = preempt(job.name, noticed, NOTICE_S)
        job.wait(lambda: _replacements(store, job, noticed), timeout=30, what="a replacement launched")
        first = _replacements(store, job, noticed)[0]
        if moment == "forming":
            assert _freeze_in_formed_round(store, job, first), "no round completed with the frozen replacement"
        else:
            reached = wait_until(lambda: _moment_reached(store, job, moment, noticed, first), NOTICE_S, 0.02)
            assert reached, f"the replacement never reached the moment {moment!r}"
        killed_at = time.time()
        preempt(job.name, first, 0)
        try:
            _recovers(job, store, moment, noticed, first, killed_at, deadline)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\ncluster events:\n{_history(store, job, since=deadline - NOTICE_S)}") from None
    steps = [s for _, s, _ in job.steps()]
    assert steps == list(range(1, len(steps) + 1)), "no completed step was skipped or ran twice"
