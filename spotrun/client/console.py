"""The two consoles: results and tables on stdout, progress and messages on stderr.

rich honours NO_COLOR and drops styling when the stream is not a terminal.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from spotrun.state.records import Event

# Off a terminal rich assumes 80 columns and truncates table cells; scripts and pipes get room.
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
out = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Machine-readable output for `--json`: plain JSON on stdout, never styled."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def format_event(event: Event) -> str:
    """One line of cluster history as `events`, `up --attach` and the head bring-up print it."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
    return f"{event.seq:>5} {stamp} {event.kind:<9} {event.message}"
