"""Launching and bootstrapping nodes: the one code path `up` and the controller share.

Every launch is recorded in etcd as an intent (`/spotrun/<c>/launches/<key>`) BEFORE the
provider is called, with the idempotency key the provider labels the VMs with; a process that
dies mid-launch leaves a pending intent, and whoever re-issues it with the same key gets the
same VMs back instead of new ones. A file lock per cluster keeps `up` and the controller from
provisioning at the same time.
"""

from __future__ import annotations

import fcntl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from spotrun import log
from spotrun.controller.bootstrap import BootstrapPlan, LogReporter, ReporterFactory, bootstrap_all, vm_tls
from spotrun.controller.placement import Placement, placements, providers_of
from spotrun.controller.ssh import DEFAULT_TIMEOUTS, SshTarget, SshTimeouts
from spotrun.controller.ssh_keys import ensure_keypair
from spotrun.errors import BootstrapError, CapacityError, ProviderError, SpotrunError
from spotrun.paths import cluster_dir
from spotrun.providers.base import Instance
from spotrun.recipe.schema import Recipe
from spotrun.state.clusterfile import ClusterFile
from spotrun.state.records import EventKind, LaunchIntent, LedgerSegment, NodeRecord, NodeState
from spotrun.state.store import Store

_log = log.get("provisioning")

AGENT_READY_TIMEOUT_S = 60.0
GONE_CHECK_S = 1.0  # while bootstrapping, how often the provider is asked which VMs are gone
_CANDIDATE_SEP = "-c"  # a launch's idempotency key is "<intent key>-c<candidate index>"
HEAD_ROLE = "head"  # the `role` label of a cluster's head VM; the provisioner never counts it as a node


def is_head(inst: Instance) -> bool:
    return inst.labels.get("role") == HEAD_ROLE


@contextmanager
def cluster_lock(cluster: str) -> Iterator[None]:
    """Serialises provisioning of one cluster across processes (up, controller). Blocks."""
    with open(cluster_dir(cluster) / "provision.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


class Provisioner:
    """Launch and bootstrap nodes of one cluster by `recipe` (`up`'s freshly loaded one, or the
    controller's from etcd); see the module docstring."""

    def __init__(
        self,
        recipe: Recipe,
        record: ClusterFile,
        store: Store,
        *,
        ssh_timeouts: SshTimeouts = DEFAULT_TIMEOUTS,
        reporter_factory: ReporterFactory | None = None,
    ) -> None:
        self.recipe, self.record, self.store = recipe, record, store
        self.cluster = recipe.name
        self.ssh_timeouts = ssh_timeouts
        self.reporter_factory = reporter_factory
        self.public_key = ensure_keypair(record.key_path, f"spotrun-{self.cluster}")

    # -- observation ----------------------------------------------------------------------------
    def instances(self) -> list[Instance]:
        """Every worker instance of the cluster in any state, fresh from each of the recipe's
        providers (a head VM holds the control plane, not a node)."""
        return [
            inst
            for provider in providers_of(self.recipe.resources)
            for inst in provider.instances(self.cluster)
            if not is_head(inst)
        ]

    def live(self) -> list[Instance]:
        return [inst for inst in self.instances() if not inst.state.is_gone]

    def pending_intents(self) -> list[LaunchIntent]:
        return self.store.list_launches(self.cluster)

    # -- launching ------------------------------------------------------------------------------
    def launch(
        self,
        count: int,
        *,
        intent_key: str | None = None,
        replaces: tuple[str, ...] = (),
        standby: int = 0,
        avoid_zones: frozenset[str] = frozenset(),
        lost: tuple[str, ...] = (),
    ) -> list[str]:
        """Launch `count` VMs on the cheapest candidate with capacity (zones in `avoid_zones` last),
        the last `standby` of them as warm spares; the launch event names `lost` (the nodes it makes
        up for, as the plan describes them). Records the intent first; re-issuing a known
        `intent_key` returns its VMs. Raises CapacityError when no candidate has capacity,
        ProviderError for other failures."""
        if intent_key is not None and not standby:
            standby = self._intent_standby(intent_key)
        intent = LaunchIntent(intent_key or f"l-{uuid.uuid4().hex[:12]}", count, tuple(replaces), standby=standby)
        self.store.put_launch(self.cluster, intent)
        ordered = sorted(placements(self.recipe), key=lambda p: p.offer.zone in avoid_zones)
        errors = []
        for placement in ordered:
            try:
                ids = self._launch_on(placement, intent, lost)
            except CapacityError as exc:
                errors.append(str(exc))
                self.store.add_event(
                    self.cluster, EventKind.CAPACITY, f"{_describe(placement)}: {exc}; trying the next candidate"
                )
                continue
            self.store.delete_launch(self.cluster, intent.key)
            return ids
        self.store.delete_launch(self.cluster, intent.key)
        raise CapacityError(
            "no candidate offer had capacity: " + "; ".join(errors),
            hint="add candidates in other zones or instance types to the recipe",
        )

    def _intent_standby(self, intent_key: str) -> int:
        """A re-issued launch keeps the spares it was recorded with."""
        found = self.store.get_launch(self.cluster, intent_key)
        return found.standby if found else 0

    def _launch_on(self, placement: Placement, intent: LaunchIntent, lost: tuple[str, ...] = ()) -> list[str]:
        from spotrun.providers import LaunchSpec

        # The key names (intent, candidate): a fallback candidate must not find the first one's VMs.
        spec = LaunchSpec(
            cluster=self.cluster,
            offer=placement.offer,
            count=intent.count,
            ssh_public_key=self.public_key,
            idempotency_key=f"{intent.key}{_CANDIDATE_SEP}{placement.index}",
        )
        self.store.add_event(
            self.cluster,
            EventKind.LAUNCH,
            f"launching {intent.count} x {_describe(placement)}"
            + (f" to replace {', '.join(intent.replaces)}" if intent.replaces else "")
            + (f"; lost {', '.join(lost)}" if lost else ""),
        )
        try:
            ids = placement.provider.launch(spec)
        except CapacityError:
            raise
        except ProviderError as exc:
            leftovers = [
                i.id
                for i in placement.provider.instances(self.cluster)
                if i.labels.get("idempotency_key") == spec.idempotency_key
            ]
            placement.provider.terminate(leftovers)
            self.store.add_event(self.cluster, EventKind.FAILURE, f"launch failed: {exc}")
            raise
        launched = sorted((i for i in placement.provider.instances(self.cluster) if i.id in ids), key=lambda i: i.id)
        replaces = list(intent.replaces) + [None] * len(launched)
        # Replacements first, spares last; spares are marked before any agent starts, so a
        # spare's agent never joins the job by mistake.
        for inst in launched[len(launched) - intent.standby :] if intent.standby else ():
            self.store.put_standby(self.cluster, inst.id)
        for inst, replaced in zip(launched, replaces, strict=False):  # replaces is padded with None
            self.record_node(inst, NodeState.BOOTING, replaces=replaced)
            if not self.store.get_ledger(self.cluster, inst.id):
                self.store.put_ledger(
                    self.cluster,
                    inst.id,
                    [LedgerSegment(inst.id, inst.price_per_hour, inst.on_demand_per_hour, time.time())],
                )
        return ids

    def record_node(self, inst: Instance, state: NodeState, *, detail: str = "", replaces: str | None = None) -> None:
        existing = self.store.get_node(inst.cluster, inst.id)
        extra = {
            **(existing.extra if existing else {}),
            "ssh_user": inst.ssh_user,
            "host_public_key": inst.host_public_key,
        }
        if replaces:
            extra["replaces"] = replaces
        self.store.put_node(
            NodeRecord(
                id=inst.id,
                cluster=inst.cluster,
                provider=inst.provider,
                zone=inst.zone,
                instance_type=inst.instance_type,
                price_per_hour=inst.price_per_hour,
                on_demand_per_hour=inst.on_demand_per_hour,
                ip=inst.host,
                ssh_port=inst.ssh_port,
                state=state,
                detail=detail,
                launched_at=existing.launched_at if existing else inst.launched_at,
                extra=extra,
            )
        )

    # -- bootstrapping --------------------------------------------------------------------------
    def bootstrap(self, todo: list[Instance]) -> None:
        """Bootstrap `todo` in parallel and wait until their agents are alive. VMs that fail are
        terminated and recorded; then BootstrapError names them."""
        if not todo:
            return
        for inst in todo:
            self.record_node(inst, NodeState.BOOTSTRAPPING)
        targets = [SshTarget(i.id, i.host, i.ssh_port, i.ssh_user, i.host_public_key) for i in todo]
        # A VM that dies while it is bootstrapped (a spot VM preempted as it boots) must not hold
        # this pass (and so every other decision of the controller) for the SSH and agent timeouts.
        gone = _GoneVms(self.instances)
        by_id = {i.id: i for i in todo}
        tls_files, tls_env = vm_tls(self.recipe)
        plan = BootstrapPlan(
            cluster=self.cluster,
            workdir=Path(self.record.workdir) if self.record.workdir else self.recipe.workdir,
            setup=self.recipe.setup,
            env={**self.recipe.env, **tls_env},
            agent_argv=lambda vm: self._agent_argv(by_id[vm]),
            key_path=self.record.key_path,
            timeouts=self.ssh_timeouts,
            secrets=tls_files,
            vm_gone=gone,
        )
        with (self.reporter_factory or LogReporter)([t.name for t in targets]) as reporter:
            outcomes = bootstrap_all(targets, plan, reporter)
        failed = {o.name: o.error or f"failed at {o.phase}" for o in outcomes if not o.ok}
        ready = [o.name for o in outcomes if o.ok]
        _log.info("agents started; waiting for them to register", extra=log.kv(nodes=len(ready)))
        failed.update(self._wait_alive(ready, AGENT_READY_TIMEOUT_S, gone))
        for vm in ready:
            if vm not in failed:
                self.store.add_event(self.cluster, EventKind.BOOTSTRAP, f"{vm} bootstrapped; agent alive", vm)
        if failed:
            self._give_up(by_id, failed)

    def _agent_argv(self, inst: Instance) -> list[str]:
        argv = ["spotrun-agent", "--cluster", inst.cluster, "--node", inst.id]
        if self.record.train:
            argv += ["--train", "--workers", str(workers_for(self.recipe, inst))]
        if inst.extra.get("shared_dir"):
            argv += ["--checkpoint-root", inst.extra["shared_dir"]]
        for endpoint in self.record.agent_endpoints or self.record.endpoints:
            argv += ["--etcd", endpoint]
        if inst.extra.get("notice_protocol"):
            argv += ["--notice-protocol", inst.extra["notice_protocol"]]
        if inst.metadata_url:
            argv += ["--metadata-url", inst.metadata_url]
        return argv

    def _wait_alive(self, nodes: list[str], timeout: float, gone: Callable[[str], bool]) -> dict[str, str]:
        """Block until every node's liveness key exists or its VM is `gone`; the nodes whose agent
        did not register, with why."""
        deadline = time.monotonic() + timeout
        waiting, failed = set(nodes), dict[str, str]()
        while waiting and time.monotonic() < deadline:
            waiting -= self.store.list_alive(self.cluster)
            failed.update((vm, "the VM is gone (the provider says so)") for vm in sorted(waiting) if gone(vm))
            waiting -= failed.keys()
            if waiting:
                time.sleep(0.1)
        failed.update((vm, f"agent did not register within {timeout:.0f} s") for vm in sorted(waiting))
        return failed

    def _give_up(self, by_id: dict[str, Instance], failed: dict[str, str]) -> None:
        for provider in providers_of(self.recipe.resources):
            provider.terminate([vm for vm in failed if by_id[vm].provider == provider.name])
        for vm, error in failed.items():
            self.record_node(by_id[vm], NodeState.FAILED, detail=error)
            self.store.add_event(
                self.cluster, EventKind.FAILURE, f"{vm} did not come up and was terminated: {error}", vm
            )
        first_vm, first_error = next(iter(failed.items()))
        raise BootstrapError(
            f"{len(failed)} of {len(by_id)} VMs failed to bootstrap and were terminated; {first_vm}: {first_error}",
            hint="see `spotrun events` / `spotrun status`",
        )


class _GoneVms:
    """VM id -> the provider reports it gone; one provider read per GONE_CHECK_S at most, shared
    by the bootstrap threads. A failed read counts as "not gone" (the timeouts still hold)."""

    def __init__(self, read: Callable[[], list[Instance]]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._gone: set[str] = set()
        self._at = -GONE_CHECK_S

    def __call__(self, vm: str) -> bool:
        with self._lock:
            if time.monotonic() - self._at >= GONE_CHECK_S:
                self._at = time.monotonic()
                try:
                    self._gone = {i.id for i in self._read() if i.state.is_gone}
                except SpotrunError as exc:
                    _log.info("could not read the provider's instances", extra=log.kv(error=exc))
            return vm in self._gone


def workers_for(recipe: Recipe, inst: Instance) -> int:
    """Training workers on `inst`: those of the recipe candidate it was launched from (its launch
    key ends in that candidate's index); else of the first candidate of its provider and type (the
    recipe changed since the launch); else 1."""
    _, _, index = inst.labels.get("idempotency_key", "").rpartition(_CANDIDATE_SEP)
    candidates = list(recipe.resources)
    if index.isdigit() and int(index) < len(candidates):
        candidates.insert(0, candidates[int(index)])
    same = (c for c in candidates if (c.provider, c.instance_type) == (inst.provider, inst.instance_type))
    return next((c.workers_per_vm for c in same), 1)


def _describe(placement: Placement) -> str:
    offer = placement.offer
    kind = "spot" if offer.spot else "on-demand"
    return f"{offer.provider}/{offer.zone}/{offer.instance_type} ({kind} {offer.price:.4f} $/h)"
