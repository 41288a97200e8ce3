"""The simulated world of `spotrun simulate`: zones with spot capacity, a provider, a training job.

Event-driven; time only advances to the next event, so a 13-day trace is cheap. Deterministic:
same inputs, same answer. The policies (`spotrun.simulate.policies`) drive it.

- Zones. Trace i is the capacity of zone i, which uses resource candidate min(i, last) of the
  recipe (its provider, spot and on-demand $/h). A zone holds at most `capacity` VMs of ours
  (booting, running, noticed or leaving all count). After its end a trace repeats.
- Provider. When a zone's capacity drops at tick T, the surplus VMs (training nodes before warm
  spares, newest first) get a notice at T - lead (the provider's lead time, `PROVIDER_NOTICE_S`)
  and die at T; VMs still above capacity at T die without notice. A launch takes the cheapest
  zone with free capacity; a VM is billed from its launch and is ready `bootstrap_s` later.
- Training. `world` nodes train at 1 / step_time(world) steps per second while world >= nodes.min
  and no pause is running (`Figures.step_time`). Periodic checkpoints (recipe checkpoint.every_steps
  / every_seconds) pause training `checkpoint_s`. A job that (re)starts from an empty world
  pays only its nodes' bootstrap.

The costs of spotrun's moves come from `Figures` (`spotrun.simulate.figures`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotrun.controller.traces import Trace
from spotrun.errors import SpotrunError
from spotrun.providers import known_providers, provider_package
from spotrun.simulate.figures import Figures
from spotrun.simulate.results import PolicyResult, Sample, ZoneInfo
from spotrun.state.ledger import summarize
from spotrun.state.records import LedgerSegment

# Lead time of a preemption notice per provider, in seconds (each package's `notices.LEAD_S`
# says where its figure comes from).
PROVIDER_NOTICE_S: Mapping[str, float] = {name: provider_package(name).notices.LEAD_S for name in known_providers()}

_EPS = 1e-9


def zone_info(
    recipe: Any,
    index: int,
    trace: Trace,
    notice_s: Mapping[str, float] | float | None,
    prices: tuple[float, float] | None,
) -> ZoneInfo:
    """Zone `index` of the simulation: capacity `trace`, with the prices and notice lead time of
    recipe candidate min(index, last). `notice_s` and `prices` are the overrides of `simulate`.
    Raises SpotrunError when the candidate has no prices and none were given."""
    candidate = recipe.resources[min(index, len(recipe.resources) - 1)]
    if candidate.prices is not None:
        spot, on_demand = candidate.prices.spot, candidate.prices.on_demand
    elif prices is not None:
        spot, on_demand = prices
    else:
        raise SpotrunError(
            f"resources[{min(index, len(recipe.resources) - 1)}] of recipe {recipe.name!r} "
            "has no prices "
            "and none were given",
            hint="pass --price SPOT:ON_DEMAND ($/h per VM)",
        )
    if isinstance(notice_s, (int, float)):
        lead = float(notice_s)
    else:
        lead = float((notice_s or {}).get(candidate.provider, PROVIDER_NOTICE_S[candidate.provider]))
    where = candidate.zone or candidate.region or candidate.provider
    return ZoneInfo(f"{index}:{trace.name}@{where}", candidate.provider, spot, on_demand, lead, trace)


@dataclass(frozen=True)
class JobSpec:
    """What the recipe asks of the training job: steps, node counts, checkpoint cadence, budget."""

    steps: int
    target: int
    min: int
    max: int
    every_steps: int | None
    every_seconds: float | None
    max_per_hour: float | None
    max_total: float | None
    spares: int = 0

    @classmethod
    def of(cls, recipe: Any, steps: int) -> JobSpec:
        ckpt, budget = recipe.checkpoint, recipe.budget
        return cls(
            steps,
            recipe.nodes.target,
            recipe.nodes.min,
            recipe.nodes.max,
            ckpt.every_steps if ckpt else None,
            ckpt.every_seconds if ckpt else None,
            budget.max_per_hour if budget else None,
            budget.max_total if budget else None,
            recipe.nodes.spares,
        )


# -- the simulated world ----------------------------------------------------------------------------


@dataclass
class _Node:
    id: str
    zone: int
    price: float
    on_demand: float
    launched_at: float
    ready_at: float
    replaces: str | None = None
    gone: bool = False
    noticed: bool = False
    deadline: float | None = None
    leaving: bool = False
    left: bool = False
    end: float | None = None  # billing end
    in_world: bool = False
    standby: bool = False  # a warm spare: billed, never joins until activated

    def running(self) -> bool:
        return not self.gone

    def ready(self, t: float) -> bool:
        return not self.gone and t >= self.ready_at - _EPS

    def deadline_reached(self, t: float) -> bool:
        """Noticed, and the notice's deadline is at or before `t`: its agent leaves now."""
        return self.noticed and self.deadline is not None and self.deadline <= t + _EPS


def _changes(trace: Trace, limit: float) -> Iterator[tuple[float, int, int]]:
    """(time, capacity before, capacity after) of each capacity change, the trace repeating."""
    before = trace.data[0]
    k = 1
    n = len(trace.data)
    if len(set(trace.data)) == 1:
        return
    while k * trace.gap_seconds <= limit:
        value = trace.data[k % n]
        if value != before:
            yield k * trace.gap_seconds, before, value
            before = value
        k += 1


class Sim:
    """The cluster and the training job; policies drive it through launch/kill/terminate/join."""

    def __init__(
        self,
        job: JobSpec,
        figures: Figures,
        zones: Sequence[ZoneInfo],
        limit: float,
        *,
        notices: bool,
        on_demand: bool = False,
    ) -> None:
        self.job, self.figures, self.zones, self.limit = job, figures, list(zones), limit
        self.notices, self.on_demand = notices, on_demand
        self.t = 0.0
        self.nodes: dict[str, _Node] = {}
        self.seq = 0
        self.capacity = [z.trace.data[0] if not on_demand else 10**9 for z in self.zones]
        self.events: list[tuple[float, int, str, Any]] = []
        self.order = 0
        # the job
        self.progress = 0.0
        self.ckpt = 0.0
        self.paused_until = 0.0
        self.last_save = 0.0
        self.world_was = 0  # world size after the previous instant
        self.training_was = False
        self.steps_lost = 0.0
        self.preemptions = 0
        self.finished_at: float | None = None
        self.samples: list[Sample] = []
        # what happened at this instant (reset each instant)
        self.hard_killed_in_world = False
        self.graceful_left = False
        self.joined = False
        if not on_demand:
            for i, zone in enumerate(self.zones):
                self._next_change(i, _changes(zone.trace, limit))

    # -- events --------------------------------------------------------------------------------
    def push(self, at: float, kind: str, payload: Any) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, kind, payload))

    def _next_change(self, zone: int, changes: Iterator[tuple[float, int, int]]) -> None:
        found = next(changes, None)
        if found is None:
            return
        at, before, after = found
        if after < before and self.notices and self.zones[zone].notice_s > 0:  # 0 s: no notice, a hard kill
            self.push(max(self.t, at - self.zones[zone].notice_s), "notice", (zone, after, at))
        self.push(at, "capacity", (zone, after, changes))

    # -- provider ------------------------------------------------------------------------------
    def zone_nodes(self, zone: int) -> list[_Node]:
        return [n for n in self.nodes.values() if n.zone == zone and n.running()]

    def free(self, zone: int) -> int:
        return self.capacity[zone] - len(self.zone_nodes(zone))

    def zones_by_price(self) -> list[int]:
        key = (
            (lambda i: (self.zones[i].on_demand_per_hour, i))
            if self.on_demand
            else (lambda i: (self.zones[i].spot_per_hour, i))
        )
        return sorted(range(len(self.zones)), key=key)

    def launch(self, zone: int, replaces: str | None = None) -> _Node:
        self.seq += 1
        z = self.zones[zone]
        price = z.on_demand_per_hour if self.on_demand else z.spot_per_hour
        node = _Node(
            f"vm-{self.seq}", zone, price, z.on_demand_per_hour, self.t, self.t + self.figures.bootstrap_s, replaces
        )
        self.nodes[node.id] = node
        self.push(node.ready_at, "ready", node.id)
        return node

    def end_billing(self, node: _Node) -> None:
        if node.end is None:
            node.end = self.t

    def segments(self) -> list[LedgerSegment]:
        return [LedgerSegment(n.id, n.price, n.on_demand, n.launched_at, n.end) for n in self.nodes.values()]

    def kill(self, node: _Node) -> None:
        """The provider takes the VM away now."""
        if node.gone:
            return
        node.gone = True
        if not node.noticed:
            self.preemptions += 1
        if node.in_world:
            node.in_world = False
            if not node.left:
                self.hard_killed_in_world = True

    def leave(self, node: _Node) -> None:
        """The node's agent leaves the training job after an agreed checkpoint."""
        if node.in_world:
            node.in_world = False
            self.graceful_left = True
        node.leaving = True
        node.left = True

    def victims(self, zone: int, count: int) -> list[_Node]:
        return self.preemption_order(self.zone_nodes(zone))[: max(0, count)]

    @staticmethod
    def preemption_order(nodes: list[_Node]) -> list[_Node]:
        """Which VMs a capacity drop takes first: training nodes before warm spares (a spare that
        absorbs a preemption would flatter spares), newest first within each."""
        return sorted(nodes, key=lambda n: (not n.standby, n.launched_at, int(n.id[3:])), reverse=True)

    # -- training ------------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return sum(1 for n in self.nodes.values() if n.in_world)

    def _rate(self) -> float:
        w = self.world
        return 1.0 / self.figures.step_time(w) if w >= self.job.min and w >= 1 else 0.0

    def _next_job_event(self) -> tuple[float, str] | None:
        """When training next finishes, or reaches a checkpoint, from now (None: not training)."""
        if self.finished_at is not None:
            return None
        rate = self._rate()
        if rate <= 0:
            return None
        start = max(self.t, self.paused_until)
        found = [(start + (self.job.steps - self.progress) / rate, "finish")]
        if self.job.every_steps:
            boundary = (math.floor(self.progress / self.job.every_steps + _EPS) + 1) * self.job.every_steps
            if boundary < self.job.steps:
                found.append((start + (boundary - self.progress) / rate, "ckpt-steps"))
        if self.job.every_seconds:
            found.append((max(start, self.last_save + self.job.every_seconds), "ckpt-time"))
        return min(found)

    def _advance(self, to: float) -> None:
        rate = self._rate()
        start = max(self.t, self.paused_until)
        if rate > 0 and to > start:
            self.progress = min(float(self.job.steps), self.progress + (to - start) * rate)
        self.t = to

    def checkpoint(self, kind: str) -> None:
        if kind == "ckpt-steps" and self.job.every_steps:  # scheduled only with every_steps
            self.progress = round(self.progress / self.job.every_steps) * self.job.every_steps
        self.ckpt = self.progress
        self.last_save = self.t
        self.paused_until = max(self.paused_until, self.t + self.figures.checkpoint_s)

    def join(self, node: _Node) -> None:
        node.in_world = True
        self.joined = True

    def settle_membership(self, elastic: bool) -> None:
        """Apply the pause and step accounting of what changed in the world at this instant:
        a hard kill falls back to the checkpoint unless an elastic survivor holds the replica;
        an elastic change while training pauses (kill > graceful leave or swap > join)."""
        world = self.world
        training_before = self.training_was
        if self.hard_killed_in_world:
            if not elastic or world == 0:
                self.steps_lost += self.progress - self.ckpt
                self.progress = self.ckpt
            if elastic and world >= self.job.min:
                self.paused_until = max(self.paused_until, self.t + self.figures.recovery_hard_kill_s)
            self.ckpt = self.progress if elastic and world > 0 else self.ckpt
        elif elastic and training_before and world >= self.job.min and (self.graceful_left or self.joined):
            pause = self.figures.recovery_notice_s if self.graceful_left else self.figures.scale_up_s
            self.paused_until = max(self.paused_until, self.t + pause)
            self.ckpt = self.progress
        elif self.graceful_left:
            self.ckpt = self.progress
        if world >= self.job.min and world > 0 and not training_before:
            self.last_save = self.t  # a (re)started trainer starts its checkpoint clock
        self.world_was = world
        self.training_was = world >= self.job.min and world > 0
        self.hard_killed_in_world = False
        self.graceful_left = False
        self.joined = False

    def sample(self) -> None:
        cap = sum(min(c, 10**6) for c in self.capacity) if not self.on_demand else self.job.target
        s = Sample(self.t, cap, self.world, self.progress)
        if self.samples and abs(self.samples[-1].t - s.t) < _EPS:
            self.samples[-1] = s
        else:
            self.samples.append(s)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, react, *, elastic: bool) -> None:
        """Advance event by event; `react(sim, events)` is the policy, called once per instant
        with the events of that instant. Ends at the step count, at the limit, or when nothing
        can happen any more."""
        react(self, [])
        self.settle_membership(elastic)
        self.sample()
        while self.finished_at is None:
            job_next = self._next_job_event()
            heap_next = self.events[0][0] if self.events else None
            candidates = [t for t in (job_next[0] if job_next else None, heap_next) if t is not None]
            if not candidates:
                break
            t = min(candidates)
            if t > self.limit:
                self._advance(self.limit)
                break
            self._advance(t)
            happened: list[tuple[str, Any]] = []
            if job_next and abs(job_next[0] - t) < _EPS:
                if job_next[1] == "finish":
                    self.progress = float(self.job.steps)
                    self.finished_at = t
                    for node in self.nodes.values():
                        self.end_billing(node)
                    self.sample()
                    break
                self.checkpoint(job_next[1])
            while self.events and self.events[0][0] <= t + _EPS:
                _, _, kind, payload = heapq.heappop(self.events)
                happened.append((kind, payload))
                if kind == "capacity":
                    zone, after, changes = payload
                    self.capacity[zone] = after
                    self._next_change(zone, changes)
            react(self, happened)
            self.settle_membership(elastic)
            self.sample()
        for node in self.nodes.values():
            self.end_billing(node)

    def result(self, policy: str, ideal_s: float | None, note: str = "") -> PolicyResult:
        end = self.finished_at if self.finished_at is not None else self.t
        cost = summarize(self.segments(), now=end)
        hours = sum(((n.end if n.end is not None else end) - n.launched_at) / 3600 for n in self.nodes.values())
        done = self.finished_at is not None
        if not done and not note:
            note = f"did not reach {self.job.steps} steps within {self.limit / 3600:g} h"
        return PolicyResult(
            policy,
            done,
            self.finished_at,
            self.progress,
            (ideal_s / self.finished_at) if done and ideal_s and self.finished_at else None,
            cost.total,
            1000 * cost.total / self.job.steps if done else None,
            self.preemptions,
            self.steps_lost,
            hours,
            note,
            tuple(self.samples),
        )
