"""The recipe's chaos schedule: injected preemptions on the local provider, driven by the controller.

The schedule's clock starts when the controller first sees the cluster (a key in etcd, so a
restarted controller keeps the same clock), and each entry fires once (its own key marks it).
"""

from __future__ import annotations

import json
import random
import time

from spotrun import log
from spotrun.providers import supports
from spotrun.store import Store, key

_log = log.get("chaos")


def due(store: Store, cluster: str, schedule, now: float | None = None) -> list[tuple[int, object]]:
    """(index, entry) of the schedule entries whose time has come and that did not fire yet."""
    if not schedule:
        return []
    now = time.time() if now is None else now
    start_key = key(cluster, "chaos", "start")
    store.cas(start_key, None, json.dumps({"at": now}))  # first caller sets the clock; later ones keep it
    start = json.loads(store.get(start_key)[0])["at"]
    return [(i, entry) for i, entry in enumerate(schedule)
            if now >= start + entry.at and store.get(key(cluster, "chaos", f"fired-{i}")) is None]


def fire(store: Store, cluster: str, index: int, entry, live: list, providers: dict) -> str | None:
    """Preempt the entry's node (index into `live` by launch time, or a seeded random one).
    Marks the entry fired whatever happens, so a schedule never fires twice. Returns the node."""
    store.put(key(cluster, "chaos", f"fired-{index}"), json.dumps({"at": time.time()}))
    candidates = sorted((i for i in live if supports(providers.get(i.provider), "preempt")),
                        key=lambda i: (i.launched_at, i.id))
    if not candidates:
        store.add_event(cluster, "chaos", f"chaos #{index}: no node the provider can preempt")
        return None
    victim = (random.Random(index).choice(candidates) if entry.node == "random"
              else candidates[entry.node % len(candidates)])
    providers[victim.provider].preempt(victim.id, entry.notice)
    store.add_event(cluster, "chaos", f"chaos #{index}: preempting {victim.id} with {entry.notice:.0f} s notice",
                    victim.id)
    _log.info("chaos preemption", extra=log.kv(node=victim.id, notice=entry.notice))
    return victim.id
