"""Typed access to cluster state in etcd v3: the only module that imports the etcd client.

Keys (see DESIGN.md, "etcd keys"), all under `/spotrun/<cluster>/`:

    spec  target  nodes/<id>  alive/<id>  notices/<id>  progress/<id>
    checkpoints/<step:012d>  ledger/<id>  events/<seq:012d>  rdzv/...

Numbers in keys are zero-padded so lexical order is numeric order. Values are JSON
(`spotrun.state.records`). Every etcd or gRPC failure leaves this module as `ControlPlaneError`
naming the endpoint; a missing key is `None`, never an exception. `pyetcd` (and grpc) load only
in `connect()`, so importing this module stays cheap.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from spotrun import log
from spotrun.errors import ControlPlaneError, MembershipError, SpotrunError
from spotrun.state.records import (
    CheckpointRecord,
    Event,
    LedgerSegment,
    NodeRecord,
    Notice,
    Progress,
    decode,
    encode,
    from_dict,
    to_dict,
)

if TYPE_CHECKING:
    import pyetcd

ROOT = "/spotrun/"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HINT = "is etcd running and reachable? `spotrun etcd status` shows the embedded one"
_log = log.get("store")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


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


def _boundary(fn: F) -> F:
    """Turn pyetcd/grpc exceptions raised by a Store method into ControlPlaneError."""

    @functools.wraps(fn)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except SpotrunError:
            raise
        except Exception as exc:
            if not _is_etcd_error(exc):
                raise
            raise self._error(exc) from exc

    return wrapper  # type: ignore[return-value]


def _check_name(what: str, name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"{what} {name!r} must be 1-128 of letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def cluster_prefix(cluster: str) -> str:
    """`/spotrun/<cluster>/`: every key of one cluster starts with it."""
    return f"{ROOT}{_check_name('cluster', cluster)}/"


def key(cluster: str, kind: str, item: str | int | None = None) -> str:
    """The etcd key of `kind` (spec, target, nodes, ...) in `cluster`; ints are zero-padded."""
    base = cluster_prefix(cluster) + kind
    if item is None:
        return base
    return f"{base}/{item:012d}" if isinstance(item, int) else f"{base}/{_check_name(f'{kind} id', item)}"


def rdzv_key(cluster: str, run_id: str, kind: str, node: str = "") -> str:
    """`.../rdzv/<run_id>/<kind>/<node>`: the elastic rendezvous' keys (kind: alive, waiting, lost);
    with no node, the prefix of that kind. spotrun's runs use the cluster name as run id."""
    return f"{key(cluster, 'rdzv', run_id)}/{kind}/{node}"


def _parse_endpoint(url: str) -> tuple[str, int, bool]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ControlPlaneError(f"bad etcd endpoint {url!r}", hint="use http://HOST:PORT or https://HOST:PORT")
    return parts.hostname, parts.port or 2379, parts.scheme == "https"


def _env_path(name: str) -> str | None:
    value = os.environ.get(name)
    return os.path.expanduser(value) if value else None


def _grpc_options(host: str) -> list[tuple[str, int]]:
    opts = [
        # Come back within ~1 s after an etcd restart instead of gRPC's default 120 s backoff cap.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # Notice a silently dead peer on long-lived watch streams (etcd allows >= 5 s).
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
    ]
    if host in ("127.0.0.1", "localhost", "::1"):
        opts.append(("grpc.enable_http_proxy", 0))
    return opts


def connect(
    endpoints: list[str],
    *,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    timeout: float = 5.0,
    check: bool = True,
) -> Store:
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
            read = [open(p, "rb").read() if p else None for p in (ca, key, cert)]
        except OSError as exc:
            raise ControlPlaneError(f"cannot read TLS file: {exc}", hint="check --ca/--cert/--key") from exc
        creds = grpc.ssl_channel_credentials(*read)
    eps = []
    for url in endpoints:
        host, port, secure = _parse_endpoint(url)
        eps.append(
            pyetcd.Endpoint(
                host, port, secure=secure or creds is not None, creds=creds, time_retry=1.0, opts=_grpc_options(host)
            )
        )
    client = pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout, failover=True)
    store = Store(client, list(endpoints), timeout)
    if check:
        try:
            store.revision()
        except ControlPlaneError:
            store.close()
            raise
    return store


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


class Store:
    """Typed cluster state over one etcd client. Thread-safe; create with `connect()`."""

    def __init__(self, client: pyetcd.MultiEndpointEtcd3Client, endpoints: list[str], timeout: float) -> None:
        self._client = client
        self.endpoints = endpoints
        self.timeout = timeout
        self._owned: list[WatchHandle | LeaseKeeper] = []
        self._owned_lock = threading.Lock()
        self._on_close: list[Callable[[], None]] = []

    def _error(self, exc: BaseException) -> ControlPlaneError:
        return ControlPlaneError(f"etcd at {','.join(self.endpoints)}: {_describe(exc)}", hint=_HINT)

    # --- raw keys (for membership / rendezvous code) ----------------------------------------

    @_boundary
    def revision(self) -> int:
        """The current store revision. Blocking; raises ControlPlaneError."""
        return int(self._client.get_response(ROOT, count_only=True).header.revision)

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
    def compact(self, revision: int) -> None:
        """Drop history before `revision` (watches starting earlier get a resync)."""
        self._client.compact(revision, physical=True)

    # --- typed helpers -----------------------------------------------------------------------

    def _get_record(self, cls: type[T], k: str) -> T | None:
        found = self.get(k)
        return None if found is None else self._decode(cls, k, found[0])

    def _list_records(self, cls: type[T], prefix: str) -> list[T]:
        out = []
        for k, value, _ in self.get_prefix(prefix):
            try:
                out.append(decode(cls, value))
            except (ValueError, TypeError) as exc:
                _log.warning("skipping unreadable record", extra=log.kv(key=k, error=exc))
        return out

    @staticmethod
    def _decode(cls: type[T], k: str, value: bytes) -> T:
        try:
            return decode(cls, value)
        except (ValueError, TypeError) as exc:
            raise ControlPlaneError(
                f"unreadable {cls.__name__} at {k}: {exc}", hint="delete the key or fix the writer"
            ) from exc

    # --- spec and target ---------------------------------------------------------------------

    def put_spec(self, cluster: str, spec: dict[str, Any]) -> int:
        """Store the recipe as JSON; returns its revision, the spec version."""
        return self.put(key(cluster, "spec"), json.dumps(spec, sort_keys=True))

    def get_spec(self, cluster: str) -> tuple[dict[str, Any], int] | None:
        """(recipe dict, spec version) or None if the cluster has no spec."""
        found = self.get(key(cluster, "spec"))
        return None if found is None else (json.loads(found[0]), found[1])

    def set_target(self, cluster: str, nodes: int) -> int:
        """Set the desired node count; returns the revision. Raises ValueError if negative."""
        if nodes < 0:
            raise ValueError(f"target node count ({nodes}) must be >= 0")
        return self.put(key(cluster, "target"), str(nodes))

    def get_target(self, cluster: str) -> int | None:
        found = self.get(key(cluster, "target"))
        return None if found is None else int(found[0])

    # --- nodes -------------------------------------------------------------------------------

    def put_node(self, node: NodeRecord) -> int:
        """Write `node` under its own cluster; returns the revision. Idempotent."""
        return self.put(key(node.cluster, "nodes", node.id), encode(node))

    def get_node(self, cluster: str, node: str) -> NodeRecord | None:
        return self._get_record(NodeRecord, key(cluster, "nodes", node))

    def list_nodes(self, cluster: str) -> list[NodeRecord]:
        return self._list_records(NodeRecord, key(cluster, "nodes") + "/")

    def delete_node(self, cluster: str, node: str) -> bool:
        return self.delete(key(cluster, "nodes", node))

    # --- liveness ----------------------------------------------------------------------------

    def alive(self, cluster: str, node: str, ttl: int = 10) -> LeaseKeeper:
        """Publish `alive/<node>` bound to a `ttl`-second lease, kept alive by a thread.

        `keeper.stop()` revokes it (the key goes at once); `keeper.stop(revoke=False)` lets it
        expire after `ttl`, as a crash would. Raises ControlPlaneError if etcd is unreachable now.
        """
        value = json.dumps({"node": node, "since": time.time()})
        keeper = LeaseKeeper(self, key(cluster, "alive", node), value, ttl)
        self._own(keeper)
        return keeper

    def list_alive(self, cluster: str) -> set[str]:
        """Ids of nodes whose liveness key exists (their lease has not expired)."""
        return self._ids(cluster, "alive")

    def _ids(self, cluster: str, kind: str) -> set[str]:
        """The item names under `/spotrun/<cluster>/<kind>/`."""
        prefix = key(cluster, kind) + "/"
        return {k[len(prefix) :] for k, _, _ in self.get_prefix(prefix)}

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

    # --- notices, progress, checkpoints, ledger ----------------------------------------------

    def put_notice(self, cluster: str, notice: Notice) -> int:
        return self.put(key(cluster, "notices", notice.node), encode(notice))

    def get_notice(self, cluster: str, node: str) -> Notice | None:
        return self._get_record(Notice, key(cluster, "notices", node))

    def list_notices(self, cluster: str) -> list[Notice]:
        return self._list_records(Notice, key(cluster, "notices") + "/")

    def delete_notice(self, cluster: str, node: str) -> bool:
        return self.delete(key(cluster, "notices", node))

    def put_standby(self, cluster: str, node: str) -> int:
        """Mark `node` a warm spare: its agent parks the pre-warmed launcher outside the rendezvous."""
        return self.put(key(cluster, "standby", node), "1")

    def list_standby(self, cluster: str) -> set[str]:
        """Ids of the warm spares not yet activated."""
        return self._ids(cluster, "standby")

    def activate_standby(self, cluster: str, node: str) -> bool:
        """Turn a warm spare into a training node; False if it was not one. Idempotent."""
        return self.delete(key(cluster, "standby", node))

    def put_progress(self, cluster: str, progress: Progress) -> int:
        return self.put(key(cluster, "progress", progress.node), encode(progress))

    def get_progress(self, cluster: str, node: str) -> Progress | None:
        return self._get_record(Progress, key(cluster, "progress", node))

    def list_progress(self, cluster: str) -> list[Progress]:
        return self._list_records(Progress, key(cluster, "progress") + "/")

    def put_checkpoint(self, cluster: str, checkpoint: CheckpointRecord) -> int:
        if checkpoint.step < 0:
            raise ValueError(f"checkpoint step ({checkpoint.step}) must be >= 0")
        return self.put(key(cluster, "checkpoints", checkpoint.step), encode(checkpoint))

    def list_checkpoints(self, cluster: str) -> list[CheckpointRecord]:
        """All checkpoints, oldest step first."""
        return sorted(self._list_records(CheckpointRecord, key(cluster, "checkpoints") + "/"), key=lambda c: c.step)

    def latest_checkpoint(self, cluster: str) -> CheckpointRecord | None:
        found = self.list_checkpoints(cluster)
        return found[-1] if found else None

    def put_ledger(self, cluster: str, node: str, segments: list[LedgerSegment]) -> int:
        """Replace the cost segments of `node` (oldest first); returns the revision."""
        return self.put(key(cluster, "ledger", node), json.dumps([to_dict(s) for s in segments]))

    def get_ledger(self, cluster: str, node: str) -> list[LedgerSegment]:
        found = self.get(key(cluster, "ledger", node))
        return [] if found is None else self._segments(found[0], key(cluster, "ledger", node))

    def list_ledger(self, cluster: str) -> dict[str, list[LedgerSegment]]:
        """Cost segments of every node that ever ran, by node id."""
        prefix = key(cluster, "ledger") + "/"
        return {k[len(prefix) :]: self._segments(v, k) for k, v, _ in self.get_prefix(prefix)}

    @staticmethod
    def _segments(raw: bytes, k: str = "ledger") -> list[LedgerSegment]:
        try:
            return [from_dict(LedgerSegment, item) for item in json.loads(raw)]
        except (ValueError, TypeError) as exc:
            raise ControlPlaneError(
                f"unreadable ledger at {k}: {exc}", hint="delete the key or fix the writer"
            ) from exc

    # --- events ------------------------------------------------------------------------------

    def add_event(self, cluster: str, kind: str, message: str, node: str | None = None) -> Event:
        """Append one history line with the next sequence number (1, 2, ...).

        The seq is allocated by a compare-and-set (no key >= seq may exist), so concurrent
        writers never share or reorder numbers. Raises ControlPlaneError, MembershipError under
        extreme contention.
        """
        prefix = key(cluster, "events") + "/"
        for _ in range(200):
            event = Event(self._last_seq(prefix) + 1, time.time(), kind, message, node)
            if self._create_above(prefix, key(cluster, "events", event.seq), encode(event)):
                return event
        raise MembershipError(
            f"could not allocate an event number in cluster {cluster!r}", hint="too many concurrent writers"
        )

    @_boundary
    def _last_seq(self, prefix: str) -> int:
        resp = self._client.get_prefix_response(
            prefix, sort_order="descend", sort_target="key", limit=1, keys_only=True
        )
        return int(resp.kvs[0].key.decode()[len(prefix) :]) if resp.kvs else 0

    @_boundary
    def _create_above(self, prefix: str, k: str, value: bytes) -> bool:
        from pyetcd import utils

        tx = self._client.transactions
        no_key_at_or_above = tx.create(k, range_end=utils.prefix_range_end(prefix.encode())) == 0
        ok, _ = self._client.transaction(compare=[no_key_at_or_above], success=[tx.put(k, value)], failure=[])
        return bool(ok)

    @_boundary
    def list_events(self, cluster: str, since: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > `since`, oldest first (at most `limit`)."""
        from pyetcd import utils

        prefix = key(cluster, "events") + "/"
        start = key(cluster, "events", since + 1)
        resp = self._client.get_range_response(start, utils.prefix_range_end(prefix.encode()), limit=limit)
        return [self._decode(Event, kv.key.decode(), kv.value) for kv in resp.kvs]

    # --- clusters ----------------------------------------------------------------------------

    @_boundary
    def list_clusters(self) -> list[str]:
        """Names of clusters that have any key, sorted."""
        resp = self._client.get_prefix_response(ROOT, keys_only=True)
        return sorted({kv.key.decode()[len(ROOT) :].split("/", 1)[0] for kv in resp.kvs})

    def delete_cluster(self, cluster: str) -> int:
        """Delete every key of `cluster`; returns how many. Idempotent."""
        return self.delete_prefix(cluster_prefix(cluster))

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
        handle = WatchHandle(self, prefix, callback, start)
        self._own(handle)
        return handle

    def watch_cluster(
        self, cluster: str, callback: Callable[[WatchEvent], None], start_revision: int | None = None
    ) -> WatchHandle:
        """`watch_prefix` over every key of `cluster`."""
        return self.watch_prefix(cluster_prefix(cluster), callback, start_revision)

    def _own(self, item: WatchHandle | LeaseKeeper) -> None:
        with self._owned_lock:
            self._owned = [o for o in self._owned if o.active] + [item]

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel watches, revoke leases held by this store, close the connection. Idempotent."""
        with self._owned_lock:
            owned, self._owned = self._owned, []
        for item in owned:
            item.stop()
        self._client.close()
        for callback in self._on_close:
            callback()
        self._on_close.clear()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run `callback` after close() (e.g. tear down the SSH tunnel this store talks through)."""
        self._on_close.append(callback)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LeaseKeeper:
    """Holds a key bound to a lease and refreshes the lease every ttl/3 on a daemon thread.

    If the lease is lost anyway (etcd was unreachable for longer than ttl), the keeper grants a new
    one and writes the key again on the next successful refresh, counting it in `renewals`.
    """

    def __init__(self, store: Store, key: str, value: str, ttl: int) -> None:
        if ttl < 1:
            raise ValueError(f"lease ttl ({ttl}) must be >= 1 s")
        self.key, self.ttl, self._store, self._value = key, ttl, store, value
        self.renewals = 0
        self.lease_id = self._publish()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"spotrun-lease {key}", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return not self._stop.is_set()

    def _publish(self) -> int:
        lease_id = self._store._grant(self.ttl)
        self._store.put(self.key, self._value, lease=lease_id)
        return lease_id

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if self._store._refresh(self.lease_id) <= 0:
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
                self._store._revoke(self.lease_id)
            except ControlPlaneError as exc:
                _log.info("lease revoke failed; it will expire", extra=log.kv(key=self.key, error=exc))

    def __enter__(self) -> LeaseKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Compacted(Exception):
    pass


class WatchHandle:
    """A resuming watch on a prefix; see `Store.watch_prefix`. `cancel()` stops it."""

    def __init__(self, store: Store, prefix: str, callback: Callable[[WatchEvent], None], start_revision: int) -> None:
        self.prefix = prefix
        self.reconnects = 0
        self.connected = threading.Event()  # set while a watch stream is established
        self._store, self._callback = store, callback
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
                if _is_etcd_error(exc):
                    _log.debug("watch stream broke", extra=log.kv(prefix=self.prefix, error=_describe(exc)))
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
        client = self._store._client
        if len(client.endpoints) > 1 and client.endpoint_in_use is not None:
            client.endpoint_in_use.fail()

    def _stream(self) -> None:
        from pyetcd import etcdrpc, utils

        client = self._store._client
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
            resp = self._store._client.get_prefix_response(self.prefix, sort_order="ascend", sort_target="key")
        except Exception as exc:
            _log.debug("resync failed, retrying", extra=log.kv(prefix=self.prefix, error=_describe(exc)))
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
