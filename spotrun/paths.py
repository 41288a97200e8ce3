"""Where spotrun keeps its files on the user's machine."""

from __future__ import annotations

import os
from pathlib import Path


def spotrun_home() -> Path:
    """`$SPOTRUN_HOME`, default `~/.spotrun`; created on first use."""
    home = Path(os.environ.get("SPOTRUN_HOME") or Path.home() / ".spotrun").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def etcd_dir() -> Path:
    """State of the embedded etcd: data dir, pid file, endpoint file, log."""
    path = spotrun_home() / "etcd"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cluster_dir(cluster: str) -> Path:
    """Per-cluster local files (keys, VM roots, logs)."""
    path = spotrun_home() / "clusters" / cluster
    path.mkdir(parents=True, exist_ok=True)
    return path
