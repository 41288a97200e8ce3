"""`spotrun tui [CLUSTER]`: watch and steer one cluster, live from etcd.

Entry points: `run(cluster, endpoints)` (what the CLI calls) and `python -m spotrun.tui.app
[CLUSTER] --endpoint URL`. All cluster state arrives through `spotrun.tui.feed.Feed` (a watch on
the cluster's keys in a thread worker). The connection and the actions go through
`spotrun.client.api`, the same path and core functions as the CLI's commands; the TUI never
talks to a cloud or a VM itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import ClassVar

from spotrun.tui.feed import Feed, LatestSlot
from spotrun.tui.model import Snapshot
from spotrun.tui.screens import ConfirmScreen, HelpScreen, LogScreen, PickerScreen, ScaleScreen
from spotrun.tui.widgets import Panel, WorkersTable, checkpoint_text, costs_text, title_text, training_text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Input, Log, Sparkline, Static
from textual.worker import get_current_worker

from spotrun.client import api
from spotrun.errors import SpotrunError
from spotrun.state.store import Store

PREEMPT_NOTICE_S = 30.0


class SnapshotReady(Message):
    """A new snapshot waits in the app's LatestSlot (at most one such message is ever queued)."""


class ActionDone(Message):
    def __init__(self, text: str, error: bool = False) -> None:
        super().__init__()
        self.text, self.error = text, error


class SpotrunApp(App[None]):
    CSS_PATH = "spotrun.tcss"
    TITLE = "spotrun"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", priority=True),
        Binding("s", "scale", "Scale"),
        Binding("d", "drain", "Drain"),
        Binding("p", "preempt", "Preempt"),
        Binding("l", "logs", "Log"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    disconnected: reactive[bool] = reactive(False)

    def __init__(
        self,
        endpoints: Sequence[str] = (),
        cluster: str | None = None,
        *,
        clock: Callable[[], float] = time.time,
        interval: float = 0.5,
        tick: float = 1.0,
    ) -> None:
        """`endpoints` empty: each cluster's own control plane (`spotrun.client.api.connect`)."""
        super().__init__()
        self.endpoints, self.cluster = tuple(endpoints), cluster
        self.clock, self.interval, self.tick = clock, interval, tick
        self.feed: Feed | None = None
        self.snapshot: Snapshot | None = None
        self.snapshots = 0  # how many snapshots were drawn (tests and the bench wait on it)
        self._slot = LatestSlot()
        self._last_event = 0

    # --- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Panel(id="title")
        yield Static(id="banner")
        with Horizontal(id="panels"):
            with Vertical(id="training", classes="panel"):
                yield Panel(id="training-text")
                yield Sparkline([], id="spark")
            yield Panel("costs", id="costs", classes="panel")
            yield Panel("checkpoint", id="checkpoint", classes="panel")
        with Vertical(id="workers-box"):
            yield WorkersTable(id="workers")
            yield Input(placeholder="filter workers: id, zone, type, state…", id="filter")
        yield Log(id="events", max_lines=500)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#training").border_title = "training"
        self.query_one("#events").border_title = "events"
        self.query_one("#title", Panel).show(title_text(None, self.cluster or "-"))
        self.set_focus(self.query_one(WorkersTable))
        if self.cluster is None:
            self.push_screen(PickerScreen(self._list_clusters), self._picked)
        else:
            self._start_feed()

    def _list_clusters(self) -> list[str]:
        return api.list_clusters(self.endpoints)

    def _picked(self, cluster: str | None) -> None:
        if cluster:
            self.cluster = cluster
            self.query_one("#title", Panel).show(title_text(None, cluster))
            self._start_feed()

    # --- the feed --------------------------------------------------------------------------

    def _start_feed(self) -> None:
        cluster, endpoints = self.cluster, self.endpoints
        assert cluster is not None
        self.feed = Feed(
            cluster,
            lambda: api.connect(cluster, endpoints),
            clock=self.clock,
            interval=self.interval,
            tick=self.tick,
        )
        self._watch_cluster(self.feed)

    @work(thread=True, exclusive=True, group="feed")
    def _watch_cluster(self, feed: Feed) -> None:
        worker = get_current_worker()

        def publish(snap: Snapshot) -> None:
            if self._slot.put(snap):  # only the first unread snapshot posts a message
                self.post_message(SnapshotReady())

        feed.run(lambda: worker.is_cancelled, publish)

    def on_snapshot_ready(self, _: SnapshotReady) -> None:
        snap = self._slot.take()
        if snap is None:
            return
        self.snapshot = snap
        self.disconnected = not snap.connected
        try:
            self._show(snap)
        except NoMatches:  # a snapshot that arrives while the app closes: there is no dashboard to draw on
            return
        self.snapshots += 1

    def _main(self) -> Screen[object]:
        """The dashboard's screen, under any modal screen (help, confirm, scale, log) pushed on it.
        Raises NoMatches while the app is closing and no screen is left."""
        if not self.screen_stack:
            raise NoMatches("no screen")
        return self.screen_stack[0]

    def _show(self, snap: Snapshot) -> None:
        main = self._main()
        if self.disconnected:
            main.query_one("#banner", Static).update(
                f"disconnected, retrying: {snap.error or 'etcd is unreachable'} (showing the last known state)"
            )
        main.query_one("#title", Panel).show(title_text(snap, snap.cluster))
        main.query_one("#training-text", Panel).show(training_text(snap))
        spark = main.query_one("#spark", Sparkline)
        if list(snap.history) != list(spark.data or []):
            spark.data = list(snap.history)
        main.query_one("#costs", Panel).show(costs_text(snap))
        main.query_one("#checkpoint", Panel).show(checkpoint_text(snap))
        main.query_one("#checkpoint").set_class(snap.checkpoints.stale, "-stale")
        main.query_one(WorkersTable).update_rows(snap.rows)
        log = main.query_one("#events", Log)
        for event in snap.events:
            if event.seq > self._last_event:
                stamp = time.strftime("%H:%M:%S", time.localtime(event.at))
                log.write_line(f"{stamp} {event.kind:<9} {event.message}")
                self._last_event = event.seq

    def watch_disconnected(self, disconnected: bool) -> None:
        try:
            self._main().query_one("#banner", Static).set_class(disconnected, "-visible")
        except NoMatches:  # not mounted yet, or already gone
            return

    # --- filter ----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "filter":
            # On other screens, or while typing in the filter, "/" is just a character.
            return self.screen is self.screen_stack[0] and self.focused is not self.query_one("#filter")
        return True

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("-visible")
        self.set_focus(box)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.query_one(WorkersTable).filter_text = event.value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            event.input.set_class(bool(event.value), "-visible")
            self.set_focus(self.query_one(WorkersTable))

    def on_key(self, event) -> None:
        box = self.query_one("#filter", Input)
        if event.key == "escape" and self.focused is box:
            box.value = ""
            box.remove_class("-visible")
            self.set_focus(self.query_one(WorkersTable))
            event.stop()

    # --- actions ---------------------------------------------------------------------------

    def _store(self) -> Store | None:
        store = self.feed.store if self.feed else None
        if store is None:
            self.notify("not connected to etcd yet", severity="error")
        return store

    def _selected(self):
        row = self.query_one(WorkersTable).selected_row
        if row is None:
            self.notify("no worker selected", severity="warning")
        return row

    def action_scale(self) -> None:
        if self._store() is None or self.cluster is None:
            return
        recipe = self.feed.state.recipe if self.feed else None
        limits = (recipe.nodes.min, recipe.nodes.max) if recipe else None
        current = self.snapshot.target if self.snapshot else None
        self.push_screen(ScaleScreen(current, limits), self._scale_to)

    def _scale_to(self, nodes: int | None) -> None:
        if nodes is not None:
            self._run_action("scale", nodes=nodes)

    def action_drain(self) -> None:
        row = self._selected()
        if row is None or self._store() is None:
            return
        self.push_screen(
            ConfirmScreen(f"Drain node {row.id}? Its work moves to the other nodes, then it is terminated."),
            self._if_confirmed("drain", row.id),
        )

    def action_preempt(self) -> None:
        row = self._selected()
        if row is None or self._store() is None:
            return
        if not api.can_preempt(row.provider):
            self.notify(
                f"preempt works with the local provider only; {row.id} runs on {row.provider}", severity="error"
            )
            return
        self.push_screen(
            ConfirmScreen(
                f"Preempt node {row.id} with a {PREEMPT_NOTICE_S:.0f} s notice? The VM dies at the deadline."
            ),
            self._if_confirmed("preempt", row.id),
        )

    def _if_confirmed(self, what: str, node: str) -> Callable[[bool | None], None]:
        """A ConfirmScreen's callback: run action `what` on `node` when the answer is yes."""

        def done(yes: bool | None) -> None:
            if yes:
                self._run_action(what, node=node)

        return done

    def action_logs(self) -> None:
        row = self._selected()
        if row is not None and self.cluster is not None:
            self.push_screen(LogScreen(self.cluster, row.id))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    @work(thread=True, group="actions")
    def _run_action(self, what: str, nodes: int = 0, node: str = "") -> None:
        """Blocking core calls, off the UI thread; the outcome comes back as an ActionDone message."""
        store, cluster = self.feed.store if self.feed else None, self.cluster
        if store is None or cluster is None:
            return
        try:
            if what == "scale":
                change = api.scale(store, cluster, nodes)
                text = f"target {change.before if change.before is not None else 'unset'} -> {change.after}"
            elif what == "drain":
                api.drain(store, cluster, node)
                text = f"{node}: drain requested"
            else:
                deadline = api.preempt(cluster, node, PREEMPT_NOTICE_S)
                text = f"{node}: preemption notice armed, {max(0, deadline - time.time()):.0f} s left"
            self.post_message(ActionDone(text))
        except SpotrunError as exc:
            self.post_message(ActionDone(f"{what} failed: {exc}", error=True))

    def on_action_done(self, message: ActionDone) -> None:
        self.notify(
            message.text, severity="error" if message.error else "information", timeout=8 if message.error else 4
        )


def run(cluster: str | None, endpoints: list[str] | None = None) -> None:
    """Run the TUI in this terminal until the user quits. Blocking.

    `cluster` None shows a picker. `endpoints` None: the cluster's own control plane, reached as
    `spotrun status` reaches it (recorded external etcd, SSH tunnel to a head VM), else the
    embedded etcd. Raises ControlPlaneError if none is known; an unreachable etcd is shown in
    the app (with retries), not raised.
    """
    api.require_control_plane(cluster, endpoints or ())
    SpotrunApp(endpoints or (), cluster).run()


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m spotrun.tui.app", description="spotrun's terminal UI")
    parser.add_argument("cluster", nargs="?", help="cluster to watch (default: pick one)")
    parser.add_argument("--endpoint", action="append", help="etcd endpoint http://HOST:PORT (repeatable)")
    args = parser.parse_args(argv)
    try:
        run(args.cluster, args.endpoint)
    except SpotrunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
