"""What spotrun reads from a recipe's `run` command: its step goal (`spotrun simulate`, the TUI)."""

from __future__ import annotations

import re

# `--steps N`, `--steps=N`, `--max-steps N`, `--max_steps=N`: a whole option with a whole number
# (not `--eval-steps 5`, not `--steps 1.5`), also inside a quoted `sh -c "..."`.
STEPS_OPTION = re.compile(r"(?<![\w-])--(?:max[-_])?steps(?:=|\s+)(\d+)(?![\w.])")


def steps_from_run(run: str) -> int | None:
    """The N of the first `--steps N` (or `--steps=N`, `--max-steps N`) in `run`, else None."""
    found = STEPS_OPTION.search(run)
    return int(found.group(1)) if found else None
