"""The one bench output format of the design notes: one JSON object per line per case."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any


def emit(bench: str, case: str, unit: str, spotrun: float, baseline: float | None = None, **extra: Any) -> None:
    """Print one result line; `baseline` is the reference measured in the same run."""
    record: dict[str, Any] = {"bench": bench, "case": case, "unit": unit, "spotrun": round(spotrun, 4)}
    if baseline is not None:
        record["baseline"] = round(baseline, 4)
    record.update(extra)
    print(json.dumps(record), flush=True)


def median_wall(argv: Sequence[str], runs: int, env: dict[str, str] | None = None) -> float:
    """Median wall-clock seconds of `argv` over `runs` runs; fails if the command fails."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
