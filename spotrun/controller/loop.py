"""The controller: a level-triggered reconcile loop per cluster (run as a daemon by spotrun.controller.daemon).

Each pass observes (the providers' instances, etcd's nodes, leases, notices, ledger, launch
intents), asks the pure `plan()` what to do, and applies it. The desired state is the cluster's
spec in etcd, read at the start of every pass: a re-run of `up` with a changed recipe (resources,
setup, env, nodes, budget, chaos, checkpoint) reaches the next pass. Passes run on every etcd change of
the cluster's plan inputs, when a rendezvous lease ends (a node that died without notice), and
at least every RESYNC_S (preemptions show up at the provider, not in etcd).
All state lives in etcd and at the provider, so the process can be killed at any moment:
a restarted controller re-reads everything, resumes unfinished launches by their idempotency
key, and a transient error (etcd or a provider call failing) skips the pass instead of acting
on half an observation: healthy nodes are never torn down for it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from spotrun import log
from spotrun.controller.bootstrap import LogReporter, QuietReporter
from spotrun.controller.placement import placements, providers_of
from spotrun.controller.plan import (
    Action,
    Activate,
    Blocked,
    CloseLedger,
    Desired,
    Drain,
    Launch,
    NodeView,
    Observed,
    StopCluster,
    Terminate,
    plan,
)
from spotrun.controller.provisioning import Provisioner, cluster_lock
from spotrun.errors import CapacityError, NotFoundError, SpotrunError
from spotrun.state import clusterfile, schema
from spotrun.state.ledger import close_open, summarize
from spotrun.state.records import EventKind, NodeReason, NodeState
from spotrun.state.schema import Kind, RdzvPart
from spotrun.state.spec import read_spec
from spotrun.state.store import Store

if TYPE_CHECKING:
    from spotrun.controller.traces import ReplayEvent
    from spotrun.providers.base import Instance
    from spotrun.recipe.job import Chaos
    from spotrun.recipe.schema import Recipe
    from spotrun.state.records import LedgerSegment, NodeRecord, Notice
    from spotrun.state.watch import WatchEvent

_log = log.get("controller")

RESYNC_S = 2.0
MIN_PASS_INTERVAL_S = 0.2
# Changes to these kinds of key can change the plan; progress and events cannot.
_PLAN_INPUTS = frozenset(
    {Kind.SPEC, Kind.TARGET, Kind.NODES, Kind.ALIVE, Kind.NOTICES, Kind.LAUNCHES, Kind.STOPPED, Kind.STANDBY}
)
AVOID_ZONE_S = 300.0  # a zone that just preempted a node is tried last for this long
PRICE_REFRESH_S = 300.0  # how often live spot prices are re-read into the ledger
JOIN_WAIT_S = 5.0  # how long a gone node's rendezvous key waits for an activated spare to reach the rendezvous


class Controller:
    """Reconciles one cluster; `reconcile_once()` is one pass, `run(stop)` loops."""

    recipe: Recipe  # the spec's, as of the last pass
    provisioner: Provisioner  # built from `recipe`

    def __init__(self, cluster: str, store: Store, *, reporter_factory: type[QuietReporter] = LogReporter) -> None:
        self.cluster = cluster
        self.store = store
        self.record = clusterfile.load(cluster)  # how to reach the VMs; the recipe comes from etcd
        self._reporter_factory = reporter_factory
        self._spec_version: int | None = None
        self._wake = threading.Event()
        self._prices_at = 0.0
        self._replay: list[ReplayEvent] | None = None
        self._preempted_zones: dict[str, float] = {}
        self._said: set[str] = set()
        # Rendezvous membership of gone VMs, released once activated spares are in (see _release_gone).
        self._members_lock = threading.Lock()
        self._gone_members: set[str] = set()
        self._joining: dict[str, float] = {}

    # -- loop -----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Reconcile until `stop`; wakes on any etcd change of the cluster. Blocks."""

        def on_change(event: WatchEvent) -> None:
            # A node that dies without a word shows first as a survivor's "peer lost" report, then
            # as its rendezvous lease (1 s) ending: look at the provider then, not up to RESYNC_S
            # later, so a warm spare can join the survivors' re-formation.
            parsed = schema.parse_key(self.cluster, event.key)
            rdzv = schema.parse_rdzv_key(self.cluster, event.key)
            if (parsed is not None and parsed.kind in _PLAN_INPUTS) or (
                rdzv is not None
                and (
                    (event.kind == "delete" and rdzv.part == RdzvPart.ALIVE)
                    or (event.kind == "put" and rdzv.part == RdzvPart.LOST)
                )
            ):
                self._wake.set()
            if event.kind == "put" and rdzv is not None and rdzv.run_id == self.cluster and rdzv.part == RdzvPart.ALIVE:
                self._spare_arrived(rdzv.node)

        watch = self.store.watch_cluster(self.cluster, on_change)
        self.event_once(EventKind.CONTROLLER, f"controller started (pid {os.getpid()})")
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    self.reconcile_once()
                except SpotrunError as exc:
                    _log.warning("pass skipped", extra=log.kv(error=exc))
                except Exception:  # a bug: keep its traceback in the log, but keep the cluster managed
                    _log.exception("pass failed")
                    stop.wait(RESYNC_S)
                stop.wait(MIN_PASS_INTERVAL_S)  # a burst of changes becomes one pass
                self._wake.wait(RESYNC_S)
        finally:
            watch.cancel()

    def reconcile_once(self) -> list[Action]:
        """Observe, plan, act; returns the actions taken. Raises NotFoundError while the cluster has
        no spec in etcd (a head VM's controller starts before `up` writes it), ControlPlaneError
        or ProviderError when a read fails: the pass then acts on nothing."""
        with cluster_lock(self.cluster):
            self._follow_spec()
            desired, observed, instances = self._observe()
            actions = plan(desired, observed)
            self._expect_spares([a.node for a in actions if isinstance(a, Activate)])
            for action in actions:
                self._apply(action, instances)
            self._release_gone()
            if not observed.stopped:
                self._bootstrap_missing()  # VMs that came up without a live agent (crashes, slow boots)
                self._chaos(instances)
                self._refresh_prices(instances)
        return actions

    # -- observe --------------------------------------------------------------------------------
    def _follow_spec(self) -> None:
        """Take the spec in etcd as the recipe; when its version changed, rebuild what derives from
        it (the provisioner, the chaos trace's replay events)."""
        spec = read_spec(self.store, self.cluster)
        if spec is None:
            raise NotFoundError(f"cluster {self.cluster!r} has no recipe in etcd yet", hint="`spotrun up` writes it")
        if spec.version == self._spec_version:
            return
        if self._spec_version is not None:
            _log.info("spec changed; reconciling to the new recipe", extra=log.kv(version=spec.version))
        self.recipe, self._spec_version = spec.recipe, spec.version
        self.provisioner = Provisioner(self.recipe, self.record, self.store, reporter_factory=self._reporter_factory)
        self._replay = None

    def _observe(self) -> tuple[Desired, Observed, dict[str, Instance]]:
        target = self.store.get_target(self.cluster)
        instances = {i.id: i for i in self.provisioner.instances()}
        records = {n.id: n for n in self.store.list_nodes(self.cluster)}
        alive = self.store.list_alive(self.cluster)
        notices = {n.node: n for n in self.store.list_notices(self.cluster)}
        ledger = self.store.list_ledger(self.cluster)
        intents = self.provisioner.pending_intents()
        standby = self.store.list_standby(self.cluster)
        nodes, budget = self.recipe.nodes, self.recipe.budget
        desired = Desired(
            target=nodes.target if target is None else target,
            min=nodes.min,
            max=nodes.max,
            max_per_hour=budget.max_per_hour if budget else None,
            max_total=budget.max_total if budget else None,
            launch_price=self._launch_price(),
            spares=nodes.spares,
        )
        ready = self._ready(alive)
        views = [
            self._view(
                inst,
                records.get(inst.id),
                inst.id in alive,
                inst.id in ready,
                notices.get(inst.id),
                ledger.get(inst.id),
                inst.id in standby,
            )
            for inst in instances.values()
            if not self._finished(inst, records.get(inst.id), ledger.get(inst.id))
        ]
        spent = summarize([s for segs in ledger.values() for s in segs]).total
        pending = None
        if intents:
            prefix = f"{intents[0].key}-c"  # the provisioner's key per candidate
            visible = sum(
                1
                for i in instances.values()
                if not i.state.is_gone and str(i.labels.get("idempotency_key", "")).startswith(prefix)
            )
            pending = (intents[0].key, intents[0].count, visible)
        observed = Observed(
            views,
            spent_total=spent,
            pending_launch=pending,
            stopped=self.store.is_stopped(self.cluster),
            now=time.time(),
        )
        return desired, observed, instances

    @staticmethod
    def _finished(inst: Instance, record: NodeRecord | None, segments: list[LedgerSegment] | None) -> bool:
        """Gone, recorded as gone, and billed to the end: nothing left to do about it."""
        closed = not segments or all(s.end is not None for s in segments)
        return inst.state.is_gone and closed and record is not None and record.state.is_gone

    def _ready(self, alive: set[str]) -> set[str]:
        """Nodes that can take over work now: without training, any live agent; with training,
        one waiting to join the rendezvous or already reporting steps."""
        if not self.record.train:
            return alive
        joining = self.store.rdzv_waiting(self.cluster)
        return alive & (joining | {p.node for p in self.store.list_progress(self.cluster)})

    @staticmethod
    def _view(
        inst: Instance,
        record: NodeRecord | None,
        alive: bool,
        ready: bool,
        notice: Notice | None,
        segments: list[LedgerSegment] | None,
        standby: bool,
    ) -> NodeView:
        state = record.state if record else None
        reason = record.reason if record else NodeReason.NONE
        return NodeView(
            id=inst.id,
            price_per_hour=inst.price_per_hour,
            gone=inst.state.is_gone,
            alive=alive,
            ready=ready,
            noticed=notice is not None,
            notice_deadline=notice.deadline if notice else None,
            leaving=state == NodeState.LEAVING,
            left=state == NodeState.LEAVING and reason is NodeReason.LEFT,
            ledger_open=any(s.end is None for s in segments or ()),
            launched_at=inst.launched_at,
            replaces=(record.extra.get("replaces") if record else None),
            standby=standby,
            finished=state == NodeState.RUNNING and reason is NodeReason.FINISHED,
        )

    def _launch_price(self) -> float:
        try:
            return placements(self.recipe)[0].offer.price
        except SpotrunError:
            return 0.0

    # -- act ------------------------------------------------------------------------------------
    def _apply(self, action: Action, instances: dict[str, Instance]) -> None:
        if isinstance(action, Launch):
            self._launch(action)
        elif isinstance(action, Activate):
            if self.store.activate_standby(self.cluster, action.node):
                self.store.add_event(self.cluster, EventKind.ACTIVATE, f"{action.node}: {action.reason}", action.node)
        elif isinstance(action, Drain):
            from spotrun.controller.scaling import drain

            drain(self.store, self.cluster, action.node, action.reason)
        elif isinstance(action, Terminate):
            self._terminate(instances[action.node], action.reason)
        elif isinstance(action, CloseLedger):
            self._close(instances[action.node])
        elif isinstance(action, StopCluster):
            self.store.mark_stopped(self.cluster, action.reason)
            self.store.set_target(self.cluster, 0)
            self.store.add_event(self.cluster, EventKind.BUDGET, f"stopping the cluster: {action.reason}")
        elif isinstance(action, Blocked):
            self.event_once(EventKind.BUDGET, f"launch of {action.wanted} limited to {action.allowed}: {action.reason}")

    def _refresh_prices(self, instances: dict[str, Instance]) -> None:
        """Spot prices move: every PRICE_REFRESH_S, re-read offers and reprice open ledger segments."""
        from spotrun.state.ledger import reprice

        if time.time() - self._prices_at < PRICE_REFRESH_S:
            return
        self._prices_at = time.time()
        offers = {
            (o.provider, o.zone, o.instance_type, o.spot): o
            for p in providers_of(self.recipe.resources)
            for o in p.offers()
        }
        for inst in instances.values():
            spot = inst.price_per_hour != inst.on_demand_per_hour
            offer = offers.get((inst.provider, inst.zone, inst.instance_type, spot))
            segments = self.store.get_ledger(self.cluster, inst.id)
            if offer is not None and segments:
                updated = reprice(segments, offer.price, offer.on_demand_price, time.time())
                if updated != segments:
                    self.store.put_ledger(self.cluster, inst.id, updated)
                    self.store.add_event(
                        self.cluster, EventKind.PRICE, f"{inst.id}: {offer.price:.4f} $/h from now", inst.id
                    )

    def _chaos(self, instances: dict[str, Instance]) -> None:
        from spotrun.controller import chaos

        if self.recipe.chaos is None:
            return
        live = [i for i in instances.values() if not i.state.is_gone]
        providers = {p.name: p for p in providers_of(self.recipe.resources)}
        for index, entry in chaos.due(self.store, self.cluster, self.recipe.chaos.preempt):
            chaos.fire(self.store, self.cluster, index, entry, live, providers)
        for index, event, capacity in chaos.trace_due(
            self.store, self.cluster, self._trace_events(self.recipe.chaos), self.recipe.nodes.target
        ):
            chaos.replay(self.store, self.cluster, index, event, capacity, live, providers)

    def _trace_events(self, spec: Chaos) -> list[ReplayEvent]:
        """The recipe's chaos trace (`spec`) as replay events, computed once."""
        if self._replay is None:
            from spotrun.controller.traces import load_trace, trace_events

            self._replay = (
                []
                if spec.trace is None
                else trace_events(
                    load_trace(spec.trace), spec.time_scale, self.recipe.nodes.target, notice_s=spec.trace_notice
                )
            )
        return self._replay

    def _launch(self, action: Launch) -> None:
        now = time.time()
        avoid = frozenset(z for z, at in self._preempted_zones.items() if now - at < AVOID_ZONE_S)
        try:
            self.provisioner.launch(
                action.count,
                intent_key=action.key,
                replaces=action.replaces,
                standby=action.standby,
                avoid_zones=avoid,
                lost=action.lost,
            )
        except CapacityError as exc:
            self.event_once(EventKind.CAPACITY, f"launch of {action.count} failed: {exc}")

    def _bootstrap_missing(self) -> None:
        """Bootstrap running VMs whose agent is not alive. One still booting (its launcher died
        with an earlier controller) is picked up by a later pass once it runs."""
        alive = self.store.list_alive(self.cluster)
        self.provisioner.bootstrap(
            [i for i in self.provisioner.live() if i.state.value == "running" and i.id not in alive]
        )

    def _terminate(self, inst: Instance, reason: str) -> None:
        provider = next(p for p in providers_of(self.recipe.resources) if p.name == inst.provider)
        provider.terminate([inst.id])
        self._end_billing(inst.id)
        self._forget_liveness(inst.id)
        self.provisioner.record_node(inst, NodeState.TERMINATED, detail=reason)
        self.store.delete_notice(self.cluster, inst.id)
        self.store.add_event(self.cluster, EventKind.TERMINATE, f"{inst.id} terminated: {reason}", inst.id)

    def _close(self, inst: Instance) -> None:
        """The provider reports the VM gone on its own (preemption, failure): stop billing it."""
        self._end_billing(inst.id)
        self._forget_liveness(inst.id)
        state = {"preempted": NodeState.PREEMPTED, "terminated": NodeState.TERMINATED}.get(
            inst.state.value, NodeState.FAILED
        )
        if state == NodeState.PREEMPTED:
            self._preempted_zones[inst.zone] = time.time()
        self.provisioner.record_node(inst, state, detail=inst.reason or inst.state.value)
        self.store.delete_notice(self.cluster, inst.id)
        self.store.add_event(
            self.cluster, EventKind(state.value), f"{inst.id} {state.value}: {inst.reason or 'gone'}", inst.id
        )

    def _forget_liveness(self, node: str) -> None:
        """The provider says the VM is gone: its leases would linger until their TTL; drop them now
        (its rendezvous membership once activated spares are in: see _release_gone)."""
        self.store.forget_alive(self.cluster, node)
        with self._members_lock:
            self._gone_members.add(node)
        self._release_gone()  # now, not after this pass's launches (they can take seconds)

    def _expect_spares(self, nodes: list[str]) -> None:
        """Spares this pass activates: a gone node's rendezvous key is kept until they are in."""
        with self._members_lock:
            self._joining.update((n, time.monotonic()) for n in nodes)

    def _spare_arrived(self, node: str) -> None:
        """An activated spare's rendezvous key appeared (a watch event): the survivors' round now
        waits for it, so a gone node's key need not hold that round open any longer."""
        with self._members_lock:
            if self._joining.pop(node, None) is None:
                return
        try:
            self._release_gone()
        except SpotrunError as exc:  # the next pass retries; the gone node's lease ends anyway
            _log.info("could not release gone nodes", extra=log.kv(error=exc))

    def _release_gone(self) -> None:
        """Delete the rendezvous keys of VMs the provider reports gone. Survivors hold a round open
        while a node's key lives (up to its 1 s lease after a hard kill); deleting it lets the round
        close at once. While an activated spare has not reached the rendezvous yet, the gone
        node's key is what keeps the round open for it: then wait (at most JOIN_WAIT_S)."""
        with self._members_lock:
            now = time.monotonic()
            self._joining = {
                n: at
                for n, at in self._joining.items()
                if now - at < JOIN_WAIT_S and not self.store.is_rdzv_member(self.cluster, n)
            }
            if self._joining or not self._gone_members:
                return
            gone, self._gone_members = self._gone_members, set()
        for node in sorted(gone):
            if self.store.release_rdzv_member(self.cluster, node):
                _log.info("released a gone node's rendezvous membership", extra=log.kv(node=node))

    def _end_billing(self, node: str) -> None:
        segments = self.store.get_ledger(self.cluster, node)
        if segments and any(s.end is None for s in segments):
            self.store.put_ledger(self.cluster, node, close_open(segments, time.time()))

    def event_once(self, kind: EventKind, message: str) -> None:
        """An event that repeats every pass (budget, capacity) is written once per process."""
        if message not in self._said:
            self._said.add(message)
            self.store.add_event(self.cluster, kind, message)
