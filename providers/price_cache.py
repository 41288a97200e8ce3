"""A small on-disk cache for fetched prices, so `spotrun up` and `spotrun prices` do not ask a
cloud's price API on every call. Each entry is a JSON file under `<spotrun_home>/cache/prices/`
with the time it was fetched; readers get the value and its age. Writes are atomic.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotrun.paths import spotrun_home

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def cache_dir() -> Path:
    path = spotrun_home() / "cache" / "prices"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached(name: str, ttl_s: float, fetch: Callable[[], Any]) -> tuple[Any, float]:
    """(value, fetched_at epoch s): the cached value if younger than `ttl_s`, else `fetch()`'s,
    stored for next time. `ttl_s <= 0` always fetches. Exceptions from `fetch` propagate and
    leave the old entry in place."""
    path = cache_dir() / (_SAFE.sub("_", name) + ".json")
    if ttl_s > 0:
        try:
            entry = json.loads(path.read_text())
            if time.time() - float(entry["fetched_at"]) < ttl_s:
                return entry["value"], float(entry["fetched_at"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    value, now = fetch(), time.time()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as out:
        json.dump({"fetched_at": now, "value": value}, out)
    os.replace(tmp, path)
    return value, now
