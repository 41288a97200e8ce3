"""Presenting a `SimulationResult`: a text table, JSON, a terminal chart and an SVG (or PNG) chart.

Pure functions of the result (`write_chart` also writes the file); nothing here simulates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from spotrun.errors import SpotrunError
from spotrun.simulate.results import Sample, SimulationResult

_EPS = 1e-9  # seconds: times closer than this are one instant (the engine uses the same tolerance)


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
    return max([*ends, 1.0])


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
                y = height - 1 - round(value / result.steps * (height - 1))
                grid[y][x] = _GLYPHS[k % len(_GLYPHS)]
    label = len(str(result.steps))
    lines = [f"steps over time ({_fmt_time(span)} across)"]
    for y, row in enumerate(grid):
        mark = str(result.steps) if y == 0 else ("0" if y == height - 1 else "")
        lines.append(f"{mark.rjust(label)} |{''.join(row)}")
    lines.append(" " * label + " +" + "-" * width)

    def digits(values: list[float], alive: list[bool]) -> str:
        return "".join((str(int(v)) if v <= 9 else "+") if ok else " " for v, ok in zip(values, alive, strict=True))

    first = result.policies[0]
    width_name = max(len(p.policy) for p in result.policies) + len("world ")
    if not (len(result.policies) == 1 and first.policy == "on-demand"):
        spot = next((p for p in result.policies if p.policy != "on-demand"), first)
        lines.append(
            "capacity".ljust(width_name) + " " + digits(_series(spot.samples, "capacity", times), [True] * width)
        )
    for p in result.policies:
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
            points: list[str] = []
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
