"""The TUI's plain-data layer (no terminal) and the core actions it triggers (spotrun.controller.scaling)."""

from __future__ import annotations

import pytest
from spotrun.tui.feed import LatestSlot
from spotrun.tui.model import ClusterState, Snapshot, arrange, total_steps

from spotrun.controller import scaling
from spotrun.errors import NotFoundError, SpotrunError
from spotrun.fmt import duration
from spotrun.state.records import CheckpointRecord, NodeRecord, NodeState, Notice, Progress, encode
from spotrun.state.schema import Kind, cluster_prefix, key
from spotrun.state.watch import WatchEvent

NOW = 1_700_000_000.0
C = "m"


def put(state: ClusterState, k: str, value: bytes | str, rev: int) -> None:
    state.apply(WatchEvent("put", k, value.encode() if isinstance(value, str) else value, rev))


def make_state() -> ClusterState:
    s = ClusterState(C)
    put(
        s,
        key(C, Kind.SPEC),
        '{"name": "m", "resources": [{"provider": "local", "instance_type": "t"}],'
        ' "run": "python t.py --steps 1000", "checkpoint": {"every_seconds": 60},'
        ' "budget": {"max_per_hour": 2.0}, "nodes": {"min": 1, "max": 4}}',
        1,
    )
    for i, zone in enumerate(["z-b", "z-a", "z-c"]):
        put(
            s,
            key(C, Kind.NODES, f"n{i}"),
            encode(
                NodeRecord(
                    f"n{i}",
                    C,
                    "local",
                    zone,
                    "t",
                    0.1 * (i + 1),
                    1.0,
                    state=NodeState.RUNNING,
                    launched_at=NOW - 100 * i,
                )
            ),
            2 + i,
        )
        put(s, key(C, Kind.LEDGER, f"n{i}"), encode_segments(i), 10 + i)
    return s


def encode_segments(i: int) -> str:
    import json

    return json.dumps(
        [{"node": f"n{i}", "price_per_hour": 0.5, "on_demand_per_hour": 2.0, "start": NOW - 3600, "end": None}]
    )


def test_progress_gives_rates_eta_and_history_free_snapshot():
    s = make_state()
    put(s, key(C, Kind.PROGRESS, "n0"), encode(Progress("n0", 100, 50.0, 3, NOW - 10, 2.5)), 20)
    put(s, key(C, Kind.PROGRESS, "n0"), encode(Progress("n0", 120, 50.0, 3, NOW, 2.4)), 21)
    put(s, key(C, Kind.PROGRESS, "n1"), encode(Progress("n1", 119, 40.0, 3, NOW, 2.4)), 22)
    snap = s.build(NOW)
    t = snap.training
    assert (t.step, t.world_size, t.loss, t.total_steps) == (120, 3, 2.4, 1000)
    assert t.steps_per_s == pytest.approx(2.0) and t.samples_per_s == pytest.approx(90.0)
    assert t.eta_s == pytest.approx((1000 - 120) / 2.0)
    assert snap.costs.summary.burn_per_hour == pytest.approx(1.5)
    assert snap.costs.budget_used == pytest.approx(0.75)  # 1.5 $/h of a 2 $/h cap
    assert snap.costs.summary.savings_pct == pytest.approx(75.0)
    row = {r.id: r for r in snap.rows}["n0"]
    assert row.steps_per_s == pytest.approx(2.0) and row.cells()[3] == "running?"  # no liveness key


def test_stale_events_never_move_a_key_backwards_and_deletes_remove_rows():
    s = make_state()
    newer = NodeRecord("n0", C, "local", "z-b", "t", 0.1, 1.0, state=NodeState.LEAVING)
    put(s, key(C, Kind.NODES, "n0"), encode(newer), 50)
    older = NodeRecord("n0", C, "local", "z-b", "t", 0.1, 1.0, state=NodeState.BOOTING)
    put(s, key(C, Kind.NODES, "n0"), encode(older), 3)  # replayed from before the listing
    assert {r.id: r.state for r in s.build(NOW).rows}["n0"] == "leaving"
    s.apply(WatchEvent("delete", key(C, Kind.NODES, "n1"), b"", 60))
    assert sorted(r.id for r in s.build(NOW).rows) == ["n0", "n2"]
    s.apply(WatchEvent("resync", cluster_prefix(C), b"", 70))
    assert s.build(NOW).rows == ()


def test_notice_countdown_and_tone():
    s = make_state()
    put(s, key(C, Kind.NOTICES, "n2"), encode(Notice("n2", "gcp", NOW + 30.7, NOW)), 30)
    put(s, key(C, Kind.ALIVE, "n2"), "{}", 31)
    row = {r.id: r for r in s.build(NOW).rows}["n2"]
    assert row.cells()[3] == "notice 30s" and row.tone == "notice"
    put(
        s,
        key(C, Kind.NODES, "n2"),
        encode(NodeRecord("n2", C, "local", "z-c", "t", 0.3, 1.0, state=NodeState.PREEMPTED)),
        32,
    )
    row = {r.id: r for r in s.build(NOW).rows}["n2"]
    assert row.cells()[3] == "preempted" and row.tone == "gone"


def test_checkpoint_staleness_follows_the_recipe_interval():
    s = make_state()
    put(s, key(C, Kind.CHECKPOINTS, 100), encode(CheckpointRecord(100, "/c", 10, "0" * 64, NOW - 30)), 40)
    assert not s.build(NOW).checkpoints.stale
    c = s.build(NOW + 61).checkpoints
    assert c.stale and c.verified and c.latest.step == 100
    put(s, key(C, Kind.CHECKPOINTS, 200), encode(CheckpointRecord(200, "/c", 10, "", NOW + 60)), 41)
    c = s.build(NOW + 61).checkpoints
    assert not c.stale and not c.verified and c.count == 2


def test_arrange_sorts_and_filters():
    rows = make_state().build(NOW).rows
    assert [r.id for r in arrange(rows)] == ["n0", "n1", "n2"]
    assert [r.id for r in arrange(rows, sort=1)] == ["n1", "n0", "n2"]  # by zone
    assert [r.id for r in arrange(rows, sort=6, reverse=True)] == ["n2", "n1", "n0"]  # by $/h
    assert [r.id for r in arrange(rows, query="Z-C")] == ["n2"]
    assert arrange(rows, query="nothing") == []


def test_latest_slot_keeps_only_the_newest():
    slot = LatestSlot()
    first, second = Snapshot.empty("a", 1.0), Snapshot.empty("a", 2.0)
    assert slot.put(first) is True
    assert slot.put(second) is False  # replaced, no second notification
    assert slot.take() is second and slot.take() is None


def test_helpers():
    assert total_steps("torchrun x.py --max-steps=500") == 500
    assert total_steps("python x.py") is None
    assert duration(59) == "0m59s" and duration(3700) == "1h01m" and duration(None) == "-"


# --- spotrun.controller.scaling against the real etcd ---------------------------------------------------


def test_set_target_validates_and_records_an_event(store, cluster):
    with pytest.raises(NotFoundError):
        scaling.set_target(store, cluster, 3)
    resources = [{"provider": "local", "instance_type": "t"}]
    store.put_spec(
        cluster, {"name": cluster, "resources": resources, "nodes": {"min": 2, "max": 4}, "run": "python t.py"}
    )
    with pytest.raises(SpotrunError, match=r"target \(5\) must be between nodes.min \(2\) and nodes.max \(4\)"):
        scaling.set_target(store, cluster, 5)
    assert store.get_target(cluster) is None
    change = scaling.set_target(store, cluster, 3)
    assert (change.before, change.after) == (None, 3) and store.get_target(cluster) == 3
    scaling.set_target(store, cluster, 3)  # idempotent: no second event
    assert [e.message for e in store.list_events(cluster)] == ["target unset -> 3 nodes"]


def test_drain_marks_leaving_once(store, cluster):
    with pytest.raises(NotFoundError):
        scaling.drain(store, cluster, "vm-0")
    store.put_node(NodeRecord("vm-0", cluster, "local", "z", "t", 0.1, 0.4, state=NodeState.RUNNING))
    store.put_node(NodeRecord("vm-1", cluster, "local", "z", "t", 0.1, 0.4, state=NodeState.TERMINATED))
    assert scaling.drain(store, cluster, "vm-0").state == NodeState.LEAVING
    scaling.drain(store, cluster, "vm-0")
    got = store.get_node(cluster, "vm-0")
    assert (got.state, got.reason) == (NodeState.LEAVING, "drain requested")
    assert [e.kind for e in store.list_events(cluster)] == ["drain"]
    with pytest.raises(SpotrunError, match="already terminated"):
        scaling.drain(store, cluster, "vm-1")
