"""`spotrun simulate`: what a recipe costs and how long it takes on spot, before spending a cent.

`run_simulation(recipe_path, traces, ...)` replays capacity traces (`spotrun.simulate.traces`) against
four policies and returns a `SimulationResult`; `render_table`, `to_json`, `write_chart` and
`terminal_chart` present it. Everything is deterministic: same inputs, same answer.

Model (event-driven; time only advances to the next event, so a 13-day trace is cheap):
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
- Policies:
  - `spotrun`: the controller's own `spotrun.controller.plan.plan(desired, observed)` decides at every
    event (launches, drains, terminations, budget); the simulator only applies its actions and
    plays the agents: a ready node joins (pause `scale_up_s`), a drained or noticed node leaves
    at once or at its deadline after an agreed checkpoint (pause `recovery_notice_s`, no step
    lost; a replacement's join and the noticed node's leave are one change), a hard kill pauses
    `recovery_hard_kill_s` and loses no step while a survivor holds the replica (the trainer's
    emergency save), else falls back to the last checkpoint.
  - `relaunch-all` (SkyPilot managed jobs): the whole cluster in one zone with room for
    nodes.target; on any preemption every VM is terminated, work since the last periodic
    checkpoint is lost, and the cluster is relaunched as soon as a zone has room.
  - `checkpoint-restart`: a fixed-size job that ignores notices; a preemption loses the work
    since the last periodic checkpoint, lost VMs are replaced when capacity returns, and the job
    restarts when all nodes.target VMs are ready (survivors wait, billed).
  - `on-demand`: nodes.target VMs at the cheapest on-demand price, never preempted.
- Goodput = time of an undisturbed run (the on-demand run: same nodes, no preemption) / time of
  the policy's run. Costs come from `spotrun.state.ledger.summarize` over per-VM ledger segments.

The costs of spotrun's moves come from `Figures` (`load_figures`): the benches record them in
`$SPOTRUN_HOME/bench-figures.json`; `DEFAULT_FIGURES` fills what no bench recorded.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from spotrun.controller.plan import (
    Activate,
    Blocked,
    CloseLedger,
    Desired,
    Drain,
    Launch,
    NodeView,
    Observed,
    StopCluster,
    Terminate,
    plan,
)
from spotrun.errors import SpotrunError
from spotrun.providers import known_providers, provider_package
from spotrun.simulate.traces import Trace
from spotrun.state.ledger import summarize
from spotrun.state.records import LedgerSegment

__all__ = [
    "DEFAULT_FIGURES",
    "FIGURES_FILE",
    "POLICIES",
    "PROVIDER_NOTICE_S",
    "Figures",
    "PolicyResult",
    "Sample",
    "SimulationResult",
    "ZoneInfo",
    "figures_path",
    "load_figures",
    "record_figures",
    "render_table",
    "run_simulation",
    "simulate",
    "steps_from_run",
    "terminal_chart",
    "to_json",
    "write_chart",
]

POLICIES = ("spotrun", "relaunch-all", "checkpoint-restart", "on-demand")
FIGURES_FILE = "bench-figures.json"

# Lead time of a preemption notice per provider, in seconds (each package's `notices.LEAD_S`
# says where its figure comes from).
PROVIDER_NOTICE_S: Mapping[str, float] = {name: provider_package(name).notices.LEAD_S for name in known_providers()}

_EPS = 1e-9


@dataclass(frozen=True)
class Figures:
    """What spotrun's moves cost, in seconds; the JSON schema of `bench-figures.json`:

        {"recovery_notice_s": 2.0,     # noticed node starts to leave -> first step at the new world size
         "recovery_hard_kill_s": 5.0,  # hard kill -> first step at the new world size
         "scale_up_s": 3.0,            # new agent ready -> first step at the larger world size
         "bootstrap_s": 60.0,          # launch request -> agent ready (VM provisioned + bootstrapped)
         "checkpoint_s": 0.0,          # training pause per periodic checkpoint (0: written in the background)
         "step_s": 1.0,                # seconds per step at world size 1 (step_s / w at world size w) ...
         "step_s_by_world": {"2": 0.6}}  # ... unless measured for that world size (optional)

    Every key is optional in the file; a missing one keeps its default. Unknown keys are ignored
    (benches may add context such as "measured_at").
    """

    recovery_notice_s: float
    recovery_hard_kill_s: float
    scale_up_s: float
    bootstrap_s: float
    checkpoint_s: float
    step_s: float
    step_s_by_world: Mapping[int, float] = field(default_factory=dict)

    def step_time(self, world: int) -> float:
        """Seconds per step with `world` nodes (the global batch is split across them)."""
        if world < 1:
            raise ValueError(f"world size must be >= 1, got {world}")
        return self.step_s_by_world.get(world, self.step_s / world)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "step_s_by_world"}
        if self.step_s_by_world:
            data["step_s_by_world"] = {str(k): v for k, v in sorted(self.step_s_by_world.items())}
        return data

    @classmethod
    def merged(cls, base: Figures, updates: Mapping[str, Any], source: str) -> Figures:
        """`base` with the known keys of `updates`, validated. Raises SpotrunError naming `source`."""
        changes: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in updates or updates[f.name] is None:
                continue
            value = updates[f.name]
            if f.name == "step_s_by_world":
                if not isinstance(value, Mapping):
                    raise SpotrunError(
                        f"{source}: step_s_by_world must be a mapping of world size to seconds, got {value!r}"
                    )
                table = {}
                for world, seconds in value.items():
                    try:
                        size = int(world)
                    except (TypeError, ValueError):
                        raise SpotrunError(f"{source}: step_s_by_world key {world!r} is not a world size") from None
                    table[size] = _seconds(source, f"step_s_by_world[{world}]", seconds, positive=True)
                    if size < 1:
                        raise SpotrunError(f"{source}: step_s_by_world key {world!r} must be >= 1")
                changes[f.name] = {**base.step_s_by_world, **table}
            else:
                changes[f.name] = _seconds(source, f.name, value, positive=f.name == "step_s")
        return replace(base, **changes)


def _seconds(source: str, name: str, value: Any, *, positive: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        raise SpotrunError(
            f"{source}: {name} must be a number of seconds {'> 0' if positive else '>= 0'}, got {value!r}"
        )
    return float(value)


# The one place defaults live. Source: the recovery goals of bench/recovery.py (GOALS: notice 2 s,
# hard kill 5 s, scale up 3 s) -- goals, not measurements; bootstrap 60 s is a typical cloud VM
# boot plus setup; checkpoint 0 s because the trainer writes periodic checkpoints in a background
# thread (spotrun.elastic.trainer._AsyncWriter); step 1 s is a placeholder. Run the benches (or pass
# overrides) for figures that mean something; the output says which figures were defaults.
DEFAULT_FIGURES = Figures(
    recovery_notice_s=2.0, recovery_hard_kill_s=5.0, scale_up_s=3.0, bootstrap_s=60.0, checkpoint_s=0.0, step_s=1.0
)


def figures_path() -> Path:
    """`$SPOTRUN_HOME/bench-figures.json` (default home `~/.spotrun`); not created here."""
    home = Path(os.environ.get("SPOTRUN_HOME") or Path.home() / ".spotrun").expanduser()
    return home / FIGURES_FILE


def load_figures(
    path: Path | str | None = None, overrides: Mapping[str, Any] | None = None
) -> tuple[Figures, dict[str, str]]:
    """Figures from `DEFAULT_FIGURES`, then the file (`path`, else `figures_path()` if it exists),
    then `overrides` (command-line values; None values are skipped). Returns the figures and the
    source of each key ("default", the file path, or "override").
    Raises SpotrunError for a missing explicit file, bad JSON or a bad value."""
    figures = DEFAULT_FIGURES
    sources = {f.name: "default" for f in fields(Figures)}
    file = Path(path) if path is not None else figures_path()
    if path is not None or file.exists():
        try:
            data = json.loads(file.read_text())
        except OSError as exc:
            raise SpotrunError(
                f"cannot read bench figures {str(file)!r}: {exc.strerror or exc}",
                hint="run the benches, or give the figures as options",
            ) from exc
        except json.JSONDecodeError as exc:
            raise SpotrunError(f"bench figures {str(file)!r} are not JSON: {exc.msg} at line {exc.lineno}") from exc
        if not isinstance(data, dict):
            raise SpotrunError(f"bench figures {str(file)!r} must hold a JSON object")
        figures = Figures.merged(figures, data, str(file))
        sources.update({k: str(file) for k in sources if data.get(k) is not None})
    if overrides:
        figures = Figures.merged(figures, overrides, "override")
        sources.update({k: "override" for k in sources if overrides.get(k) is not None})
    return figures, sources


def record_figures(updates: Mapping[str, Any], path: Path | str | None = None) -> Path:
    """Merge `updates` into the figures file (for benches): validated, written atomically,
    other keys kept. Returns the path. Raises SpotrunError for a bad value."""
    file = Path(path) if path is not None else figures_path()
    Figures.merged(DEFAULT_FIGURES, updates, "record_figures")  # validate before writing
    current: dict[str, Any] = {}
    if file.exists():
        try:
            current = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError):
            current = {}
    current.update(updates)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    tmp.replace(file)
    return file


def steps_from_run(run: str) -> int | None:
    """The `--steps N` (or `--steps=N`) of a recipe's run command, if any."""
    try:
        words = shlex.split(run)
    except ValueError:
        words = run.split()
    for i, word in enumerate(words):
        if word == "--steps" and i + 1 < len(words) and words[i + 1].isdigit():
            return int(words[i + 1])
        match = re.fullmatch(r"--steps=(\d+)", word)
        if match:
            return int(match.group(1))
    return None


# -- results ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """The state after the events of one instant: capacity over all zones, nodes training, steps done."""

    t: float
    capacity: int
    world: int
    step: float


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    finished: bool
    time_s: float | None  # to reach the step count; None when it did not
    steps_done: float
    goodput: float | None  # undisturbed time / time_s
    total_usd: float
    usd_per_1000_steps: float | None
    preemptions_survived: int  # VMs the provider took away (noticed or killed) during the run
    steps_lost: float  # steps computed again after falling back to a checkpoint
    node_hours: float
    note: str = ""
    samples: tuple[Sample, ...] = ()

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        data = {
            "policy": self.policy,
            "finished": self.finished,
            "time_s": None if self.time_s is None else round(self.time_s, 3),
            "time_h": None if self.time_s is None else round(self.time_s / 3600, 4),
            "steps_done": round(self.steps_done, 3),
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "total_usd": round(self.total_usd, 4),
            "usd_per_1000_steps": None if self.usd_per_1000_steps is None else round(self.usd_per_1000_steps, 4),
            "preemptions_survived": self.preemptions_survived,
            "steps_lost": round(self.steps_lost, 3),
            "node_hours": round(self.node_hours, 4),
            "note": self.note,
        }
        if timeline:
            data["timeline"] = [[round(s.t, 3), s.capacity, s.world, round(s.step, 3)] for s in self.samples]
        return data


@dataclass(frozen=True)
class ZoneInfo:
    name: str
    provider: str
    spot_per_hour: float
    on_demand_per_hour: float
    notice_s: float
    trace: Trace


@dataclass(frozen=True)
class SimulationResult:
    recipe: str
    steps: int
    nodes_target: int
    figures: Figures
    figure_sources: Mapping[str, str]
    zones: tuple[ZoneInfo, ...]
    undisturbed_s: float
    policies: tuple[PolicyResult, ...]

    def policy(self, name: str) -> PolicyResult:
        return next(p for p in self.policies if p.policy == name)


# -- entry points -----------------------------------------------------------------------------------


def run_simulation(
    recipe_path: Path | str,
    traces: Sequence[Trace],
    policies: Sequence[str] = POLICIES,
    *,
    steps: int | None = None,
    figures: Figures | None = None,
    figures_file: Path | str | None = None,
    figure_overrides: Mapping[str, Any] | None = None,
    notice_s: Mapping[str, float] | float | None = None,
    prices: tuple[float, float] | None = None,
    max_hours: float = 24.0 * 30,
) -> SimulationResult:
    """Load the recipe and `simulate` it. Steps: `steps`, else `--steps N` of the recipe's run.
    Figures: `figures` if given, else `load_figures(figures_file, figure_overrides)`.
    Raises RecipeError for a bad recipe, SpotrunError for bad traces, figures, policies or steps."""
    from spotrun.recipe.schema import load_recipe

    recipe = load_recipe(Path(recipe_path))
    sources: Mapping[str, str] = {f.name: "given" for f in fields(Figures)}
    if figures is None:
        figures, sources = load_figures(figures_file, figure_overrides)
    return simulate(
        recipe,
        traces,
        policies,
        steps=steps,
        figures=figures,
        figure_sources=sources,
        notice_s=notice_s,
        prices=prices,
        max_hours=max_hours,
    )


def simulate(
    recipe: Any,
    traces: Sequence[Trace],
    policies: Sequence[str] = POLICIES,
    *,
    steps: int | None = None,
    figures: Figures = DEFAULT_FIGURES,
    figure_sources: Mapping[str, str] | None = None,
    notice_s: Mapping[str, float] | float | None = None,
    prices: tuple[float, float] | None = None,
    max_hours: float = 24.0 * 30,
) -> SimulationResult:
    """Simulate a validated `Recipe` (see the module docstring). `notice_s` overrides the lead
    time for every provider (a number) or per provider (a mapping); `prices` = (spot, on-demand)
    $/h for candidates without a `prices` table. Pure and deterministic."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise SpotrunError(
            f"unknown policy {', '.join(map(repr, unknown)) or '(none given)'}",
            hint=f"choose from {', '.join(POLICIES)}",
        )
    if not traces:
        raise SpotrunError(
            "simulate needs at least one trace", hint="a trace file or e.g. poisson:nodes=4,hours=48,rate=0.2"
        )
    steps = steps if steps is not None else steps_from_run(recipe.run)
    if steps is None or steps < 1:
        raise SpotrunError(
            f"the number of steps to simulate is unknown for recipe {recipe.name!r}"
            if steps is None
            else f"steps must be >= 1, got {steps}",
            hint="pass --steps N (or put --steps N in the recipe's run command)",
        )
    if max_hours <= 0:
        raise SpotrunError(f"max_hours must be > 0, got {max_hours}")
    zones = tuple(_zone(recipe, i, trace, notice_s, prices) for i, trace in enumerate(traces))
    job = _JobSpec.of(recipe, steps)
    limit = max_hours * 3600.0
    od_zone = min(zones, key=lambda z: z.on_demand_per_hour)
    undisturbed = _Sim(
        job,
        figures,
        (replace(od_zone, trace=Trace(1.0, (job.target,)), name="on-demand"),),
        limit,
        notices=False,
        on_demand=True,
    )
    ideal = _run_static(undisturbed, one_zone=False)
    results = []
    for name in policies:
        results.append(_run_policy(name, job, figures, zones, od_zone, limit, ideal))
    return SimulationResult(
        recipe.name, steps, job.target, figures, dict(figure_sources or {}), zones, ideal.time_s or 0.0, tuple(results)
    )


def _zone(
    recipe: Any,
    index: int,
    trace: Trace,
    notice_s: Mapping[str, float] | float | None,
    prices: tuple[float, float] | None,
) -> ZoneInfo:
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
class _JobSpec:
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
    def of(cls, recipe: Any, steps: int) -> _JobSpec:
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


class _Sim:
    """The cluster and the training job; policies drive it through launch/kill/terminate/join."""

    def __init__(
        self,
        job: _JobSpec,
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
        if kind == "ckpt-steps":
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


# -- policies ---------------------------------------------------------------------------------------


def _run_policy(
    name: str,
    job: _JobSpec,
    figures: Figures,
    zones: Sequence[ZoneInfo],
    od_zone: ZoneInfo,
    limit: float,
    ideal: PolicyResult,
) -> PolicyResult:
    if name == "on-demand":
        sim = _Sim(
            job,
            figures,
            (replace(od_zone, trace=Trace(1.0, (job.target,)), name="on-demand"),),
            limit,
            notices=False,
            on_demand=True,
        )
        return _run_static(sim, one_zone=False, ideal=ideal.time_s, policy=name)
    if name == "checkpoint-restart":
        return _run_static(
            _Sim(job, figures, zones, limit, notices=False), one_zone=False, ideal=ideal.time_s, policy=name
        )
    if name == "relaunch-all":
        return _run_static(
            _Sim(job, figures, zones, limit, notices=False), one_zone=True, ideal=ideal.time_s, policy=name
        )
    return _run_spotrun(_Sim(job, figures, zones, limit, notices=True), job, ideal.time_s)


def _run_static(sim: _Sim, *, one_zone: bool, ideal: float | None = None, policy: str = "undisturbed") -> PolicyResult:
    """A fixed-size job of nodes.target VMs that trains only when all are ready and falls back to
    its last periodic checkpoint on any preemption. `one_zone`: relaunch-all (the whole cluster in
    one zone, torn down on a preemption); else checkpoint-restart (lost VMs replaced anywhere)."""
    target = sim.job.target

    def react(s: _Sim, happened: list[tuple[str, Any]]) -> None:
        killed = False
        for kind, payload in happened:
            if kind == "capacity":
                zone, after, _ = payload
                for node in s.victims(zone, len(s.zone_nodes(zone)) - after):
                    s.kill(node)
                    s.end_billing(node)
                    killed = True
        if killed:  # the job fails: every node leaves the world; the work since the checkpoint is lost
            for node in s.nodes.values():
                if node.in_world:
                    node.in_world = False
            if one_zone:
                for node in s.nodes.values():
                    if not node.gone:
                        node.gone = True
                        s.end_billing(node)
        live = [n for n in s.nodes.values() if not n.gone]
        if one_zone and not live:
            room = [z for z in s.zones_by_price() if s.free(z) >= target]
            if room:
                live = [s.launch(room[0]) for _ in range(target)]
        elif not one_zone and len(live) < target:
            for zone in s.zones_by_price():
                while len(live) < target and s.free(zone) > 0:
                    live.append(s.launch(zone))
        if len(live) == target and all(n.ready(s.t) for n in live) and not any(n.in_world for n in live):
            for node in live:
                s.join(node)

    sim.run(react, elastic=False)
    return sim.result(policy, ideal)


def _run_spotrun(sim: _Sim, job: _JobSpec, ideal: float | None) -> PolicyResult:
    """Drive `spotrun.controller.plan.plan` at every instant; apply its actions; play provider and agents."""
    launch_price = min(z.spot_per_hour for z in sim.zones)
    desired = Desired(
        target=job.target,
        min=job.min,
        max=job.max,
        max_per_hour=job.max_per_hour,
        max_total=job.max_total,
        launch_price=launch_price,
        spares=job.spares,
    )
    state = {"stopped": False, "note": "", "finished_ids": set()}

    def views(s: _Sim) -> list[NodeView]:
        out = []
        for n in s.nodes.values():
            if n.id in state["finished_ids"]:
                continue
            out.append(
                NodeView(
                    id=n.id,
                    price_per_hour=n.price,
                    gone=n.gone,
                    alive=n.ready(s.t),
                    ready=n.ready(s.t),
                    noticed=n.noticed,
                    notice_deadline=n.deadline,
                    leaving=n.leaving,
                    left=n.left,
                    ledger_open=n.end is None,
                    launched_at=n.launched_at,
                    replaces=n.replaces,
                    standby=n.standby,
                )
            )
        return out

    def apply(s: _Sim, action: Any) -> bool:
        if isinstance(action, Launch):
            made = 0
            for i in range(action.count):
                zone = next((z for z in s.zones_by_price() if s.free(z) > 0), None)
                if zone is None:
                    break  # no capacity: the controller's launch fails; a later pass tries again
                node = s.launch(zone, action.replaces[i] if i < len(action.replaces) else None)
                node.standby = i >= action.count - action.standby  # spares last, as the provisioner does
                made += 1
            return made > 0
        if isinstance(action, Activate):
            spare = s.nodes.get(action.node)
            if spare is None or not spare.standby:
                return False
            spare.standby = False
            return True
        node = s.nodes.get(getattr(action, "node", ""))
        if isinstance(action, Drain) and node is not None:
            if node.leaving:
                return False
            s.leave(node)
            return True
        if isinstance(action, (Terminate, CloseLedger)) and node is not None:
            if node.in_world:  # terminated while training: a hard kill for the job
                node.in_world = False
                s.hard_killed_in_world = True
            node.gone = True
            s.end_billing(node)
            state["finished_ids"].add(node.id)
            return True
        if isinstance(action, StopCluster):
            changed = not state["stopped"]
            state["stopped"] = True
            state["note"] = action.reason
            return changed
        if isinstance(action, Blocked):
            return False
        return False

    def react(s: _Sim, happened: list[tuple[str, Any]]) -> None:
        for kind, payload in happened:
            if kind == "notice":
                zone, after, at = payload
                staying = s.preemption_order([n for n in s.zone_nodes(zone) if not n.noticed])
                for node in staying[: max(0, len(staying) - after)]:
                    node.noticed, node.deadline = True, at
                    s.preemptions += 1
        for kind, payload in happened:
            if kind == "capacity":
                zone, after, _ = payload
                for node in s.zone_nodes(zone):  # the agent of a noticed node leaves at its deadline
                    if node.noticed and node.deadline is not None and node.deadline <= s.t + _EPS:
                        s.leave(node)
                        s.kill(node)
                for node in s.victims(zone, len(s.zone_nodes(zone)) - after):
                    s.kill(node)  # above capacity without (enough) notice
        for _ in range(100):  # level-triggered: plan again until nothing changes at this instant
            observed = Observed(
                views(s), spent_total=summarize(s.segments(), now=s.t).total, stopped=state["stopped"], now=s.t
            )
            changed = False
            for action in plan(replace(desired, target=0) if state["stopped"] else desired, observed):
                changed = apply(s, action) or changed
            joined = False
            for node in s.nodes.values():  # ready agents that stay join the training job
                if (
                    node.ready(s.t)
                    and not node.in_world
                    and not node.leaving
                    and not node.standby
                    and not state["stopped"]
                    and s.world < job.max
                ):
                    s.join(node)
                    joined = True
            if not (changed or joined):
                break
        if state["stopped"] and all(n.gone for n in s.nodes.values()):
            s.events.clear()  # the budget stopped the cluster: nothing more happens
        elif job.max_total is not None and not state["stopped"]:
            cost = summarize(s.segments(), now=s.t)  # the controller checks often; wake at the crossing
            if cost.burn_per_hour > 0:
                s.push(s.t + max(0.0, job.max_total - cost.total) / cost.burn_per_hour * 3600 + 1e-6, "budget", None)

    sim.run(react, elastic=True)
    return sim.result("spotrun", ideal, state["note"])


# -- presentation -----------------------------------------------------------------------------------


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def render_table(result: SimulationResult) -> str:
    """One row per policy: time to the step count, goodput, total $, $ per 1000 steps, preemptions."""
    head = ("policy", "time", "goodput", "total $", "$/1000 steps", "preemptions", "steps lost", "note")
    rows = [head]
    for p in result.policies:
        rows.append(
            (
                p.policy,
                _fmt_time(p.time_s),
                "-" if p.goodput is None else f"{p.goodput:.3f}",
                f"{p.total_usd:.2f}" if p.total_usd >= 10 else f"{p.total_usd:.4f}",
                "-" if p.usd_per_1000_steps is None else f"{p.usd_per_1000_steps:.4f}",
                str(p.preemptions_survived),
                f"{p.steps_lost:.0f}",
                p.note,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    right = {1, 2, 3, 4, 5, 6}
    lines = [
        f"{result.recipe}: {result.steps} steps on {result.nodes_target} nodes; traces: "
        + ", ".join(f"{z.name} ({z.provider}, {z.notice_s:g} s notice)" for z in result.zones)
        + f"; undisturbed {_fmt_time(result.undisturbed_s)}"
    ]
    for n, row in enumerate(rows):
        cells = [(c.rjust(widths[i]) if i in right else c.ljust(widths[i])) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    defaults = sorted(k for k, v in result.figure_sources.items() if v == "default" and k != "step_s_by_world")
    if defaults:
        lines.append(f"default figures (not measured): {', '.join(defaults)}; run the benches or pass overrides")
    return "\n".join(lines)


def to_json(result: SimulationResult, *, timeline: bool = False) -> str:
    """The result as one JSON object; `timeline` adds [t, capacity, world, step] samples per policy."""
    return json.dumps(
        {
            "recipe": result.recipe,
            "steps": result.steps,
            "nodes_target": result.nodes_target,
            "undisturbed_s": round(result.undisturbed_s, 3),
            "figures": result.figures.to_dict(),
            "figure_sources": dict(result.figure_sources),
            "zones": [
                {
                    "name": z.name,
                    "provider": z.provider,
                    "spot_per_hour": z.spot_per_hour,
                    "on_demand_per_hour": z.on_demand_per_hour,
                    "notice_s": z.notice_s,
                    "gap_seconds": z.trace.gap_seconds,
                    "ticks": len(z.trace.data),
                }
                for z in result.zones
            ],
            "policies": [p.to_dict(timeline) for p in result.policies],
        },
        indent=2,
    )


def _series(samples: Sequence[Sample], attr: str, times: Sequence[float]) -> list[float]:
    """Step-wise value of `attr` at each of `times` (the last sample at or before it)."""
    out, i = [], 0
    for t in times:
        while i + 1 < len(samples) and samples[i + 1].t <= t + _EPS:
            i += 1
        out.append(float(getattr(samples[i], attr)) if samples else 0.0)
    return out


def _span(result: SimulationResult) -> float:
    ends = [p.samples[-1].t for p in result.policies if p.samples]
    return max(ends + [1.0])


_GLYPHS = "*o+x#@"
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def terminal_chart(result: SimulationResult, width: int = 72, height: int = 12) -> str:
    """A text chart: steps done over time per policy (one glyph each), then capacity and world size
    per policy as digit rows (0-9, '+' above 9)."""
    span = _span(result)
    times = [span * i / (width - 1) for i in range(width)]
    grid = [[" "] * width for _ in range(height)]
    for k, p in reversed(list(enumerate(result.policies))):  # the first policy drawn last, on top
        for x, value in enumerate(_series(p.samples, "step", times)):
            if p.samples and times[x] <= p.samples[-1].t + _EPS:
                y = height - 1 - int(round(value / result.steps * (height - 1)))
                grid[y][x] = _GLYPHS[k % len(_GLYPHS)]
    label = len(str(result.steps))
    lines = [f"steps over time ({_fmt_time(span)} across)"]
    for y, row in enumerate(grid):
        mark = str(result.steps) if y == 0 else ("0" if y == height - 1 else "")
        lines.append(f"{mark.rjust(label)} |{''.join(row)}")
    lines.append(" " * label + " +" + "-" * width)

    def digits(values: list[float], alive: list[bool]) -> str:
        return "".join((str(int(v)) if v <= 9 else "+") if ok else " " for v, ok in zip(values, alive))

    first = result.policies[0]
    width_name = max(len(p.policy) for p in result.policies) + len("world ")
    if not (len(result.policies) == 1 and first.policy == "on-demand"):
        spot = next((p for p in result.policies if p.policy != "on-demand"), first)
        lines.append(
            "capacity".ljust(width_name) + " " + digits(_series(spot.samples, "capacity", times), [True] * width)
        )
    for k, p in enumerate(result.policies):
        alive = [bool(p.samples) and t <= p.samples[-1].t + _EPS for t in times]
        lines.append(f"world {p.policy}".ljust(width_name) + " " + digits(_series(p.samples, "world", times), alive))
    lines.append(
        "legend: " + ", ".join(f"{_GLYPHS[k % len(_GLYPHS)]} {p.policy}" for k, p in enumerate(result.policies))
    )
    return "\n".join(lines)


def write_chart(result: SimulationResult, path: Path | str) -> Path:
    """Write a chart of capacity, world size and progress over time: `.svg` (drawn here, no
    dependency) or `.png` (needs matplotlib). Raises SpotrunError for another suffix or a PNG
    without matplotlib."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        path.write_text(_svg(result))
        return path
    if suffix == ".png":
        try:
            import matplotlib
        except ImportError:
            raise SpotrunError(
                f"cannot write {str(path)!r}: PNG charts need matplotlib",
                hint="pip install matplotlib, or write an .svg chart",
            ) from None
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
        spot = next((p for p in result.policies if p.policy != "on-demand"), result.policies[0])
        axes[0].step([s.t / 3600 for s in spot.samples], [s.capacity for s in spot.samples], where="post")
        axes[0].set_ylabel("capacity")
        for k, p in enumerate(result.policies):
            hours = [s.t / 3600 for s in p.samples]
            axes[1].step(hours, [s.world for s in p.samples], where="post", label=p.policy, color=_COLORS[k % 6])
            axes[2].plot(hours, [s.step for s in p.samples], label=p.policy, color=_COLORS[k % 6])
        axes[1].set_ylabel("world size")
        axes[2].set_ylabel("steps")
        axes[2].set_xlabel("hours")
        axes[2].legend()
        fig.savefig(path)
        plt.close(fig)
        return path
    raise SpotrunError(
        f"cannot write chart {str(path)!r}: unknown format {suffix or '(none)'}", hint="use a .svg or .png file name"
    )


def _svg(result: SimulationResult) -> str:
    width, panel, left, top, gap = 900, 160, 70, 40, 40
    plot_w = width - left - 170
    span = _span(result)
    height = top + 3 * (panel + gap) + 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15">{_esc(result.recipe)}: {result.steps} steps, '
        f"{result.nodes_target} nodes ({_fmt_time(span)} shown)</text>",
    ]
    spot = next((p for p in result.policies if p.policy != "on-demand"), result.policies[0])
    cap_max = max([s.capacity for s in spot.samples] + [1])
    world_max = max([s.world for p in result.policies for s in p.samples] + [1])
    panels = [
        ("capacity (VMs available)", [(spot.samples, "capacity", "#555555")], cap_max, True),
        (
            "world size (nodes training)",
            [(p.samples, "world", _COLORS[k % 6]) for k, p in enumerate(result.policies)],
            world_max,
            True,
        ),
        (
            "steps done",
            [(p.samples, "step", _COLORS[k % 6]) for k, p in enumerate(result.policies)],
            float(result.steps),
            False,
        ),
    ]
    for index, (title, series, top_value, stepwise) in enumerate(panels):
        y0 = top + index * (panel + gap)
        out.append(f'<text x="{left}" y="{y0 - 6}">{title}</text>')
        out.append(f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{panel}" fill="none" stroke="#999"/>')
        out.append(f'<text x="{left - 6}" y="{y0 + 10}" text-anchor="end">{top_value:g}</text>')
        out.append(f'<text x="{left - 6}" y="{y0 + panel}" text-anchor="end">0</text>')
        for samples, attr, color in series:
            points = []
            for s in samples:
                x = left + plot_w * s.t / span
                y = y0 + panel - panel * float(getattr(s, attr)) / top_value
                if stepwise and points:
                    points.append(f"{x:.1f},{points[-1].split(',')[1]}")
                points.append(f"{x:.1f},{y:.1f}")
            if points:
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(points)}"/>')
    axis_y = top + 3 * (panel + gap) - gap + 16
    for i in range(5):
        x = left + plot_w * i / 4
        out.append(f'<text x="{x:.1f}" y="{axis_y}" text-anchor="middle">{_fmt_time(span * i / 4)}</text>')
    for k, p in enumerate(result.policies):
        y = top + 20 * k + 10
        out.append(
            f'<line x1="{left + plot_w + 15}" y1="{y}" x2="{left + plot_w + 35}" y2="{y}" '
            f'stroke="{_COLORS[k % 6]}" stroke-width="3"/>'
        )
        out.append(f'<text x="{left + plot_w + 40}" y="{y + 4}">{_esc(p.policy)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
