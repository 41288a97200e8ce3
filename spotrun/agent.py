"""The node agent (`spotrun-agent`), one per VM, started by bootstrap.

It keeps a lease-backed liveness key in etcd, watches the VM's metadata endpoint for a
preemption notice and writes the notice to etcd the moment it arrives, so the controller can
start a replacement while this VM still has its notice period left.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from spotrun import log
from spotrun.errors import ControlPlaneError, SpotrunError
from spotrun.records import Notice, NodeRecord, NodeState
from spotrun.store import LeaseKeeper, Store, connect

_log = log.get("agent")


@dataclass(frozen=True)
class AgentConfig:
    cluster: str
    node: str
    endpoints: list[str]
    ttl: int = 10
    notice_protocol: str | None = None  # default: $SPOTRUN_NOTICE_PROTOCOL, else aws
    metadata_url: str | None = None  # default: $SPOTRUN_METADATA_URL, else the cloud's address


class Agent:
    """Runs until `stop` is set (SIGTERM/SIGINT in `run_agent`)."""

    def __init__(self, config: AgentConfig, stop: threading.Event | None = None) -> None:
        self.config = config
        self.stop = stop or threading.Event()
        self.store: Store = connect(config.endpoints)
        self._keeper: LeaseKeeper | None = None

    def run(self) -> None:
        """Register, then hold liveness and watch for a notice until stopped. Blocks."""
        cluster, node = self.config.cluster, self.config.node
        self._keep_alive()
        self._set_state(NodeState.RUNNING, "agent registered")
        self.store.add_event(cluster, "join", f"agent on {node} registered (pid {os.getpid()})", node)
        _log.info("registered", extra=log.kv(cluster=cluster, node=node, ttl=self.config.ttl))
        watcher = threading.Thread(target=self._watch_notice, name="notice", daemon=True)
        watcher.start()
        while not self.stop.wait(1.0):
            if self._keeper is None or not self._keeper.active:
                self._keep_alive()
        self._shutdown()

    def _keep_alive(self) -> None:
        """(Re)publish liveness; after an etcd outage the old lease is gone, so take a new one."""
        try:
            self._keeper = self.store.alive(self.config.cluster, self.config.node, self.config.ttl)
        except ControlPlaneError as exc:
            _log.warning("etcd unreachable; will retry", extra=log.kv(error=exc))
            self._keeper = None

    def _watch_notice(self) -> None:
        from spotrun.notices import NoticeWatcher

        protocol = self.config.notice_protocol or os.environ.get("SPOTRUN_NOTICE_PROTOCOL", "aws")
        watcher = NoticeWatcher(protocol, self.config.metadata_url or os.environ.get("SPOTRUN_METADATA_URL"))
        notice = watcher.wait(self.stop)
        if notice is None:
            return
        _log.warning("preemption notice", extra=log.kv(source=notice.source, deadline=notice.deadline))
        record = Notice(node=self.config.node, source=notice.source, deadline=notice.deadline,
                        received_at=notice.received_at)
        self._retry(lambda: self.store.put_notice(self.config.cluster, record))
        left = max(0.0, notice.deadline - time.time())
        self._set_state(NodeState.NOTICE, f"{notice.source} preemption notice, {left:.0f} s left")
        self._retry(lambda: self.store.add_event(
            self.config.cluster, "notice", f"{self.config.node}: {notice.source} preemption notice, {left:.0f} s left",
            self.config.node))

    def _retry(self, write, attempts: int = 20) -> None:
        """Notices must land: retry a write through a short etcd outage."""
        for attempt in range(attempts):
            try:
                write()
                return
            except ControlPlaneError as exc:
                _log.warning("etcd write failed; retrying", extra=log.kv(attempt=attempt, error=exc))
                if self.stop.wait(0.5):
                    return

    def _set_state(self, state: NodeState, reason: str) -> None:
        cluster, node = self.config.cluster, self.config.node
        current = self.store.get_node(cluster, node) or NodeRecord(
            id=node, cluster=cluster, provider=os.environ.get("SPOTRUN_PROVIDER", "unknown"), zone="",
            instance_type="", price_per_hour=0.0, on_demand_per_hour=0.0, launched_at=time.time())
        updated = dataclasses.replace(current, state=state, reason=reason)
        self._retry(lambda: self.store.put_node(updated))

    def _shutdown(self) -> None:
        if self._keeper is not None:
            self._keeper.stop(revoke=True)
        self.store.close()


def run_agent(config: AgentConfig) -> None:
    """Run the agent until SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    Agent(config, stop).run()


def main(argv: list[str] | None = None) -> int:
    """`spotrun-agent`: a lean entry point (argparse, no typer/rich), because every VM starts one
    and on a small machine bringing up 32 VMs their start-up CPU adds up."""
    import argparse

    parser = argparse.ArgumentParser(prog="spotrun-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", required=True, help="cluster name")
    parser.add_argument("--node", required=True, help="this VM's node id")
    parser.add_argument("--etcd", action="append", required=True, help="etcd endpoint (repeatable)")
    parser.add_argument("--notice-protocol", choices=("aws", "gcp", "azure"), help="default: $SPOTRUN_NOTICE_PROTOCOL")
    parser.add_argument("--metadata-url", help="the VM's metadata endpoint; default: $SPOTRUN_METADATA_URL")
    parser.add_argument("--ttl", type=int, default=10, help="liveness lease seconds (default 10)")
    args = parser.parse_args(argv)
    log.setup(1)  # the agent's log file is for people debugging a VM: keep INFO lines
    try:
        run_agent(AgentConfig(args.cluster, args.node, args.etcd, args.ttl, args.notice_protocol, args.metadata_url))
    except SpotrunError as exc:
        sys.stderr.write(f"spotrun-agent: error: {exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
