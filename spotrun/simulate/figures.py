"""Bench figures: what spotrun's moves cost, recorded by the benches and read by the simulator.

The benches write them into `$SPOTRUN_HOME/bench-figures.json` (`record_figures`); `load_figures`
reads them back, fills what no bench recorded from `DEFAULT_FIGURES` and applies command-line
overrides, remembering where each figure came from so the report can say which were defaults.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from spotrun.errors import SpotrunError

FIGURES_FILE = "bench-figures.json"


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
