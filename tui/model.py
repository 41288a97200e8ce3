"""What the TUI shows, as plain data: a cluster's keys folded into one immutable Snapshot.

No Textual here. `ClusterState` applies etcd watch events (thread-safe) and `build()` turns the
state into a `Snapshot` at a given time; `arrange()` sorts and filters worker rows. Widgets only
draw what these return, so everything here is unit-testable without a terminal.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spotrun.client.api import steps_from_run
from spotrun.errors import ControlPlaneError
from spotrun.fmt import duration
from spotrun.state.ledger import CostSummary, summarize
from spotrun.state.records import (
    CheckpointRecord,
    Event,
    LedgerSegment,
    NodeRecord,
    NodeState,
    Notice,
    Progress,
    decode,
    from_dict,
)
from spotrun.state.schema import Kind, parse_key
from spotrun.state.spec import decode_spec
from spotrun.state.watch import WatchEvent

if TYPE_CHECKING:
    from spotrun.recipe.schema import Recipe

GONE = frozenset(s.value for s in NodeState if s.is_gone)  # row states (text) of VMs that can never run again
STATE_ORDER = {
    s: i
    for i, s in enumerate(
        ["notice", "leaving", "booting", "bootstrapping", "running", "standby", "preempted", "failed", "terminated"]
    )
}
# A node's throughput counts towards the cluster's while its last report is this recent.
FRESH_S = 30.0
MAX_EVENTS = 200


@dataclass(frozen=True)
class WorkerRow:
    id: str
    provider: str
    zone: str
    instance_type: str
    state: str
    reason: str
    alive: bool
    uptime_s: float | None
    steps_per_s: float | None
    price_per_hour: float
    notice_left_s: float | None  # seconds to the preemption deadline, None without a notice

    def cells(self) -> tuple[str, ...]:
        """The row as display strings, in COLUMNS order."""
        state = self.state
        if self.notice_left_s is not None and self.state not in GONE:
            state = f"notice {int(self.notice_left_s)}s"
        elif self.state not in GONE and not self.alive and self.state in ("running", "standby"):
            state = "running?"  # the agent's liveness lease is gone
        rate = "-" if self.steps_per_s is None else f"{self.steps_per_s:.2f}"
        return (
            self.id,
            f"{self.provider}/{self.zone}" if self.zone else self.provider,
            self.instance_type or "-",
            state,
            duration(self.uptime_s),
            rate,
            f"{self.price_per_hour:.3f}",
        )

    @property
    def tone(self) -> str:
        """Colour class of the row: running, standby, booting, notice, leaving or gone."""
        if self.state in GONE:
            return "gone"
        if self.notice_left_s is not None or self.state == "notice":
            return "notice"
        if self.state in ("booting", "bootstrapping"):
            return "booting"
        return self.state if self.state in ("running", "leaving", "standby") else "booting"


# (title, WorkerRow sort key); cells() returns the same order.
COLUMNS: tuple[tuple[str, Any], ...] = (
    ("node", lambda r: r.id),
    ("provider/zone", lambda r: (r.provider, r.zone)),
    ("type", lambda r: r.instance_type),
    ("state", lambda r: (STATE_ORDER.get(r.state, 99), r.notice_left_s or 0.0)),
    ("up", lambda r: r.uptime_s or 0.0),
    ("step/s", lambda r: -1.0 if r.steps_per_s is None else r.steps_per_s),
    ("$/h", lambda r: r.price_per_hour),
)


def arrange(rows: Sequence[WorkerRow], sort: int = 0, reverse: bool = False, query: str = "") -> list[WorkerRow]:
    """Rows matching `query` (case-insensitive substring of any cell), sorted by column `sort`, ties by id."""
    q = query.strip().lower()
    picked = [r for r in rows if any(q in c.lower() for c in r.cells())] if q else list(rows)
    keyf = COLUMNS[sort][1]
    picked.sort(key=lambda r: r.id)
    picked.sort(key=keyf, reverse=reverse)
    return picked


@dataclass(frozen=True)
class Training:
    step: int | None
    world_size: int | None
    samples_per_s: float
    steps_per_s: float | None
    loss: float | None
    total_steps: int | None
    eta_s: float | None


@dataclass(frozen=True)
class Costs:
    summary: CostSummary
    max_per_hour: float | None
    max_total: float | None

    @property
    def budget_used(self) -> float | None:
        """Fraction of the budget used: the total cap if set, else the hourly cap; None without a budget."""
        if self.max_total:
            return self.summary.total / self.max_total
        if self.max_per_hour:
            return self.summary.burn_per_hour / self.max_per_hour
        return None


@dataclass(frozen=True)
class Checkpoints:
    latest: CheckpointRecord | None
    age_s: float | None
    count: int
    stale: bool  # the newest one is older than the recipe's checkpoint interval
    verified: bool  # it carries a full sha256 in its manifest


@dataclass(frozen=True)
class Snapshot:
    cluster: str
    now: float
    connected: bool
    error: str
    revision: int
    target: int | None
    rows: tuple[WorkerRow, ...]
    alive: int
    training: Training
    costs: Costs
    checkpoints: Checkpoints
    events: tuple[Event, ...]
    history: tuple[float, ...] = field(default=())  # cluster samples/s, one point per second

    @classmethod
    def empty(cls, cluster: str, now: float, connected: bool = False, error: str = "") -> Snapshot:
        return cls(
            cluster,
            now,
            connected,
            error,
            0,
            None,
            (),
            0,
            Training(None, None, 0.0, None, None, None, None),
            Costs(summarize([], now), None, None),
            Checkpoints(None, None, 0, False, False),
            (),
        )


_PROGRESS_FIELDS = ("node", "step", "samples_per_s", "world_size", "heartbeat_at", "loss")


def _progress(raw: bytes) -> Progress:
    """`decode(Progress, raw)` without its per-call field introspection: this runs ~2000 times a second."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object for Progress")
    return Progress(**{k: data[k] for k in _PROGRESS_FIELDS if k in data})


def total_steps(run: str | None) -> int | None:
    """The run's step goal: a `--steps N` / `--max-steps N` in the recipe's run command, else None."""
    return steps_from_run(run or "")


class ClusterState:
    """The keys of one cluster, kept current by watch events. Thread-safe.

    Each key remembers the revision it was last written at, so replayed or late events (listing and
    watch overlap) never move a key backwards.
    """

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self.revision = 0
        self._revs: dict[str, int] = {}
        self.recipe: Recipe | None = None  # the spec's
        self.target: int | None = None
        self.nodes: dict[str, NodeRecord] = {}
        self.alive: set[str] = set()
        self.notices: dict[str, Notice] = {}
        self.standby: set[str] = set()  # warm spares not yet activated
        self.progress: dict[str, Progress] = {}
        self.rates: dict[str, float] = {}
        self.checkpoints: dict[int, CheckpointRecord] = {}
        self.ledger: dict[str, list[LedgerSegment]] = {}
        self.events: dict[int, Event] = {}

    def load(self, items: Sequence[tuple[str, bytes, int]], revision: int) -> None:
        """Replace everything with a listing of (key, value, mod_revision)."""
        with self._lock:
            self._clear()
            for k, value, rev in items:
                self._put(k, value, rev)
            self.revision = revision

    def apply(self, event: WatchEvent) -> None:
        """Fold one watch event in; unknown or unreadable keys are ignored."""
        with self._lock:
            if event.kind == "resync":
                self._clear()
            elif event.revision >= self._revs.get(event.key, 0):
                if event.kind == "put":
                    self._put(event.key, event.value, event.revision)
                else:
                    self._delete(event.key, event.revision)
            self.revision = max(self.revision, event.revision)

    def _split(self, k: str) -> tuple[Kind | None, str]:
        parsed = parse_key(self.cluster, k)
        return (None, "") if parsed is None else (parsed.kind, parsed.item)

    def _put(self, k: str, value: bytes, rev: int) -> None:
        kind, item = self._split(k)
        self._revs[k] = rev
        try:
            if kind is Kind.SPEC:
                self.recipe = decode_spec(self.cluster, value)
            elif kind is Kind.TARGET:
                self.target = int(value)
            elif kind is Kind.NODES and item:
                self.nodes[item] = decode(NodeRecord, value)
            elif kind is Kind.ALIVE and item:
                self.alive.add(item)
            elif kind is Kind.NOTICES and item:
                self.notices[item] = decode(Notice, value)
            elif kind is Kind.STANDBY and item:
                self.standby.add(item)
            elif kind is Kind.PROGRESS and item:
                new = _progress(value)
                old = self.progress.get(item)
                if old is not None and new.heartbeat_at > old.heartbeat_at and new.step >= old.step:
                    self.rates[item] = (new.step - old.step) / (new.heartbeat_at - old.heartbeat_at)
                self.progress[item] = new
            elif kind is Kind.CHECKPOINTS and item:
                self.checkpoints[int(item)] = decode(CheckpointRecord, value)
            elif kind is Kind.LEDGER and item:
                self.ledger[item] = [from_dict(LedgerSegment, s) for s in json.loads(value)]
            elif kind is Kind.EVENTS and item:
                ev = decode(Event, value)
                self.events[ev.seq] = ev
                if len(self.events) > MAX_EVENTS:
                    del self.events[min(self.events)]
        except (ValueError, TypeError, KeyError, ControlPlaneError):
            pass  # a malformed record is skipped; `spotrun status` reports it

    def _delete(self, k: str, rev: int) -> None:
        kind, item = self._split(k)
        self._revs[k] = rev
        if kind is Kind.SPEC:
            self.recipe = None
        elif kind is Kind.TARGET:
            self.target = None
        elif kind is Kind.NODES:
            self.nodes.pop(item, None)
        elif kind is Kind.ALIVE:
            self.alive.discard(item)
        elif kind is Kind.NOTICES:
            self.notices.pop(item, None)
        elif kind is Kind.STANDBY:
            self.standby.discard(item)
        elif kind is Kind.PROGRESS:
            self.progress.pop(item, None)
            self.rates.pop(item, None)
        elif kind is Kind.CHECKPOINTS and item.isdigit():
            self.checkpoints.pop(int(item), None)
        elif kind is Kind.LEDGER:
            self.ledger.pop(item, None)
        elif kind is Kind.EVENTS and item.isdigit():
            self.events.pop(int(item), None)

    def build(self, now: float, connected: bool = True, error: str = "", history: Sequence[float] = ()) -> Snapshot:
        """The state at time `now` as an immutable Snapshot."""
        with self._lock:
            rows = tuple(self._row(n, now) for n in self.nodes.values())
            training = self._training(now)
            segments = [s for segs in self.ledger.values() for s in segs]
            budget = self.recipe.budget if self.recipe else None
            costs = Costs(
                summarize(segments, now), budget.max_per_hour if budget else None, budget.max_total if budget else None
            )
            checkpoints = self._checkpoints(now, training.step)
            events = tuple(self.events[s] for s in sorted(self.events))
            return Snapshot(
                self.cluster,
                now,
                connected,
                error,
                self.revision,
                self.target,
                rows,
                len(self.alive & set(self.nodes)),
                training,
                costs,
                checkpoints,
                events,
                tuple(history),
            )

    def _row(self, n: NodeRecord, now: float) -> WorkerRow:
        notice = self.notices.get(n.id)
        progress = self.progress.get(n.id)
        fresh = progress is not None and now - progress.heartbeat_at <= FRESH_S
        state = "standby" if n.id in self.standby and n.state.value == "running" else n.state.value
        return WorkerRow(
            n.id,
            n.provider,
            n.zone,
            n.instance_type,
            state,
            n.reason_text,
            n.id in self.alive,
            max(0.0, now - n.launched_at) if n.launched_at else None,
            self.rates.get(n.id) if fresh else None,
            n.price_per_hour,
            max(0.0, notice.deadline - now) if notice else None,
        )

    def _training(self, now: float) -> Training:
        fresh = [p for p in self.progress.values() if now - p.heartbeat_at <= FRESH_S]
        if not self.progress:
            return Training(None, None, 0.0, None, None, self._total_steps(), None)
        newest = max(self.progress.values(), key=lambda p: (p.step, p.heartbeat_at))
        rates = [self.rates[p.node] for p in fresh if p.node in self.rates]
        rate = max(rates) if rates else None
        goal = self._total_steps()
        eta = (
            (goal - newest.step) / rate
            if goal is not None and rate and goal > newest.step
            else (0.0 if goal is not None and newest.step >= goal else None)
        )
        return Training(
            newest.step, newest.world_size, sum(p.samples_per_s for p in fresh), rate, newest.loss, goal, eta
        )

    def _total_steps(self) -> int | None:
        return total_steps(self.recipe.run if self.recipe else None)

    def _checkpoints(self, now: float, step: int | None) -> Checkpoints:
        if not self.checkpoints:
            return Checkpoints(None, None, 0, False, False)
        latest = self.checkpoints[max(self.checkpoints)]
        age = max(0.0, now - latest.written_at)
        every = self.recipe.checkpoint if self.recipe else None
        stale = bool(
            every
            and (
                (every.every_seconds and age > every.every_seconds)
                or (every.every_steps and step is not None and step - latest.step > every.every_steps)
            )
        )
        verified = bool(re.fullmatch(r"[0-9a-f]{64}", latest.sha256 or ""))
        return Checkpoints(latest, age, len(self.checkpoints), stale, verified)


# --- formatting shared by the widgets -------------------------------------------------------


def fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def fmt_count(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"
