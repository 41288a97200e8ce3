"""`spotrun down`: stop everything of a cluster; works when the controller or etcd died.

VMs are found through the providers by their cluster label (not through etcd), so a crash that
lost etcd still leaves nothing running. Idempotent.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

from spotrun import log
from spotrun.controller.placement import provider_named, providers_of
from spotrun.errors import ControlPlaneError
from spotrun.paths import spotrun_home
from spotrun.providers import supports
from spotrun.providers.base import SupportsCleanup, SupportsPurge
from spotrun.state import clusterfile
from spotrun.state.ledger import close_open, summarize
from spotrun.state.records import EventKind

_log = log.get("down")


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
    from spotrun.controller.daemon import stop_daemon

    record = clusterfile.load(cluster)
    result = DownResult(cluster)
    stop_daemon(cluster)  # first, or it would replace the VMs we terminate
    candidates = record.candidates()  # from the local file: etcd may be gone
    if record.head:
        _stop_head(record, candidates, result)  # first too: its controller would replace them
    for provider in providers_of(candidates):
        ids = [inst.id for inst in provider.instances(cluster) if not inst.state.is_gone]
        provider.terminate(ids)
        result.terminated += ids
        if supports(provider, "cleanup"):  # key pairs, security groups: nothing of the cluster may stay
            cast(SupportsCleanup, provider).cleanup(cluster)
        if purge and supports(provider, "purge"):
            cast(SupportsPurge, provider).purge(cluster)
    if not record.head:  # a head's etcd went with the head VM
        _clean_etcd(record, purge, result)
    clusterfile.remove(cluster)
    if record.embedded and not clusterfile.names():
        from spotrun.state import etcd_server

        result.etcd_stopped = etcd_server.stop()
    return result


def _stop_head(record, candidates, result: DownResult) -> None:
    """Keep the head's history (events, closed ledger, cost) in a local file, then terminate the
    head VM and wait until it is gone: with it go its etcd and its controller."""
    from spotrun.client.connect import connect_record
    from spotrun.client.head import HeadRecord

    try:
        with connect_record(record) as store:
            path = _archive(store, record.name)
            result.etcd_cleaned = True
            result.notes.append(f"events and cost ledger saved to {path}")
    except ControlPlaneError as exc:
        result.notes.append(f"head VM unreachable, its events and ledger are lost: {exc}")
    head = HeadRecord(**record.head)
    provider_named(head.provider, candidates).terminate([head.id])
    result.terminated.append(head.id)


def _archive(store, cluster: str) -> Path:
    """$SPOTRUN_HOME/history/<cluster>-<time>.json: events, the ledger closed now, the cost."""
    now = time.time()
    ledger = {node: close_open(segments, now) for node, segments in store.list_ledger(cluster).items()}
    data = {
        "cluster": cluster,
        "at": now,
        "events": [asdict(e) for e in store.list_events(cluster)],
        "ledger": {node: [asdict(s) for s in segments] for node, segments in ledger.items()},
        "cost": summarize([s for segments in ledger.values() for s in segments], now).to_dict(),
    }
    path = spotrun_home() / "history" / f"{cluster}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def _clean_etcd(record, purge: bool, result: DownResult) -> None:
    from spotrun.state.control_plane import connect_endpoints

    try:
        store = connect_endpoints(record.endpoints, record.tls)
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
            store.add_event(record.name, EventKind.DOWN, f"cluster down; {len(result.terminated)} VMs terminated")
            store.drop_live_state(record.name)  # the history (spec, checkpoints, ledger, events) stays
        result.etcd_cleaned = True
