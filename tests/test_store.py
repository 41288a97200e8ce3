"""spotrun.state.store against a real etcd: key schema, records, CAS, events, leases, resuming watches."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest
from polling import wait_until

from spotrun.errors import ControlPlaneError
from spotrun.state import etcd_server as etcd_mod
from spotrun.state import schema
from spotrun.state import store as store_mod
from spotrun.state.records import (
    CheckpointRecord,
    Event,
    LaunchIntent,
    LedgerSegment,
    NodeRecord,
    NodeState,
    Notice,
    Progress,
    decode,
    encode,
)
from spotrun.state.schema import ChaosMark, Kind, RdzvPart
from spotrun.state.store import Store
from spotrun.state.watch import WatchEvent


def _node(cluster: str, node_id: str, state: NodeState = NodeState.RUNNING) -> NodeRecord:
    return NodeRecord(
        id=node_id,
        cluster=cluster,
        provider="local",
        zone="local-a",
        instance_type="cpu-2",
        price_per_hour=0.1,
        on_demand_per_hour=0.4,
        ip="127.0.0.1",
        ssh_port=2222,
        state=state,
        launched_at=1700000000.0,
        extra={"vm_root": "/tmp/x"},
    )


# --- records -------------------------------------------------------------------------------


def test_records_roundtrip_json() -> None:
    node = _node("c", "n1", NodeState.NOTICE)
    assert decode(NodeRecord, encode(node)) == node
    assert b'"state":"notice"' in encode(node)
    # unknown keys from a newer writer are ignored
    assert decode(Notice, b'{"node":"n","source":"aws","deadline":2.0,"received_at":1.0,"new":1}').source == "aws"
    with pytest.raises(ValueError):
        decode(NodeRecord, encode(node).replace(b"notice", b"bogus"))


def test_gone_node_states_are_the_gone_instance_states() -> None:
    from spotrun.providers.base import InstanceState

    gone = {s.value for s in NodeState if s.is_gone}
    assert gone == {"preempted", "terminated", "failed"} == {s.value for s in InstanceState if s.is_gone}


# --- key schema and typed records ---------------------------------------------------------


def test_spec_and_target(store: Store, cluster: str) -> None:
    assert store.get_spec(cluster) is None and store.get_target(cluster) is None
    v1 = store.put_spec(cluster, {"name": cluster, "nodes": {"min": 1, "max": 4}})
    spec, version = store.get_spec(cluster)
    assert spec["nodes"]["max"] == 4 and version == v1
    v2 = store.put_spec(cluster, {"name": cluster, "nodes": {"min": 1, "max": 8}})
    assert v2 > v1 and store.get_spec(cluster)[1] == v2
    store.set_target(cluster, 3)
    assert store.get_target(cluster) == 3
    assert store.get(f"/spotrun/{cluster}/target")[0] == b"3"
    with pytest.raises(ValueError):
        store.set_target(cluster, -1)


def test_nodes(store: Store, cluster: str) -> None:
    for i in range(3):
        store.put_node(_node(cluster, f"n{i}"))
    assert store.get(f"/spotrun/{cluster}/nodes/n1") is not None
    assert store.get_node(cluster, "n1") == _node(cluster, "n1")
    assert store.get_node(cluster, "missing") is None
    assert [n.id for n in store.list_nodes(cluster)] == ["n0", "n1", "n2"]
    assert store.delete_node(cluster, "n1") and not store.delete_node(cluster, "n1")
    assert [n.id for n in store.list_nodes(cluster)] == ["n0", "n2"]
    with pytest.raises(ValueError):
        store.get_node(cluster, "../escape")


def test_notices_progress_checkpoints_ledger(store: Store, cluster: str) -> None:
    notice = Notice(node="n1", source="aws", deadline=2000.0, received_at=1880.0)
    store.put_notice(cluster, notice)
    assert store.get_notice(cluster, "n1") == notice and store.list_notices(cluster) == [notice]
    assert store.delete_notice(cluster, "n1") and store.list_notices(cluster) == []

    prog = Progress(node="n1", step=120, samples_per_s=512.5, world_size=4, heartbeat_at=1.0, loss=2.5)
    store.put_progress(cluster, prog)
    store.put_progress(cluster, Progress(node="n2", step=121, samples_per_s=1.0, world_size=4, heartbeat_at=2.0))
    assert store.get_progress(cluster, "n1") == prog
    assert [p.node for p in store.list_progress(cluster)] == ["n1", "n2"]
    assert store.get_progress(cluster, "n2").loss is None

    for step in (900, 80, 10000):  # numeric order, not lexical, and not insertion order
        store.put_checkpoint(cluster, CheckpointRecord(step, f"/ckpt/{step}", 1024, "ab" * 32, float(step)))
    assert [c.step for c in store.list_checkpoints(cluster)] == [80, 900, 10000]
    assert store.latest_checkpoint(cluster).path == "/ckpt/10000"
    assert store.get(f"/spotrun/{cluster}/checkpoints/000000000080") is not None

    segs = [LedgerSegment("n1", 0.1, 0.4, 0.0, 3600.0), LedgerSegment("n1", 0.12, 0.4, 3600.0)]
    store.put_ledger(cluster, "n1", segs)
    assert store.get_ledger(cluster, "n1") == segs and store.get_ledger(cluster, "n9") == []
    assert store.list_ledger(cluster) == {"n1": segs}


def test_unreadable_record_is_skipped_in_lists(store: Store, cluster: str) -> None:
    store.put_node(_node(cluster, "good"))
    store.put(f"/spotrun/{cluster}/nodes/bad", b"{not json")
    assert [n.id for n in store.list_nodes(cluster)] == ["good"]
    with pytest.raises(ControlPlaneError, match="unreadable NodeRecord"):
        store.get_node(cluster, "bad")


def test_cas(store: Store, cluster: str) -> None:
    k = f"/spotrun/{cluster}/rdzv/state"
    assert store.cas(k, None, b"v1")
    assert not store.cas(k, None, b"other")  # exists already
    value, rev = store.get(k)
    assert value == b"v1"
    assert store.cas(k, rev, b"v2")
    assert not store.cas(k, rev, b"stale")  # revision moved on
    assert store.get(k)[0] == b"v2"


def test_clusters_list_and_delete(store: Store, cluster: str) -> None:
    other = cluster + "-x"  # shares a prefix: deleting `cluster` must not touch it
    store.set_target(cluster, 1)
    store.set_target(other, 2)
    try:
        assert {cluster, other} <= set(store.list_clusters())
        assert store.delete_cluster(cluster) == 1
        assert cluster not in store.list_clusters() and store.get_target(other) == 2
    finally:
        store.delete_cluster(other)


def test_node_compare_and_set(store: Store, cluster: str) -> None:
    store.put_node(_node(cluster, "n1"))
    record, revision = store.get_node_revision(cluster, "n1")
    assert record == _node(cluster, "n1") and store.get_node_revision(cluster, "missing") is None
    leaving = _node(cluster, "n1", NodeState.LEAVING)
    assert store.cas_node(leaving, revision)
    assert not store.cas_node(_node(cluster, "n1", NodeState.FAILED), revision)  # someone wrote first
    assert store.get_node(cluster, "n1") == leaving


def test_launch_intents(store: Store, cluster: str) -> None:
    late = LaunchIntent("l-late", 2, ("n1",), at=20.0, standby=1)
    store.put_launch(cluster, late)
    store.put_launch(cluster, LaunchIntent("l-early", 1, at=10.0))
    assert [i.key for i in store.list_launches(cluster)] == ["l-early", "l-late"]  # oldest first
    found = store.get_launch(cluster, "l-late")
    assert (found.count, tuple(found.replaces), found.standby) == (2, ("n1",), 1)
    assert store.delete_launch(cluster, "l-late") and store.get_launch(cluster, "l-late") is None
    assert not store.delete_launch(cluster, "l-late")


def test_stopped_and_chaos_marks(store: Store, cluster: str) -> None:
    assert not store.is_stopped(cluster)
    store.mark_stopped(cluster, "budget max_total reached")
    assert store.is_stopped(cluster)
    assert json.loads(store.get(schema.key(cluster, Kind.STOPPED))[0])["reason"] == "budget max_total reached"

    assert store.chaos_start(cluster, 100.0) == 100.0
    assert store.chaos_start(cluster, 200.0) == 100.0  # a restarted controller keeps the clock
    assert not store.chaos_fired(cluster, ChaosMark.SCHEDULE, 0)
    store.mark_chaos_fired(cluster, ChaosMark.SCHEDULE, 0)
    assert store.chaos_fired(cluster, ChaosMark.SCHEDULE, 0)
    assert not store.chaos_fired(cluster, ChaosMark.TRACE, 0)  # the two lists count separately


def test_rendezvous_membership(store: Store, cluster: str) -> None:
    seen: list[tuple[str, str]] = []
    handle = store.watch_rdzv_waiting(cluster, lambda kind, node: seen.append((kind, node)))
    try:
        assert handle.connected.wait(5)
        store.put(schema.rdzv_key(cluster, cluster, RdzvPart.ALIVE, "n1"), b"{}")  # as the rendezvous writes it
        store.put(schema.rdzv_key(cluster, cluster, RdzvPart.WAITING, "n2"), b"{}")
        assert store.is_rdzv_member(cluster, "n1") and not store.is_rdzv_member(cluster, "n2")
        assert store.rdzv_waiting(cluster) == {"n2"}
        assert store.release_rdzv_member(cluster, "n1") and not store.release_rdzv_member(cluster, "n1")
        assert not store.is_rdzv_member(cluster, "n1")
        store.delete(schema.rdzv_key(cluster, cluster, RdzvPart.WAITING, "n2"))
        assert wait_until(lambda: len(seen) == 2)
    finally:
        handle.cancel()
    assert seen == [("put", "n2"), ("delete", "n2")]


def test_drop_live_state_keeps_the_history(store: Store, cluster: str) -> None:
    store.put_spec(cluster, {"name": cluster})
    store.set_target(cluster, 2)
    store.put_node(_node(cluster, "n1"))
    store.put_notice(cluster, Notice("n1", "aws", 2.0, 1.0))
    store.put_standby(cluster, "n1")
    store.put_progress(cluster, Progress("n1", 1, 1.0, 1, 1.0))
    store.put_checkpoint(cluster, CheckpointRecord(5, "/c", 1, "", 1.0))
    store.put_ledger(cluster, "n1", [LedgerSegment("n1", 0.1, 0.4, 0.0)])
    store.add_event(cluster, "join", "n1 joined", "n1")
    store.put_launch(cluster, LaunchIntent("l-1", 1))
    store.mark_stopped(cluster, "budget")
    store.mark_chaos_fired(cluster, ChaosMark.TRACE, 3)
    store.put(schema.rdzv_state_key(cluster, cluster), b"x")
    with store.alive(cluster, "n1", ttl=30):
        assert store.drop_live_state(cluster) == 10  # one key of each kind that is not history
    kinds = {schema.parse_key(cluster, k).kind for k, _, _ in store.cluster_keys(cluster)}
    assert kinds == {Kind.SPEC, Kind.CHECKPOINTS, Kind.LEDGER, Kind.EVENTS} == {k for k in Kind if k.is_history}


def test_watch_node_sees_only_its_own_record(store: Store, cluster: str) -> None:
    seen = _Collector()
    handle = store.watch_node(cluster, "n1", seen)
    try:
        assert handle.connected.wait(5)
        store.put_node(_node(cluster, "n10"))  # shares the prefix nodes/n1
        store.put_node(_node(cluster, "n1"))
        assert wait_until(lambda: len(seen.events) == 1)
        time.sleep(0.2)
    finally:
        handle.cancel()
    assert [e.key for e in seen.events] == [schema.key(cluster, Kind.NODES, "n1")]


def test_watch_standby_sees_the_activation(store: Store, cluster: str) -> None:
    store.put_standby(cluster, "n1")
    store.put_standby(cluster, "n11")
    seen = _Collector()
    handle = store.watch_standby(cluster, "n1", seen)
    try:
        assert handle.connected.wait(5) and store.is_standby(cluster, "n1")
        assert store.activate_standby(cluster, "n11") and store.activate_standby(cluster, "n1")
        assert wait_until(lambda: len(seen.events) == 1)
        time.sleep(0.2)
    finally:
        handle.cancel()
    assert [(e.kind, e.key) for e in seen.events] == [("delete", schema.key(cluster, Kind.STANDBY, "n1"))]
    assert not store.is_standby(cluster, "n1") and store.list_standby(cluster) == set()


# --- events -------------------------------------------------------------------------------


def test_events_seq_monotonic_under_concurrent_writers(
    store: Store, etcd_server: etcd_mod.EtcdProcess, cluster: str
) -> None:
    writers, per_writer = 6, 15
    got: list[Event] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        with store_mod.connect([etcd_server.endpoint]) as own:  # separate clients, like separate processes
            for j in range(per_writer):
                ev = own.add_event(cluster, "join", f"writer {i} #{j}", node=f"n{i}")
                with lock:
                    got.append(ev)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = writers * per_writer
    assert sorted(e.seq for e in got) == list(range(1, total + 1))
    listed = store.list_events(cluster)
    assert [e.seq for e in listed] == list(range(1, total + 1))
    assert all(a.at <= b.at + 0.5 for a, b in itertools.pairwise(listed))
    assert [e.seq for e in store.list_events(cluster, since=total - 3)] == [total - 2, total - 1, total]
    assert len(store.list_events(cluster, since=10, limit=5)) == 5
    # a shared client across threads works too
    threads = [threading.Thread(target=lambda: store.add_event(cluster, "x", "shared")) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e.seq for e in store.list_events(cluster, since=total)] == [total + 1, total + 2, total + 3, total + 4]


# --- liveness leases ----------------------------------------------------------------------


def test_lease_keepalive_keeps_key_and_expiry_removes_it(store: Store, cluster: str) -> None:
    ttl = 2  # etcd's minimum lease TTL is about 2 s
    keeper = store.alive(cluster, "n1", ttl=ttl)
    try:
        assert store.list_alive(cluster) == {"n1"}
        time.sleep(ttl * 1.6)  # longer than the TTL: only the keep-alive keeps it
        assert store.list_alive(cluster) == {"n1"}
    finally:
        keeper.stop(revoke=False)  # as if the agent died
    stopped = time.monotonic()
    assert wait_until(lambda: store.list_alive(cluster) == set(), timeout=ttl + 3)
    assert time.monotonic() - stopped > 0.5  # it expired, it was not revoked


def test_lease_revoke_removes_key_at_once(store: Store, cluster: str) -> None:
    with store.alive(cluster, "n2", ttl=30):
        assert store.list_alive(cluster) == {"n2"}
    assert store.list_alive(cluster) == set()


# --- watches ------------------------------------------------------------------------------


class _Collector:
    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self.arrived: dict[str, float] = {}

    def __call__(self, ev: WatchEvent) -> None:
        self.arrived.setdefault(ev.key, time.perf_counter())
        self.events.append(ev)


def test_watch_sees_put_and_delete_and_reports_latency(store: Store, cluster: str) -> None:
    seen = _Collector()
    prefix = schema.cluster_prefix(cluster)
    handle = store.watch_cluster(cluster, seen)
    try:
        assert handle.connected.wait(5), "watch stream not established"
        latencies = []
        for i in range(20):
            k = f"{prefix}progress/lat{i}"
            t0 = time.perf_counter()
            store.put(k, b"x")
            assert wait_until(lambda k=k: k in seen.arrived, 5.0), f"watch never saw {k}"
            latencies.append(seen.arrived[k] - t0)
        store.delete(f"{prefix}progress/lat0")
        assert wait_until(lambda: seen.events[-1].kind == "delete", 5.0)
    finally:
        handle.cancel()
    latencies.sort()
    print(f"\nwatch latency put->callback: median {latencies[10] * 1000:.2f} ms, max {latencies[-1] * 1000:.2f} ms")
    revs = [e.revision for e in seen.events]
    assert revs == sorted(set(revs))


def test_watch_from_revision_replays_history(store: Store, cluster: str) -> None:
    prefix = schema.cluster_prefix(cluster)
    first = store.put(prefix + "a", b"1")
    store.put(prefix + "b", b"2")
    seen = _Collector()
    handle = store.watch_prefix(prefix, seen, start_revision=first)
    try:
        assert wait_until(lambda: len(seen.events) == 2)
    finally:
        handle.cancel()
    assert [e.key for e in seen.events] == [prefix + "a", prefix + "b"]


def test_watch_cancel_stops_callbacks(store: Store, cluster: str) -> None:
    seen = _Collector()
    handle = store.watch_cluster(cluster, seen)
    assert handle.connected.wait(5)
    handle.cancel()
    handle.cancel()  # idempotent
    store.set_target(cluster, 5)
    time.sleep(0.3)
    assert seen.events == [] and not handle._thread.is_alive()


def test_watch_resyncs_after_compaction(store: Store, cluster: str) -> None:
    prefix = schema.cluster_prefix(cluster)
    start = store.put(prefix + "nodes/a", b"1")
    store.put(prefix + "nodes/a", b"2")
    last = store.put(prefix + "nodes/b", b"3")
    store.compact(last)
    seen = _Collector()
    handle = store.watch_prefix(prefix, seen, start_revision=start)
    try:
        assert wait_until(lambda: len(seen.events) >= 3)
        store.put(prefix + "nodes/c", b"4")
        assert wait_until(lambda: any(e.key.endswith("/c") for e in seen.events))
    finally:
        handle.cancel()
    kinds = [(e.kind, e.key.rsplit("/", 1)[-1], e.value) for e in seen.events]
    assert kinds[0][0] == "resync"
    assert kinds[1:] == [("put", "a", b"2"), ("put", "b", b"3"), ("put", "c", b"4")]


def test_watch_resumes_after_etcd_restart(etcd_process: etcd_mod.EtcdProcess, cluster: str) -> None:
    st = store_mod.connect([etcd_process.endpoint])
    prefix = schema.cluster_prefix(cluster)
    seen = _Collector()
    written: list[int] = []
    handle = st.watch_prefix(prefix, seen)
    try:
        for i in range(3):
            written.append(st.put(f"{prefix}nodes/before{i}", str(i)))
        assert wait_until(lambda: len(seen.events) == 3)

        etcd_process.stop()
        time.sleep(0.5)  # the watcher notices and starts retrying
        assert not handle.connected.is_set()
        etcd_process.restart()

        # A second client writes at once, before the watcher has necessarily resubscribed.
        with store_mod.connect([etcd_process.endpoint]) as other:
            for i in range(3):
                written.append(other.put(f"{prefix}nodes/after{i}", str(i)))
        # And the original client recovers as well (its endpoint may be marked failed for ~1 s).
        assert wait_until(lambda: _try_put(st, f"{prefix}nodes/late", written), timeout=10)
        assert wait_until(lambda: len(seen.events) >= len(written), timeout=10), (written, seen.events)
        time.sleep(0.2)
    finally:
        handle.cancel()
        st.close()
    revs = [e.revision for e in seen.events]
    assert revs == written, "events lost, duplicated or reordered across the restart"
    assert handle.reconnects >= 1


def _try_put(st: Store, key: str, written: list[int]) -> bool:
    try:
        written.append(st.put(key, b"x"))
        return True
    except ControlPlaneError:
        return False


# --- errors -------------------------------------------------------------------------------


def test_unreachable_endpoint_is_control_plane_error() -> None:
    port = etcd_mod.free_port()  # nothing listens here
    t0 = time.monotonic()
    with pytest.raises(ControlPlaneError) as info:
        store_mod.connect([f"http://127.0.0.1:{port}"], timeout=2.0)
    assert time.monotonic() - t0 < 5
    assert f"127.0.0.1:{port}" in str(info.value) and "spotrun etcd status" in str(info.value)
    assert info.value.exit_code == 4


def test_store_error_after_etcd_stops(etcd_process: etcd_mod.EtcdProcess, cluster: str) -> None:
    st = store_mod.connect([etcd_process.endpoint], timeout=2.0)
    try:
        st.set_target(cluster, 1)
        etcd_process.stop()
        t0 = time.monotonic()
        with pytest.raises(ControlPlaneError, match=str(etcd_process.client_port)):
            st.get_target(cluster)
        assert time.monotonic() - t0 < 5
    finally:
        st.close()


def test_bad_endpoint_is_control_plane_error() -> None:
    with pytest.raises(ControlPlaneError, match="bad etcd endpoint"):
        store_mod.connect(["ftp://nowhere"])


def test_importing_store_does_not_load_the_client() -> None:
    import subprocess
    import sys

    modules = "spotrun.state.store, spotrun.state.etcd, spotrun.state.watch, spotrun.state.schema"
    code = f"import {modules}, sys; print('pyetcd' in sys.modules, 'grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"
