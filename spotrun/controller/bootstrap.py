"""Bring fresh VMs to a running node agent over SSH, in parallel, idempotently.

Phases per VM: connect (retrying while it boots) -> upload the workdir (skipped when the same
content is there) -> setup (skipped when it already finished for this workdir and script) ->
agent (started detached unless one already runs). A re-run therefore only does what is missing.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from spotrun import log
from spotrun.controller.ssh import DEFAULT_TIMEOUTS, LineSink, Session, SshTarget, SshTimeouts, connect, tar_tree
from spotrun.errors import BootstrapError

if TYPE_CHECKING:
    from spotrun.recipe.schema import Recipe

_log = log.get("bootstrap")

PHASES = ("connect", "upload", "setup", "agent", "done")
REMOTE_WORKDIR = "~/work"
REMOTE_STATE = "~/.spotrun"
REMOTE_SECRETS = f"{REMOTE_STATE}/secrets"


class Reporter(Protocol):
    """Where progress goes; called from worker threads, so implementations must be thread-safe."""

    def phase(self, vm: str, phase: str) -> None: ...
    def line(self, vm: str, text: str) -> None: ...
    def failed(self, vm: str, error: str) -> None: ...


# Builds the progress display for the named VMs; entering it yields the Reporter (e.g. QuietReporter).
ReporterFactory = Callable[[list[str]], AbstractContextManager[Reporter]]


class QuietReporter:
    """A Reporter that shows nothing and keeps failures (scripts, benches, tests)."""

    def __init__(self, vms: list[str] | None = None) -> None:
        self.failures: dict[str, str] = {}

    def __enter__(self) -> QuietReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def phase(self, vm: str, phase: str) -> None:
        pass

    def line(self, vm: str, text: str) -> None:
        pass

    def failed(self, vm: str, error: str) -> None:
        self.failures[vm] = error


class LogReporter(QuietReporter):
    """A Reporter for daemons: log lines instead of bars (the controller's default)."""

    def phase(self, vm: str, phase: str) -> None:
        _log.info("bootstrap", extra=log.kv(vm=vm, phase=phase))

    def line(self, vm: str, text: str) -> None:
        _log.info(f"[{vm}] {text}")

    def failed(self, vm: str, error: str) -> None:
        super().failed(vm, error)
        _log.warning("bootstrap failed", extra=log.kv(vm=vm, error=error))


@dataclass(frozen=True)
class BootstrapPlan:
    """What every VM of one cluster gets."""

    cluster: str
    workdir: Path
    setup: str | None
    env: dict[str, str]
    agent_argv: Callable[[str], list[str]]  # VM name -> the agent's command line on that VM
    key_path: Path
    timeouts: SshTimeouts = DEFAULT_TIMEOUTS
    secrets: dict[str, bytes] = field(default_factory=dict)  # name -> content, into REMOTE_SECRETS (mode 600)
    vm_gone: Callable[[str], bool] | None = None  # VM name -> gone for good (stop retrying SSH to it)


@dataclass
class VmOutcome:
    name: str
    ok: bool = False
    phase: str = "connect"
    error: str | None = None
    skipped: list[str] = field(default_factory=list)


def bootstrap_all(
    targets: list[SshTarget], plan: BootstrapPlan, reporter: Reporter, *, parallel: int = 32
) -> list[VmOutcome]:
    """Bootstrap every target concurrently; blocks until all finished or failed. Never raises
    for one VM's failure: each outcome says how far it got and why it stopped."""
    if not targets:
        return []
    blob = tar_tree(plan.workdir)
    with ThreadPoolExecutor(max_workers=min(parallel, len(targets)), thread_name_prefix="bootstrap") as pool:
        return list(pool.map(lambda target: _bootstrap_one(target, plan, blob, reporter), targets))


def _bootstrap_one(target: SshTarget, plan: BootstrapPlan, blob: bytes, reporter: Reporter) -> VmOutcome:
    outcome = VmOutcome(target.name)
    try:
        reporter.phase(target.name, "connect")
        gone = plan.vm_gone
        with connect(
            target,
            plan.key_path,
            plan.timeouts,
            on_retry=lambda msg: reporter.line(target.name, msg),
            gone=(lambda: gone(target.name)) if gone is not None else None,
        ) as session:
            content = hashlib.sha256(blob + (plan.setup or "").encode()).hexdigest()[:16]
            for phase, step in (("upload", _upload), ("setup", _setup), ("agent", _start_agent)):
                outcome.phase = phase
                reporter.phase(target.name, phase)
                if not step(session, plan, blob, content, lambda text: reporter.line(target.name, text)):
                    outcome.skipped.append(phase)
        outcome.phase, outcome.ok = "done", True
        reporter.phase(target.name, "done")
    except BootstrapError as exc:
        outcome.error = str(exc)
        reporter.failed(target.name, outcome.error)
    return outcome


def _upload(session: Session, plan: BootstrapPlan, blob: bytes, content: str, emit: LineSink) -> bool:
    for name, data in sorted(plan.secrets.items()):  # always rewritten: a rotated cert must land
        session.check(
            f"umask 077 && mkdir -p {REMOTE_SECRETS} && cat > {REMOTE_SECRETS}/{shlex.quote(name)}",
            what=f"upload of {name}",
            stdin=data,
        )
    marker = f"{REMOTE_STATE}/workdir.{content}"
    if session.run(f"test -f {marker}").exit_status == 0:
        return False
    session.check(
        f"mkdir -p {REMOTE_STATE} {REMOTE_WORKDIR} && tar -xzf - -C {REMOTE_WORKDIR} && touch {marker}",
        what="workdir upload",
        stdin=blob,
    )
    return True


def _setup(session: Session, plan: BootstrapPlan, blob: bytes, content: str, emit: LineSink) -> bool:
    if not plan.setup:
        return False
    marker = f"{REMOTE_STATE}/setup.{content}.done"
    if session.run(f"test -f {marker}").exit_status == 0:
        return False
    script = f"set -e\ncd {REMOTE_WORKDIR}\n{_exports(plan.env)}\n{plan.setup}\n"
    session.check(f"bash -s && touch {marker}", what="setup", stdin=script.encode(), on_line=emit)
    return True


def _start_agent(session: Session, plan: BootstrapPlan, blob: bytes, content: str, emit: LineSink) -> bool:
    pidfile = f"{REMOTE_STATE}/agent.pid"
    if session.run(f"test -f {pidfile} && kill -0 $(cat {pidfile}) 2>/dev/null").exit_status == 0:
        return False
    agent = " ".join(shlex.quote(arg) for arg in plan.agent_argv(session.target.name))
    # setsid + closed stdio: the agent must outlive this SSH session.
    # Braces keep the background job to the agent alone: `a && b &` would background a subshell
    # that holds the SSH channel open until the agent exits.
    command = (
        f"cd {REMOTE_WORKDIR} && {{ {_exports(plan.env)} "
        f"setsid nohup {agent} > {REMOTE_STATE}/agent.log 2>&1 < /dev/null & echo $! > {pidfile}; }}"
    )
    session.check(command, what="agent start")
    return True


def _exports(env: dict[str, str]) -> str:
    return " ".join(f"export {name}={shlex.quote(value)};" for name, value in sorted(env.items()))


def vm_tls(recipe: Recipe) -> tuple[dict[str, bytes], dict[str, str]]:
    """(files, env) that give a VM's processes the recipe's etcd TLS files: the files go to the
    VM's secrets dir (REMOTE_SECRETS), the env points state.store.connect at them."""
    from spotrun.errors import ControlPlaneError
    from spotrun.state.control_plane import tls_path

    tls = recipe.control_plane.tls
    files, env = {}, {}
    for name in ("ca", "cert", "key"):
        path = tls_path(tls, name)
        if path:
            try:
                files[f"etcd-{name}.pem"] = Path(path).read_bytes()
            except OSError as exc:
                raise ControlPlaneError(f"cannot read TLS file: {exc}", hint="check control_plane.tls") from exc
            env[f"SPOTRUN_ETCD_{name.upper()}"] = f"{REMOTE_SECRETS}/etcd-{name}.pem"
    return files, env
