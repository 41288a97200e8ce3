"""The four policies `spotrun simulate` compares, and `simulate`, which runs them on the same traces.

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

Goodput = time of an undisturbed run (the on-demand run: same nodes, no preemption) / time of
the policy's run. Costs come from `spotrun.state.ledger.summarize` over per-VM ledger segments.
The world they run in (zones, provider, training) is `spotrun.simulate.engine`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from spotrun.controller.traces import Trace
from spotrun.errors import SpotrunError
from spotrun.recipe.run_command import steps_from_run
from spotrun.simulate.engine import JobSpec, Sim, zone_info
from spotrun.simulate.figures import DEFAULT_FIGURES, Figures, load_figures
from spotrun.simulate.results import PolicyResult, SimulationResult, ZoneInfo
from spotrun.state.ledger import summarize

POLICIES = ("spotrun", "relaunch-all", "checkpoint-restart", "on-demand")


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
    zones = tuple(zone_info(recipe, i, trace, notice_s, prices) for i, trace in enumerate(traces))
    job = JobSpec.of(recipe, steps)
    limit = max_hours * 3600.0
    od_zone = min(zones, key=lambda z: z.on_demand_per_hour)
    ideal = _run_static(_on_demand_sim(job, figures, od_zone, limit), one_zone=False)
    results = []
    for name in policies:
        results.append(_run_policy(name, job, figures, zones, od_zone, limit, ideal))
    return SimulationResult(
        recipe.name, steps, job.target, figures, dict(figure_sources or {}), zones, ideal.time_s or 0.0, tuple(results)
    )


def _on_demand_sim(job: JobSpec, figures: Figures, od_zone: ZoneInfo, limit: float) -> Sim:
    """nodes.target VMs in the cheapest on-demand zone, never preempted: the on-demand policy and
    the undisturbed run that goodput is measured against."""
    return Sim(
        job,
        figures,
        (replace(od_zone, trace=Trace(1.0, (job.target,)), name="on-demand"),),
        limit,
        notices=False,
        on_demand=True,
    )


def _run_policy(
    name: str,
    job: JobSpec,
    figures: Figures,
    zones: Sequence[ZoneInfo],
    od_zone: ZoneInfo,
    limit: float,
    ideal: PolicyResult,
) -> PolicyResult:
    if name == "on-demand":
        return _run_static(
            _on_demand_sim(job, figures, od_zone, limit), one_zone=False, ideal=ideal.time_s, policy=name
        )
    if name == "checkpoint-restart":
        return _run_static(
            Sim(job, figures, zones, limit, notices=False), one_zone=False, ideal=ideal.time_s, policy=name
        )
    if name == "relaunch-all":
        return _run_static(
            Sim(job, figures, zones, limit, notices=False), one_zone=True, ideal=ideal.time_s, policy=name
        )
    return _run_spotrun(Sim(job, figures, zones, limit, notices=True), job, ideal.time_s)


def _run_static(sim: Sim, *, one_zone: bool, ideal: float | None = None, policy: str = "undisturbed") -> PolicyResult:
    """A fixed-size job of nodes.target VMs that trains only when all are ready and falls back to
    its last periodic checkpoint on any preemption. `one_zone`: relaunch-all (the whole cluster in
    one zone, torn down on a preemption); else checkpoint-restart (lost VMs replaced anywhere)."""
    target = sim.job.target

    def react(s: Sim, happened: list[tuple[str, Any]]) -> None:
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


@dataclass
class _Cluster:
    """What the spotrun policy's controller remembers between passes."""

    stopped: bool = False  # the budget stopped the cluster
    note: str = ""  # why it stopped
    finished_ids: set[str] = field(default_factory=set)  # nodes whose VM is gone and billing ended


def _run_spotrun(sim: Sim, job: JobSpec, ideal: float | None) -> PolicyResult:
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
    state = _Cluster()

    def views(s: Sim) -> list[NodeView]:
        out = []
        for n in s.nodes.values():
            if n.id in state.finished_ids:
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

    def apply(s: Sim, action: Any) -> bool:
        if isinstance(action, Launch):
            made = 0
            for i in range(action.count):
                zone = next((z for z in s.zones_by_price() if s.free(z) > 0), None)
                if zone is None:
                    break  # no capacity: the controller's launch fails; a later pass tries again
                new = s.launch(zone, action.replaces[i] if i < len(action.replaces) else None)
                new.standby = i >= action.count - action.standby  # spares last, as the provisioner does
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
            state.finished_ids.add(node.id)
            return True
        if isinstance(action, StopCluster):
            changed = not state.stopped
            state.stopped = True
            state.note = action.reason
            return changed
        if isinstance(action, Blocked):
            return False
        return False

    def react(s: Sim, happened: list[tuple[str, Any]]) -> None:
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
                    if node.deadline_reached(s.t):
                        s.leave(node)
                        s.kill(node)
                for node in s.victims(zone, len(s.zone_nodes(zone)) - after):
                    s.kill(node)  # above capacity without (enough) notice
        for _ in range(100):  # level-triggered: plan again until nothing changes at this instant
            observed = Observed(
                views(s), spent_total=summarize(s.segments(), now=s.t).total, stopped=state.stopped, now=s.t
            )
            changed = False
            for action in plan(replace(desired, target=0) if state.stopped else desired, observed):
                changed = apply(s, action) or changed
            joined = False
            for node in s.nodes.values():  # ready agents that stay join the training job
                if (
                    node.ready(s.t)
                    and not node.in_world
                    and not node.leaving
                    and not node.standby
                    and not state.stopped
                    and s.world < job.max
                ):
                    s.join(node)
                    joined = True
            if not (changed or joined):
                break
        if state.stopped and all(n.gone for n in s.nodes.values()):
            s.events.clear()  # the budget stopped the cluster: nothing more happens
        elif job.max_total is not None and not state.stopped:
            cost = summarize(s.segments(), now=s.t)  # the controller checks often; wake at the crossing
            if cost.burn_per_hour > 0:
                s.push(s.t + max(0.0, job.max_total - cost.total) / cost.burn_per_hour * 3600 + 1e-6, "budget", None)

    sim.run(react, elastic=True)
    return sim.result("spotrun", ideal, state.note)
