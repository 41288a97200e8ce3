"""Reaching a cluster's control plane from the user's machine: the one connection path of every
command and of the TUI (embedded etcd, the recipe's external etcd, or an SSH tunnel to the head)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotrun.state.control_plane import connect_default, connect_endpoints

if TYPE_CHECKING:
    from spotrun.state.clusterfile import ClusterFile
    from spotrun.state.store import Store


def connect_cluster(cluster: str) -> Store:
    """The control plane of a cluster this machine started (embedded or the recipe's external
    etcd), else the embedded one. Raises ControlPlaneError if it is unreachable."""
    from spotrun.state import clusterfile

    if cluster in clusterfile.names():
        return connect_record(clusterfile.load(cluster))
    return connect_default()


def connect_record(record: ClusterFile) -> Store:
    """The control plane of a cluster record: through an SSH tunnel to its head VM in mode
    'head', else at its endpoints. Raises ControlPlaneError."""
    if record.head:
        from spotrun.client.head import connect_head

        return connect_head(record)
    return connect_endpoints(record.endpoints, record.tls)
