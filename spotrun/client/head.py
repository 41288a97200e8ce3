"""Control plane mode 'head': etcd and the controller on a small on-demand VM next to the workers.

`spotrun up` (this module, on the user's machine):
1. finds or launches the head VM: one on-demand instance of `control_plane.head.instance_type`,
   labelled `role=head` and launched with the fixed idempotency key "head", so a re-run or a
   crashed `up` never makes a second one;
2. bootstraps it over SSH like a worker (workdir, `setup`), ships what the controller needs
   (the cluster record, the cluster's SSH key, the provider's credentials; mode 600) and starts
   `spotrun-head` there (spotrun.controller.head_entry), which starts etcd on the head's port 2379 and the
   controller daemon;
3. writes the spec and target through an SSH tunnel to the head's etcd and waits while the
   head's controller launches and bootstraps the workers.

From then on nothing of the cluster runs on the user's machine: it may go offline; every later
command (`status`, `scale`, `events`, the TUI) reaches the head's etcd through an SSH tunnel.
Workers dial the head's private address; the provider's security group admits them (and only
members of the cluster) to it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from spotrun import log
from spotrun.controller.bootstrap import BootstrapPlan, bootstrap_all
from spotrun.controller.placement import provider_named
from spotrun.controller.provisioning import HEAD_ROLE, is_head
from spotrun.controller.ssh import SshTarget, SshTimeouts
from spotrun.controller.ssh_keys import ensure_keypair
from spotrun.errors import BootstrapError, ControlPlaneError, ProviderError
from spotrun.state.clusterfile import ClusterFile
from spotrun.state.records import EventKind

if TYPE_CHECKING:
    from spotrun.providers.base import Instance, Offer, Provider
    from spotrun.recipe.schema import Head, Recipe
    from spotrun.state.store import Store

_log = log.get("head")

HEAD_ETCD_PORT, HEAD_PEER_PORT = 2379, 2380
HEAD_KEY = "head"  # the head's idempotency key: one head per cluster, whoever launches it
NODES_TIMEOUT_S = 900.0  # how long `up` waits for the head's controller to bring the workers up


@dataclass(frozen=True)
class HeadRecord:
    """How this machine reaches the head VM (kept in the cluster file)."""

    id: str
    provider: str
    host: str
    port: int
    user: str
    host_key: str
    private_ip: str
    etcd_port: int = HEAD_ETCD_PORT

    @classmethod
    def of(cls, inst: Instance) -> HeadRecord:
        return cls(
            inst.id,
            inst.provider,
            inst.host,
            inst.ssh_port,
            inst.ssh_user,
            inst.host_public_key,
            str(inst.extra.get("private_ip") or inst.host),
        )

    @property
    def ssh_target(self) -> SshTarget:
        return SshTarget(self.id, self.host, self.port, self.user, self.host_key)

    @property
    def agent_endpoint(self) -> str:
        return f"http://{self.private_ip}:{self.etcd_port}"


# -- the head VM ---------------------------------------------------------------------------------
def _head(recipe: Recipe) -> Head:
    head = recipe.control_plane.head
    assert head is not None, "mode 'head' only"
    return head


def head_provider(recipe: Recipe) -> Provider:
    head = _head(recipe)
    return provider_named(head.provider or recipe.resources[0].provider, recipe.resources)


def head_offer(recipe: Recipe, provider: Provider) -> Offer:
    """The cheapest on-demand offer of the head's instance type (in its zone, if given)."""
    head = _head(recipe)
    matches = [
        o
        for o in provider.offers()
        if not o.spot and o.instance_type == head.instance_type and (head.zone is None or o.zone == head.zone)
    ]
    if not matches:
        where = f" in {head.zone}" if head.zone else ""
        raise ProviderError(
            f"no on-demand {provider.name} offer for head instance type {head.instance_type}{where}",
            hint="see `spotrun prices --provider " + provider.name + "` for the types on offer",
        )
    return min(matches, key=lambda o: (o.price, o.zone))


def ensure_head(recipe: Recipe, record: ClusterFile) -> Instance:
    """The cluster's head VM, launched if none runs. Blocks until it is running."""
    from spotrun.providers import LaunchSpec

    provider = head_provider(recipe)
    heads = [i for i in provider.instances(recipe.name) if is_head(i) and not i.state.is_gone]
    if not heads:
        spec = LaunchSpec(
            cluster=recipe.name,
            offer=head_offer(recipe, provider),
            count=1,
            ssh_public_key=ensure_keypair(record.key_path, f"spotrun-{recipe.name}"),
            idempotency_key=HEAD_KEY,
            labels={"role": HEAD_ROLE},
        )
        ids = provider.launch(spec)
        heads = [i for i in provider.instances(recipe.name) if i.id in ids]
    return heads[0]


def credential_env(recipe: Recipe) -> tuple[dict[str, str], dict[str, bytes]]:
    """(env, files) the head's controller needs to call the recipe's providers, from this
    machine's environment, as each provider package's `credentials.head_env` says (e.g. AWS keys
    found in ~/.aws/credentials are resolved). Files (a GCP service-account key) go to the head's
    secrets dir and the env points at them there. Raises ProviderError for missing credentials."""
    from spotrun.controller.bootstrap import REMOTE_SECRETS
    from spotrun.providers import provider_package

    env: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for name in sorted(recipe.providers | {_head(recipe).provider or recipe.resources[0].provider}):
        more_env, more_files = provider_package(name).credentials.head_env(REMOTE_SECRETS)
        env.update(more_env)
        files.update(more_files)
    return env, files


def start_head(
    recipe: Recipe, record: ClusterFile, head: HeadRecord, *, ssh_timeouts: SshTimeouts, reporter_factory
) -> None:
    """Bootstrap the head and start `spotrun-head` on it (idempotent). Raises BootstrapError."""
    from spotrun.client.bootstrap_bars import BootstrapProgress

    on_head = ClusterFile.for_recipe(
        recipe,
        [f"http://127.0.0.1:{head.etcd_port}"],
        embedded=False,
        train=record.train,
        agent_endpoints=[head.agent_endpoint],
    )
    env, files = credential_env(recipe)
    secrets = {
        **files,
        "cluster.json": on_head.to_json().encode(),
        "provider-env.json": json.dumps(env).encode(),
        "id_ed25519": record.key_path.read_bytes(),
        "id_ed25519.pub": record.key_path.with_name(record.key_path.name + ".pub").read_bytes(),
    }
    argv = ["spotrun-head", recipe.name, "--private-ip", head.private_ip, "--port", str(head.etcd_port)]
    plan = BootstrapPlan(
        cluster=recipe.name,
        workdir=recipe.workdir,
        setup=recipe.setup,
        env=dict(recipe.env),
        agent_argv=lambda vm: argv,
        key_path=record.key_path,
        timeouts=ssh_timeouts,
        secrets=secrets,
    )
    with (reporter_factory or BootstrapProgress)([head.id]) as reporter:
        (outcome,) = bootstrap_all([head.ssh_target], plan, reporter)
    if not outcome.ok:
        raise BootstrapError(
            f"head VM {head.id} did not come up: {outcome.error}",
            hint="`spotrun down` removes it; check the recipe's setup installs spotrun",
        )


# -- reaching its etcd ---------------------------------------------------------------------------
def connect_head(record: ClusterFile, *, timeout: float = 30.0) -> Store:
    """A Store on the head's etcd through an SSH tunnel; closing the store closes the tunnel.
    Retries until `timeout` while etcd starts. Raises ControlPlaneError."""
    from spotrun.controller.ssh import connect as ssh_connect
    from spotrun.state.store import connect

    if record.head is None:
        raise ControlPlaneError(f"cluster {record.name!r} has no head VM", hint="its etcd is at its endpoints")
    head = HeadRecord(**record.head)
    try:
        session = ssh_connect(head.ssh_target, record.key_path, SshTimeouts(boot=min(timeout, 20.0)))
    except BootstrapError as exc:
        raise ControlPlaneError(
            f"cannot reach the head VM {head.id} at {head.host}: {exc}",
            hint="is it still running? `spotrun down` then `up` rebuilds the cluster",
        ) from exc
    tunnel = session.forward("127.0.0.1", head.etcd_port)
    deadline = time.monotonic() + timeout
    while True:
        try:
            store = connect([f"http://127.0.0.1:{tunnel.port}"], timeout=3.0)
            break
        except ControlPlaneError as exc:
            if time.monotonic() > deadline:
                tunnel.close()
                raise ControlPlaneError(
                    f"the head VM {head.id} answers SSH but not etcd: {exc}",
                    hint="see ~/.spotrun/agent.log on the head",
                ) from exc
            time.sleep(0.5)
    store.on_close(tunnel.close)
    return store


# -- `spotrun up` in mode head -------------------------------------------------------------------
def up_head(
    recipe: Recipe,
    record: ClusterFile,
    *,
    ssh_timeouts: SshTimeouts,
    reporter_factory,
    nodes_timeout: float = NODES_TIMEOUT_S,
) -> tuple[ClusterFile, list[str], list[str]]:
    """Steps 1-3 of the module docstring; returns the saved record, the live worker ids and
    those of them the head's controller brought up during this call.
    Raises ProviderError, BootstrapError, ControlPlaneError."""
    from spotrun.state.records import LedgerSegment
    from spotrun.state.spec import put_recipe

    inst = ensure_head(recipe, record)
    head = HeadRecord.of(inst)
    record = replace(record, endpoints=[], head=asdict(head))
    record.save()
    _log.info("head VM running", extra=log.kv(id=head.id, host=head.host))
    start_head(recipe, record, head, ssh_timeouts=ssh_timeouts, reporter_factory=reporter_factory)
    with connect_head(record) as store:
        put_recipe(store, recipe)
        store.set_target(recipe.name, recipe.nodes.target)
        if not store.get_ledger(recipe.name, head.id):  # the head is part of the true cost
            store.put_ledger(
                recipe.name,
                head.id,
                [LedgerSegment(head.id, inst.price_per_hour, inst.on_demand_per_hour, inst.launched_at)],
            )
        before = store.list_alive(recipe.name)
        alive = wait_for_nodes(store, recipe.name, recipe.nodes.target, nodes_timeout)
        store.add_event(
            recipe.name,
            EventKind.UP,
            f"cluster at {len(alive)} of target {recipe.nodes.target} nodes (control plane on head VM {head.id})",
        )
    return record, alive, [node for node in alive if node not in before]


def wait_for_nodes(store: Store, cluster: str, target: int, timeout: float) -> list[str]:
    """Block until the agents of `target` training nodes (spares aside) are alive, printing the
    cluster's events meanwhile (the head's controller is doing the work). Raises BootstrapError
    at the timeout."""
    from spotrun.client.console import err, format_event

    deadline, since = time.monotonic() + timeout, 0
    while True:
        for event in store.list_events(cluster, since=since):
            err.print(format_event(event), markup=False)
            since = event.seq
        # Warm spares do not fill the target (their standby key is written before their agent starts).
        alive = sorted(store.list_alive(cluster) - store.list_standby(cluster))
        if len(alive) >= target:
            return alive
        if time.monotonic() > deadline:
            raise BootstrapError(
                f"{len(alive)} of {target} workers alive after {timeout:.0f} s",
                hint="the head's controller goes on trying; see `spotrun events " + cluster + "`",
            )
        time.sleep(0.5)
