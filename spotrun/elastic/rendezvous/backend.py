"""The rendezvous' storage in etcd v3: one state blob, written by compare-and-set, and the alive keys.

torch's `RendezvousBackend` contract (STYLE.md §2): `get_state() -> (bytes, token) | None` and
`set_state(bytes, token)`, a compare-and-set on a fencing token, here the state key's mod
revision. All membership logic lives above this layer (torch's handler and state holder). etcd
failures become `RendezvousConnectionError`, a blob spotrun did not write `RendezvousStateError`.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from spotrun.elastic.rendezvous.fork_guard import check_not_forked
from spotrun.errors import ControlPlaneError
from spotrun.state import schema

if TYPE_CHECKING:
    from spotrun.state.etcd import Etcd
    from spotrun.state.watch import WatchEvent, WatchHandle

BACKEND_NAME = "spotrun-etcd"
_MAGIC = b"spotrun-rdzv/1\n"  # prefix of the stored state blob; anything else is corrupt


def connection_error(what: str, exc: BaseException) -> RendezvousConnectionError:
    """torch's error for an unreachable etcd; raise it `from exc`."""
    return RendezvousConnectionError(f"{what}: {exc}")


class EtcdRendezvousBackend(RendezvousBackend):
    """The rendezvous state in etcd v3, compare-and-set on the state key's mod revision.

    `get_state`/`set_state` also read the run's alive keys (after the state, so every node in the
    state that is still alive is in `alive`); `alive` holds the node descriptors (`repr` of torch's
    `_NodeDesc`) of the latest read. One watch on the run prefix bumps `generation` on every change
    of the state or of an alive key and wakes `wait_change` and `EtcdStore` waiters.
    """

    def __init__(self, store: Etcd, cluster: str, run_id: str, *, watch: bool = True) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        self._store = store
        self.cluster, self.run_id = cluster, run_id
        self.prefix = schema.rdzv_prefix(cluster, run_id)
        self.state_key = schema.rdzv_state_key(cluster, run_id)
        self.alive_prefix = schema.rdzv_key(cluster, run_id, schema.RdzvPart.ALIVE)
        self.waiting_prefix = schema.rdzv_key(cluster, run_id, schema.RdzvPart.WAITING)
        self.lost_prefix = schema.rdzv_key(cluster, run_id, schema.RdzvPart.LOST)
        self.store_prefix = schema.rdzv_key(cluster, run_id, schema.RdzvPart.STORE)
        self.alive: frozenset[str] = frozenset()
        self._cond = threading.Condition()
        self._generation = 0  # state or alive changes
        self._store_generation = 0  # store/ changes
        self._watch: WatchHandle | None = None
        if watch:
            try:
                self._watch = store.watch_prefix(self.prefix, self._on_event)
            except ControlPlaneError as exc:
                raise connection_error("cannot watch the rendezvous in etcd", exc) from exc

    @property
    def name(self) -> str:
        """See base class."""
        return BACKEND_NAME

    @property
    def store(self) -> Etcd:
        return self._store

    # watch ------------------------------------------------------------------------------------

    def _on_event(self, event: WatchEvent) -> None:
        with self._cond:
            if event.key.startswith(self.store_prefix):
                self._store_generation += 1
            else:
                self._generation += 1
            self._cond.notify_all()

    @property
    def watching(self) -> bool:
        """True while the watch stream is established (changes are seen within milliseconds)."""
        return self._watch is not None and self._watch.active and self._watch.connected.is_set()

    @property
    def generation(self) -> int:
        """Counts changes of the state and alive keys seen by the watch."""
        return self._generation

    def wait_change(self, generation: int, timeout: float) -> bool:
        """Block until `generation` is outdated or `timeout` s passed; True if something changed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._generation == generation:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def wait_store_change(self, generation: int, timeout: float) -> None:
        with self._cond:
            if self._store_generation == generation:
                self._cond.wait(timeout)

    @property
    def store_generation(self) -> int:
        return self._store_generation

    # state ------------------------------------------------------------------------------------

    def get_state(self) -> tuple[bytes, Token] | None:
        """See base class. Raises RendezvousConnectionError, RendezvousStateError."""
        check_not_forked()
        try:
            found = self._store.get(self.state_key)
            alive = self._store.get_prefix(self.alive_prefix)
        except ControlPlaneError as exc:
            raise connection_error("The connection to etcd has failed", exc) from exc
        self.alive = frozenset(d for d in (_alive_desc(v) for _, v, _ in alive) if d)
        if found is None:
            return None
        blob, revision = found
        if not blob.startswith(_MAGIC):
            raise RendezvousStateError(f"The rendezvous state at {self.state_key} is corrupt (not written by spotrun).")
        return blob[len(_MAGIC) :], revision

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        """See base class. Raises RendezvousConnectionError, RendezvousStateError."""
        check_not_forked()
        try:
            expect = int(token) if token is not None else None
        except (TypeError, ValueError):
            got = self.get_state()
            return None if got is None else (*got, False)
        try:
            ok = self._store.cas(self.state_key, expect, _MAGIC + state)
        except ControlPlaneError as exc:
            raise connection_error("The connection to etcd has failed", exc) from exc
        got = self.get_state()  # the new token (and maybe a newer state built on ours)
        if got is None:
            return None
        return (*got, ok)

    def close(self) -> None:
        """Stop the watch. Idempotent."""
        if self._watch is not None:
            self._watch.cancel()


def _alive_desc(value: bytes) -> str | None:
    try:
        return str(json.loads(value)["desc"])
    except (ValueError, KeyError, TypeError):
        return None
