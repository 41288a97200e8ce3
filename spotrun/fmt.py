"""Durations for people, written the same way by the CLI (`status`, `prices`) and the TUI."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """`59` -> "0m59s", `3700` -> "1h01m", `90000` -> "1d01h"; None -> "-". Whole seconds, rounded down."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"
