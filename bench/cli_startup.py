"""CLI cold start: `spotrun --help` (and `spotrun validate`) against bare `python -c pass`.

Goal: `--help` within 0.25 s above bare Python. Run: .venv/bin/python bench/cli_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _format import emit, median_wall

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    spotrun = [sys.executable, "-m", "spotrun"]
    env = dict(os.environ, NO_COLOR="1")
    baseline = median_wall([sys.executable, "-c", "pass"], args.runs, env)
    cases = {
        "--help": [*spotrun, "--help"],
        "validate": [*spotrun, "validate", str(REPO / "recipes" / "quickstart.yaml")],
    }
    for case, argv in cases.items():
        took = median_wall(argv, args.runs, env)
        emit(
            "cli_startup",
            case,
            "s",
            took,
            baseline,
            runs=args.runs,
            above_baseline=round(took - baseline, 4),
            goal_above_baseline=0.25,
        )


if __name__ == "__main__":
    main()
