"""A resuming watch on an etcd prefix: one background thread per watch, every event exactly once.

The stream mechanics below `Etcd.watch_prefix` (spotrun.state.etcd): it resubscribes from the last
delivered revision after a broken stream or an etcd restart, fails over between endpoints, and
re-lists the prefix when history was compacted away.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotrun import log

if TYPE_CHECKING:
    import pyetcd

_log = log.get("etcd")


@dataclass(frozen=True)
class WatchEvent:
    """One change under a watched prefix.

    `kind` is "put" or "delete"; or "resync" when history was compacted away: forget what you
    know about the prefix, the "put" events that follow are its whole current state.
    """

    kind: str
    key: str
    value: bytes
    revision: int


class _Compacted(Exception):
    pass


class WatchHandle:
    """A resuming watch on a prefix; see `Etcd.watch_prefix`. `cancel()` stops it.

    `failure(exc)` describes an etcd/gRPC failure in one line, None for any other exception (a bug:
    logged with its traceback). The thread starts at once.
    """

    def __init__(
        self,
        client: pyetcd.MultiEndpointEtcd3Client,
        prefix: str,
        callback: Callable[[WatchEvent], None],
        start_revision: int,
        failure: Callable[[BaseException], str | None],
    ) -> None:
        self.prefix = prefix
        self.reconnects = 0
        self.connected = threading.Event()  # set while a watch stream is established
        self._client, self._callback, self._failure = client, callback, failure
        self._next = start_revision
        self._stop = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"spotrun-watch {prefix}", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return not self._stop.is_set()

    @property
    def next_revision(self) -> int:
        """The revision the watch resumes from: one past the last event delivered."""
        return self._next

    def cancel(self, timeout: float = 5.0) -> None:
        """Stop watching; no callback runs after this returns (unless called from the callback). Idempotent."""
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    stop = cancel

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                self._stream()
            except _Compacted:
                self._resync()
                continue
            except Exception as exc:
                if self._stop.is_set():
                    break
                described = self._failure(exc)
                if described is not None:
                    _log.debug("watch stream broke", extra=log.kv(prefix=self.prefix, error=described))
                    self._fail_over()
                else:
                    _log.exception("watch failed unexpectedly", extra=log.kv(prefix=self.prefix))
            if self.connected.is_set():  # it had worked: retry fast first
                backoff = 0.05
                self.connected.clear()
            self.reconnects += 1
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 2.0)

    def _fail_over(self) -> None:
        """With several endpoints, mark the current one failed so the next stream uses another."""
        client = self._client
        if len(client.endpoints) > 1 and client.endpoint_in_use is not None:
            client.endpoint_in_use.fail()

    def _stream(self) -> None:
        from pyetcd import etcdrpc, utils

        client = self._client
        create = etcdrpc.WatchCreateRequest(
            key=self.prefix.encode(), range_end=utils.prefix_range_end(self.prefix.encode()), start_revision=self._next
        )
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        requests.put(etcdrpc.WatchRequest(create_request=create))
        stub = etcdrpc.WatchStub(client.channel)
        with self._lock:
            if self._stop.is_set():
                return
            call = stub.Watch(iter(requests.get, None), credentials=client.call_credentials, metadata=client.metadata)
            self._call = call
        try:
            for resp in call:
                self._handle(resp)
        finally:
            requests.put(None)
            with self._lock:
                self._call = None

    def _handle(self, resp: Any) -> None:
        if resp.created:
            self.connected.set()
        if resp.compact_revision:
            raise _Compacted(resp.compact_revision)
        if resp.canceled:
            raise RuntimeError(f"etcd cancelled the watch: {resp.cancel_reason}")
        last = 0
        for ev in resp.events:
            rev = int(ev.kv.mod_revision)
            if rev < self._next:
                continue  # already delivered before a reconnect
            kind = "delete" if ev.type == ev.DELETE else "put"
            self._deliver(WatchEvent(kind, ev.kv.key.decode(), ev.kv.value, rev))
            last = rev
        if last:
            self._next = last + 1

    def _resync(self) -> None:
        try:
            resp = self._client.get_prefix_response(self.prefix, sort_order="ascend", sort_target="key")
        except Exception as exc:
            _log.debug("resync failed, retrying", extra=log.kv(prefix=self.prefix, error=self._failure(exc) or exc))
            self._stop.wait(0.2)
            return
        revision = int(resp.header.revision)
        _log.info("watch history compacted, re-listed", extra=log.kv(prefix=self.prefix, revision=revision))
        self._deliver(WatchEvent("resync", self.prefix, b"", revision))
        for kv in resp.kvs:
            self._deliver(WatchEvent("put", kv.key.decode(), kv.value, int(kv.mod_revision)))
        self._next = revision + 1

    def _deliver(self, event: WatchEvent) -> None:
        if self._stop.is_set():
            return
        try:
            self._callback(event)
        except Exception:
            _log.exception("watch callback failed", extra=log.kv(prefix=self.prefix, key=event.key))
