"""What a simulation returns: per-policy results with their timelines, and the zones it ran on.

Frozen dataclasses, built by the engine (`spotrun.simulate.engine`) and the policies
(`spotrun.simulate.policies`), read by the report (`spotrun.simulate.report`) and by benches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotrun.controller.traces import Trace
from spotrun.simulate.figures import Figures


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
