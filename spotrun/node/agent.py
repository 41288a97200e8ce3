"""The node agent (`spotrun-agent`), one per VM, started by bootstrap.

It keeps a lease-backed liveness key in etcd, watches the VM's metadata endpoint for a
preemption notice and writes the notice to etcd the moment it arrives (so the controller can
start a replacement while this VM still has its notice period left), and supervises the elastic
launcher: it asks the trainer for an agreed checkpoint and leaves the rendezvous shortly before
the deadline, on a drain request, and asks for a checkpoint when another node waits to join.
A warm spare (`/spotrun/<c>/standby/<id>`) parks its pre-warmed launcher outside the job until
the controller deletes that key.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spotrun import log
from spotrun.errors import ControlPlaneError, SpotrunError
from spotrun.node import protocol
from spotrun.node.protocol import ControlCommand, ExitCode
from spotrun.state.etcd import LeaseKeeper
from spotrun.state.records import EventKind, NodeReason, NodeRecord, NodeState, Notice, decode
from spotrun.state.store import Store, connect
from spotrun.state.watch import WatchEvent

if TYPE_CHECKING:  # the supervisor loads only when this node trains
    from spotrun.node.supervisor import Launcher, ProgressPublisher

_log = log.get("agent")

DEFAULT_LEAVE_MARGIN_S = 5.0  # before the deadline, until a checkpoint of this job has been timed
MIN_LEAVE_MARGIN_S = 1.5  # the agreed checkpoint waits for a step boundary, then the group re-forms
DEFAULT_STATE_DIR = Path("~/.spotrun").expanduser()  # on the VM, where the agent keeps its files


@dataclass(frozen=True)
class AgentConfig:
    cluster: str
    node: str
    endpoints: list[str]
    ttl: int = 10
    notice_protocol: str | None = None  # default: $SPOTRUN_NOTICE_PROTOCOL, else aws
    metadata_url: str | None = None  # default: $SPOTRUN_METADATA_URL, else the cloud's address
    train: bool = False  # run the recipe's `run` under the elastic launcher
    checkpoint_root: Path | None = None  # storage every node of the cluster reaches
    state_dir: Path = DEFAULT_STATE_DIR
    leave_margin_s: float | None = None  # None: measured from the job's checkpoints (see _leave_margin)
    workers: int = 1  # training workers on this VM (the launcher's --nproc-per-node)


class Agent:
    """Runs until `stop` is set (SIGTERM/SIGINT in `run_agent`) or its training job finished."""

    def __init__(self, config: AgentConfig, stop: threading.Event | None = None) -> None:
        self.config = config
        self.stop = stop or threading.Event()
        self.store: Store = connect(config.endpoints)
        self._keeper: LeaseKeeper | None = None
        self._launcher: Launcher | None = None
        self._publisher: ProgressPublisher | None = None
        self._leave_once = threading.Lock()
        self._left = False
        self._noticed = threading.Event()
        self._ready_said = False
        self._standby_lock = threading.Lock()
        self._activated = False  # the standby key was deleted (possibly before the launcher existed)

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> None:
        """Register, then hold liveness, watch for notices, drains and joins until stopped. Blocks."""
        cluster, node = self.config.cluster, self.config.node
        self._keep_alive()
        self._set_state(NodeState.RUNNING, detail="agent registered")
        self.store.add_event(cluster, EventKind.JOIN, f"agent on {node} registered (pid {os.getpid()})", node)
        _log.info("registered", extra=log.kv(cluster=cluster, node=node, ttl=self.config.ttl))
        threading.Thread(target=self._watch_notice, name="notice", daemon=True).start()
        watches = [self.store.watch_node(cluster, node, self._on_own_record)]
        if self.config.train:
            watches.append(self.store.watch_standby(cluster, node, self._on_standby))  # before reading it
            self._start_training()
            watches.append(self.store.watch_rdzv_waiting(cluster, self._on_waiting))
        while not self.stop.wait(0.5):
            if self._keeper is None or not self._keeper.active:
                self._keep_alive()
            if self._publisher is not None:
                self._guard(self._publisher.publish_once)
        for watch in watches:
            watch.cancel()
        self._shutdown()

    def _shutdown(self) -> None:
        if self._launcher is not None:
            self._launcher.stop()
        if self._publisher is not None:
            self._guard(self._publisher.publish_once)
        if self._keeper is not None:
            self._keeper.stop(revoke=True)
        self.store.close()

    def _keep_alive(self) -> None:
        """(Re)publish liveness; after an etcd outage the old lease is gone, so take a new one."""
        try:
            self._keeper = self.store.alive(self.config.cluster, self.config.node, self.config.ttl)
        except ControlPlaneError as exc:
            _log.warning("etcd unreachable; will retry", extra=log.kv(error=exc))
            self._keeper = None

    # -- training -------------------------------------------------------------------------------
    def _start_training(self) -> None:
        from spotrun.node.supervisor import Launcher, ProgressPublisher

        spec = self._train_spec()
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        with self._standby_lock:
            standby = not self._activated and bool(
                self._guarded_get(lambda: self.store.is_standby(self.config.cluster, self.config.node))
            )
            launcher = self._launcher = Launcher(
                self.config.cluster,
                self.config.node,
                self.config.endpoints,
                spec,
                self.config.state_dir,
                self._on_launcher_exit,
                standby=standby,
            )
        if standby:
            self._guard(
                lambda: self._set_state(NodeState.RUNNING, detail="warm spare, parked outside the training job")
            )
        self._publisher = ProgressPublisher(self.store, self.config.cluster, self.config.node, launcher.files.progress)
        launcher.start()
        _log.info("launcher started", extra=log.kv(run=spec.run, nnodes=spec.nnodes))

    def _train_spec(self):
        from spotrun.node.supervisor import TrainSpec
        from spotrun.state.spec import recipe_from_spec

        recipe = recipe_from_spec(self.store, self.config.cluster)
        ckpt = recipe.checkpoint
        root = self.config.checkpoint_root or Path.cwd()
        record = self.store.get_node(self.config.cluster, self.config.node)
        return TrainSpec(
            local_addr=record.ip if record else None,
            expected_nodes=self.store.get_target(self.config.cluster) or recipe.nodes.target,
            run=recipe.run,
            nnodes=f"{recipe.nodes.min}:{recipe.nodes.max}",
            workers=self.config.workers,
            workdir=Path.cwd(),
            env=dict(recipe.env),
            checkpoint_dir=_checkpoint_location(root, ckpt.dir if ckpt else None),
            every_steps=ckpt.every_steps if ckpt else None,
            every_seconds=ckpt.every_seconds if ckpt else None,
            keep=ckpt.keep if ckpt else 3,
        )

    def _on_launcher_exit(self, code: int, leaving: bool) -> bool:
        """Record why the launcher stopped; True when the job is finished for this node."""
        node = self.config.node
        if code == ExitCode.OK and leaving:
            self._guard(lambda: self._set_state(NodeState.LEAVING, NodeReason.LEFT))
            self._event(EventKind.LEAVE, f"{node} left the training job")
            return True
        if code == ExitCode.OK:
            self._event(EventKind.FINISHED, f"{node}: training job finished")
            self._guard(lambda: self._set_state(NodeState.RUNNING, NodeReason.FINISHED))
            return True
        self._event(EventKind.FAILURE, f"{node}: launcher exited with code {code}; restarting")
        return False

    def _parked(self) -> bool:
        return self._launcher is not None and self._launcher.parked

    def _on_standby(self, event: WatchEvent) -> None:
        """The controller deleted this spare's standby key: join the training job now."""
        if event.kind != "delete":
            return
        with self._standby_lock:
            self._activated = True
            activated = self._launcher is not None and self._launcher.activate()
        if activated:
            _log.info("warm spare activated")
            self._guard(lambda: self._set_state(NodeState.RUNNING, detail="warm spare activated"))

    def _on_waiting(self, kind: str, joiner: str) -> None:
        """Another node waits to join: checkpoint at the next step so the group re-forms with it.
        A noticed node leaves in that same re-formation: its replacement swaps in with one
        membership change instead of two."""
        if self._launcher is None:
            return
        if kind == "delete":
            # The joiner got into a re-formation (or went away) before our workers acted on its
            # join request: new workers must not restart once more for it.
            if joiner != self.config.node and self._launcher.control.withdraw(ControlCommand.JOIN, joiner):
                _log.info("join request withdrawn: the node is no longer waiting", extra=log.kv(joiner=joiner))
            return
        if kind != "put":
            return
        if joiner == self.config.node:
            if not self._ready_said:  # the launcher reached the rendezvous: this node can take work
                self._ready_said = True
                self._event(EventKind.READY, f"{joiner} is in the rendezvous, ready to train")
            return
        if self._parked():
            return  # a warm spare is not in the job: nothing to checkpoint or swap
        if self._guarded_get(lambda: self.store.get_progress(self.config.cluster, joiner)) is not None:
            return  # a member re-joining after a re-formation, not a new node: nothing to admit
        if self._noticed.is_set():
            self._leave(f"swapping with joining node {joiner}")
            return
        seq = self._launcher.control.request(ControlCommand.JOIN, joiner)
        _log.info("join pending; checkpoint requested", extra=log.kv(joiner=joiner, seq=seq))

    # -- leaving: notices and drains ------------------------------------------------------------
    def _watch_notice(self) -> None:
        from spotrun.node.notices import NoticeWatcher
        from spotrun.providers import DEFAULT_NOTICE_PROTOCOL

        protocol = self.config.notice_protocol or os.environ.get("SPOTRUN_NOTICE_PROTOCOL", DEFAULT_NOTICE_PROTOCOL)
        watcher = NoticeWatcher(protocol, self.config.metadata_url or os.environ.get("SPOTRUN_METADATA_URL"))
        notice = watcher.wait(self.stop)
        if notice is None:
            return
        _log.warning("preemption notice", extra=log.kv(source=notice.source, deadline=notice.deadline))
        record = Notice(
            node=self.config.node, source=notice.source, deadline=notice.deadline, received_at=notice.received_at
        )
        self._noticed.set()
        self._retry(lambda: self.store.put_notice(self.config.cluster, record))
        left = max(0.0, notice.deadline - time.time())
        self._guard(
            lambda: self._set_state(NodeState.NOTICE, detail=f"{notice.source} preemption notice, {left:.0f} s left")
        )
        self._event(EventKind.NOTICE, f"{self.config.node}: {notice.source} preemption notice, {left:.0f} s left")
        if self._parked():
            self._leave("preemption notice on a warm spare")  # nothing to hand over
            return
        # Keep training through the notice period; leave with just enough margin to checkpoint.
        if not self.stop.wait(max(0.0, notice.deadline - self._leave_margin() - time.time())):
            self._leave(f"preemption deadline in {max(0.0, notice.deadline - time.time()):.0f} s")

    def _leave_margin(self) -> float:
        """Seconds before the deadline to checkpoint and leave (see leave_margin)."""
        if self.config.leave_margin_s is not None:
            return self.config.leave_margin_s
        report = protocol.read_progress(self._launcher.files.progress) if self._launcher is not None else None
        latest = self._guarded_get(lambda: self.store.latest_checkpoint(self.config.cluster))
        return leave_margin(report, latest.seconds if latest is not None else None)

    def _on_own_record(self, event: WatchEvent) -> None:
        """A drain (scale-down, TUI) marks this node `leaving`; leave the same way a notice does."""
        if event.kind != "put" or event.value is None:
            return
        try:
            record = decode(NodeRecord, event.value)
        except (ValueError, TypeError):
            return
        if record.state == NodeState.LEAVING and record.reason is NodeReason.DRAIN:
            self._leave(record.reason_text, NodeReason.DRAIN)

    def _leave(self, why: str, reason: NodeReason = NodeReason.NONE) -> None:
        """Checkpoint and leave the training job (once); `reason` is recorded with `why` (a drain stays one)."""
        with self._leave_once:
            if self._left:
                return
            self._left = True
        self._event(EventKind.LEAVING, f"{self.config.node} leaving: {why}")
        self._guard(lambda: self._set_state(NodeState.LEAVING, reason, why))
        if self._launcher is not None:
            self._launcher.leave()  # first, so the launcher does not rejoin after the workers exit
            self._launcher.control.request(ControlCommand.LEAVE, self.config.node)
        else:  # nothing to hand over: the node can go at once
            self._guard(lambda: self._set_state(NodeState.LEAVING, NodeReason.LEFT))

    # -- etcd helpers ---------------------------------------------------------------------------
    def _event(self, kind: EventKind, message: str) -> None:
        self._retry(lambda: self.store.add_event(self.config.cluster, kind, message, self.config.node))

    def _retry(self, write, attempts: int = 20) -> None:
        """Notices and events must land: retry a write through a short etcd outage."""
        for attempt in range(attempts):
            try:
                write()
                return
            except ControlPlaneError as exc:
                _log.warning("etcd write failed; retrying", extra=log.kv(attempt=attempt, error=exc))
                if self.stop.wait(0.5):
                    return

    @staticmethod
    def _guarded_get(read):
        try:
            return read()
        except ControlPlaneError:
            return None

    @staticmethod
    def _guard(action) -> None:
        try:
            action()
        except ControlPlaneError as exc:
            _log.warning("etcd unreachable", extra=log.kv(error=exc))

    def _set_state(self, state: NodeState, reason: NodeReason = NodeReason.NONE, detail: str = "") -> None:
        """Update this node's record (the controller wrote it, with its provider, before bootstrap;
        an agent started by hand for a node without one writes a minimal record)."""
        cluster, node = self.config.cluster, self.config.node
        current = self.store.get_node(cluster, node) or NodeRecord(
            id=node,
            cluster=cluster,
            provider="unknown",
            zone="",
            instance_type="",
            price_per_hour=0.0,
            on_demand_per_hour=0.0,
            launched_at=time.time(),
        )
        self.store.put_node(dataclasses.replace(current, state=state, reason=reason, detail=detail))


def _checkpoint_location(root: Path, directory: str | None):
    """An object-store URL (s3://...) is used as it is; a plain dir lives under the shared root."""
    directory = directory or "checkpoints"
    return directory if "://" in directory else root / directory


def _positive(text: str) -> int:
    """argparse type: an integer >= 1. Raises argparse.ArgumentTypeError otherwise."""
    import argparse

    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


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

    from spotrun.providers import notice_protocols

    parser = argparse.ArgumentParser(prog="spotrun-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", required=True, help="cluster name")
    parser.add_argument("--node", required=True, help="this VM's node id")
    parser.add_argument("--etcd", action="append", required=True, help="etcd endpoint (repeatable)")
    parser.add_argument("--notice-protocol", choices=notice_protocols(), help="default: $SPOTRUN_NOTICE_PROTOCOL")
    parser.add_argument("--metadata-url", help="the VM's metadata endpoint; default: $SPOTRUN_METADATA_URL")
    parser.add_argument("--ttl", type=int, default=10, help="liveness lease seconds (default 10)")
    parser.add_argument("--train", action="store_true", help="run the recipe's `run` under the elastic launcher")
    parser.add_argument(
        "--workers", type=_positive, default=1, help="training workers on this VM, one per GPU (default 1)"
    )
    parser.add_argument("--checkpoint-root", type=Path, help="shared storage for checkpoints (default: cwd)")
    parser.add_argument(
        "--leave-margin",
        type=float,
        default=None,
        help="seconds before a preemption deadline to checkpoint and leave "
        "(default: measured from the job's checkpoint write time)",
    )
    args = parser.parse_args(argv)
    log.setup(1)  # the agent's log file is for people debugging a VM: keep INFO lines
    config = AgentConfig(
        args.cluster,
        args.node,
        args.etcd,
        args.ttl,
        args.notice_protocol,
        args.metadata_url,
        args.train,
        args.checkpoint_root,
        workers=args.workers,
        leave_margin_s=args.leave_margin,
    )
    try:
        run_agent(config)
    except SpotrunError as exc:
        sys.stderr.write(f"spotrun-agent: error: {exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def leave_margin(report: protocol.ProgressReport | None, checkpoint_s: float | None) -> float:
    """Seconds before a notice's deadline to checkpoint and leave: measured, not guessed. With live
    recovery (the trainer's `report` says so) a second plus two steps: the peers hold replicas, a
    leave saves nothing. Otherwise three times the newest checkpoint's write time (`checkpoint_s`)
    plus a second for the leave itself, DEFAULT_LEAVE_MARGIN_S until the job has written one. At
    least MIN_LEAVE_MARGIN_S."""
    if report is not None and report.live_recovery:
        return max(MIN_LEAVE_MARGIN_S, 1.0 + 2.0 * report.step_s)
    if checkpoint_s is None or checkpoint_s <= 0:
        return DEFAULT_LEAVE_MARGIN_S
    return max(MIN_LEAVE_MARGIN_S, 1.0 + 3.0 * checkpoint_s)
