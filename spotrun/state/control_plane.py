"""Where a cluster's etcd is and how to connect to it: the embedded etcd by default, or the
recipe's external cluster (with its TLS files)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotrun.errors import ControlPlaneError

if TYPE_CHECKING:
    from spotrun.recipe.schema import TLS, Recipe
    from spotrun.state.store import Store


def endpoints_for(recipe: Recipe) -> tuple[list[str], bool]:
    """(endpoints, embedded) for a recipe; starts the embedded etcd when the recipe uses it."""
    if recipe.control_plane.mode == "external":
        return [_as_url(e) for e in recipe.control_plane.endpoints], False
    from spotrun.state import etcd_server

    return [etcd_server.ensure_running().endpoint], True


def connect_recipe(recipe: Recipe, endpoints: list[str]) -> Store:
    """A store on `endpoints` with the recipe's TLS files. Raises ControlPlaneError."""
    return connect_endpoints(endpoints, tls_files(recipe.control_plane.tls))


def connect_endpoints(endpoints: list[str], tls: dict[str, str] | None = None) -> Store:
    """A store on `endpoints` with the TLS files `tls` (by name: ca, cert, key), e.g. a cluster
    file's. Raises ControlPlaneError."""
    from spotrun.state.store import connect

    tls = tls or {}
    return connect(endpoints, ca=tls.get("ca"), cert=tls.get("cert"), key=tls.get("key"))


def connect_default() -> Store:
    """The embedded etcd, for commands that name no recipe. Raises ControlPlaneError if it is down."""
    from spotrun.state import etcd_server
    from spotrun.state.store import connect

    info = etcd_server.status()
    if info is None:
        raise ControlPlaneError(
            "the embedded etcd is not running",
            hint="start a cluster with `spotrun up RECIPE` or run `spotrun etcd start`",
        )
    return connect([info.endpoint])


def tls_path(tls: TLS | None, name: str) -> str | None:
    """The recipe's control_plane.tls file `name` (ca, cert or key) as a string, or None."""
    value = getattr(tls, name, None) if tls else None
    return str(value) if value else None


def tls_files(tls: TLS | None) -> dict[str, str]:
    """The recipe's control_plane.tls files that are set, by name (ca, cert, key)."""
    return {name: path for name in ("ca", "cert", "key") if (path := tls_path(tls, name))}


def _as_url(endpoint: str) -> str:
    return endpoint if "://" in endpoint else f"http://{endpoint}"
