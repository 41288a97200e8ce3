"""The cluster's recipe in etcd (`/spotrun/<cluster>/spec`): the one copy that everyone reads.

`spotrun up` puts the validated recipe there; the etcd revision it was written at is the spec
version. The controller (every pass), the provisioner it builds from it, the agents, `scale` and
the TUI read it back through this module as a validated `Recipe`, never as a raw dict, so a re-run
of `up` with a changed recipe reaches all of them. (The local cluster file keeps only what
reaching and tearing down the cluster needs: spotrun.state.clusterfile.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotrun.errors import ControlPlaneError, NotFoundError

if TYPE_CHECKING:
    from spotrun.recipe.schema import Recipe
    from spotrun.state.store import Store


@dataclass(frozen=True)
class Spec:
    """The validated recipe of a cluster and its spec version (the etcd revision it was written at)."""

    recipe: Recipe
    version: int


def put_recipe(store: Store, recipe: Recipe) -> int:
    """Store `recipe` as its cluster's spec; returns the new spec version. Blocking; writing the same
    recipe again is harmless (only the version moves). Raises ControlPlaneError if etcd is unreachable."""
    return store.put_spec(recipe.name, json.loads(recipe.to_json()))


def read_spec(store: Store, cluster: str) -> Spec | None:
    """The cluster's spec, validated, or None when it has none. Blocking.

    Raises ControlPlaneError if etcd is unreachable or the stored spec is not a valid recipe.
    """
    found = store.get_spec(cluster)
    return None if found is None else Spec(_validate(cluster, found[0]), found[1])


def recipe_from_spec(store: Store, cluster: str) -> Recipe:
    """The cluster's recipe from etcd, validated. Blocking.

    Raises NotFoundError if the cluster has no spec, ControlPlaneError if etcd is unreachable or the
    stored spec is not a valid recipe.
    """
    spec = read_spec(store, cluster)
    if spec is None:
        raise NotFoundError(f"cluster {cluster!r} has no recipe in etcd", hint="start it with `spotrun up RECIPE`")
    return spec.recipe


def decode_spec(cluster: str, raw: str | bytes) -> Recipe:
    """A spec key's value (as a watch delivers it) as a validated recipe.

    Raises ControlPlaneError if it is not a valid recipe.
    """
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise _invalid(cluster, f"not JSON: {exc}") from exc
    return _validate(cluster, data)


def _validate(cluster: str, data: Any) -> Recipe:
    """The recipe `data` (parsed JSON) holds; paths are taken as stored, no file is touched.
    Raises ControlPlaneError if it is not a valid recipe."""
    from pydantic import ValidationError

    from spotrun.recipe.schema import Recipe

    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        raise _invalid(cluster, f"{where}: {error['msg']}" if where else str(error["msg"])) from exc


def _invalid(cluster: str, why: str) -> ControlPlaneError:
    return ControlPlaneError(
        f"the spec of cluster {cluster!r} in etcd is not a valid recipe: {why}",
        hint="run `spotrun up RECIPE` to write it again",
    )
