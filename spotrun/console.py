"""The two consoles: results and tables on stdout, progress and messages on stderr.

rich honours NO_COLOR and drops styling when the stream is not a terminal.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Machine-readable output for `--json`: plain JSON on stdout, never styled."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def is_interactive() -> bool:
    """True only when a person can answer a prompt."""
    return sys.stdin.isatty() and sys.stdout.isatty()
