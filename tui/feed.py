"""The TUI's one link to etcd: list a cluster, watch it, hand over only the latest Snapshot.

`Feed.run()` blocks (the app runs it in a thread worker). Watch events only update
`ClusterState`; snapshots are built at most every `interval` seconds and at least every `tick`
(countdowns, uptimes and cost totals move with time). `LatestSlot` holds one snapshot: a newer one
replaces an unread one, so a burst of etcd updates can never queue up in front of the UI.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from spotrun.tui.model import ClusterState, Snapshot

from spotrun.errors import ControlPlaneError
from spotrun.state.store import Store
from spotrun.state.watch import WatchHandle

HISTORY_POINTS = 120


class LatestSlot:
    """A one-item mailbox. `put` replaces any unread item and says whether the slot was empty."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._item: Snapshot | None = None

    def put(self, item: Snapshot) -> bool:
        with self._lock:
            was_empty = self._item is None
            self._item = item
            return was_empty

    def take(self) -> Snapshot | None:
        with self._lock:
            item, self._item = self._item, None
            return item


class Feed:
    """Watches one cluster and publishes snapshots until cancelled.

    `store` is the connected Store (None until etcd answered once); actions may use it from any
    thread. Connection loss is reported in the snapshot (`connected=False`, `error`), and the
    watch resumes where it stopped when etcd returns.
    """

    def __init__(
        self,
        cluster: str,
        connect: Callable[[], Store],
        *,
        clock: Callable[[], float] = time.time,
        interval: float = 0.25,
        tick: float = 1.0,
        retry: float = 1.0,
    ) -> None:
        """`connect()` opens the cluster's store (blocking; raises ControlPlaneError); called until it succeeds."""
        self.cluster, self._connect = cluster, connect
        self.clock, self.interval, self.tick, self.retry = clock, interval, tick, retry
        self.state = ClusterState(cluster)
        self.store: Store | None = None
        self._watch: WatchHandle | None = None
        self._dirty = threading.Event()
        self._history: deque[float] = deque(maxlen=HISTORY_POINTS)
        self._last_point = 0.0

    def _on_event(self, event) -> None:
        self.state.apply(event)
        self._dirty.set()

    def _start(self) -> None:
        """Connect, list the cluster and start the watch. Raises ControlPlaneError."""
        if self.store is None:
            self.store = self._connect()
        revision = self.store.revision()
        self.state.load(self.store.cluster_keys(self.cluster), revision)
        self._watch = self.store.watch_cluster(self.cluster, self._on_event, start_revision=revision + 1)

    def connected(self) -> bool:
        watch = self._watch
        if watch is None:
            return False
        # Before the first stream is up (reconnects == 0) the listing just succeeded: count as connected.
        return watch.connected.is_set() or watch.reconnects == 0

    def run(self, cancelled: Callable[[], bool], publish: Callable[[Snapshot], None]) -> None:
        """Block until `cancelled()` is true, calling `publish` with each new snapshot."""
        try:
            self._run(cancelled, publish)
        finally:
            self.close()

    def _run(self, cancelled: Callable[[], bool], publish: Callable[[Snapshot], None]) -> None:
        error = ""
        while self._watch is None and not cancelled():
            try:
                self._start()
            except ControlPlaneError as exc:
                error = str(exc.message)
                publish(Snapshot.empty(self.cluster, self.clock(), connected=False, error=error))
                time.sleep(self.retry)
        last_publish, was_connected = 0.0, None
        while not cancelled():
            self._dirty.wait(self.tick)
            connected = self.connected()
            now = time.monotonic()
            if connected == was_connected and not self._dirty.is_set() and now - last_publish < self.tick:
                continue
            wait = self.interval - (now - last_publish)
            if wait > 0 and connected == was_connected:
                time.sleep(wait)  # coalesce a burst of updates into one snapshot
            self._dirty.clear()
            snap = self._build(connected)
            was_connected, last_publish = connected, time.monotonic()
            publish(snap)

    def _build(self, connected: bool) -> Snapshot:
        now = self.clock()
        endpoints = self.store.endpoints if self.store is not None else []  # a tunnel's local end for a head VM
        error = "" if connected else f"etcd at {', '.join(endpoints)} is unreachable"
        snap = self.state.build(now, connected, error, self._history)
        if connected and now - self._last_point >= 1.0:
            self._history.append(snap.training.samples_per_s)
            self._last_point = now
            snap = replace(snap, history=tuple(self._history))
        return snap

    def close(self) -> None:
        """Stop the watch and close the connection. Idempotent."""
        if self._watch is not None:
            self._watch.cancel()
        if self.store is not None:
            self.store.close()
