"""`spotrun down`: stop everything of a cluster; works when the controller or etcd died.

VMs are found through the providers by their cluster label (not through etcd), so a crash that
lost etcd still leaves nothing running. Idempotent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from spotrun import clusterfile, log
from spotrun.costs import close_open
from spotrun.errors import ControlPlaneError
from spotrun.placement import providers_of
from spotrun.providers import supports
from spotrun.store import key

_log = log.get("down")

# What a cluster keeps in etcd after `down` (its history) unless purged.
KEPT_KINDS = ("spec", "checkpoints", "ledger", "events")
DROPPED_KINDS = ("target", "nodes", "alive", "notices", "progress", "rdzv", "launches", "chaos", "stopped")


@dataclass
class DownResult:
    cluster: str
    terminated: list[str] = field(default_factory=list)
    etcd_cleaned: bool = False
    etcd_stopped: bool = False
    notes: list[str] = field(default_factory=list)


def down(cluster: str, *, purge: bool = False) -> DownResult:
    """Terminate every VM labelled with `cluster`, drop its live etcd state (all of it with
    `purge`), forget it locally, and stop the embedded etcd when no cluster is left.
    Raises NotFoundError for a cluster this machine does not know."""
    from spotrun.controller import stop_daemon

    record = clusterfile.load(cluster)
    result = DownResult(cluster)
    stop_daemon(cluster)  # first, or it would replace the VMs we terminate
    recipe = record.recipe()
    for provider in providers_of(recipe):
        ids = [inst.id for inst in provider.instances(cluster) if not inst.state.is_gone]
        provider.terminate(ids)
        result.terminated += ids
        if supports(provider, "cleanup"):
            provider.cleanup(cluster)  # key pairs, security groups: nothing of the cluster may stay
        if purge and supports(provider, "purge"):
            provider.purge(cluster)
    _clean_etcd(record, recipe, purge, result)
    clusterfile.remove(cluster)
    if record.embedded and not clusterfile.names():
        from spotrun import etcd_server

        result.etcd_stopped = etcd_server.stop()
    return result


def _clean_etcd(record, recipe, purge: bool, result: DownResult) -> None:
    from spotrun.control_plane import connect_recipe

    try:
        store = connect_recipe(recipe, record.endpoints)
    except ControlPlaneError as exc:
        result.notes.append(f"etcd unreachable, its keys stay as they are: {exc}")
        return
    with store:
        now = time.time()
        for node, segments in store.list_ledger(record.name).items():
            store.put_ledger(record.name, node, close_open(segments, now))
        if purge:
            store.delete_cluster(record.name)
        else:
            store.add_event(record.name, "down", f"cluster down; {len(result.terminated)} VMs terminated")
            for kind in DROPPED_KINDS:
                store.delete_prefix(key(record.name, kind) + "/")
                store.delete(key(record.name, kind))
        result.etcd_cleaned = True
