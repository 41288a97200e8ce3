"""Structured, quiet-by-default logging to stderr.

Lines look like `12:00:01 spotrun.etcd INFO started etcd pid=123 port=2379`; key=value pairs
come from `extra={"kv": {...}}` through `kv()`, so scripts can grep them.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

_LEVELS = {0: logging.WARNING, 1: logging.INFO}


class _KvFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = getattr(record, "kv", None)
        if pairs:
            line += " " + " ".join(f"{k}={v}" for k, v in pairs.items())
        return line


def kv(**pairs: Any) -> dict[str, Any]:
    """`log.info("msg", extra=kv(pid=1))` attaches key=value pairs to a line."""
    return {"kv": pairs}


def setup(verbosity: int = 0) -> None:
    """Configure the `spotrun` logger once: WARNING by default, INFO at -v, DEBUG at -vv."""
    if os.environ.get("SPOTRUN_DEBUG"):
        verbosity = max(verbosity, 2)
    logger = logging.getLogger("spotrun")
    logger.setLevel(_LEVELS.get(verbosity, logging.DEBUG))
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_KvFormatter("%(asctime)s %(name)s %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.propagate = False


def get(name: str) -> logging.Logger:
    return logging.getLogger(f"spotrun.{name}")
