"""The creator torchrun calls for `--rdzv-backend spotrun-etcd` (entry-point group `torchrun.handlers`).

`handler_creator` is the entry point (pyproject.toml); `create_handler` reads torchrun's
parameters (the conf keys are listed in the package doc), connects to etcd and wires the
backend, the store, the state holder and the handler together.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from datetime import timedelta

from torch.distributed.elastic.rendezvous.api import RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousSettings, RendezvousTimeout

from spotrun.elastic.rendezvous.backend import EtcdRendezvousBackend, connection_error
from spotrun.elastic.rendezvous.fork_guard import check_not_forked
from spotrun.elastic.rendezvous.handler import SpotrunRendezvousHandler
from spotrun.elastic.rendezvous.store import EtcdStore
from spotrun.elastic.rendezvous.torch_patches import SpotrunStateHolder, node_desc
from spotrun.errors import ControlPlaneError
from spotrun.state.etcd import connect

_ID = re.compile(r"[^A-Za-z0-9._-]")


def _default_node_id() -> str:
    return _ID.sub("-", f"{socket.gethostname()}-{os.getpid()}")[:128]


def _timeout(params: RendezvousParameters, name: str) -> timedelta | None:
    value = params.get_as_int(f"{name}_timeout")
    return None if value is None else timedelta(seconds=value)


def create_handler(params: RendezvousParameters) -> SpotrunRendezvousHandler:
    """Build a handler from torchrun's parameters (see the package doc for the conf keys).

    Raises RendezvousConnectionError if etcd is unreachable, ValueError on bad parameters.
    """
    endpoints = [e.strip() for e in (params.endpoint or "").split(",") if e.strip()]
    if not endpoints:
        raise ValueError("--rdzv-endpoint must name etcd, e.g. http://127.0.0.1:2379 (comma-separate several)")
    run_id = params.run_id
    cluster = str(params.get("cluster") or run_id)
    node_id = str(params.get("node") or _default_node_id())
    lease_ttl = params.get_as_int("lease_ttl", 1)
    if lease_ttl is None or lease_ttl < 1:
        raise ValueError(f"lease_ttl ({lease_ttl}) must be an integer >= 1")
    expected = params.get_as_int("expected_nodes")
    gather_s = params.get_as_int("gather_timeout", 15)
    keep_alive_interval = params.get_as_int("keep_alive_interval", 5)
    keep_alive_max_attempt = params.get_as_int("keep_alive_max_attempt", 3)
    settings = RendezvousSettings(
        run_id,
        params.min_nodes,
        params.max_nodes,
        RendezvousTimeout(
            _timeout(params, "join"),
            _timeout(params, "last_call"),
            _timeout(params, "close"),
            _timeout(params, "heartbeat"),
        ),
        keep_alive_interval=timedelta(seconds=keep_alive_interval or 5),
        keep_alive_max_attempt=keep_alive_max_attempt or 3,
    )
    check_not_forked()
    try:
        etcd = connect(endpoints)
    except ControlPlaneError as exc:
        raise connection_error("cannot connect to etcd for the rendezvous", exc) from exc
    try:
        backend = EtcdRendezvousBackend(etcd, cluster, run_id)
        store = EtcdStore(backend)
        node = node_desc(params.local_addr, node_id)
        holder = SpotrunStateHolder(backend, settings, node, expected_nodes=expected, gather_s=float(gather_s or 0))
        return SpotrunRendezvousHandler(
            node,
            settings,
            store,
            holder,
            backend,
            node_id=node_id,
            lease_ttl=lease_ttl,
        )
    except BaseException:
        etcd.close()
        raise


def handler_creator() -> Callable[[RendezvousParameters], SpotrunRendezvousHandler]:
    """Entry point of group `torchrun.handlers`: torch calls it once and registers the creator."""
    return create_handler
