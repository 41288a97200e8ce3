"""The TUI's way into spotrun: where a cluster's etcd is, and the actions the TUI offers.

spotrun.tui imports this module and spotrun.state, nothing else of spotrun, so it does what the
CLI does: it reaches etcd through `connect_cluster` like every command (the embedded etcd, the
recipe's external etcd with its TLS files, or an SSH tunnel to the head VM), scales and drains
through spotrun.controller.scaling, preempts and reads logs through spotrun.client.nodes.

Every function but `require_control_plane` blocks (the TUI calls them from thread workers) and
raises SpotrunError subclasses only. Importing this module is cheap: the controller, SSH and
provider code load inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from spotrun.client.connect import connect_cluster
from spotrun.errors import ControlPlaneError
from spotrun.recipe.run_command import steps_from_run
from spotrun.state.control_plane import connect_default

if TYPE_CHECKING:
    from spotrun.controller.scaling import TargetChange
    from spotrun.state.records import NodeRecord
    from spotrun.state.store import Store

__all__ = [
    "can_preempt",
    "connect",
    "drain",
    "follow_log",
    "list_clusters",
    "preempt",
    "require_control_plane",
    "scale",
    "steps_from_run",
]

ENDPOINT_TIMEOUT_S = 3.0  # an explicit endpoint that does not answer fails fast; the TUI retries


def require_control_plane(cluster: str | None, endpoints: Sequence[str] = ()) -> None:
    """Raise ControlPlaneError at once when `connect` would have nowhere to go: no `endpoints`,
    no record of `cluster` on this machine and no embedded etcd running. Reads local files only;
    an etcd that is known but does not answer is not checked here (the TUI shows it and retries)."""
    from spotrun.state import clusterfile, etcd_server

    if endpoints or (cluster and cluster in clusterfile.names()) or etcd_server.status() is not None:
        return
    raise ControlPlaneError(
        "the embedded etcd is not running and no endpoint was given",
        hint="pass --endpoint http://HOST:PORT, or start a cluster with `spotrun up RECIPE`",
    )


def connect(cluster: str | None, endpoints: Sequence[str] = ()) -> Store:
    """A store to watch and steer `cluster` through: etcd at `endpoints` when given (the TUI's
    `--endpoint`), else the cluster's own control plane (`connect_cluster`, as every command),
    else (no cluster picked yet) the embedded etcd. Closing the store closes any SSH tunnel.
    Raises ControlPlaneError."""
    if endpoints:
        from spotrun.state.store import connect as connect_etcd

        return connect_etcd(list(endpoints), timeout=ENDPOINT_TIMEOUT_S)
    return connect_cluster(cluster) if cluster else connect_default()


def list_clusters(endpoints: Sequence[str] = ()) -> list[str]:
    """The clusters in etcd at `endpoints`, else in the embedded etcd (the TUI's picker).
    Raises ControlPlaneError."""
    with connect(None, endpoints) as store:
        return store.list_clusters()


def scale(store: Store, cluster: str, nodes: int) -> TargetChange:
    """`spotrun scale`: set the target size within nodes.min..nodes.max. Idempotent. Raises
    SpotrunError (out of range), NotFoundError (no recipe in etcd), ControlPlaneError."""
    from spotrun.controller.scaling import set_target

    return set_target(store, cluster, nodes)


def drain(store: Store, cluster: str, node: str) -> NodeRecord:
    """Mark `node` leaving; the controller moves its work off and terminates it. Idempotent.
    Raises NotFoundError, SpotrunError (already gone), MembershipError, ControlPlaneError."""
    from spotrun.controller import scaling

    return scaling.drain(store, cluster, node)


def preempt(cluster: str, node: str, notice_s: float) -> float:
    """`spotrun preempt`: arm a preemption notice on `node` (the VM dies at the returned deadline).
    Raises NotFoundError, ProviderError (a provider that cannot inject preemptions)."""
    from spotrun.client import nodes

    return nodes.preempt(cluster, node, notice_s)


def can_preempt(provider: str) -> bool:
    """Whether `preempt` works on VMs of `provider` (it injects preemptions: the local provider)."""
    from spotrun.providers import Feature, has_feature

    return has_feature(provider, Feature.CHAOS)


def follow_log(cluster: str, node: str, emit: Callable[[str, str], None]) -> None:
    """`spotrun logs CLUSTER NODE -f`: `emit(node, line)` for each line of the node's training
    log; blocks while the log is quiet and returns when the SSH session ends (an exception from
    `emit` ends the read). Raises NotFoundError for a node that is not running."""
    from spotrun.client import nodes

    nodes.logs(cluster, node, follow=True, emit=emit)
