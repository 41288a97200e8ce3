"""The two consoles: results and tables on stdout, progress and messages on stderr.

rich honours NO_COLOR and drops styling when the stream is not a terminal.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

# Off a terminal rich assumes 80 columns and truncates table cells; scripts and pipes get room.
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
out = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Machine-readable output for `--json`: plain JSON on stdout, never styled."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def is_interactive() -> bool:
    """True only when a person can answer a prompt."""
    return sys.stdin.isatty() and sys.stdout.isatty()
