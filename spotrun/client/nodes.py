"""Per-node operations reached through the provider and SSH: logs and injected preemptions."""

from __future__ import annotations

import threading
from collections.abc import Callable

from spotrun.controller.placement import providers_of
from spotrun.controller.ssh import SshTarget, SshTimeouts, connect
from spotrun.errors import NotFoundError, ProviderError, SpotrunError
from spotrun.providers import supports
from spotrun.state import clusterfile

AGENT_LOG = "~/.spotrun/agent.log"
TRAIN_LOG = "~/.spotrun/train.log"  # the launcher's and the training script's output


def find_nodes(cluster: str, node: str | None):
    """(provider, instance) pairs of the cluster's live VMs, or the one named `node`."""
    record = clusterfile.load(cluster)
    found = [
        (p, i)
        for p in providers_of(record.candidates())
        for i in p.instances(cluster)
        if not i.state.is_gone and (node is None or i.id == node)
    ]
    if node is not None and not found:
        raise NotFoundError(f"cluster {cluster!r} has no running node {node!r}", hint="see `spotrun status`")
    return record, found


def preempt(cluster: str, node: str, notice_seconds: float) -> float:
    """Arm a preemption notice on `node`; the VM dies at the deadline. Returns the deadline.
    Raises ProviderError where the provider cannot inject preemptions (real clouds)."""
    _, found = find_nodes(cluster, node)
    provider, inst = found[0]
    if not supports(provider, "preempt"):
        raise ProviderError(
            f"provider {provider.name!r} cannot inject preemptions; "
            "`spotrun preempt` works with the local provider only"
        )
    return provider.preempt(inst.id, notice_seconds)


def logs(
    cluster: str,
    node: str | None,
    follow: bool,
    emit: Callable[[str, str], None],
    lines: int = 100,
    agent: bool = False,
) -> None:
    """Print the training log (or with `agent` the agent's) of one node or all, prefixed;
    with `follow`, until interrupted."""
    record, found = find_nodes(cluster, node)
    command = f"tail -n {lines} {'-F ' if follow else ''}{AGENT_LOG if agent else TRAIN_LOG} 2>&1"
    timeouts = SshTimeouts(boot=10, command=10**9 if follow else 60)

    def one(inst) -> None:
        target = SshTarget(inst.id, inst.host, inst.ssh_port, inst.ssh_user, inst.host_public_key)
        try:
            with connect(target, record.key_path, timeouts) as session:
                session.run(command, on_line=lambda text: emit(inst.id, text))
        except SpotrunError as exc:
            emit(inst.id, f"error: {exc}")

    threads = [threading.Thread(target=one, args=(inst,), daemon=True) for _, inst in found]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)
