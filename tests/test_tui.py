"""The TUI against a real etcd: Pilot tests of what it shows and writes, plus SVG snapshots.

pytest-textual-snapshot 1.1 pins a syrupy that needs pytest < 9, so the snapshot check here is our
own: `app.export_screenshot()` compared with tests/snapshots/*.svg; SPOTRUN_UPDATE_SNAPSHOTS=1
rewrites them (review the SVGs in a browser before committing).
"""

from __future__ import annotations

import asyncio
import functools
import io
import os
import time
from pathlib import Path

import pytest
from spotrun.tui.app import SpotrunApp
from spotrun.tui.screens import ConfirmScreen
from spotrun.tui.widgets import WorkersTable

from spotrun.errors import ControlPlaneError
from spotrun.state.records import (
    CheckpointRecord,
    Event,
    LedgerSegment,
    NodeRecord,
    NodeState,
    Notice,
    Progress,
    encode,
)
from spotrun.state.schema import Kind, key
from spotrun.state.store import Store, connect

SNAPSHOTS = Path(__file__).parent / "snapshots"
SPEC = {
    "name": "demo",
    "resources": [{"provider": "local", "instance_type": "cpu-small"}],
    "run": "python train.py --steps 5000",
    "nodes": {"min": 2, "max": 8, "target": 4},
    "checkpoint": {"every_steps": 100},
    "budget": {"max_total": 50.0},
}


def sync(fn):
    """Run an async test body under asyncio.run (no async pytest plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


def node(cluster: str, i: int, now: float, state: NodeState = NodeState.RUNNING, zone: str = "lo-a") -> NodeRecord:
    return NodeRecord(
        f"vm-{i}",
        cluster,
        "local",
        zone,
        "cpu-small",
        0.12,
        0.40,
        ip="127.0.0.1",
        state=state,
        launched_at=now - 600 * (i + 1),
    )


def populate(store: Store, cluster: str, now: float, count: int = 4) -> None:
    """A realistic running cluster: spec, target, nodes (one noticed), progress, ledger, a checkpoint, events."""
    store.put_spec(cluster, dict(SPEC, name=cluster))
    store.set_target(cluster, count)
    for i in range(count):
        n = node(cluster, i, now, NodeState.NOTICE if i == 2 else NodeState.RUNNING, "lo-a" if i % 2 == 0 else "lo-b")
        store.put_node(n)
        store.put_progress(cluster, Progress(n.id, 1200 + i, 250.0 + i, count, now - 1, 2.3125))
        store.put_ledger(cluster, n.id, [LedgerSegment(n.id, 0.12, 0.40, now - 3600)])
        if i != 3:
            store.alive(cluster, n.id, ttl=30)  # vm-3's agent is gone: its row shows "running?"
    store.put_notice(cluster, Notice("vm-2", "aws", now + 45, now - 5))
    store.put_checkpoint(cluster, CheckpointRecord(1100, "/ckpt/1100", 123_456_789, "ab" * 32, now - 121))
    for seq, (kind, message) in enumerate(
        [
            ("launch", "launching 4 x local cpu-small"),
            ("join", "agent on vm-0 registered"),
            ("notice", "vm-2: aws preemption notice, 45 s left"),
        ],
        start=1,
    ):
        store.put(key(cluster, Kind.EVENTS, seq), encode(Event(seq, now - 300 + seq, kind, message)))


async def wait_for(pilot, condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def screen_text(app) -> str:
    """The current screen as plain text, as a terminal would show it."""
    from rich.console import Console

    console = Console(
        width=app.size.width,
        height=app.size.height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def ids(app) -> list[str]:
    return [r.id for r in app.query_one(WorkersTable).rows]


def app_for(endpoint: str, cluster: str | None, **kwargs) -> SpotrunApp:
    return SpotrunApp([endpoint], cluster, interval=0.05, tick=0.2, **kwargs)


# --- rows follow the keys --------------------------------------------------------------------


@sync
async def test_rows_appear_update_and_disappear(etcd_server, store, cluster):
    now = time.time()
    populate(store, cluster, now)
    app = app_for(etcd_server.endpoint, cluster)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: ids(app) == ["vm-0", "vm-1", "vm-2", "vm-3"], what="4 rows")
        text = screen_text(app)
        assert "vm-3" in text and "notice 4" in text  # vm-2's countdown (45 s at most)
        assert "1,203/5,000" in text  # newest step of the cluster / the run's --steps

        store.put_node(node(cluster, 7, now, NodeState.BOOTING))
        await wait_for(pilot, lambda: "vm-7" in ids(app), what="new row")
        await wait_for(pilot, lambda: "booting" in screen_text(app), what="booting row drawn")

        store.put_node(node(cluster, 7, now, NodeState.LEAVING))
        await wait_for(
            pilot,
            lambda: any(r.id == "vm-7" and r.state == "leaving" for r in app.query_one(WorkersTable).rows),
            what="row update",
        )
        await wait_for(pilot, lambda: "leaving" in screen_text(app), what="leaving drawn")

        store.delete_node(cluster, "vm-0")
        await wait_for(pilot, lambda: "vm-0" not in ids(app), what="row removed")
        assert "vm-0 " not in screen_text(app).split("events")[0]


@sync
async def test_only_changed_lines_repaint(etcd_server, store, cluster):
    now = time.time()
    populate(store, cluster, now, count=30)
    app = app_for(etcd_server.endpoint, cluster, clock=lambda: now)  # frozen clock: uptimes stay put
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(ids(app)) == 30, what="30 rows")
        await pilot.pause(0.3)
        table = app.query_one(WorkersTable)
        rendered = []
        original = table._render_key
        table._render_key = lambda k: rendered.append(k) or original(k)  # count fresh (uncached) renders
        painted = []
        render_line = table.render_line
        table.render_line = lambda y: painted.append(y) or render_line(y)
        store.put_node(node(cluster, 1, now, NodeState.LEAVING, "lo-b"))
        await wait_for(pilot, lambda: any(r.id == "vm-1" and r.state == "leaving" for r in table.rows), what="update")
        await pilot.pause(0.3)
        assert [k[1][0] for k in rendered if k[0] == "row"] == ["vm-1"]
        assert painted and set(painted) == {2}, painted  # vm-1 is the second row, under the header


# --- sort and filter ---------------------------------------------------------------------------


@sync
async def test_sort_by_keys_and_header_click(etcd_server, store, cluster):
    populate(store, cluster, time.time())
    app = app_for(etcd_server.endpoint, cluster)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(ids(app)) == 4, what="rows")
        await pilot.press("r")  # reverse the id order
        assert ids(app) == ["vm-3", "vm-2", "vm-1", "vm-0"]
        for _ in range(4):  # node -> provider/zone -> type -> state -> up
            await pilot.press("o")
        assert app.query_one(WorkersTable).sort_column == 4
        assert ids(app) == ["vm-3", "vm-2", "vm-1", "vm-0"]  # reversed uptime: vm-3 launched first
        await pilot.press("r")
        assert ids(app) == ["vm-0", "vm-1", "vm-2", "vm-3"]
        table = app.query_one(WorkersTable)
        state_x = sum(w + 1 for w in table._widths[:3]) + 1
        await pilot.click(WorkersTable, offset=(state_x, 0))  # the "state" header
        assert table.sort_column == 3 and ids(app)[0] == "vm-2"  # notice sorts first
        assert "state▲" in screen_text(app)


@sync
async def test_filter_with_slash(etcd_server, store, cluster):
    populate(store, cluster, time.time())
    app = app_for(etcd_server.endpoint, cluster)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(ids(app)) == 4, what="rows")
        await pilot.press("slash", "l", "o", "-", "b", "enter")  # a fast burst, as a user types
        assert ids(app) == ["vm-1", "vm-3"]
        assert app.focused is app.query_one(WorkersTable)
        await pilot.press("slash")
        assert app.focused is app.query_one("#filter")
        await pilot.press("escape")
        assert ids(app) == ["vm-0", "vm-1", "vm-2", "vm-3"]
        assert app.focused is app.query_one(WorkersTable)


@sync
async def test_the_dashboard_keeps_updating_under_a_modal_screen(etcd_server, store, cluster):
    populate(store, cluster, time.time())
    app = app_for(etcd_server.endpoint, cluster)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(ids(app)) == 4, what="rows")
        await pilot.press("question_mark")
        assert app.screen is not app.screen_stack[0], "the help screen is on top"
        seen = app.snapshots
        store.set_target(cluster, 6)  # a change in etcd: the feed posts a new snapshot
        await wait_for(pilot, lambda: app.snapshots > seen, what="a snapshot drawn under the help screen")
        assert app.snapshot is not None and app.snapshot.target == 6


# --- actions write the right keys -------------------------------------------------------------


@sync
async def test_scale_writes_target_and_event(etcd_server, store, cluster):
    populate(store, cluster, time.time())
    app = app_for(etcd_server.endpoint, cluster)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None and app.snapshot.target == 4, what="target")
        await pilot.press("s")
        await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "target", what="dialog")
        await pilot.press("backspace", "9", "enter")  # above nodes.max (8): refused in the dialog
        assert "9 is outside nodes.min..nodes.max (2-8)" in screen_text(app)
        assert store.get_target(cluster) == 4
        await pilot.press("backspace", "6", "enter")
        await wait_for(pilot, lambda: store.get_target(cluster) == 6, what="target written")
        events = store.list_events(cluster)
        assert events[-1].kind == "scale" and events[-1].message == "target 4 -> 6 nodes"
        await wait_for(pilot, lambda: "target 4 -> 6 nodes" in screen_text(app), what="event in the log")


@sync
async def test_drain_asks_then_writes_leaving(etcd_server, store, cluster):
    populate(store, cluster, time.time())
    app = app_for(etcd_server.endpoint, cluster)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(ids(app)) == 4, what="rows")
        await pilot.press("down", "d")
        await pilot.pause(0.1)
        assert "Drain node vm-1?" in screen_text(app)
        await pilot.press("n")  # cancelled: nothing written
        await pilot.pause(0.2)
        assert store.get_node(cluster, "vm-1").state == NodeState.RUNNING
        await pilot.press("d")
        await pilot.pause(0.1)
        await pilot.press("y")
        await wait_for(pilot, lambda: store.get_node(cluster, "vm-1").state == NodeState.LEAVING, what="drain")
        assert store.get_node(cluster, "vm-1").reason == "drain requested"
        assert store.list_events(cluster)[-1].kind == "drain"
        assert store.get_node(cluster, "vm-0").state == NodeState.RUNNING
        await wait_for(pilot, lambda: "leaving" in screen_text(app), what="leaving row")


@sync
async def test_preempt_refused_off_the_local_provider(etcd_server, store, cluster):
    now = time.time()
    populate(store, cluster, now, count=1)
    store.put_node(NodeRecord("vm-0", cluster, "aws", "us-east-1a", "p4d", 9.0, 32.0, state=NodeState.RUNNING))
    app = app_for(etcd_server.endpoint, cluster)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(
            pilot, lambda: any(r.provider == "aws" for r in app.query_one(WorkersTable).rows), what="aws row"
        )
        await pilot.press("p")
        await wait_for(
            pilot, lambda: any("local provider only" in n.message for n in app._notifications), what="refusal shown"
        )
        assert not isinstance(app.screen, ConfirmScreen)
        assert store.get_notice(cluster, "vm-0") is None


# --- connection ---------------------------------------------------------------------------------


@sync
async def test_disconnect_banner_and_recovery(etcd_process, cluster):
    with connect([etcd_process.endpoint]) as st:
        populate(st, cluster, time.time())
    app = app_for(etcd_process.endpoint, cluster)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(ids(app)) == 4, what="rows")
        assert "disconnected" not in screen_text(app)
        await asyncio.to_thread(etcd_process.stop)
        await wait_for(pilot, lambda: "disconnected, retrying" in screen_text(app), what="banner")
        assert len(ids(app)) == 4  # the last known state stays on screen
        await asyncio.to_thread(etcd_process.start)
        await wait_for(pilot, lambda: "disconnected" not in screen_text(app), timeout=15, what="banner cleared")
        with connect([etcd_process.endpoint]) as st:
            st.put_node(node(cluster, 9, time.time()))
        await wait_for(pilot, lambda: "vm-9" in ids(app), what="updates after the restart")


@sync
async def test_picker_when_no_cluster_named(etcd_server, store, cluster):
    populate(store, cluster, time.time())
    app = app_for(etcd_server.endpoint, None)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: cluster in screen_text(app), what="cluster listed")
        from textual.widgets import OptionList

        options = app.screen.query_one(OptionList)
        names = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        options.highlighted = names.index(cluster)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(ids(app)) == 4, what="rows of the picked cluster")
        assert app.cluster == cluster


def test_run_refuses_when_no_control_plane_is_known(tmp_path, monkeypatch):
    from spotrun.tui.app import run

    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path))  # no cluster record, no embedded etcd
    with pytest.raises(ControlPlaneError, match="the embedded etcd is not running and no endpoint was given"):
        run("nowhere")


# --- snapshots ----------------------------------------------------------------------------------

SNAP_CLUSTER = "snap-demo"
SNAP_NOW = 1_700_000_000.0


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
@sync
async def test_snapshot(etcd_server, size, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    with connect([etcd_server.endpoint]) as st:
        st.delete_cluster(SNAP_CLUSTER)
        populate(st, SNAP_CLUSTER, SNAP_NOW, count=6 if size[1] < 40 else 12)
        try:
            app = app_for(etcd_server.endpoint, SNAP_CLUSTER, clock=lambda: SNAP_NOW)
            async with app.run_test(size=size) as pilot:
                await wait_for(
                    pilot, lambda: len(ids(app)) >= 6 and app.query_one("#events").line_count == 3, what="state drawn"
                )
                await pilot.pause(0.3)
                svg = app.export_screenshot(title="spotrun")
                text = screen_text(app)
        finally:
            st.delete_cluster(SNAP_CLUSTER)
    time.tzset()
    name = f"tui_main_{size[0]}x{size[1]}"
    check_snapshot(name, svg, text)


def check_snapshot(name: str, svg: str, text: str) -> None:
    svg_path, text_path = SNAPSHOTS / f"{name}.svg", SNAPSHOTS / f"{name}.txt"
    if os.environ.get("SPOTRUN_UPDATE_SNAPSHOTS") == "1" or not svg_path.exists():
        if os.environ.get("SPOTRUN_UPDATE_SNAPSHOTS") != "1":
            pytest.fail(f"no snapshot {svg_path.name}; run with SPOTRUN_UPDATE_SNAPSHOTS=1 to create it")
        SNAPSHOTS.mkdir(exist_ok=True)
        svg_path.write_text(svg)
        text_path.write_text(text)
        return
    expected_text = text_path.read_text()
    assert text == expected_text, "screen text differs from the snapshot:\n" + text
    assert svg == svg_path.read_text(), f"colours or styles differ from {svg_path.name} (text is equal)"
