"""etcd v3 rendezvous for torchrun: backend `spotrun-etcd`, registered through `torchrun.handlers`.

torch's `DynamicRendezvousHandler` keeps all membership logic; this module gives it

- `EtcdRendezvousBackend`: the state blob under `/spotrun/<cluster>/rdzv/<run_id>/state`, written
  by compare-and-set on the key's mod revision (the fencing token);
- `EtcdStore`: the c10d `Store` the agents share (rank assignment, MASTER_ADDR/PORT, the exit
  barrier) under `.../rdzv/<run_id>/store/`, so it survives any node (torch's c10d store dies
  with the node that hosts it);
- `SpotrunRendezvousHandler`: the handler, with four speed-ups over torch's defaults:

  1. Liveness by lease. Each handler holds `.../rdzv/<run_id>/alive/<node>` bound to a short
     etcd lease (1 s on spotrun's own etcd, refreshed every ttl/3; see etcd_server.ELECTION_ARGS). A node in the state whose alive
     key is gone counts as dead at the next read: its heartbeat is aged so torch's own sanitizer
     drops it (`_SpotrunStateHolder._sanitize`). torch's heartbeats still run as a second check.
  2. Watches instead of fixed polls. One etcd watch on the run prefix wakes the handler on any
     change of the state or of an alive key: the op executor's `_delay(seconds=1)` and the 1 s
     state cache end at the first change (the 1 s stay the upper bound), and a participant
     waiting for the last-call deadline wakes at the deadline instead of up to 1 s after it.
  3. Early last call. Once every live node of the run (every alive key) is a participant, the
     round completes at once instead of after `last_call_timeout`.
  4. Leaving. `leave()` revokes the alive lease (every survivor sees the delete through its watch)
     and removes the node from participants, wait list and redundancy list by compare-and-set.
     `request_leave()` makes the next `next_rendezvous()` leave and raise
     `RendezvousGracefulExitError`. `shutdown()` leaves and never closes the rendezvous; the
     launcher closes it (`finish(closed=True)`) only when the job has finished.

Joins are coordinated by the trainer (conf `coordinated_join=1`, the default): a node waiting for
the next round publishes `.../rdzv/<run_id>/waiting/<node>` (bound to its alive lease) and
`num_nodes_waiting()` reports 0, so torch never kills workers mid-step for a join; spotrun's agent
sees the key, the trainer checkpoints at a step boundary and its workers exit 75, every agent
re-rendezvouses and the joiner is admitted. `coordinated_join=0` restores torch's behaviour.
`num_nodes_waiting()` also reports 1 as soon as the round the local workers run in loses a member
(a lease expired or a node left), so every agent restarts its workers at once rather than waiting
for a collective to time out.

What is patched in torch (module `dynamic_rendezvous`, torch 2.4-2.13), each guarded so that a
torch without the expected names simply keeps torch's behaviour:

- `dynamic_rendezvous._delay` is replaced by `_watching_delay`, which behaves exactly like the
  original unless called on a thread that is running one of *our* handlers' op executors
  (`_WatchingOpExecutor.run` marks it through a thread-local); there it waits for the next watch
  event, bounded by the requested delay, and skips the random 0-0.3 s first-round jitter.
- `_SpotrunStateHolder` subclasses `_BackendRendezvousStateHolder`, overriding `sync()` (serve
  the cache only while nothing changed, using the private `_dirty`, `_last_sync_time` and
  `_cache_duration`) and `_sanitize()` (lease-dead nodes, early last call).

Conf keys (`--rdzv-conf`): `cluster` (default: the run id), `node` (spotrun node id for the alive
and waiting keys; default `<host>-<pid>`), `lease_ttl` (s, default 1; an etcd run with
etcd's default election timeout rounds it up to its minimum, 2 s), `coordinated_join` (default 1), plus torch's `join_timeout`, `last_call_timeout`,
`close_timeout`, `heartbeat_timeout`, `keep_alive_interval`, `keep_alive_max_attempt`.

Peer lost: a worker that exits because a peer died touches `$SPOTRUN_PEER_LOST_FILE`; the
handler then puts `.../rdzv/<run_id>/lost/<node>` (bound to its alive lease) as it re-joins, and
the controller, woken by it, looks at the provider before the dead node's lease has ended.

Creating a handler sets `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` in this process: torch's shared
agent TCPStore lives on the rank-0 node and dies with it; the agents share `EtcdStore` instead.

Forked workers must never use the launcher's etcd connection (gRPC is not fork-safe): an
at-fork hook marks a forked child, after which every etcd call from this module raises.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _dr
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousParameters,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousSettings,
    RendezvousTimeout,
    Token,
)

from spotrun import log
from spotrun.errors import ControlPlaneError
from spotrun.node.protocol import PEER_LOST_FILE_ENV
from spotrun.state import store as store_mod

if TYPE_CHECKING:
    from spotrun.state.store import LeaseKeeper, Store, WatchEvent, WatchHandle

BACKEND_NAME = "spotrun-etcd"
_MAGIC = b"spotrun-rdzv/1\n"  # prefix of the stored state blob; anything else is corrupt
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_log = log.get("rendezvous")

# --- fork safety ---------------------------------------------------------------------------

_in_forked_child = False


def _after_fork_in_child() -> None:
    global _in_forked_child
    _in_forked_child = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_not_forked() -> None:
    if _in_forked_child:
        raise RuntimeError("a forked worker must not use the launcher's etcd connection (gRPC is not fork-safe)")


def _connection_error(what: str, exc: BaseException) -> RendezvousConnectionError:
    return RendezvousConnectionError(f"{what}: {exc}")


# --- backend -------------------------------------------------------------------------------


class EtcdRendezvousBackend(RendezvousBackend):
    """The rendezvous state in etcd v3, compare-and-set on the state key's mod revision.

    `get_state`/`set_state` also read the run's alive keys (after the state, so every node in the
    state that is still alive is in `alive`); `alive` holds the node descriptors (`repr` of torch's
    `_NodeDesc`) of the latest read. One watch on the run prefix bumps `generation` on every change
    of the state or of an alive key and wakes `wait_change` and `EtcdStore` waiters.
    """

    def __init__(self, store: Store, cluster: str, run_id: str, *, watch: bool = True) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        self._store = store
        self.cluster, self.run_id = cluster, run_id
        self.prefix = store_mod.key(cluster, "rdzv", run_id) + "/"
        self.state_key = self.prefix + "state"
        self.alive_prefix = store_mod.rdzv_key(cluster, run_id, "alive")
        self.waiting_prefix = store_mod.rdzv_key(cluster, run_id, "waiting")
        self.lost_prefix = store_mod.rdzv_key(cluster, run_id, "lost")
        self.store_prefix = self.prefix + "store/"
        self.alive: frozenset[str] = frozenset()
        self._cond = threading.Condition()
        self._generation = 0  # state or alive changes
        self._store_generation = 0  # store/ changes
        self._watch: WatchHandle | None = None
        if watch:
            try:
                self._watch = store.watch_prefix(self.prefix, self._on_event)
            except ControlPlaneError as exc:
                raise _connection_error("cannot watch the rendezvous in etcd", exc) from exc

    @property
    def name(self) -> str:
        """See base class."""
        return BACKEND_NAME

    @property
    def store(self) -> Store:
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
        _check_not_forked()
        try:
            found = self._store.get(self.state_key)
            alive = self._store.get_prefix(self.alive_prefix)
        except ControlPlaneError as exc:
            raise _connection_error("The connection to etcd has failed", exc) from exc
        self.alive = frozenset(d for d in (_alive_desc(v) for _, v, _ in alive) if d)
        if found is None:
            return None
        blob, revision = found
        if not blob.startswith(_MAGIC):
            raise RendezvousStateError(f"The rendezvous state at {self.state_key} is corrupt (not written by spotrun).")
        return blob[len(_MAGIC) :], revision

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        """See base class. Raises RendezvousConnectionError, RendezvousStateError."""
        _check_not_forked()
        try:
            expect = int(token) if token is not None else None
        except (TypeError, ValueError):
            got = self.get_state()
            return None if got is None else (*got, False)
        try:
            ok = self._store.cas(self.state_key, expect, _MAGIC + state)
        except ControlPlaneError as exc:
            raise _connection_error("The connection to etcd has failed", exc) from exc
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


# --- c10d store ----------------------------------------------------------------------------


class EtcdStore(dist.Store):
    """A c10d `Store` for the agents, in etcd under the run's `store/` prefix.

    Blocking `get`/`wait` wake on the backend's watch (polling every 0.5 s as a fallback) and
    raise `DistStoreError` after the store timeout. Keys are stored as given (torch prefixes them
    with `torch.rendezvous.<run>.<round>/`), so old rounds can be deleted by prefix.
    """

    def __init__(self, backend: EtcdRendezvousBackend, timeout: timedelta | None = None) -> None:
        super().__init__()
        self._backend = backend
        self._etcd = backend.store
        self._prefix = backend.store_prefix
        if timeout is not None:
            self.set_timeout(timeout)

    def _k(self, key: str | bytes) -> str:
        return self._prefix + (key.decode() if isinstance(key, bytes) else key)

    @staticmethod
    def _b(value: str | bytes | list[int]) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        return bytes(value)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        _check_not_forked()
        try:
            return fn(*args)
        except ControlPlaneError as exc:
            raise dist.DistStoreError(f"etcd store: {exc}") from exc

    def set(self, key: str, value: str | bytes) -> None:  # type: ignore[override]
        self._call(self._etcd.put, self._k(key), self._b(value))

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:  # type: ignore[override]
        for k, v in zip(keys, values):
            self.set(k, v)

    def _try_get(self, keys: list[str]) -> list[bytes] | None:
        out = []
        for k in keys:
            found = self._call(self._etcd.get, self._k(k))
            if found is None:
                return None
            out.append(found[0])
        return out

    def _wait_get(self, keys: list[str], timeout: timedelta | None = None) -> list[bytes]:
        limit = (timeout or self.timeout).total_seconds()
        deadline = time.monotonic() + limit
        while True:
            generation = self._backend.store_generation
            got = self._try_get(keys)
            if got is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                raise dist.DistStoreError(f"timed out after {limit:.0f} s waiting for keys {keys} in the etcd store")
            self._backend.wait_store_change(generation, min(left, 0.5))

    def get(self, key: str) -> bytes:  # type: ignore[override]
        return self._wait_get([key])[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
        return self._wait_get(list(keys))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:  # type: ignore[override]
        self._wait_get(list(keys), timeout)

    def check(self, keys: list[str]) -> bool:  # type: ignore[override]
        return self._try_get(list(keys)) is not None

    def add(self, key: str, amount: int) -> int:  # type: ignore[override]
        k = self._k(key)
        for _ in range(1000):
            found = self._call(self._etcd.get, k)
            value = (int(found[0]) if found else 0) + amount
            if self._call(self._etcd.cas, k, found[1] if found else None, str(value).encode()):
                return value
        raise dist.DistStoreError(f"etcd store: add on {key!r} kept conflicting")

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:  # type: ignore[override]
        k, expected_b, desired_b = self._k(key), self._b(expected), self._b(desired)
        while True:
            found = self._call(self._etcd.get, k)
            if found is None:
                if expected_b:
                    return expected_b
                if self._call(self._etcd.cas, k, None, desired_b):
                    return desired_b
            elif found[0] != expected_b:
                return found[0]
            elif self._call(self._etcd.cas, k, found[1], desired_b):
                return desired_b

    def delete_key(self, key: str) -> bool:  # type: ignore[override]
        return bool(self._call(self._etcd.delete, self._k(key)))

    def num_keys(self) -> int:  # type: ignore[override]
        return len(self._call(self._etcd.get_prefix, self._prefix))

    def delete_round(self, round_prefix: str) -> int:
        """Delete every key of one rendezvous round (`torch.rendezvous.<run>.<round>/`)."""
        return int(self._call(self._etcd.delete_prefix, self._prefix + round_prefix))


# --- torch patches -------------------------------------------------------------------------

_local = threading.local()
_original_delay = getattr(_dr, "_delay", None)
_patch_lock = threading.Lock()


def _watching_delay(seconds: float | tuple[float, float]) -> None:
    """torch's `_delay`, except on a thread running a spotrun op executor (see module doc)."""
    holder: _SpotrunStateHolder | None = getattr(_local, "holder", None)
    if holder is None:
        assert _original_delay is not None
        _original_delay(seconds)
        return
    if isinstance(seconds, tuple):
        return  # first-round jitter: compare-and-set already resolves concurrent writers
    holder.wait_for_change(float(seconds))


def _install_delay_patch() -> bool:
    """Replace `dynamic_rendezvous._delay` once; False (torch's behaviour) if torch differs."""
    with _patch_lock:
        current = getattr(_dr, "_delay", None)
        if current is _watching_delay:
            return True
        if current is None or current is not _original_delay:
            _log.warning("torch's dynamic rendezvous has no _delay to patch; keeping its 1 s polls")
            return False
        _dr._delay = _watching_delay
        return True


_HOLDER_ATTRS = ("_dirty", "_last_sync_time", "_cache_duration", "_state", "_settings", "_sanitize")


class _SpotrunStateHolder(_dr._BackendRendezvousStateHolder):
    """torch's state holder with watch-driven caching, lease-based death and an early last call."""

    def __init__(
        self,
        backend: EtcdRendezvousBackend,
        settings: RendezvousSettings,
        node: Any,
        expected_nodes: int | None = None,
        gather_s: float = 15.0,
    ) -> None:
        super().__init__(backend, settings, cache_duration=1)
        # A round's last call stays open (up to gather_s) while a node that is alive has not joined
        # yet, and the first round also for the cluster's target size: on a busy machine restarted
        # members arrive seconds apart, and a round that closes without them costs another
        # re-formation (or leaves them waiting) right away. A dead node's lease ends the wait.
        self._expected = expected_nodes
        self._gather = timedelta(seconds=gather_s)
        self._opened: dict[int, datetime] = {}
        self._spotrun_backend = backend
        self._node = node
        self._lock = threading.RLock()
        self._synced_generation = -1
        self._patched = all(hasattr(self, a) for a in _HOLDER_ATTRS)
        if not self._patched:
            _log.warning("torch's rendezvous state holder changed; using its plain 1 s cache")
        self.on_state: Callable[[Any], None] | None = None

    def sync(self) -> bool | None:
        with self._lock:
            backend = self._spotrun_backend
            if not self._patched or not backend.watching:
                result = super().sync()
            else:
                fresh = self._last_sync_time >= 0 and time.monotonic() - self._last_sync_time < self._cache_duration
                if not self._dirty and fresh and backend.generation == self._synced_generation:
                    return None
                self._synced_generation = backend.generation
                saved, self._cache_duration = self._cache_duration, 0
                try:
                    result = super().sync()
                finally:
                    self._cache_duration = saved
            if self.on_state is not None:
                self.on_state(self._state)
            return result

    def _sanitize(self) -> None:
        if not self._patched:
            super()._sanitize()
            return
        state, alive = self._state, self._spotrun_backend.alive
        members = (
            set(state.participants) | set(state.wait_list) | set(state.redundancy_list) | set(state.last_heartbeats)
        )
        for node in members:
            if node != self._node and repr(node) not in alive:
                state.last_heartbeats[node] = _EPOCH  # torch's sanitizer drops it as dead
        super()._sanitize()
        if not self._hold_last_call(state, alive):
            self._end_last_call_early(state, alive)

    def _hold_last_call(self, state: Any, alive: frozenset[str]) -> bool:
        """Keep the last call open while an alive node is missing (or, in the first round, the
        expected count is not reached), for at most gather_s after the round's last call opened."""
        if state.complete or state.closed or state.deadline is None:
            return False
        missing = alive - {repr(p) for p in state.participants}
        short = state.round == 0 and self._expected is not None and len(state.participants) < self._expected
        if not missing and not short:
            return False
        now = datetime.now(timezone.utc)
        hold_until = self._opened.setdefault(state.round, now) + self._gather
        if now >= hold_until:
            return False
        if state.deadline < hold_until:
            state.deadline = hold_until
        return True

    def _end_last_call_early(self, state: Any, alive: frozenset[str]) -> None:
        settings = self._settings
        if state.complete or state.closed or state.deadline is None:
            return
        n = len(state.participants)
        if not settings.min_nodes <= n <= settings.max_nodes:
            return
        names = {repr(p) for p in state.participants}
        if alive and alive <= names:
            state.deadline = datetime.now(timezone.utc) - timedelta(milliseconds=1)

    def wait_for_change(self, seconds: float) -> None:
        """The executor's SYNC pause: until the next watch event, the last-call deadline, or `seconds`."""
        backend = self._spotrun_backend
        if not self._patched or not backend.watching:
            assert _original_delay is not None
            _original_delay(seconds)
            return
        timeout = seconds
        state = self._state
        if not state.complete and state.deadline is not None and self._node in state.participants:
            until = (state.deadline - datetime.now(timezone.utc)).total_seconds()
            timeout = min(timeout, max(until, 0.0) + 0.005)
        if timeout >= 0.001:
            backend.wait_change(self._synced_generation, timeout)
        # The next sync must read: the cached state is stale or the deadline has passed.
        self._synced_generation = -1


class _WatchingOpExecutor(_dr._DistributedRendezvousOpExecutor):
    """torch's op executor; marks its thread so `_watching_delay` knows whose watch to wait on."""

    def run(self, *args: Any, **kwargs: Any) -> None:
        previous = getattr(_local, "holder", None)
        _local.holder = self._state_holder
        try:
            super().run(*args, **kwargs)
        finally:
            _local.holder = previous


# --- handler -------------------------------------------------------------------------------

_handlers: list[weakref.ref[SpotrunRendezvousHandler]] = []


def current_handler() -> SpotrunRendezvousHandler | None:
    """The most recent handler created in this process (the launcher has exactly one)."""
    for ref in reversed(_handlers):
        handler = ref()
        if handler is not None:
            return handler
    return None


class SpotrunRendezvousHandler(DynamicRendezvousHandler):
    """torch's dynamic handler over `EtcdRendezvousBackend`; see the module doc for what differs."""

    def __init__(
        self,
        node: Any,
        settings: RendezvousSettings,
        store: EtcdStore,
        state_holder: _SpotrunStateHolder,
        backend: EtcdRendezvousBackend,
        *,
        node_id: str,
        lease_ttl: int = 1,
        coordinated_join: bool = True,
    ) -> None:
        super().__init__(node, settings, BACKEND_NAME, store, state_holder)
        if hasattr(_dr, "_DistributedRendezvousOpExecutor") and hasattr(self, "_op_executor"):
            self._op_executor = _WatchingOpExecutor(self._this_node, self._state_holder, self._settings)
        self._backend = backend
        self._etcd_store = store
        self.node_id = node_id
        self.coordinated_join = coordinated_join
        self._leave_requested = threading.Event()
        self._left = threading.Event()
        self._leave_lock = threading.Lock()
        self._waiting = False
        self._cleaned_round = -1
        self._round: int | None = None  # the round the local workers run in, and its members
        self._members: frozenset[Any] = frozenset()
        self._reported_broken = False
        value = json.dumps({"node": node_id, "desc": repr(node), "pid": os.getpid(), "since": time.time()})
        try:
            self._alive: LeaseKeeper = store_mod.LeaseKeeper(
                backend.store, backend.alive_prefix + node_id, value, lease_ttl
            )
        except ControlPlaneError as exc:
            raise _connection_error("cannot publish the rendezvous alive key", exc) from exc
        state_holder.on_state = self._on_state
        _handlers.append(weakref.ref(self))

    @property
    def node(self) -> str:
        """This node's descriptor as torch writes it into the state (`addr_pid_localid`)."""
        return repr(self._this_node)

    @property
    def left(self) -> bool:
        """True once this node has left the rendezvous (it will not rejoin)."""
        return self._left.is_set()

    @property
    def waiting_key(self) -> str:
        return self._backend.waiting_prefix + self.node_id

    # joins ------------------------------------------------------------------------------------

    def _on_state(self, state: Any) -> None:
        waiting = self._this_node in state.wait_list and not state.closed
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
            raise RendezvousGracefulExitError(f"node {self.node_id} left the rendezvous {self._settings.run_id!r}")
        self._round = None
        self._report_peer_lost()
        info = super().next_rendezvous()
        state = self._state_holder.state
        self._round, self._members, self._reported_broken = state.round, frozenset(state.participants), False
        self._on_state(state)
        self._cleanup_old_rounds(info.rank)
        return info

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
        value = json.dumps({"node": self.node_id, "round": self._state_holder.state.round, "at": time.time()})
        try:
            self._backend.store.put(self._backend.lost_prefix + self.node_id, value, lease=self._alive.lease_id)
        except ControlPlaneError as exc:
            _log.info("could not report the lost peer", extra=log.kv(node=self.node_id, error=exc))

    def _cleanup_old_rounds(self, rank: int) -> None:
        """Rank 0 deletes the store keys of rounds older than the previous one (best effort)."""
        current = self._state_holder.state.round
        if rank != 0:
            return
        for old in range(max(self._cleaned_round + 1, current - 20), current - 1):
            try:
                self._etcd_store.delete_round(f"torch.rendezvous.{self._settings.run_id}.{old}/")
            except dist.DistStoreError:
                return
            self._cleaned_round = old

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join, as torch's agent polls it (every monitor interval) to restart workers.

        With coordinated joins waiting nodes count 0 (the trainer admits them at a step boundary);
        with `coordinated_join=0`, torch's count. Either way it reports 1 when the round the local
        workers run in is broken: a member left it (lease gone, graceful leave) or it was replaced,
        so the agent restarts its workers at once instead of leaving them blocked in a collective
        until its timeout (gloo does not always see a dead peer). Never raises: an unreachable
        etcd counts as "no change" (workers keep running; liveness comes from the lease anyway).
        """
        try:
            with self._heartbeat_lock:
                self._state_holder.sync()
                state = self._state_holder.state
        except Exception as exc:
            _log.info("could not read the rendezvous state", extra=log.kv(error=exc))
            return 0
        waiting = 0 if self.coordinated_join else len(state.wait_list)
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
            return max(waiting, 1)
        return waiting

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
            self._stop_heartbeats()
            self._alive.stop(revoke=True)  # also deletes the waiting key bound to the same lease
            try:
                self._remove_self()
            except Exception as exc:
                _log.info(
                    "could not remove the node from the rendezvous state", extra=log.kv(node=self.node_id, error=exc)
                )

    def _remove_self(self) -> None:
        backend, me = self._backend, self._this_node
        for _ in range(100):
            got = backend.get_state()
            if got is None:
                return
            try:
                state = pickle.loads(got[0])
            except Exception as exc:
                raise RendezvousStateError("The rendezvous state is corrupt.") from exc
            was_participant = me in state.participants
            changed = (
                was_participant or me in state.wait_list or me in state.redundancy_list or me in state.last_heartbeats
            )
            if not changed:
                return
            state.participants.pop(me, None)
            state.wait_list.discard(me)
            state.redundancy_list.discard(me)
            state.last_heartbeats.pop(me, None)
            if was_participant:
                _dr._remove_participant_epilogue(state, self._settings)
            result = backend.set_state(pickle.dumps(state), got[1])
            if result is None or result[2]:
                return
        raise RendezvousConnectionError("could not remove the node from the rendezvous: too many concurrent writers")

    def shutdown(self) -> bool:
        """Leave the rendezvous; unlike torch it does not close it (see `finish`). Returns True."""
        self.leave()
        return True

    def finish(self, *, closed: bool) -> None:
        """Release everything; with `closed` mark the rendezvous closed first (the job is done)."""
        if closed and not _in_forked_child:
            try:
                self._close()
            except Exception as exc:
                _log.info("could not close the rendezvous", extra=log.kv(error=exc))
        self.leave()
        self._backend.close()


# --- creator -------------------------------------------------------------------------------

_ID = re.compile(r"[^A-Za-z0-9._-]")


def _default_node_id() -> str:
    return _ID.sub("-", f"{socket.gethostname()}-{os.getpid()}")[:128]


def _timeout(params: RendezvousParameters, name: str) -> timedelta | None:
    value = params.get_as_int(f"{name}_timeout")
    return None if value is None else timedelta(seconds=value)


def create_handler(params: RendezvousParameters) -> SpotrunRendezvousHandler:
    """Build a handler from torchrun's parameters (see the module doc for the conf keys).

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
    coordinated = params.get_as_bool("coordinated_join", True)
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
    _check_not_forked()
    # torch's default shares a TCPStore hosted by the rank-0 agent; it dies with that node and
    # new nodes wait forever for its address. This backend's store is etcd: always opt out.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    try:
        etcd = store_mod.connect(endpoints)
    except ControlPlaneError as exc:
        raise _connection_error("cannot connect to etcd for the rendezvous", exc) from exc
    try:
        backend = EtcdRendezvousBackend(etcd, cluster, run_id)
        store = EtcdStore(backend)
        node = _unique_desc(DynamicRendezvousHandler._node_desc_generator.generate(params.local_addr), node_id)
        holder = _SpotrunStateHolder(backend, settings, node, expected_nodes=expected, gather_s=float(gather_s or 0))
        _install_delay_patch()
        return SpotrunRendezvousHandler(
            node,
            settings,
            store,
            holder,
            backend,
            node_id=node_id,
            lease_ttl=lease_ttl,
            coordinated_join=bool(coordinated),
        )
    except BaseException:
        etcd.close()
        raise


def _unique_desc(desc: Any, node_id: str) -> Any:
    """torch tells nodes apart by (address, pid, counter). Local VMs share 127.0.0.1 and, each in
    its own PID namespace, the same launcher pid: without this, three nodes looked like one and
    each trained alone. The pid field gets a value unique to this node id and handler."""
    import dataclasses
    import uuid
    import zlib

    return dataclasses.replace(desc, pid=zlib.crc32(f"{node_id}/{os.getpid()}/{uuid.uuid4()}".encode()))


def handler_creator() -> Callable[[RendezvousParameters], SpotrunRendezvousHandler]:
    """Entry point of group `torchrun.handlers`: torch calls it once and registers the creator."""
    return create_handler
