"""The one polling helper of tests and benches (bench/ imports it through bench/_shared.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float = 5.0, step: float = 0.05) -> T | None:
    """Call `check` every `step` seconds until it returns something truthy, and return that; None
    when it did not within `timeout` seconds (it is called once more after the deadline). Blocking."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(step)
