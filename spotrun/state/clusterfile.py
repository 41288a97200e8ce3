"""The local record of a cluster this machine started (`$SPOTRUN_HOME/clusters/<name>/cluster.json`).

The recipe itself lives in etcd (spotrun.state.spec). This file holds only what this machine needs
to reach the control plane and to tear the cluster down even when etcd or the controller is gone:
the endpoints and TLS files, the head VM, the SSH key, whether agents train, and the recipe's
resource candidates (`down` rebuilds their providers and asks them for every VM labelled with the
cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotrun.errors import NotFoundError
from spotrun.paths import cluster_dir, spotrun_home

if TYPE_CHECKING:
    from spotrun.recipe.schema import Recipe, ResourceCandidate


@dataclass(frozen=True)
class ClusterFile:
    name: str
    endpoints: list[str]
    embedded: bool
    train: bool = True  # agents run the recipe's `run`; False brings up nodes and agents only
    created_at: float = field(default_factory=time.time)
    # What agents on the VMs dial, when it differs from `endpoints` (on a head VM: its private IP).
    agent_endpoints: list[str] | None = None
    # Mode 'head': how to SSH to the head VM, whose etcd this machine reaches through a tunnel
    # (spotrun.client.head.HeadRecord as a dict); `endpoints` is then empty.
    head: dict[str, Any] | None = None
    # The recipe's resource candidates as JSON: what `down` rebuilds the providers from.
    resources: list[dict[str, Any]] = field(default_factory=list)
    # The control plane's TLS files for an external etcd (ca, cert, key: absolute paths), if any.
    tls: dict[str, str] | None = None
    # This machine's copy of the recipe's workdir where it is not at the spec's path (on a head VM:
    # the copy `up` uploaded; the spec holds the path on the user's machine).
    workdir: str | None = None

    @classmethod
    def for_recipe(
        cls, recipe: Recipe, endpoints: list[str], embedded: bool, train: bool = True, **fields: Any
    ) -> ClusterFile:
        """A new record of `recipe`'s cluster; `fields` are the optional ones (agent_endpoints, ...)."""
        return cls(recipe.name, endpoints, embedded, train, **fields).with_recipe(recipe)

    def with_recipe(self, recipe: Recipe, **changes: Any) -> ClusterFile:
        """This record after an `up` of `recipe`: its resource candidates and TLS files, plus `changes`."""
        from spotrun.state.control_plane import tls_files

        resources = [candidate.model_dump(mode="json") for candidate in recipe.resources]
        return replace(self, resources=resources, tls=tls_files(recipe.control_plane.tls) or None, **changes)

    def candidates(self) -> tuple[ResourceCandidate, ...]:
        """The recipe's resource candidates, validated (no file is touched)."""
        from spotrun.recipe.schema import ResourceCandidate

        return tuple(ResourceCandidate.model_validate(candidate) for candidate in self.resources)

    @property
    def key_path(self) -> Path:
        return cluster_dir(self.name) / "id_ed25519"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> ClusterFile:
        """Read `to_json()` output, or a file from before the recipe lived only in etcd: that one
        carries the whole recipe (`recipe_json`), of which the record keeps what teardown needs."""
        data = json.loads(text)
        old = data.pop("recipe_json", None)
        record = cls(**data)
        if old is None:
            return record
        from spotrun.recipe.schema import Recipe

        return record.with_recipe(Recipe.from_json(old))

    def save(self) -> None:
        """Atomic write: a crash leaves the old file or the new one, never half of one."""
        path = cluster_dir(self.name) / "cluster.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)


def _clusters_root() -> Path:
    return spotrun_home() / "clusters"


def load(name: str) -> ClusterFile:
    """Raises NotFoundError naming the known clusters."""
    path = _clusters_root() / name / "cluster.json"
    if not path.is_file():
        known = ", ".join(names()) or "none"
        raise NotFoundError(f"no cluster named {name!r} on this machine (known: {known})", hint="see `spotrun status`")
    return ClusterFile.from_json(path.read_text())


def names() -> list[str]:
    root = _clusters_root()
    return sorted(p.parent.name for p in root.glob("*/cluster.json")) if root.is_dir() else []


def remove(name: str) -> None:
    """Forget the cluster locally: its record and its SSH key. Idempotent."""
    shutil.rmtree(_clusters_root() / name, ignore_errors=True)
