"""Reaching the control plane: the embedded etcd by default, or the recipe's external cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotrun.errors import ControlPlaneError

if TYPE_CHECKING:
    from spotrun.recipe import Recipe
    from spotrun.store import Store


def endpoints_for(recipe: "Recipe") -> tuple[list[str], bool]:
    """(endpoints, embedded) for a recipe; starts the embedded etcd when the recipe uses it."""
    if recipe.control_plane.mode == "external":
        return [_as_url(e) for e in recipe.control_plane.endpoints], False
    from spotrun import etcd_server

    return [etcd_server.ensure_running().endpoint], True


def connect_recipe(recipe: "Recipe", endpoints: list[str]) -> "Store":
    from spotrun.store import connect

    tls = recipe.control_plane.tls
    return connect(endpoints, ca=_path(tls, "ca"), cert=_path(tls, "cert"), key=_path(tls, "key"))


def connect_default() -> "Store":
    """The embedded etcd, for commands that name no recipe. Raises ControlPlaneError if it is down."""
    from spotrun import etcd_server
    from spotrun.store import connect

    info = etcd_server.status()
    if info is None:
        raise ControlPlaneError("the embedded etcd is not running",
                                hint="start a cluster with `spotrun up RECIPE` or run `spotrun etcd start`")
    return connect([info.endpoint])


def connect_cluster(cluster: str) -> "Store":
    """The control plane of a cluster this machine started (embedded or the recipe's external
    etcd), else the embedded one. Raises ControlPlaneError if it is unreachable."""
    from spotrun import clusterfile

    if cluster in clusterfile.names():
        return connect_record(clusterfile.load(cluster))
    return connect_default()


def connect_record(record) -> "Store":
    """The control plane of a cluster record: through an SSH tunnel to its head VM in mode
    'head', else at its endpoints. Raises ControlPlaneError."""
    if record.head:
        from spotrun.head import connect_head

        return connect_head(record)
    return connect_recipe(record.recipe(), record.endpoints)


def vm_tls(recipe: "Recipe") -> tuple[dict[str, bytes], dict[str, str]]:
    """(files, env) that give a VM's processes the recipe's etcd TLS files: the files go to the
    VM's secrets dir (bootstrap.REMOTE_SECRETS), the env points store.connect at them."""
    from spotrun.bootstrap import REMOTE_SECRETS

    tls = recipe.control_plane.tls
    files, env = {}, {}
    for name in ("ca", "cert", "key"):
        path = _path(tls, name)
        if path:
            try:
                files[f"etcd-{name}.pem"] = open(path, "rb").read()
            except OSError as exc:
                raise ControlPlaneError(f"cannot read TLS file: {exc}", hint="check control_plane.tls") from exc
            env[f"SPOTRUN_ETCD_{name.upper()}"] = f"{REMOTE_SECRETS}/etcd-{name}.pem"
    return files, env


def _as_url(endpoint: str) -> str:
    return endpoint if "://" in endpoint else f"http://{endpoint}"


def _path(tls, name: str) -> str | None:
    value = getattr(tls, name, None) if tls else None
    return str(value) if value else None
