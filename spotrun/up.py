"""`spotrun up`: bring a cluster to its target size; a re-run reconciles instead of duplicating.

Level-based: it reads what the providers and etcd say exists, launches only the missing VMs and
bootstraps only the VMs whose agent is not alive. A VM that fails to come up is terminated, so
a failed `up` leaves no half-built VM running; a brand-new cluster that gets no node at all is
torn down completely.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from spotrun import clusterfile, log
from spotrun.bootstrap import BootstrapPlan, bootstrap_all
from spotrun.clusterfile import ClusterFile
from spotrun.control_plane import connect_recipe, endpoints_for
from spotrun.errors import BootstrapError, CapacityError, ProviderError, SpotrunError
from spotrun.keys import ensure_keypair
from spotrun.placement import Placement, placements, providers_of
from spotrun.records import LedgerSegment, NodeRecord, NodeState
from spotrun.recipe import Recipe, load_recipe
from spotrun.remote import SshTarget, SshTimeouts
from spotrun.store import Store

_log = log.get("up")

AGENT_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class UpResult:
    cluster: str
    launched: list[str]
    bootstrapped: list[str]
    nodes: list[str]


def up(recipe_path: Path, *, ssh_timeouts: SshTimeouts = SshTimeouts(), reporter_factory=None) -> UpResult:
    """Reconcile the cluster of `recipe_path` to its target size. Blocks until every node's agent
    is alive. Raises RecipeError, ControlPlaneError, ProviderError or BootstrapError."""
    recipe = load_recipe(recipe_path)
    endpoints, embedded = endpoints_for(recipe)
    store = connect_recipe(recipe, endpoints)
    new_cluster = recipe.name not in clusterfile.names()
    record = ClusterFile(recipe.name, recipe.to_json(), endpoints, embedded)
    record.save()
    try:
        return _reconcile(recipe, record, store, ssh_timeouts, reporter_factory)
    except SpotrunError:
        if new_cluster and not store.list_alive(recipe.name):
            _log.warning("first up failed; removing the half-built cluster", extra=log.kv(cluster=recipe.name))
            from spotrun.down import down

            store.close()
            down(recipe.name)
        raise
    finally:
        store.close()


def _reconcile(recipe: Recipe, record: ClusterFile, store: Store, ssh_timeouts: SshTimeouts,
               reporter_factory) -> UpResult:
    cluster = recipe.name
    public_key = ensure_keypair(record.key_path, f"spotrun-{cluster}")
    store.put_spec(cluster, json.loads(recipe.to_json()))
    store.set_target(cluster, recipe.nodes.target)
    started = time.monotonic()
    missing = recipe.nodes.target - len(_live(recipe))
    launched = _launch(recipe, store, public_key, missing) if missing > 0 else []
    live = _live(recipe)
    alive = store.list_alive(cluster)
    todo = [inst for inst in live if inst.id not in alive]
    for inst in todo:
        _record_node(store, inst, NodeState.BOOTSTRAPPING)
    _log.info("launch finished", extra=log.kv(launched=len(launched), seconds=round(time.monotonic() - started, 2)))
    _bootstrap(recipe, record, store, todo, ssh_timeouts, reporter_factory)
    _log.info("bootstrap finished", extra=log.kv(nodes=len(todo), seconds=round(time.monotonic() - started, 2)))
    store.add_event(cluster, "up", f"cluster at {len(live)} of target {recipe.nodes.target} nodes")
    return UpResult(cluster, launched, [i.id for i in todo], [i.id for i in live])


def _live(recipe: Recipe) -> list:
    """Instances of the cluster that run or are coming up, across the recipe's providers."""
    return [inst for provider in providers_of(recipe) for inst in provider.instances(recipe.name)
            if not inst.state.is_gone]


def _launch(recipe: Recipe, store: Store, public_key: str, count: int) -> list[str]:
    """Launch `count` VMs on the cheapest candidate with capacity, falling through the rest."""
    from spotrun.providers import LaunchSpec

    errors = []
    for placement in placements(recipe):
        key = f"up-{uuid.uuid4().hex[:12]}"
        spec = LaunchSpec(cluster=recipe.name, offer=placement.offer, count=count,
                          ssh_public_key=public_key, idempotency_key=key)
        store.add_event(recipe.name, "launch", f"launching {count} x {_describe(placement)} (key {key})")
        try:
            ids = placement.provider.launch(spec)
        except CapacityError as exc:
            errors.append(str(exc))
            store.add_event(recipe.name, "capacity", f"{_describe(placement)}: {exc}; trying the next candidate")
            continue
        except ProviderError as exc:
            _terminate_failed(placement, recipe.name, key)
            store.add_event(recipe.name, "failure", f"launch failed: {exc}")
            raise
        for inst in placement.provider.instances(recipe.name):
            if inst.id in ids:
                _record_node(store, inst, NodeState.BOOTING)
                store.put_ledger(recipe.name, inst.id, [LedgerSegment(inst.id, inst.price_per_hour,
                                                                      inst.on_demand_per_hour, time.time())])
        return ids
    raise CapacityError("no candidate offer had capacity: " + "; ".join(errors),
                        hint="add candidates in other zones or types to the recipe")


def _terminate_failed(placement: Placement, cluster: str, key: str) -> None:
    """A launch that raised may have left VMs with its key; they must not keep running."""
    leftovers = [i.id for i in placement.provider.instances(cluster) if i.labels.get("idempotency_key") == key]
    placement.provider.terminate(leftovers)


def _describe(placement: Placement) -> str:
    offer = placement.offer
    kind = "spot" if offer.spot else "on-demand"
    return f"{offer.provider}/{offer.zone}/{offer.instance_type} ({kind} {offer.price:.4f} $/h)"


def _record_node(store: Store, inst, state: NodeState) -> None:
    existing = store.get_node(inst.cluster, inst.id)
    store.put_node(NodeRecord(
        id=inst.id, cluster=inst.cluster, provider=inst.provider, zone=inst.zone, instance_type=inst.instance_type,
        price_per_hour=inst.price_per_hour, on_demand_per_hour=inst.on_demand_per_hour, ip=inst.host,
        ssh_port=inst.ssh_port, state=state, reason="",
        launched_at=existing.launched_at if existing else inst.launched_at,
        extra={"ssh_user": inst.ssh_user, "host_public_key": inst.host_public_key}))


def _bootstrap(recipe: Recipe, record: ClusterFile, store: Store, todo: list, ssh_timeouts: SshTimeouts,
               reporter_factory) -> None:
    if not todo:
        return
    from spotrun.progress import BootstrapProgress

    targets = [SshTarget(i.id, i.host, i.ssh_port, i.ssh_user, i.host_public_key) for i in todo]
    by_id = {i.id: i for i in todo}
    plan = BootstrapPlan(cluster=recipe.name, workdir=recipe.workdir, setup=recipe.setup, env=dict(recipe.env),
                         agent_argv=lambda vm: _agent_argv(by_id[vm], record), key_path=record.key_path,
                         timeouts=ssh_timeouts)
    with (reporter_factory or BootstrapProgress)([t.name for t in targets]) as reporter:
        outcomes = bootstrap_all(targets, plan, reporter)
    failed = {o.name: o.error for o in outcomes if not o.ok}
    ready = [o.name for o in outcomes if o.ok]
    _log.info("agents started; waiting for them to register", extra=log.kv(nodes=len(ready)))
    missing = _wait_alive(store, recipe.name, ready, AGENT_READY_TIMEOUT_S)
    failed.update({vm: f"agent did not register within {AGENT_READY_TIMEOUT_S:.0f} s" for vm in missing})
    for vm in ready:
        if vm not in failed:
            store.add_event(recipe.name, "bootstrap", f"{vm} bootstrapped; agent alive", vm)
    if failed:
        _give_up(recipe, store, by_id, failed)


def _agent_argv(inst, record: ClusterFile) -> list[str]:
    argv = ["spotrun-agent", "--cluster", inst.cluster, "--node", inst.id]
    for endpoint in record.endpoints:
        argv += ["--etcd", endpoint]
    protocol = inst.extra.get("notice_protocol")
    if protocol:
        argv += ["--notice-protocol", protocol]
    if inst.metadata_url:
        argv += ["--metadata-url", inst.metadata_url]
    return argv


def _wait_alive(store: Store, cluster: str, nodes: list[str], timeout: float) -> list[str]:
    """Block until every node's liveness key exists; return the ones still missing at the timeout."""
    deadline = time.monotonic() + timeout
    waiting = set(nodes)
    while waiting and time.monotonic() < deadline:
        waiting -= store.list_alive(cluster)
        if waiting:
            time.sleep(0.1)
    return sorted(waiting)


def _give_up(recipe: Recipe, store: Store, by_id: dict, failed: dict[str, str]) -> None:
    """Terminate the VMs that did not come up, record why, and raise one BootstrapError."""
    for provider in providers_of(recipe):
        provider.terminate([vm for vm in failed if by_id[vm].provider == provider.name])
    for vm, error in failed.items():
        _record_node(store, by_id[vm], NodeState.FAILED)
        store.add_event(recipe.name, "failure", f"{vm} did not come up and was terminated: {error}", vm)
    first_vm, first_error = next(iter(failed.items()))
    raise BootstrapError(f"{len(failed)} of {len(by_id)} VMs failed to bootstrap and were terminated; "
                         f"{first_vm}: {first_error}", hint="see `spotrun events` / `spotrun status`")
