"""`spotrun up`: bring a cluster to its target size; a re-run reconciles instead of duplicating.

Level-based: it reads what the providers and etcd say exists, launches only the missing VMs and
bootstraps only the VMs whose agent is not alive. A VM that fails to come up is terminated, so
a failed `up` leaves no half-built VM running; a brand-new cluster that gets no node at all is
torn down completely.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from spotrun import log
from spotrun.controller.provisioning import Provisioner, cluster_lock
from spotrun.controller.ssh import DEFAULT_TIMEOUTS, SshTimeouts
from spotrun.errors import SpotrunError
from spotrun.recipe.schema import Recipe, load_recipe
from spotrun.state import clusterfile
from spotrun.state.clusterfile import ClusterFile
from spotrun.state.control_plane import connect_recipe, endpoints_for
from spotrun.state.records import EventKind
from spotrun.state.spec import put_recipe
from spotrun.state.store import Store

_log = log.get("up")


@dataclass(frozen=True)
class UpResult:
    cluster: str
    launched: list[str]
    bootstrapped: list[str]
    nodes: list[str]


def up(
    recipe_path: Path, *, train: bool = True, ssh_timeouts: SshTimeouts = DEFAULT_TIMEOUTS, reporter_factory=None
) -> UpResult:
    """Reconcile the cluster of `recipe_path` to its target size. Blocks until every node's agent
    is alive; with `train` the agents then start the recipe's `run` under the elastic launcher.
    Raises RecipeError, ControlPlaneError, ProviderError or BootstrapError."""
    recipe = load_recipe(recipe_path)
    if reporter_factory is None:
        from spotrun.client.bootstrap_bars import BootstrapProgress

        reporter_factory = BootstrapProgress
    if recipe.control_plane.mode == "head":
        return _up_head(recipe, train, ssh_timeouts, reporter_factory)
    endpoints, embedded = endpoints_for(recipe)
    store = connect_recipe(recipe, endpoints)
    new_cluster = recipe.name not in clusterfile.names()
    record = ClusterFile.for_recipe(recipe, endpoints, embedded, train)
    record.save()
    try:
        result = _reconcile(recipe, record, store, ssh_timeouts, reporter_factory)
    except SpotrunError:
        if new_cluster and not store.list_alive(recipe.name):
            store.close()
            _remove_half_built(recipe.name)
        raise
    finally:
        store.close()
    from spotrun.controller.daemon import start_daemon

    start_daemon(recipe.name)  # from here on it keeps the cluster at its target
    return result


def _remove_half_built(cluster: str) -> None:
    """A brand-new cluster whose first `up` failed leaves nothing running."""
    from spotrun.client.down import down

    _log.warning("first up failed; removing the half-built cluster", extra=log.kv(cluster=cluster))
    down(cluster)


def _up_head(recipe: Recipe, train: bool, ssh_timeouts: SshTimeouts, reporter_factory) -> UpResult:
    """Mode 'head': the head VM's controller launches the workers (see spotrun.client.head)."""
    from spotrun.client.head import up_head

    new_cluster = recipe.name not in clusterfile.names()
    record = (
        ClusterFile.for_recipe(recipe, [], False, train)
        if new_cluster
        else clusterfile.load(recipe.name).with_recipe(recipe, train=train)
    )
    record.save()
    try:
        record, alive, new = up_head(recipe, record, ssh_timeouts=ssh_timeouts, reporter_factory=reporter_factory)
    except SpotrunError:
        if new_cluster:
            _remove_half_built(recipe.name)
        raise
    return UpResult(recipe.name, new, new, alive)


def _reconcile(
    recipe: Recipe, record: ClusterFile, store: Store, ssh_timeouts: SshTimeouts, reporter_factory
) -> UpResult:
    cluster = recipe.name
    put_recipe(store, recipe)  # what the running controller reconciles to from its next pass on
    store.set_target(cluster, recipe.nodes.target)
    provisioner = Provisioner(recipe, record, store, ssh_timeouts=ssh_timeouts, reporter_factory=reporter_factory)
    started = time.monotonic()
    with cluster_lock(cluster):
        launched = []
        for intent in provisioner.pending_intents():  # a launch an earlier process did not finish
            launched += provisioner.launch(
                intent.count, intent_key=intent.key, replaces=intent.replaces, standby=intent.standby
            )
        spares = store.list_standby(cluster)  # the controller keeps them; they do not fill the target
        missing = recipe.nodes.target - len([i for i in provisioner.live() if i.id not in spares])
        if missing > 0:
            launched += provisioner.launch(missing)
        live = provisioner.live()
        alive = store.list_alive(cluster)
        todo = [inst for inst in live if inst.id not in alive]
        _log.info("launch finished", extra=log.kv(launched=len(launched), seconds=round(time.monotonic() - started, 2)))
        provisioner.bootstrap(todo)
    _log.info("bootstrap finished", extra=log.kv(nodes=len(todo), seconds=round(time.monotonic() - started, 2)))
    training = [i for i in live if i.id not in spares]  # up itself launches no spare
    store.add_event(cluster, EventKind.UP, f"cluster at {len(training)} of target {recipe.nodes.target} nodes")
    return UpResult(cluster, launched, [i.id for i in todo], [i.id for i in live])
