"""`SpotrunRendezvousHandler`: torch's dynamic rendezvous handler over the etcd backend.

torch's `DynamicRendezvousHandler` keeps all membership logic; what this subclass adds (liveness
by lease, watches, early last call, leaving, coordinated joins, peer-lost reports) is described
in the package doc (`spotrun.elastic.rendezvous`). It patches nothing and calls nothing private in
torch itself (it reads the fields of torch's rendezvous state, as torch's own handler does): the
patches and private calls it relies on are in `torch_patches`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousGracefulExitError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousSettings

from spotrun import log
from spotrun.elastic.rendezvous import torch_patches
from spotrun.elastic.rendezvous.backend import BACKEND_NAME, EtcdRendezvousBackend, connection_error
from spotrun.elastic.rendezvous.fork_guard import in_forked_child
from spotrun.elastic.rendezvous.store import EtcdStore
from spotrun.elastic.rendezvous.torch_patches import SpotrunStateHolder
from spotrun.errors import ControlPlaneError
from spotrun.node.protocol import PEER_LOST_FILE_ENV
from spotrun.state.etcd import LeaseKeeper

_log = log.get("rendezvous")
_handlers: list[weakref.ref[SpotrunRendezvousHandler]] = []


def current_handler() -> SpotrunRendezvousHandler | None:
    """The most recent handler created in this process (the launcher has exactly one)."""
    for ref in reversed(_handlers):
        handler = ref()
        if handler is not None:
            return handler
    return None


class SpotrunRendezvousHandler(DynamicRendezvousHandler):
    """torch's dynamic handler over `EtcdRendezvousBackend`; see the package doc for what differs."""

    def __init__(
        self,
        node: Any,
        settings: RendezvousSettings,
        store: EtcdStore,
        state_holder: SpotrunStateHolder,
        backend: EtcdRendezvousBackend,
        *,
        node_id: str,
        lease_ttl: int = 1,
    ) -> None:
        super().__init__(node, settings, BACKEND_NAME, store, state_holder)
        torch_patches.apply(self)
        self._desc = node  # the objects torch keeps in its private _this_node and _state_holder
        self._holder = state_holder
        self._backend = backend
        self._etcd_store = store
        self.node_id = node_id
        self._leave_requested = threading.Event()
        self._left = threading.Event()
        self._leave_lock = threading.Lock()
        self._waiting = False
        self._cleaned_round = -1
        self._round: int | None = None  # the round the local workers run in, and its members
        self._members: frozenset[Any] = frozenset()
        self._reported_broken = False
        self._rendezvousing = False  # from next_rendezvous() until the agent monitors its new workers
        self._formed: tuple[int, frozenset[Any]] = (-1, frozenset())  # a completed round with this node, its members
        store.broken = self._round_lost_member
        value = json.dumps({"node": node_id, "desc": repr(node), "pid": os.getpid(), "since": time.time()})
        try:
            self._alive: LeaseKeeper = LeaseKeeper(backend.store, backend.alive_prefix + node_id, value, lease_ttl)
        except ControlPlaneError as exc:
            raise connection_error("cannot publish the rendezvous alive key", exc) from exc
        state_holder.on_state = self._on_state
        _handlers.append(weakref.ref(self))

    @property
    def node(self) -> str:
        """This node's descriptor as torch writes it into the state (`addr_pid_localid`)."""
        return repr(self._desc)

    @property
    def left(self) -> bool:
        """True once this node has left the rendezvous (it will not rejoin)."""
        return self._left.is_set()

    @property
    def waiting_key(self) -> str:
        return self._backend.waiting_prefix + self.node_id

    # joins ------------------------------------------------------------------------------------

    def _on_state(self, state: Any) -> None:
        if state.complete and self._desc in state.participants and state.round != self._formed[0]:
            # The members as this node first sees the round completed: what its agent's world is
            # built from (a member dropped later still counts; see _round_lost_member).
            self._formed = (state.round, frozenset(state.participants))
        waiting = self._desc in state.wait_list and not state.closed
        if waiting == self._waiting or self.left:
            return
        try:
            if waiting:
                value = json.dumps({"node": self.node_id, "desc": self.node, "since": time.time()})
                self._backend.store.put(self.waiting_key, value, lease=self._alive.lease_id)
            else:
                self._backend.store.delete(self.waiting_key)
            self._waiting = waiting
        except ControlPlaneError as exc:
            _log.info("could not update the waiting key", extra=log.kv(node=self.node_id, error=exc))

    def next_rendezvous(self) -> Any:
        """See base class. After `request_leave()` it leaves instead and raises RendezvousGracefulExitError."""
        if self._leave_requested.is_set() or self.left:
            self.leave()
            raise RendezvousGracefulExitError(f"node {self.node_id} left the rendezvous {self.settings.run_id!r}")
        self._round = None
        self._rendezvousing = True
        self._report_peer_lost()
        info = super().next_rendezvous()
        state = self._holder.state
        self._round, self._members, self._reported_broken = state.round, frozenset(state.participants), False
        self._on_state(state)
        self._cleanup_old_rounds(info.rank)
        return info

    def _round_lost_member(self) -> str | None:
        """Why the round this node just joined can no longer start, or None: asked by the store while
        the agents wait for each other's keys (MASTER_ADDR, rank assignment), between the round's
        completion and the start of the workers. A member that died there (a joiner hard-killed as
        it arrives) never writes its keys; torch's agent would wait out the store timeout (300 s)
        with the survivors' workers stopped. Its alive lease ends, the state drops it and the
        agent rendezvouses again (launcher: `_rendezvous_again_when_broken`).
        Never raises: an unreadable state counts as "not broken" (the store timeout still holds)."""
        if not self._rendezvousing or self.left:
            return None
        state = self._read_state()
        if state is None:
            return None
        if state.closed:
            return None  # the job finished: torch's own handling
        formed, members = self._formed
        if state.round != formed or not members <= set(state.participants):
            return f"round {formed} lost a member before its workers started"
        if sorted(state.participants[m] for m in members) != list(range(len(members))):
            return f"round {formed} lost a member before this node saw it complete"  # a gap in the ranks
        return None

    def _report_peer_lost(self) -> None:
        """A local worker exited because a peer died (the trainer touched $SPOTRUN_PEER_LOST_FILE):
        say so under `.../lost/<node>`, so the controller looks at the provider now and a warm spare
        can join this very round, instead of waking when the dead node's lease ends with it."""
        path = os.environ.get(PEER_LOST_FILE_ENV)
        if not path:
            return
        try:
            os.unlink(path)
        except OSError:
            return  # no marker: an ordinary re-formation
        value = json.dumps({"node": self.node_id, "round": self._holder.state.round, "at": time.time()})
        try:
            self._backend.store.put(self._backend.lost_prefix + self.node_id, value, lease=self._alive.lease_id)
        except ControlPlaneError as exc:
            _log.info("could not report the lost peer", extra=log.kv(node=self.node_id, error=exc))

    def _cleanup_old_rounds(self, rank: int) -> None:
        """Rank 0 deletes the store keys of rounds older than the previous one (best effort)."""
        current = self._holder.state.round
        if rank != 0:
            return
        for old in range(max(self._cleaned_round + 1, current - 20), current - 1):
            try:
                self._etcd_store.delete_round(f"torch.rendezvous.{self.settings.run_id}.{old}/")
            except dist.DistStoreError:
                return
            self._cleaned_round = old

    def _read_state(self) -> Any:
        """The rendezvous state as etcd holds it now, or None (logged) when it cannot be read."""
        try:
            with torch_patches.heartbeat_lock(self):
                self._holder.sync()
                return self._holder.state
        except Exception as exc:
            _log.info("could not read the rendezvous state", extra=log.kv(error=exc))
            return None

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join, as torch's agent polls it (every monitor interval) to restart workers.

        Waiting nodes count 0: joins are coordinated (the trainer admits them at a step boundary).
        It reports 1 when the round the local workers run in is broken: a member left it (lease
        gone, graceful leave) or it was replaced, so the agent restarts its workers at once instead
        of leaving them blocked in a collective until its timeout (gloo does not always see a dead
        peer). Never raises: an unreachable etcd counts as "no change" (workers keep running;
        liveness comes from the lease anyway).
        """
        self._rendezvousing = False  # the agent polls this only once its workers run
        state = self._read_state()
        if state is None:
            return 0
        if (
            self._round is not None
            and not state.closed
            and (state.round != self._round or frozenset(state.participants) != self._members)
        ):
            if not self._reported_broken:
                _log.info(
                    "the rendezvous round changed; restarting the local workers",
                    extra=log.kv(node=self.node_id, round=self._round),
                )
                self._reported_broken = True
            return 1
        return 0

    # leaving ----------------------------------------------------------------------------------

    def request_leave(self) -> None:
        """Leave at the next rendezvous (signal-safe: only sets a flag)."""
        self._leave_requested.set()

    def leave(self) -> None:
        """Leave now: revoke the alive lease, then remove this node from the state. Idempotent.

        Survivors see the alive key go through their watch and drop this node at once. Raises
        nothing: a node that cannot reach etcd is dropped when its lease expires.
        """
        with self._leave_lock:
            if self.left:
                return
            self._left.set()
            torch_patches.stop_heartbeats(self)
            self._alive.stop(revoke=True)  # also deletes the waiting key bound to the same lease
            try:
                self._remove_self()
            except Exception as exc:
                _log.info(
                    "could not remove the node from the rendezvous state", extra=log.kv(node=self.node_id, error=exc)
                )

    def _remove_self(self) -> None:
        backend = self._backend
        for _ in range(100):
            got = backend.get_state()
            if got is None:
                return
            blob = torch_patches.without_node(got[0], self._desc, self.settings)
            if blob is None:
                return
            result = backend.set_state(blob, got[1])
            if result is None or result[2]:
                return
        raise RendezvousConnectionError("could not remove the node from the rendezvous: too many concurrent writers")

    def shutdown(self) -> bool:
        """Leave the rendezvous; unlike torch it does not close it (see `finish`). Returns True."""
        self.leave()
        return True

    def finish(self, *, closed: bool) -> None:
        """Release everything; with `closed` mark the rendezvous closed first (the job is done)."""
        if closed and not in_forked_child():
            try:
                torch_patches.close(self)
            except Exception as exc:
                _log.info("could not close the rendezvous", extra=log.kv(error=exc))
        self.leave()
        self._backend.close()
