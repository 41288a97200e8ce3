"""Spot capacity traces: the public format, seeded synthetic generators, and replay events.

A trace says how many spot instances a zone lets us keep at each tick, in the format of
skypilot-org/spot-traces:

    {"metadata": {"gap_seconds": 300}, "data": [4, 4, 1, 1, 4, ...]}

Tick k covers [k * gap_seconds, (k + 1) * gap_seconds). Several traces stand for several zones
or clouds of one recipe (see `spotrun.simulate.engine`).

Generators (`poisson_trace`, `gcp_24h_trace`, `drought_trace`) are pure functions of their
arguments and seed: the same call always gives the same trace. `parse_trace_spec` turns a
command-line spec ("path.json", "poisson:rate=0.5,nodes=4,hours=48,seed=1", ...) into a trace.

`trace_events` turns a trace into the preempt/restore schedule a local replay performs.
Only the standard library is imported: this module is on the CLI path.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from spotrun.errors import SpotrunError

__all__ = [
    "GENERATORS",
    "ReplayEvent",
    "Trace",
    "drought_trace",
    "gcp_24h_trace",
    "load_trace",
    "parse_trace_spec",
    "poisson_trace",
    "trace_events",
]


@dataclass(frozen=True)
class Trace:
    """Capacity (instances available) per tick; `name` labels it in tables and charts."""

    gap_seconds: float
    data: tuple[int, ...]
    name: str = "trace"

    def __post_init__(self) -> None:
        gap = self.gap_seconds
        if isinstance(gap, bool) or not (isinstance(gap, (int, float)) and gap > 0 and math.isfinite(gap)):
            raise SpotrunError(f"trace {self.name!r}: gap_seconds must be a positive number, got {self.gap_seconds!r}")
        if not self.data:
            raise SpotrunError(f"trace {self.name!r} has no data", hint="data must list at least one tick")
        for index, value in enumerate(self.data):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpotrunError(f"trace {self.name!r}: data[{index}] must be an integer >= 0, got {value!r}")

    @property
    def duration_s(self) -> float:
        """Seconds the trace covers."""
        return self.gap_seconds * len(self.data)

    def capacity_at(self, t: float) -> int:
        """Capacity at time `t` (seconds from the start); after the end the trace repeats."""
        tick = math.floor(t / self.gap_seconds + 1e-9)
        return self.data[tick % len(self.data)]

    def to_json(self) -> str:
        """The public format (the name is not part of it)."""
        return json.dumps({"metadata": {"gap_seconds": self.gap_seconds}, "data": list(self.data)})


def load_trace(path: Path | str) -> Trace:
    """Read a trace file in the public format. Raises SpotrunError naming the file and the problem."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise SpotrunError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise SpotrunError(f"trace {str(path)!r} is not JSON: {exc.msg} at line {exc.lineno}") from exc
    hint = 'expected {"metadata": {"gap_seconds": N}, "data": [n0, n1, ...]}'
    if not isinstance(raw, dict) or not isinstance(raw.get("metadata"), dict) or not isinstance(raw.get("data"), list):
        raise SpotrunError(f"trace {str(path)!r} is not in the spot-traces format", hint=hint)
    gap = raw["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)):
        raise SpotrunError(f"trace {str(path)!r}: metadata.gap_seconds must be a number, got {gap!r}", hint=hint)
    return Trace(float(gap), tuple(raw["data"]), name=path.stem)


# -- synthetic generators ---------------------------------------------------------------------------


def _ticks(hours: float, gap_seconds: float) -> int:
    if hours <= 0 or gap_seconds <= 0:
        raise SpotrunError(f"a synthetic trace needs hours > 0 and gap_seconds > 0, got {hours} and {gap_seconds}")
    return max(1, math.ceil(hours * 3600 / gap_seconds))


def _from_slots(down: list[list[tuple[float, float]]], ticks: int, gap: float, nodes: int, name: str) -> Trace:
    """Capacity per tick = slots that are not inside one of their down intervals at the tick's start."""
    data = []
    for k in range(ticks):
        t = k * gap
        data.append(nodes - sum(1 for slot in down if any(a <= t < b for a, b in slot)))
    return Trace(gap, tuple(data), name)


def poisson_trace(
    nodes: int,
    hours: float,
    rate_per_hour: float,
    *,
    mean_down_s: float = 1800.0,
    gap_seconds: float = 300.0,
    seed: int = 0,
) -> Trace:
    """Each of `nodes` slots is preempted as a Poisson process (`rate_per_hour` per slot) and
    comes back after an exponentially distributed outage (mean `mean_down_s`)."""
    if nodes < 1 or rate_per_hour < 0 or mean_down_s <= 0:
        raise SpotrunError(
            f"poisson trace needs nodes >= 1, rate >= 0, mean_down_s > 0; got {nodes}, {rate_per_hour}, {mean_down_s}"
        )
    ticks = _ticks(hours, gap_seconds)
    end = ticks * gap_seconds
    rng = random.Random(seed)
    down: list[list[tuple[float, float]]] = []
    for _ in range(nodes):
        slot, t = [], 0.0
        while rate_per_hour > 0:
            t += rng.expovariate(rate_per_hour / 3600.0)
            if t >= end:
                break
            back = t + rng.expovariate(1.0 / mean_down_s)
            slot.append((t, back))
            t = back
        down.append(slot)
    return _from_slots(down, ticks, gap_seconds, nodes, f"poisson-{rate_per_hour:g}ph-s{seed}")


def gcp_24h_trace(
    nodes: int,
    hours: float,
    *,
    cap_hours: float = 24.0,
    restart_s: float = 600.0,
    gap_seconds: float = 300.0,
    seed: int = 0,
) -> Trace:
    """GCP-style caps: every VM is stopped `cap_hours` after it started and its slot comes back
    `restart_s` later. Slots start staggered at seeded random offsets within the first cap."""
    if nodes < 1 or cap_hours <= 0 or restart_s < 0:
        raise SpotrunError(
            f"gcp24h trace needs nodes >= 1, cap_hours > 0, restart_s >= 0; got {nodes}, {cap_hours}, {restart_s}"
        )
    ticks = _ticks(hours, gap_seconds)
    end = ticks * gap_seconds
    rng = random.Random(seed)
    cap = cap_hours * 3600.0
    down = []
    for _ in range(nodes):
        slot, t = [], rng.uniform(0, cap)
        while t < end:
            slot.append((t, t + restart_s))
            t += restart_s + cap
        down.append(slot)
    return _from_slots(down, ticks, gap_seconds, nodes, f"gcp24h-s{seed}")


def drought_trace(
    nodes: int,
    hours: float,
    *,
    droughts_per_day: float = 1.0,
    mean_drought_hours: float = 2.0,
    level: int = 0,
    gap_seconds: float = 300.0,
    seed: int = 0,
) -> Trace:
    """Full capacity, interrupted by zone-wide droughts (Poisson, `droughts_per_day`) during which
    capacity falls to `level` for an exponentially distributed time (mean `mean_drought_hours`)."""
    if nodes < 1 or not 0 <= level <= nodes or droughts_per_day < 0 or mean_drought_hours <= 0:
        raise SpotrunError(
            f"drought trace needs nodes >= 1, 0 <= level <= nodes, droughts_per_day >= 0, "
            f"mean_drought_hours > 0; got {nodes}, {level}, {droughts_per_day}, {mean_drought_hours}"
        )
    ticks = _ticks(hours, gap_seconds)
    end = ticks * gap_seconds
    rng = random.Random(seed)
    spans, t = [], 0.0
    while droughts_per_day > 0:
        t += rng.expovariate(droughts_per_day / 86400.0)
        if t >= end:
            break
        spans.append((t, t + rng.expovariate(1.0 / (mean_drought_hours * 3600.0))))
        t = spans[-1][1]
    data = tuple(level if any(a <= k * gap_seconds < b for a, b in spans) else nodes for k in range(ticks))
    return Trace(gap_seconds, data, f"drought-s{seed}")


# kind -> (generator, its parameters with the type each is parsed as)
GENERATORS: dict[str, tuple[Callable[..., Trace], dict[str, Callable[[str], object]]]] = {
    "poisson": (
        poisson_trace,
        {"nodes": int, "hours": float, "rate": float, "mean_down_s": float, "gap_seconds": float, "seed": int},
    ),
    "gcp24h": (
        gcp_24h_trace,
        {"nodes": int, "hours": float, "cap_hours": float, "restart_s": float, "gap_seconds": float, "seed": int},
    ),
    "drought": (
        drought_trace,
        {
            "nodes": int,
            "hours": float,
            "droughts_per_day": float,
            "mean_drought_hours": float,
            "level": int,
            "gap_seconds": float,
            "seed": int,
        },
    ),
}


def parse_trace_spec(spec: str) -> Trace:
    """A trace from a file path or a generator spec `KIND:key=value,...`, e.g.
    `poisson:nodes=4,hours=48,rate=0.2,seed=1`, `gcp24h:nodes=4,hours=72`,
    `drought:nodes=4,hours=48,droughts_per_day=2`. Raises SpotrunError for a bad spec."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in GENERATORS:
        return load_trace(spec)
    function, fields = GENERATORS[kind]
    args: dict[str, object] = {}
    for part in filter(None, rest.split(",")):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in fields:
            raise SpotrunError(
                f"trace spec {spec!r}: unknown or malformed {part!r}", hint=f"{kind} takes {', '.join(fields)}"
            )
        try:
            args[name] = fields[name](value.strip())
        except ValueError:
            raise SpotrunError(f"trace spec {spec!r}: {name} must be a number, got {value.strip()!r}") from None
    for required in ("nodes", "hours") + (("rate",) if kind == "poisson" else ()):
        if required not in args:
            raise SpotrunError(f"trace spec {spec!r} needs {required}=...", hint=f"{kind} takes {', '.join(fields)}")
    if kind == "poisson":
        args["rate_per_hour"] = args.pop("rate")
    nodes, hours = args.pop("nodes"), args.pop("hours")
    return function(nodes, hours, **args)


# -- replay -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayEvent:
    """At `at_s` (scaled seconds from the replay's start): preempt `count` nodes with `notice_s`
    of notice (they die at at_s + notice_s, the trace's drop), or restore `count` of capacity."""

    at_s: float
    action: Literal["preempt", "restore"]
    count: int
    notice_s: float


def trace_events(trace: Trace, time_scale: float, nodes: int, *, notice_s: float = 0.0) -> list[ReplayEvent]:
    """The preempt/restore schedule that replays `trace` on a cluster of `nodes`, time scaled by
    `time_scale` (0.01: 300 s ticks last 3 s). Capacity before the first tick is `nodes`; values
    above `nodes` count as `nodes`. A drop at scaled time T becomes a preemption announced at
    T - notice_s (never before 0; the notice shrinks instead) so the nodes die at T; a rise
    becomes a restore at T. `notice_s` is in replay (scaled) seconds. Pure; sorted by time."""
    if time_scale <= 0 or nodes < 1 or notice_s < 0:
        raise SpotrunError(
            f"trace replay needs time_scale > 0, nodes >= 1, notice_s >= 0; got {time_scale}, {nodes}, {notice_s}"
        )
    events, before = [], nodes
    for k, value in enumerate(trace.data):
        now = min(value, nodes)
        at = k * trace.gap_seconds * time_scale
        if now < before:
            start = max(0.0, at - notice_s)
            events.append(ReplayEvent(round(start, 6), "preempt", before - now, round(at - start, 6)))
        elif now > before:
            events.append(ReplayEvent(round(at, 6), "restore", now - before, 0.0))
        before = now
    return sorted(events, key=lambda e: e.at_s)
