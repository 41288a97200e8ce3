"""The recipe's chaos schedule: injected preemptions on the local provider, driven by the controller.

The schedule's clock starts when the controller first sees the cluster (a key in etcd, so a
restarted controller keeps the same clock), and each entry fires once (its own key marks it).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from spotrun import log
from spotrun.providers import supports
from spotrun.providers.base import SupportsCapacity, SupportsPreempt
from spotrun.state.records import EventKind
from spotrun.state.schema import ChaosMark
from spotrun.state.store import Store

if TYPE_CHECKING:
    from spotrun.controller.traces import ReplayEvent
    from spotrun.providers.base import Instance, Provider
    from spotrun.recipe.job import Preemption

_log = log.get("chaos")


def due(
    store: Store, cluster: str, schedule: Sequence[Preemption], now: float | None = None
) -> list[tuple[int, Preemption]]:
    """(index, entry) of the schedule entries whose time has come and that did not fire yet."""
    if not schedule:
        return []
    now = time.time() if now is None else now
    start = store.chaos_start(cluster, now)
    return [
        (i, entry)
        for i, entry in enumerate(schedule)
        if now >= start + entry.at and not store.chaos_fired(cluster, ChaosMark.SCHEDULE, i)
    ]


def trace_due(
    store: Store, cluster: str, events: Sequence[ReplayEvent], nodes: int, now: float | None = None
) -> list[tuple[int, ReplayEvent, int]]:
    """(index, replay event, capacity after it) of the trace events due and not yet fired."""
    if not events:
        return []
    now = time.time() if now is None else now
    start = store.chaos_start(cluster, now)
    out: list[tuple[int, ReplayEvent, int]] = []
    capacity = nodes
    for i, event in enumerate(events):
        capacity += event.count if event.action == "restore" else -event.count
        if now >= start + event.at_s and not store.chaos_fired(cluster, ChaosMark.TRACE, i):
            out.append((i, event, capacity))
    return out


def replay(
    store: Store,
    cluster: str,
    index: int,
    event: ReplayEvent,
    capacity: int,
    live: Sequence[Instance],
    providers: Mapping[str, Provider],
) -> list[str]:
    """Apply one trace event: the local cloud's capacity becomes `capacity`; a drop preempts the
    newest live VMs (those not already leaving; training VMs before warm spares, as `spotrun
    simulate` does) with the event's notice. Fires once."""
    store.mark_chaos_fired(cluster, ChaosMark.TRACE, index)
    for provider in providers.values():
        if supports(provider, "capacity"):
            cast(SupportsCapacity, provider).set_capacity(cluster, capacity)
    victims: list[str] = []
    if event.action == "preempt":
        noticed = {n.node for n in store.list_notices(cluster)}
        spares = store.list_standby(cluster)
        candidates = sorted(
            (i for i in live if i.id not in noticed and supports(providers.get(i.provider), "preempt")),
            key=lambda i: (i.id not in spares, i.launched_at, i.id),
            reverse=True,
        )
        for victim in candidates[: event.count]:
            cast(SupportsPreempt, providers[victim.provider]).preempt(victim.id, event.notice_s)
            victims.append(victim.id)
    store.add_event(
        cluster,
        EventKind.CHAOS,
        f"trace: capacity {capacity}"
        + (f"; preempting {', '.join(victims)} with {event.notice_s:.0f} s notice" if victims else ""),
    )
    return victims


def fire(
    store: Store,
    cluster: str,
    index: int,
    entry: Preemption,
    live: Sequence[Instance],
    providers: Mapping[str, Provider],
) -> str | None:
    """Preempt the entry's node (index into `live` by launch time, or a seeded random one).
    Marks the entry fired whatever happens, so a schedule never fires twice. Returns the node."""
    store.mark_chaos_fired(cluster, ChaosMark.SCHEDULE, index)
    candidates = sorted(
        (i for i in live if supports(providers.get(i.provider), "preempt")), key=lambda i: (i.launched_at, i.id)
    )
    if not candidates:
        store.add_event(cluster, EventKind.CHAOS, f"chaos #{index}: no node the provider can preempt")
        return None
    victim = (
        random.Random(index).choice(candidates) if entry.node == "random" else candidates[entry.node % len(candidates)]
    )
    cast(SupportsPreempt, providers[victim.provider]).preempt(victim.id, entry.notice)
    store.add_event(
        cluster, EventKind.CHAOS, f"chaos #{index}: preempting {victim.id} with {entry.notice:.0f} s notice", victim.id
    )
    _log.info("chaos preemption", extra=log.kv(node=victim.id, notice=entry.notice))
    return victim.id
