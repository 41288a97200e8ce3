"""`spotrun status`: what etcd says about clusters, nodes and costs. Reads etcd only."""

from __future__ import annotations

import time
from typing import Any

from spotrun.fmt import duration
from spotrun.state.ledger import summarize
from spotrun.state.records import EventKind, NodeState, to_dict
from spotrun.state.store import Store


def cluster_status(store: Store, cluster: str, now: float | None = None) -> dict[str, Any]:
    """One cluster as plain data (the `--json` form; the table is rendered from it)."""
    now = time.time() if now is None else now
    alive = store.list_alive(cluster)
    notices = {n.node: n for n in store.list_notices(cluster)}
    standby = store.list_standby(cluster)
    nodes = []
    for node in store.list_nodes(cluster):
        row = to_dict(node)
        row["alive"] = node.id in alive
        row["standby"] = node.id in standby  # a warm spare, outside the training job
        row["uptime_s"] = round(now - node.launched_at, 1) if node.launched_at else None
        notice = notices.get(node.id)
        row["notice_deadline"] = notice.deadline if notice else None
        nodes.append(row)
    segments = [s for segs in store.list_ledger(cluster).values() for s in segs]
    spec = store.get_spec(cluster)
    latest = store.latest_checkpoint(cluster)
    progress = max(store.list_progress(cluster), key=lambda p: (p.step, p.heartbeat_at), default=None)
    return {
        "cluster": cluster,
        "training": to_dict(progress) if progress else None,
        "target": store.get_target(cluster),
        "spec_version": spec[1] if spec else None,
        "nodes": nodes,
        "alive": len(alive),
        "costs": summarize(segments, now).to_dict(),
        "latest_checkpoint": to_dict(latest) if latest else None,
        "recent_events": [to_dict(e) for e in store.list_events(cluster)[-5:]],
    }


def all_statuses() -> list[dict[str, Any]]:
    """Every cluster: those in the embedded etcd, and those of this machine whose control plane
    is elsewhere (an external etcd, a head VM). One that cannot be reached is listed with its
    error instead of failing the rest."""
    from spotrun.client.connect import connect_record
    from spotrun.errors import ControlPlaneError
    from spotrun.state import clusterfile, etcd_server
    from spotrun.state.control_plane import connect_default

    statuses: list[dict[str, Any]] = []
    if etcd_server.status() is not None:
        with connect_default() as store:
            statuses += [cluster_status(store, name) for name in store.list_clusters()]
    seen = {s["cluster"] for s in statuses}
    for name in clusterfile.names():
        record = clusterfile.load(name)
        if name in seen or record.embedded:
            continue
        try:
            with connect_record(record) as store:
                statuses.append(cluster_status(store, name))
        except ControlPlaneError as exc:
            statuses.append({"cluster": name, "error": str(exc)})
    return statuses


def render(statuses: list[dict[str, Any]]) -> None:
    """Tables on stdout, one per cluster."""
    from rich import box
    from rich.table import Table

    from spotrun.client import console

    for status in statuses:
        if "error" in status:
            console.out.print(f"{status['cluster']}: unreachable: {status['error']}", markup=False)
            continue
        costs = status["costs"]
        table = Table(
            box=box.SIMPLE_HEAD,
            title=f"{status['cluster']}: {status['alive']} alive / target {status['target']}",
            title_justify="left",
        )
        for column in ("node", "provider", "zone", "type", "state", "alive", "uptime", "$/h"):
            table.add_column(column, justify="right" if column in ("uptime", "$/h") else "left")
        gone = [n for n in status["nodes"] if NodeState(n["state"]).is_gone]
        for node in (n for n in status["nodes"] if not NodeState(n["state"]).is_gone):
            state = "standby" if node.get("standby") and node["state"] == "running" else node["state"]
            state += f" ({_left(node['notice_deadline'])} left)" if node["notice_deadline"] else ""
            table.add_row(
                node["id"],
                node["provider"],
                node["zone"],
                node["instance_type"],
                state,
                "yes" if node["alive"] else "no",
                duration(node["uptime_s"]),
                f"{node['price_per_hour']:.4f}",
            )
        console.out.print(table)
        if gone:
            counts = ", ".join(
                f"{sum(n['state'] == s for n in gone)} {s.value}"
                for s in NodeState
                if s.is_gone and any(n["state"] == s for n in gone)
            )
            console.out.print(f"gone: {counts} (see `spotrun events {status['cluster']}`)", markup=False)
        console.out.print(
            f"burn {costs['burn_per_hour']:.4f} $/h (on-demand {costs['on_demand_per_hour']:.4f} $/h), "
            f"total {costs['total']:.4f} $, savings {costs['savings_pct']:.1f} %",
            markup=False,
        )
        training, latest = status["training"], status["latest_checkpoint"]
        if training:
            loss = f", loss {training['loss']:.4f}" if training.get("loss") is not None else ""
            console.out.print(
                f"training: step {training['step']} at world size {training['world_size']}, "
                f"{training['samples_per_s']:.0f} samples/s{loss}",
                markup=False,
            )
        if latest:
            age = max(0, int(time.time() - latest["written_at"]))
            console.out.print(
                f"checkpoint: step {latest['step']}, {latest['bytes'] / 1e6:.1f} MB, {age} s ago", markup=False
            )
        for event in status["recent_events"]:
            stamp = time.strftime("%H:%M:%S", time.localtime(event["at"]))
            console.out.print(f"  {stamp} {event['kind']:<9} {event['message']}", markup=False)


def _left(deadline: float) -> str:
    return f"{max(0, int(deadline - time.time()))}s"


def follow_events(
    store: Store, cluster: str, emit, *, since: int = 0, until_finished: bool = False, poll_s: float = 0.5
) -> None:
    """Print the cluster's events as they come (blocks; Ctrl-C ends it). With `until_finished`,
    return once the training job finished on every live node or the cluster was stopped."""
    from spotrun.client.console import format_event

    while True:
        for event in store.list_events(cluster, since=since):
            emit(format_event(event))
            since = event.seq
            if (
                until_finished
                and event.kind in (EventKind.FINISHED, EventKind.BUDGET)
                and _job_over(store, cluster, event)
            ):
                return
        time.sleep(poll_s)


def _job_over(store: Store, cluster: str, event) -> bool:
    if event.kind is EventKind.BUDGET:
        return "stopping" in event.message
    finished = {e.node for e in store.list_events(cluster) if e.kind is EventKind.FINISHED and e.seq <= event.seq}
    return store.list_alive(cluster) - store.list_standby(cluster) <= finished  # a parked spare never finishes
