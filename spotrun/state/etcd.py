"""A generic etcd v3 client: connection, the error boundary, raw keys, compare-and-set, leases, watches.

Nothing here knows spotrun's key layout (that is `spotrun.state.schema`; the typed records are
`spotrun.state.store`; the watch stream itself is `spotrun.state.watch`). Every etcd or gRPC
failure leaves this module as `ControlPlaneError` naming the endpoint; a missing key is `None`,
never an exception. `pyetcd` (and grpc) load only in `Etcd.connect()`, so importing this module
stays cheap.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from spotrun import log
from spotrun.errors import ControlPlaneError, SpotrunError
from spotrun.state.watch import WatchEvent, WatchHandle

if TYPE_CHECKING:
    import pyetcd

_HINT = "is etcd running and reachable? `spotrun etcd status` shows the embedded one"
_log = log.get("etcd")
F = TypeVar("F", bound=Callable[..., Any])
E = TypeVar("E", bound="Etcd")


def _is_etcd_error(exc: BaseException) -> bool:
    import grpc
    import pyetcd

    return isinstance(exc, (pyetcd.Etcd3Exception, grpc.RpcError))


def _describe(exc: BaseException) -> str:
    import grpc

    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"{exc.code().name.lower()}: {exc.details()}"
    text = {
        "ConnectionFailedError": "connection failed",
        "ConnectionTimeoutError": "request timed out",
        "NoServerAvailableError": "no endpoint available (all failed within the last second)",
        "WatchTimedOut": "watch was not created in time",
        "PreconditionFailedError": "precondition failed (e.g. an expired lease)",
    }.get(type(exc).__name__)
    return text or (str(exc) or type(exc).__name__)


def _failure(exc: BaseException) -> str | None:
    """One line describing an etcd or gRPC failure; None for any other exception."""
    return _describe(exc) if _is_etcd_error(exc) else None


def _boundary(fn: F) -> F:
    """Turn pyetcd/grpc exceptions raised by an Etcd method into ControlPlaneError."""

    @functools.wraps(fn)
    def wrapper(self: Etcd, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except SpotrunError:
            raise
        except Exception as exc:
            if not _is_etcd_error(exc):
                raise
            raise self._error(exc) from exc

    return wrapper  # type: ignore[return-value]


def _parse_endpoint(url: str) -> tuple[str, int, bool]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ControlPlaneError(f"bad etcd endpoint {url!r}", hint="use http://HOST:PORT or https://HOST:PORT")
    return parts.hostname, parts.port or 2379, parts.scheme == "https"


def _env_path(name: str) -> str | None:
    value = os.environ.get(name)
    return os.path.expanduser(value) if value else None


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _grpc_options(host: str) -> list[tuple[str, int]]:
    opts = [
        # Come back within a fraction of a second after an etcd restart (gRPC's default backoff cap
        # is 120 s): the rendezvous' 1 s leases must be refreshed before they run out, and etcd only
        # extends them by their TTL when it is back. A 1 s cap lost them now and then (a restart of
        # etcd then broke the training round, and steps since the last checkpoint were recomputed).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 250),
        # Notice a silently dead peer on long-lived watch streams (etcd allows >= 5 s).
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
    ]
    if host in ("127.0.0.1", "localhost", "::1"):
        opts.append(("grpc.enable_http_proxy", 0))
    return opts


class Etcd:
    """One etcd client over any number of endpoints. Thread-safe; create with `Etcd.connect()`."""

    PROBE_KEY = "/"  # what `revision()` reads (count only); a subclass may point it into its own key space

    def __init__(self, client: pyetcd.MultiEndpointEtcd3Client, endpoints: list[str], timeout: float) -> None:
        self._client = client
        self.endpoints = endpoints
        self.timeout = timeout
        self._owned: list[WatchHandle | LeaseKeeper] = []
        self._owned_lock = threading.Lock()
        self._on_close: list[Callable[[], None]] = []

    @classmethod
    def connect(
        cls: type[E],
        endpoints: list[str],
        *,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        timeout: float = 5.0,
        check: bool = True,
    ) -> E:
        """Connect to etcd at `endpoints` (`http://host:port`, `https://...` with `ca`).

        With `check` it makes one request, so a dead endpoint fails here. Blocks up to `timeout`.
        TLS files not given default to $SPOTRUN_ETCD_CA / _CERT / _KEY (`~` expanded): that is how a
        VM's agent, launcher, rendezvous and trainer all reach an etcd that wants TLS.
        Raises ControlPlaneError naming the endpoint.
        """
        ca, cert, key = (
            given or _env_path(f"SPOTRUN_ETCD_{name}") for given, name in ((ca, "CA"), (cert, "CERT"), (key, "KEY"))
        )
        if not endpoints:
            raise ControlPlaneError("no etcd endpoint given", hint="pass at least one http://HOST:PORT")
        import grpc
        import pyetcd

        creds = None
        if ca or cert or any(_parse_endpoint(e)[2] for e in endpoints):
            try:
                read = [_read(p) if p else None for p in (ca, key, cert)]
            except OSError as exc:
                raise ControlPlaneError(f"cannot read TLS file: {exc}", hint="check --ca/--cert/--key") from exc
            creds = grpc.ssl_channel_credentials(*read)
        eps = []
        for url in endpoints:
            host, port, secure = _parse_endpoint(url)
            eps.append(
                pyetcd.Endpoint(
                    host,
                    port,
                    secure=secure or creds is not None,
                    creds=creds,
                    time_retry=1.0,
                    opts=_grpc_options(host),
                )
            )
        client = pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout, failover=True)
        etcd = cls(client, list(endpoints), timeout)
        if check:
            try:
                etcd.revision()
            except ControlPlaneError:
                etcd.close()
                raise
        return etcd

    def _error(self, exc: BaseException) -> ControlPlaneError:
        return ControlPlaneError(f"etcd at {','.join(self.endpoints)}: {_describe(exc)}", hint=_HINT)

    # --- keys --------------------------------------------------------------------------------

    @_boundary
    def revision(self) -> int:
        """The current store revision. Blocking; raises ControlPlaneError."""
        return int(self._client.get_response(self.PROBE_KEY, count_only=True).header.revision)

    @_boundary
    def get(self, key: str) -> tuple[bytes, int] | None:
        """(value, mod_revision) of `key`, None if absent. Raises ControlPlaneError."""
        value, meta = self._client.get(key)
        return None if meta is None else (value, int(meta.mod_revision))

    @_boundary
    def put(self, key: str, value: bytes | str, lease: int | None = None) -> int:
        """Write `key` (bound to lease id `lease` if given); returns the new revision. Idempotent."""
        return int(self._client.put(key, value, lease=lease).header.revision)

    @_boundary
    def delete(self, key: str) -> bool:
        """Delete `key`; False if it did not exist. Idempotent."""
        return bool(self._client.delete(key))

    @_boundary
    def get_prefix(self, prefix: str) -> list[tuple[str, bytes, int]]:
        """(key, value, mod_revision) of every key under `prefix`, in key order."""
        resp = self._client.get_prefix_response(prefix, sort_order="ascend", sort_target="key")
        return [(kv.key.decode(), kv.value, int(kv.mod_revision)) for kv in resp.kvs]

    @_boundary
    def keys(self, prefix: str) -> list[str]:
        """The keys under `prefix` (no values), in no particular order."""
        return [kv.key.decode() for kv in self._client.get_prefix_response(prefix, keys_only=True).kvs]

    @_boundary
    def get_range(self, start: str, prefix: str, limit: int | None = None) -> list[tuple[str, bytes, int]]:
        """(key, value, mod_revision) of the keys under `prefix` from `start` on, in key order (at most `limit`)."""
        from pyetcd import utils

        resp = self._client.get_range_response(start, utils.prefix_range_end(prefix.encode()), limit=limit)
        return [(kv.key.decode(), kv.value, int(kv.mod_revision)) for kv in resp.kvs]

    @_boundary
    def last_key(self, prefix: str) -> str | None:
        """The greatest key under `prefix`, None if there is none."""
        resp = self._client.get_prefix_response(
            prefix, sort_order="descend", sort_target="key", limit=1, keys_only=True
        )
        return resp.kvs[0].key.decode() if resp.kvs else None

    @_boundary
    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under `prefix`; returns how many. Idempotent."""
        return int(self._client.delete_prefix(prefix).deleted)

    @_boundary
    def cas(self, key: str, expect_revision: int | None, value: bytes | str, lease: int | None = None) -> bool:
        """Write `key` only if its mod revision is `expect_revision` (None: only if absent).

        Returns False when someone else wrote first (re-read and retry). Raises ControlPlaneError.
        """
        tx = self._client.transactions
        compare = tx.create(key) == 0 if expect_revision is None else tx.mod(key) == expect_revision
        ok, _ = self._client.transaction(compare=[compare], success=[tx.put(key, value, lease=lease)], failure=[])
        return bool(ok)

    @_boundary
    def create_above(self, prefix: str, key: str, value: bytes | str) -> bool:
        """Write `key` only if no key under `prefix` sorts at or after it: an append to a sequence.

        Returns False when a concurrent writer took `key` or one after it (re-read and retry).
        """
        from pyetcd import utils

        tx = self._client.transactions
        no_key_at_or_above = tx.create(key, range_end=utils.prefix_range_end(prefix.encode())) == 0
        ok, _ = self._client.transaction(compare=[no_key_at_or_above], success=[tx.put(key, value)], failure=[])
        return bool(ok)

    @_boundary
    def compact(self, revision: int) -> None:
        """Drop history before `revision` (watches starting earlier get a resync)."""
        self._client.compact(revision, physical=True)

    # --- leases ------------------------------------------------------------------------------

    def lease(self, key: str, value: str, ttl: int) -> LeaseKeeper:
        """Publish `key` bound to a `ttl`-second lease, kept alive by a thread until stopped.

        `keeper.stop()` revokes it (the key goes at once); `keeper.stop(revoke=False)` lets it
        expire after `ttl`, as a crash would. Raises ControlPlaneError if etcd is unreachable now.
        """
        keeper = LeaseKeeper(self, key, value, ttl)
        self._own(keeper)
        return keeper

    @_boundary
    def _grant(self, ttl: int) -> int:
        return int(self._client.lease(ttl).id)

    @_boundary
    def _refresh(self, lease_id: int) -> int:
        """Remaining TTL after a keep-alive; <= 0 means the lease is gone."""
        responses = list(self._client.refresh_lease(lease_id))
        return int(responses[0].TTL) if responses else 0

    @_boundary
    def _revoke(self, lease_id: int) -> None:
        self._client.revoke_lease(lease_id)

    # --- watches -----------------------------------------------------------------------------

    def watch_prefix(
        self, prefix: str, callback: Callable[[WatchEvent], None], start_revision: int | None = None
    ) -> WatchHandle:
        """Call `callback` for every change under `prefix`, from `start_revision` (default: now).

        Non-blocking: events arrive on one background thread, in revision order, each exactly
        once, across etcd restarts and lost connections (it resubscribes from the last seen
        revision + 1, with backoff). If history was compacted it re-lists (see WatchEvent).
        Raises ControlPlaneError only now, if etcd is unreachable when start_revision is None.
        """
        start = self.revision() + 1 if start_revision is None else start_revision
        handle = WatchHandle(self._client, prefix, callback, start, _failure)
        self._own(handle)
        return handle

    def watch_key(self, key: str, callback: Callable[[WatchEvent], None]) -> WatchHandle:
        """`watch_prefix` narrowed to exactly `key` (a prefix watch on `a/n1` also sees `a/n10`).
        A resync event carries `key` too."""

        def on_event(event: WatchEvent) -> None:
            if event.key == key:
                callback(event)

        return self.watch_prefix(key, on_event)

    def _own(self, item: WatchHandle | LeaseKeeper) -> None:
        with self._owned_lock:
            self._owned = [o for o in self._owned if o.active] + [item]

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel watches, revoke leases held by this client, close the connection. Idempotent."""
        with self._owned_lock:
            owned, self._owned = self._owned, []
        for item in owned:
            item.stop()
        self._client.close()
        for callback in self._on_close:
            callback()
        self._on_close.clear()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run `callback` after close() (e.g. tear down the SSH tunnel this client talks through)."""
        self._on_close.append(callback)

    def __enter__(self: E) -> E:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The generic client; `spotrun.state.store.connect` gives the typed one.
connect = Etcd.connect


class LeaseKeeper:
    """Holds a key bound to a lease and refreshes the lease every ttl/3 on a daemon thread.

    If the lease is lost anyway (etcd was unreachable for longer than ttl), the keeper grants a new
    one and writes the key again on the next successful refresh, counting it in `renewals`.
    """

    def __init__(self, etcd: Etcd, key: str, value: str, ttl: int) -> None:
        if ttl < 1:
            raise ValueError(f"lease ttl ({ttl}) must be >= 1 s")
        self.key, self.ttl, self._etcd, self._value = key, ttl, etcd, value
        self.renewals = 0
        self.lease_id = self._publish()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"spotrun-lease {key}", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return not self._stop.is_set()

    def _publish(self) -> int:
        lease_id = self._etcd._grant(self.ttl)
        self._etcd.put(self.key, self._value, lease=lease_id)
        return lease_id

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if self._etcd._refresh(self.lease_id) <= 0:
                    _log.warning("lease expired, publishing again", extra=log.kv(key=self.key))
                    self.lease_id = self._publish()
                    self.renewals += 1
            except ControlPlaneError as exc:
                _log.info("lease refresh failed, will retry", extra=log.kv(key=self.key, error=exc))

    def stop(self, revoke: bool = True) -> None:
        """Stop refreshing; with `revoke` delete the key now (best effort), else let it expire. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if revoke:
            try:
                self._etcd._revoke(self.lease_id)
            except ControlPlaneError as exc:
                _log.info("lease revoke failed; it will expire", extra=log.kv(key=self.key, error=exc))

    def __enter__(self) -> LeaseKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
