"""The local record of a cluster this machine started (`$SPOTRUN_HOME/clusters/<name>/cluster.json`).

It holds what `down` needs even when etcd is gone: the recipe (so providers can be rebuilt and
asked for every VM labelled with the cluster) and the control-plane endpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spotrun.errors import NotFoundError
from spotrun.paths import cluster_dir, spotrun_home


@dataclass(frozen=True)
class ClusterFile:
    name: str
    recipe_json: str
    endpoints: list[str]
    embedded: bool
    train: bool = True  # agents run the recipe's `run`; False brings up nodes and agents only
    created_at: float = field(default_factory=time.time)
    # What agents on the VMs dial, when it differs from `endpoints` (on a head VM: its private IP).
    agent_endpoints: list[str] | None = None
    # Mode 'head': how to SSH to the head VM, whose etcd this machine reaches through a tunnel
    # (spotrun.client.head.HeadRecord as a dict); `endpoints` is then empty.
    head: dict | None = None

    @property
    def key_path(self) -> Path:
        return cluster_dir(self.name) / "id_ed25519"

    def save(self) -> None:
        """Atomic write: a crash leaves the old file or the new one, never half of one."""
        path = cluster_dir(self.name) / "cluster.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    def recipe(self):
        from spotrun.recipe.schema import Recipe

        return Recipe.from_json(self.recipe_json)


def _clusters_root() -> Path:
    return spotrun_home() / "clusters"


def load(name: str) -> ClusterFile:
    """Raises NotFoundError naming the known clusters."""
    path = _clusters_root() / name / "cluster.json"
    if not path.is_file():
        known = ", ".join(names()) or "none"
        raise NotFoundError(f"no cluster named {name!r} on this machine (known: {known})", hint="see `spotrun status`")
    return ClusterFile(**json.loads(path.read_text()))


def names() -> list[str]:
    root = _clusters_root()
    return sorted(p.parent.name for p in root.glob("*/cluster.json")) if root.is_dir() else []


def remove(name: str) -> None:
    """Forget the cluster locally: its record and its SSH key. Idempotent."""
    shutil.rmtree(_clusters_root() / name, ignore_errors=True)
