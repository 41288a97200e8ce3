"""A noticed VM's swap with its replacement survives the replacement dying at any moment.

3 local VMs train with the controller on; one (never rank 0) gets a notice long enough that its
replacement can be hard-killed (`preempt(..., 0)` kills the whole VM) at each moment of the swap:
while it boots (before its agent registers), while it joins (its launcher waits in the
rendezvous, the noticed node starts to leave for it), and right after the swap (the noticed node
has left). Training must never stop, the noticed VM must be gone by its deadline, another
replacement must be launched and train, no completed step may run twice, and the cluster's
events must say what happened.
"""

from __future__ import annotations

import time

import pytest
from polling import wait_until
from test_training_e2e import Job, job_factory  # noqa: F401  (the fixture is reused here)

from spotrun.state import clusterfile
from spotrun.state.control_plane import connect_endpoints
from spotrun.state.records import EventKind, NodeState

pytestmark = pytest.mark.slow

NOTICE_S = 25.0
MOMENTS = ("booting", "joining", "swapped")


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
    assert _event(store, job, EventKind.PREEMPTED, first), "the lost replacement is recorded"
    if moment != "booting":  # it was in the rendezvous: the survivors went on without it
        assert job.at_world(2, after=killed_at), "the survivors trained at world 2"
    job.wait(lambda: job.at_world(3, after=max(killed_at, deadline)), timeout=90, what="world 3 again")
    latest = job.steps()[-1][1]
    job.wait(lambda: job.steps()[-1][1] > latest + 20, timeout=30, what="20 steps at world 3")
    assert not store.is_rdzv_member(job.name, first), "the dead replacement's membership is released"


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
