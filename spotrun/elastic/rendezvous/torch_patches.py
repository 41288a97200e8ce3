"""Every place spotrun reaches into torch's private rendezvous internals (torch 2.4-2.13), in one module.

Each is guarded so that a torch without the expected names keeps torch's own behaviour (or, for
a private class we subclass, fails at import, loudly), and each names the internal it touches:

- `dynamic_rendezvous._delay` is replaced by `_watching_delay`, which behaves exactly like the
  original unless called on a thread that is running one of *our* handlers' op executors
  (`_WatchingOpExecutor.run` marks it through a thread-local); there it waits for the next watch
  event, bounded by the requested delay, and skips the random 0-0.3 s first-round jitter.
- `_WatchingOpExecutor` subclasses `_DistributedRendezvousOpExecutor` and replaces the handler's
  private `_op_executor`, to mark its thread.
- `SpotrunStateHolder` subclasses `_BackendRendezvousStateHolder`, overriding `sync()` (serve
  the cache only while nothing changed, using the private `_dirty`, `_last_sync_time` and
  `_cache_duration`) and `_sanitize()` (lease-dead nodes, early last call), and edits the
  private `_RendezvousState` (`last_heartbeats`, `deadline`).
- `without_node` unpickles `_RendezvousState`, removes a node and calls
  `_remove_participant_epilogue`, as torch's own exit op does.
- `node_desc` uses `DynamicRendezvousHandler._node_desc_generator` and rewrites `_NodeDesc.pid`.
- `heartbeat_lock`, `stop_heartbeats` and `close` expose the handler's private `_heartbeat_lock`,
  `_stop_heartbeats()` and `_close()`.
- `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, an environment switch torch reads in
  `DynamicRendezvousHandler.next_rendezvous` and `use_agent_store`.

`apply(handler)` applies the patches (the environment switch, `_delay`, the op executor); the
handler calls it from its constructor. The rest are classes and functions the handler and the
creator use instead of touching torch's internals themselves.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _dr
from torch.distributed.elastic.rendezvous.api import RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousSettings

from spotrun import log
from spotrun.elastic.rendezvous.backend import EtcdRendezvousBackend

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_log = log.get("rendezvous")

# --- dynamic_rendezvous._delay: watch-driven waits on our executors' threads ---------------

_local = threading.local()
_original_delay = getattr(_dr, "_delay", None)
_patch_lock = threading.Lock()


def _watching_delay(seconds: float | tuple[float, float]) -> None:
    """torch's `_delay`, except on a thread running a spotrun op executor (see module doc)."""
    holder: SpotrunStateHolder | None = getattr(_local, "holder", None)
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


# --- _BackendRendezvousStateHolder: watch-driven cache, lease-based death, early last call ---

# The private attributes SpotrunStateHolder relies on; without any of them it is torch's holder.
_HOLDER_ATTRS = ("_dirty", "_last_sync_time", "_cache_duration", "_state", "_settings", "_sanitize")


class SpotrunStateHolder(_dr._BackendRendezvousStateHolder):
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
        """torch's sync, but its 1 s cache (private `_cache_duration`, `_last_sync_time`, `_dirty`)
        is served only while the watch saw no change: a change is read at once, not up to 1 s late."""
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
        """torch's private `_sanitize` (drops nodes whose heartbeat is too old), run after every read:
        a node whose alive lease is gone gets an ancient heartbeat first, so it is dropped now
        instead of after torch's heartbeat timeout; then the last call is held or ended early."""
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
        """Once every alive node is a participant, move the round's deadline into the past: it
        completes at once instead of after `last_call_timeout`."""
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


# --- _DistributedRendezvousOpExecutor: mark the thread for _watching_delay ------------------


class _WatchingOpExecutor(_dr._DistributedRendezvousOpExecutor):
    """torch's op executor; marks its thread so `_watching_delay` knows whose watch to wait on."""

    def run(self, *args: Any, **kwargs: Any) -> None:
        previous = getattr(_local, "holder", None)
        _local.holder = self._state_holder
        try:
            super().run(*args, **kwargs)
        finally:
            _local.holder = previous


# --- the rest of torch's internals the handler and creator need ----------------------------


def apply(handler: DynamicRendezvousHandler) -> None:
    """Apply the patches for `handler`: the process-wide ones (idempotent) and its op executor.
    Called once, from the handler's constructor."""
    # torch's default shares a TCPStore hosted by the rank-0 agent; it dies with that node and
    # new nodes wait forever for its address. This backend's store is etcd: always opt out.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    _install_delay_patch()
    if hasattr(_dr, "_DistributedRendezvousOpExecutor") and hasattr(handler, "_op_executor"):
        handler._op_executor = _WatchingOpExecutor(handler._this_node, handler._state_holder, handler._settings)


def heartbeat_lock(handler: DynamicRendezvousHandler) -> AbstractContextManager[Any]:
    """The handler's private `_heartbeat_lock`. torch takes it around every state sync outside the
    op executor (`_keep_alive`, `is_closed`, `num_nodes_waiting`); spotrun's `num_nodes_waiting`,
    which replaces torch's, must take it too."""
    return handler._heartbeat_lock


def stop_heartbeats(handler: DynamicRendezvousHandler) -> None:
    """The handler's private `_stop_heartbeats()`: cancel its keep-alive timer (a leaving node)."""
    handler._stop_heartbeats()


def close(handler: DynamicRendezvousHandler) -> None:
    """The handler's private `_close()`: mark the rendezvous closed, the job is done. torch's
    public `shutdown()` closes too, which is why spotrun's handler overrides it."""
    handler._close()


def without_node(blob: bytes, node: Any, settings: RendezvousSettings) -> bytes | None:
    """The state `blob` (a pickled `_RendezvousState`) with `node` removed from participants, wait
    list, redundancy list and heartbeats, finished as torch's own exit op does
    (`_remove_participant_epilogue`); None if `node` is in none of them.
    Raises RendezvousStateError for a blob that does not unpickle."""
    try:
        state = pickle.loads(blob)
    except Exception as exc:
        raise RendezvousStateError("The rendezvous state is corrupt.") from exc
    was_participant = node in state.participants
    changed = (
        was_participant or node in state.wait_list or node in state.redundancy_list or node in state.last_heartbeats
    )
    if not changed:
        return None
    state.participants.pop(node, None)
    state.wait_list.discard(node)
    state.redundancy_list.discard(node)
    state.last_heartbeats.pop(node, None)
    if was_participant:
        _dr._remove_participant_epilogue(state, settings)
    return pickle.dumps(state)


def node_desc(local_addr: str | None, node_id: str) -> Any:
    """This node's descriptor (torch's `_NodeDesc`: address, pid, counter) from torch's private
    `_node_desc_generator`, with a pid unique to `node_id` and this call.

    torch tells nodes apart by (address, pid, counter). Local VMs share 127.0.0.1 and, each in
    its own PID namespace, the same launcher pid: without this, three nodes looked like one and
    each trained alone."""
    desc = DynamicRendezvousHandler._node_desc_generator.generate(local_addr)
    return dataclasses.replace(desc, pid=zlib.crc32(f"{node_id}/{os.getpid()}/{uuid.uuid4()}".encode()))
