"""Steering a running cluster: set its target size, drain one node.

Both only write desired state into etcd (the target, a node's `leaving` state) plus one history
event; the controller reads them and acts. `spotrun scale` and the TUI call the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from spotrun.errors import MembershipError, NotFoundError, SpotrunError
from spotrun.state.records import EventKind, NodeReason, NodeRecord, NodeState
from spotrun.state.spec import recipe_from_spec
from spotrun.state.store import Store


@dataclass(frozen=True)
class TargetChange:
    cluster: str
    before: int | None  # None: the cluster had no target yet
    after: int


def node_limits(store: Store, cluster: str) -> tuple[int, int]:
    """(nodes.min, nodes.max) of the cluster's stored recipe.

    Raises NotFoundError if the cluster has no spec, ControlPlaneError if etcd is unreachable or
    the spec is not a valid recipe.
    """
    nodes = recipe_from_spec(store, cluster).nodes
    return nodes.min, nodes.max


def set_target(store: Store, cluster: str, nodes: int) -> TargetChange:
    """Set the desired node count of `cluster` to `nodes` and record a "scale" event.

    Validates against the recipe's nodes.min/nodes.max. Blocking, idempotent (setting the current
    target again writes no event). Raises SpotrunError if `nodes` is out of range, NotFoundError if
    the cluster has no recipe, ControlPlaneError if etcd is unreachable.
    """
    low, high = node_limits(store, cluster)
    if not low <= nodes <= high:
        raise SpotrunError(
            f"target ({nodes}) must be between nodes.min ({low}) and nodes.max ({high}) of cluster {cluster!r}",
            hint="change nodes in the recipe and run `spotrun up` to allow it",
        )
    before = store.get_target(cluster)
    if before == nodes:
        return TargetChange(cluster, before, nodes)
    store.set_target(cluster, nodes)
    was = "unset" if before is None else str(before)
    store.add_event(cluster, EventKind.SCALE, f"target {was} -> {nodes} nodes")
    return TargetChange(cluster, before, nodes)


def drain(store: Store, cluster: str, node: str, detail: str = "") -> NodeRecord:
    """Mark `node` as `leaving` with NodeReason.DRAIN (its agent leaves the training job, then the
    controller terminates it); `detail` says why, for people.

    A compare-and-set on the node key, so a concurrent agent write is never lost. Idempotent: a
    node already leaving is returned unchanged, without a second event. Raises NotFoundError if the
    node does not exist, SpotrunError if it is already gone, MembershipError if the node record
    keeps changing under us, ControlPlaneError if etcd is unreachable.
    """
    for _ in range(20):
        found = store.get_node_revision(cluster, node)
        if found is None:
            raise NotFoundError(f"cluster {cluster!r} has no node {node!r}", hint="see `spotrun status`")
        record, revision = found
        if record.state == NodeState.LEAVING:
            return record
        if record.state.is_gone:
            raise SpotrunError(
                f"node {node!r} of cluster {cluster!r} is already {record.state.value}",
                hint="only live nodes can be drained",
            )
        updated = replace(record, state=NodeState.LEAVING, reason=NodeReason.DRAIN, detail=detail)
        if store.cas_node(updated, revision):
            store.add_event(cluster, EventKind.DRAIN, f"{node}: {updated.reason_text}", node)
            return updated
    raise MembershipError(f"node {node!r} of cluster {cluster!r} kept changing while draining it", hint="try again")
