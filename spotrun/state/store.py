"""Typed cluster state in etcd: the records of `spotrun.state.records` at the keys of `spotrun.state.schema`.

`Store` is the object every caller holds: the generic client (`spotrun.state.etcd.Etcd`: raw keys,
leases, watches) plus one typed accessor per kind of key, so nothing outside `spotrun.state` builds
a key. A missing key is `None` (or empty), never an exception; every etcd failure is
`ControlPlaneError`; an unreadable record is `ControlPlaneError` when asked for by id and skipped
(with a warning) in listings. Importing this module does not load the etcd client.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from spotrun import log
from spotrun.errors import ControlPlaneError, MembershipError
from spotrun.state import schema
from spotrun.state.etcd import Etcd
from spotrun.state.records import (
    CheckpointRecord,
    Event,
    EventKind,
    LaunchIntent,
    LedgerSegment,
    NodeRecord,
    Notice,
    Progress,
    decode,
    encode,
    from_dict,
    to_dict,
)
from spotrun.state.schema import ChaosMark, Kind, RdzvPart

if TYPE_CHECKING:
    from spotrun.state.etcd import LeaseKeeper
    from spotrun.state.watch import WatchEvent, WatchHandle

_log = log.get("store")
T = TypeVar("T")


class Store(Etcd):
    """Typed cluster state over one etcd client. Thread-safe; create with `connect()`.

    Every method blocks on etcd and raises ControlPlaneError when it is unreachable.
    """

    PROBE_KEY = schema.ROOT

    # --- typed helpers -----------------------------------------------------------------------

    def _get_record(self, cls: type[T], k: str) -> T | None:
        found = self.get(k)
        return None if found is None else self._decode(cls, k, found[0])

    def _list_records(self, cls: type[T], cluster: str, kind: Kind) -> list[T]:
        out = []
        for k, value, _ in self.get_prefix(schema.kind_prefix(cluster, kind)):
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

    def _ids(self, cluster: str, kind: Kind) -> set[str]:
        """The item names under `/spotrun/<cluster>/<kind>/`."""
        prefix = schema.kind_prefix(cluster, kind)
        return {k[len(prefix) :] for k, _, _ in self.get_prefix(prefix)}

    def _stamp(self, k: str, **fields: Any) -> int:
        """Write a small JSON marker `{"at": now, **fields}` at `k`; returns the revision."""
        return self.put(k, json.dumps({**fields, "at": time.time()}))

    # --- spec, target, stopped -----------------------------------------------------------------

    def put_spec(self, cluster: str, spec: dict[str, Any]) -> int:
        """Store the recipe as JSON; returns its revision, the spec version."""
        return self.put(schema.key(cluster, Kind.SPEC), json.dumps(spec, sort_keys=True))

    def get_spec(self, cluster: str) -> tuple[dict[str, Any], int] | None:
        """(recipe dict, spec version) or None if the cluster has no spec."""
        found = self.get(schema.key(cluster, Kind.SPEC))
        return None if found is None else (json.loads(found[0]), found[1])

    def set_target(self, cluster: str, nodes: int) -> int:
        """Set the desired node count; returns the revision. Raises ValueError if negative."""
        if nodes < 0:
            raise ValueError(f"target node count ({nodes}) must be >= 0")
        return self.put(schema.key(cluster, Kind.TARGET), str(nodes))

    def get_target(self, cluster: str) -> int | None:
        found = self.get(schema.key(cluster, Kind.TARGET))
        return None if found is None else int(found[0])

    def mark_stopped(self, cluster: str, reason: str) -> int:
        """Record that the cluster was stopped for `reason` (the budget): it launches nothing more. Idempotent."""
        return self._stamp(schema.key(cluster, Kind.STOPPED), reason=reason)

    def is_stopped(self, cluster: str) -> bool:
        return self.get(schema.key(cluster, Kind.STOPPED)) is not None

    # --- nodes ---------------------------------------------------------------------------------

    def put_node(self, node: NodeRecord) -> int:
        """Write `node` under its own cluster; returns the revision. Idempotent."""
        return self.put(schema.key(node.cluster, Kind.NODES, node.id), encode(node))

    def get_node(self, cluster: str, node: str) -> NodeRecord | None:
        return self._get_record(NodeRecord, schema.key(cluster, Kind.NODES, node))

    def get_node_revision(self, cluster: str, node: str) -> tuple[NodeRecord, int] | None:
        """(record, mod revision) of `node`, for a later `cas_node`; None if absent."""
        k = schema.key(cluster, Kind.NODES, node)
        found = self.get(k)
        return None if found is None else (self._decode(NodeRecord, k, found[0]), found[1])

    def cas_node(self, node: NodeRecord, expect_revision: int) -> bool:
        """Write `node` only if its record is still at `expect_revision`; False if someone wrote first."""
        return self.cas(schema.key(node.cluster, Kind.NODES, node.id), expect_revision, encode(node))

    def list_nodes(self, cluster: str) -> list[NodeRecord]:
        return self._list_records(NodeRecord, cluster, Kind.NODES)

    def delete_node(self, cluster: str, node: str) -> bool:
        return self.delete(schema.key(cluster, Kind.NODES, node))

    def watch_node(self, cluster: str, node: str, callback: Callable[[WatchEvent], None]) -> WatchHandle:
        """Call `callback` for every change of exactly this node's record (see `Etcd.watch_prefix`)."""
        return self.watch_key(schema.key(cluster, Kind.NODES, node), callback)

    # --- liveness ------------------------------------------------------------------------------

    def alive(self, cluster: str, node: str, ttl: int = 10) -> LeaseKeeper:
        """Publish `alive/<node>` bound to a `ttl`-second lease, kept alive by a thread (see `Etcd.lease`)."""
        value = json.dumps({"node": node, "since": time.time()})
        return self.lease(schema.key(cluster, Kind.ALIVE, node), value, ttl)

    def list_alive(self, cluster: str) -> set[str]:
        """Ids of nodes whose liveness key exists (their lease has not expired)."""
        return self._ids(cluster, Kind.ALIVE)

    def forget_alive(self, cluster: str, node: str) -> bool:
        """Delete a node's liveness key now instead of when its lease ends (the VM is gone). Idempotent."""
        return self.delete(schema.key(cluster, Kind.ALIVE, node))

    # --- notices, warm spares, progress, checkpoints -------------------------------------------

    def put_notice(self, cluster: str, notice: Notice) -> int:
        return self.put(schema.key(cluster, Kind.NOTICES, notice.node), encode(notice))

    def get_notice(self, cluster: str, node: str) -> Notice | None:
        return self._get_record(Notice, schema.key(cluster, Kind.NOTICES, node))

    def list_notices(self, cluster: str) -> list[Notice]:
        return self._list_records(Notice, cluster, Kind.NOTICES)

    def delete_notice(self, cluster: str, node: str) -> bool:
        return self.delete(schema.key(cluster, Kind.NOTICES, node))

    def put_standby(self, cluster: str, node: str) -> int:
        """Mark `node` a warm spare: its agent parks the pre-warmed launcher outside the rendezvous."""
        return self.put(schema.key(cluster, Kind.STANDBY, node), "1")

    def is_standby(self, cluster: str, node: str) -> bool:
        """True while `node` is a warm spare not yet activated."""
        return self.get(schema.key(cluster, Kind.STANDBY, node)) is not None

    def list_standby(self, cluster: str) -> set[str]:
        """Ids of the warm spares not yet activated."""
        return self._ids(cluster, Kind.STANDBY)

    def activate_standby(self, cluster: str, node: str) -> bool:
        """Turn a warm spare into a training node; False if it was not one. Idempotent."""
        return self.delete(schema.key(cluster, Kind.STANDBY, node))

    def watch_standby(self, cluster: str, node: str, callback: Callable[[WatchEvent], None]) -> WatchHandle:
        """Call `callback` for every change of this node's standby key (a "delete" is its activation)."""
        return self.watch_key(schema.key(cluster, Kind.STANDBY, node), callback)

    def put_progress(self, cluster: str, progress: Progress) -> int:
        return self.put(schema.key(cluster, Kind.PROGRESS, progress.node), encode(progress))

    def get_progress(self, cluster: str, node: str) -> Progress | None:
        return self._get_record(Progress, schema.key(cluster, Kind.PROGRESS, node))

    def list_progress(self, cluster: str) -> list[Progress]:
        return self._list_records(Progress, cluster, Kind.PROGRESS)

    def put_checkpoint(self, cluster: str, checkpoint: CheckpointRecord) -> int:
        if checkpoint.step < 0:
            raise ValueError(f"checkpoint step ({checkpoint.step}) must be >= 0")
        return self.put(schema.key(cluster, Kind.CHECKPOINTS, checkpoint.step), encode(checkpoint))

    def list_checkpoints(self, cluster: str) -> list[CheckpointRecord]:
        """All checkpoints, oldest step first."""
        return sorted(self._list_records(CheckpointRecord, cluster, Kind.CHECKPOINTS), key=lambda c: c.step)

    def latest_checkpoint(self, cluster: str) -> CheckpointRecord | None:
        found = self.list_checkpoints(cluster)
        return found[-1] if found else None

    # --- ledger --------------------------------------------------------------------------------

    def put_ledger(self, cluster: str, node: str, segments: list[LedgerSegment]) -> int:
        """Replace the cost segments of `node` (oldest first); returns the revision."""
        return self.put(schema.key(cluster, Kind.LEDGER, node), json.dumps([to_dict(s) for s in segments]))

    def get_ledger(self, cluster: str, node: str) -> list[LedgerSegment]:
        k = schema.key(cluster, Kind.LEDGER, node)
        found = self.get(k)
        return [] if found is None else self._segments(found[0], k)

    def list_ledger(self, cluster: str) -> dict[str, list[LedgerSegment]]:
        """Cost segments of every node that ever ran, by node id."""
        prefix = schema.kind_prefix(cluster, Kind.LEDGER)
        return {k[len(prefix) :]: self._segments(v, k) for k, v, _ in self.get_prefix(prefix)}

    @staticmethod
    def _segments(raw: bytes, k: str) -> list[LedgerSegment]:
        try:
            return [from_dict(LedgerSegment, item) for item in json.loads(raw)]
        except (ValueError, TypeError) as exc:
            raise ControlPlaneError(
                f"unreadable ledger at {k}: {exc}", hint="delete the key or fix the writer"
            ) from exc

    # --- events --------------------------------------------------------------------------------

    def add_event(self, cluster: str, kind: EventKind, message: str, node: str | None = None) -> Event:
        """Append one history line with the next sequence number (1, 2, ...).

        The seq is allocated by a compare-and-set (no key >= seq may exist), so concurrent
        writers never share or reorder numbers. Raises ControlPlaneError, MembershipError under
        extreme contention.
        """
        prefix = schema.kind_prefix(cluster, Kind.EVENTS)
        for _ in range(200):
            last = self.last_key(prefix)
            event = Event((int(last[len(prefix) :]) if last else 0) + 1, time.time(), kind, message, node)
            if self.create_above(prefix, schema.key(cluster, Kind.EVENTS, event.seq), encode(event)):
                return event
        raise MembershipError(
            f"could not allocate an event number in cluster {cluster!r}", hint="too many concurrent writers"
        )

    def list_events(self, cluster: str, since: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > `since`, oldest first (at most `limit`)."""
        start = schema.key(cluster, Kind.EVENTS, since + 1)
        items = self.get_range(start, schema.kind_prefix(cluster, Kind.EVENTS), limit=limit)
        return [self._decode(Event, k, value) for k, value, _ in items]

    # --- launch intents (the provisioner's) ----------------------------------------------------

    def put_launch(self, cluster: str, intent: LaunchIntent) -> int:
        """Record a launch before the provider is called; returns the revision. Idempotent."""
        return self.put(schema.key(cluster, Kind.LAUNCHES, intent.key), encode(intent))

    def get_launch(self, cluster: str, key: str) -> LaunchIntent | None:
        return self._get_record(LaunchIntent, schema.key(cluster, Kind.LAUNCHES, key))

    def list_launches(self, cluster: str) -> list[LaunchIntent]:
        """Launches not finished yet, oldest first."""
        return sorted(self._list_records(LaunchIntent, cluster, Kind.LAUNCHES), key=lambda i: i.at)

    def delete_launch(self, cluster: str, key: str) -> bool:
        """The launch is over (its VMs are recorded, or no candidate had capacity). Idempotent."""
        return self.delete(schema.key(cluster, Kind.LAUNCHES, key))

    # --- chaos (the controller's schedule) -----------------------------------------------------

    def chaos_start(self, cluster: str, now: float) -> float:
        """When the cluster's chaos clock started: `now` on the first call ever, the stored time after
        that (a restarted controller keeps the clock)."""
        k = schema.chaos_start_key(cluster)
        self.cas(k, None, json.dumps({"at": now}))  # the first caller sets the clock; later ones keep it
        found = self.get(k)
        if found is None:  # deleted in between: the cluster's state is being removed
            raise ControlPlaneError(
                f"the chaos clock of cluster {cluster!r} vanished", hint="is `spotrun down` running?"
            )
        return float(json.loads(found[0])["at"])

    def chaos_fired(self, cluster: str, mark: ChaosMark, index: int) -> bool:
        """True once entry `index` of that chaos list was marked fired."""
        return self.get(schema.chaos_key(cluster, mark, index)) is not None

    def mark_chaos_fired(self, cluster: str, mark: ChaosMark, index: int) -> int:
        """Mark entry `index` of that chaos list fired, so it never fires again. Idempotent."""
        return self._stamp(schema.chaos_key(cluster, mark, index))

    # --- the elastic rendezvous (spotrun's run id is the cluster name) --------------------------

    def rdzv_waiting(self, cluster: str) -> set[str]:
        """Nodes waiting to join the cluster's rendezvous."""
        prefix = schema.rdzv_key(cluster, cluster, RdzvPart.WAITING)
        return {k[len(prefix) :] for k, _, _ in self.get_prefix(prefix)}

    def watch_rdzv_waiting(self, cluster: str, callback: Callable[[str, str], None]) -> WatchHandle:
        """Call `callback(kind, node)` whenever a node starts ("put") or stops ("delete") waiting to
        join the cluster's rendezvous ("resync" with node "" after a compaction)."""
        prefix = schema.rdzv_key(cluster, cluster, RdzvPart.WAITING)
        return self.watch_prefix(prefix, lambda event: callback(event.kind, event.key[len(prefix) :]))

    def is_rdzv_member(self, cluster: str, node: str) -> bool:
        """True while `node`'s membership key in the cluster's rendezvous exists."""
        return self.get(schema.rdzv_key(cluster, cluster, RdzvPart.ALIVE, node)) is not None

    def release_rdzv_member(self, cluster: str, node: str) -> bool:
        """Delete a gone node's rendezvous membership now, instead of when its lease ends: survivors
        hold a round open while it exists. False if it was not there. Idempotent."""
        return self.delete(schema.rdzv_key(cluster, cluster, RdzvPart.ALIVE, node))

    # --- clusters ------------------------------------------------------------------------------

    def list_clusters(self) -> list[str]:
        """Names of clusters that have any key, sorted."""
        return sorted({c for c in map(schema.cluster_of, self.keys(schema.ROOT)) if c})

    def cluster_keys(self, cluster: str) -> list[tuple[str, bytes, int]]:
        """(key, value, mod_revision) of every key of `cluster`: what a `watch_cluster` consumer starts from."""
        return self.get_prefix(schema.cluster_prefix(cluster))

    def watch_cluster(
        self, cluster: str, callback: Callable[[WatchEvent], None], start_revision: int | None = None
    ) -> WatchHandle:
        """`watch_prefix` over every key of `cluster` (take keys apart with `schema.parse_key`)."""
        return self.watch_prefix(schema.cluster_prefix(cluster), callback, start_revision)

    def drop_live_state(self, cluster: str) -> int:
        """Delete every key of `cluster` except its history (`Kind.is_history`); returns how many. Idempotent."""
        dropped = 0
        for kind in Kind:
            if not kind.is_history:
                dropped += self.delete_prefix(schema.kind_prefix(cluster, kind))
                dropped += self.delete(schema.key(cluster, kind))
        return dropped

    def delete_cluster(self, cluster: str) -> int:
        """Delete every key of `cluster`; returns how many. Idempotent."""
        return self.delete_prefix(schema.cluster_prefix(cluster))


# The typed client; `spotrun.state.etcd.connect` gives the generic one. Same options.
connect = Store.connect
