"""The pre-warmed elastic launcher: torchrun with spotrun's etcd rendezvous and fast-recovery settings.

    python -m spotrun.elastic.launcher --cluster C --node N --etcd URL [--etcd URL] --nnodes MIN:MAX \\
        [--run-id ID] [--nproc-per-node 1] [--local-addr ADDR] [--join-timeout 600] \\
        [--collective-timeout 60] [--standby-file PATH] -- python train.py ARGS...

It imports torch, torch.optim, torch.nn.parallel and torch._dynamo before anything else, then runs
torch's elastic agent in this process (`torch.distributed.run`) with workers *forked* from it
(`--start-method fork`), so a restarted worker skips those imports. `python SCRIPT.py ARGS` and
`python -m MODULE ARGS` run in the forked worker (runpy); any other command runs as a
subprocess (`--no-python`, no pre-warming).

Settings passed to torchrun: `--rdzv-backend spotrun-etcd`, `--rdzv-endpoint` = the etcd URLs,
`--rdzv-id` = run id (default: the cluster), `--rdzv-conf last_call_timeout=1,
keep_alive_interval=1,keep_alive_max_attempt=5,join_timeout=...,cluster=C,node=N`,
`--max-restarts` 1000000 (every membership change is a restart), `--monitor-interval 0.1`,
`--shutdown-timeout 5`, `--signals-to-handle SIGINT,SIGHUP,SIGQUIT` (SIGTERM is ours, below).
The 5 s from SIGTERM to SIGKILL also bound torch's restart of the workers when a peer is gone
(torch itself waits 30 s there), so a worker stuck in a collective never holds up the survivors.

Environment: sets `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (required: with the shared agent store
recoveries failed on stale gloo addresses), `GRPC_ENABLE_FORK_SUPPORT=0` (with it on, every fork
waits ~1 s for gRPC's threads; forked workers never use gRPC) and, unless already set,
`SPOTRUN_COLLECTIVE_TIMEOUT_S` (the `init_process_group` timeout the trainer should use; a node
that vanishes silently is only detected by it). Workers get this environment plus torch's
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), and
`SPOTRUN_NODE`/`SPOTRUN_CLUSTER`.

Forked workers must not use gRPC (no etcd client, no `spotrun.state.store`): it hangs in a forked
child. Report through the agent, or through etcd's HTTP gateway (`/v3/kv/put`).

`--standby-file PATH` (a warm spare): after the imports, wait outside the rendezvous while PATH
exists; the agent deletes it when the controller activates the spare, and the node joins with
torch already imported. SIGUSR1 or SIGTERM while parked: exit 0 without joining.

Signals: SIGUSR1 or SIGTERM before the launcher joins (even during torch's import): exit 0
without joining. SIGUSR1 = leave at the next rendezvous (when the local workers next exit, the node
removes itself and the launcher exits 0); SIGTERM = leave now (the node leaves the rendezvous at
once, workers get SIGTERM, SIGKILL after 5 s, exit 0).

Exit codes (spotrun.node.protocol.ExitCode): 0 the job finished, or the node left (SIGUSR1/SIGTERM),
or the rendezvous was closed because the job had finished; 1 workers failed for good or the
rendezvous failed; 2 usage error.
"""

from __future__ import annotations

import os
import signal

# Before anything can import grpc or torch.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"
os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"

# A leave signal can come while torch imports (a node noticed as it starts): the default action
# would kill the launcher and its agent would record a failure. Keep it for main() instead.
_early_signals: list[int] = []
if __name__ == "__main__":
    for _sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(_sig, lambda signum, _frame: _early_signals.append(signum))

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402  pre-warm: forked workers inherit these modules
import torch._dynamo  # noqa: E402
import torch.distributed.run as torchrun  # noqa: E402
import torch.nn.parallel  # noqa: E402
import torch.optim  # noqa: E402,F401
from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: E402
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError  # noqa: E402
from torch.distributed.launcher.api import elastic_launch  # noqa: E402

from spotrun.elastic import rendezvous  # noqa: E402
from spotrun.node.protocol import CLUSTER_ENV, COLLECTIVE_TIMEOUT_ENV, NODE_ENV, ExitCode  # noqa: E402

__all__ = ["LaunchPlan", "build_plan", "main"]

MAX_RESTARTS = 1_000_000
SHUTDOWN_TIMEOUT_S = 5  # SIGTERM to SIGKILL for workers, at a restart as at the end
STANDBY_POLL_S = 0.02  # a parked spare notices its activation within this
_log = logging.getLogger("spotrun.elastic.launcher")


@dataclass(frozen=True)
class LaunchPlan:
    """What `main` will run: torchrun's argv, and a module to run instead of a script path, if any."""

    torchrun_args: list[str]
    module: str | None = None
    standby_file: str | None = None  # park outside the rendezvous while this file exists


def _is_python(exe: str) -> bool:
    name = os.path.basename(exe)
    return (
        name == "python"
        or (name.startswith("python") and name[6:].replace(".", "").isdigit())
        or os.path.realpath(exe) == os.path.realpath(sys.executable)
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spotrun.elastic.launcher",
        description="Run a training command under torch elastic with spotrun's etcd rendezvous.",
    )
    p.add_argument("--cluster", required=True, help="spotrun cluster name (etcd key prefix)")
    p.add_argument("--node", required=True, help="this node's spotrun id")
    p.add_argument("--etcd", action="append", required=True, metavar="URL", help="etcd endpoint; repeat for several")
    p.add_argument("--nnodes", required=True, metavar="MIN:MAX", help="node count range, e.g. 1:4")
    p.add_argument("--run-id", default=None, help="rendezvous id (default: the cluster name)")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--local-addr", default=None, help="address other nodes reach this one at (default: FQDN)")
    p.add_argument("--join-timeout", type=int, default=600, help="seconds a node may wait to be admitted")
    p.add_argument("--last-call-timeout", type=int, default=1)
    p.add_argument(
        "--collective-timeout",
        type=int,
        default=None,
        help=f"init_process_group timeout for the trainer, via ${COLLECTIVE_TIMEOUT_ENV} (default 60)",
    )
    p.add_argument("--rdzv-conf", default="", help="extra key=value,... for the rendezvous (e.g. gather_timeout=30)")
    p.add_argument(
        "--standby-file",
        default=None,
        metavar="PATH",
        help="warm spare: after the imports, wait outside the rendezvous while PATH exists",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- training command")
    return p


def build_plan(argv: list[str]) -> LaunchPlan:
    """Parse spotrun's options into torchrun's argv. Raises SystemExit(2) on a usage error."""
    parser = _parser()
    opts = parser.parse_args(argv)
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not command:
        parser.error("missing the training command after --")
    if ":" not in opts.nnodes:
        opts.nnodes = f"{opts.nnodes}:{opts.nnodes}"
    if opts.collective_timeout is not None:
        os.environ[COLLECTIVE_TIMEOUT_ENV] = str(opts.collective_timeout)
    else:
        os.environ.setdefault(COLLECTIVE_TIMEOUT_ENV, "60")
    os.environ[NODE_ENV] = opts.node
    os.environ[CLUSTER_ENV] = opts.cluster
    conf = {
        "last_call_timeout": str(opts.last_call_timeout),
        "keep_alive_interval": "1",
        "keep_alive_max_attempt": "5",
        "join_timeout": str(opts.join_timeout),
        "cluster": opts.cluster,
        "node": opts.node,
    }
    for item in filter(None, opts.rdzv_conf.split(",")):
        k, _, v = item.partition("=")
        conf[k.strip()] = v.strip()
    args = [
        "--rdzv-backend",
        rendezvous.BACKEND_NAME,
        "--rdzv-endpoint",
        ",".join(opts.etcd),
        "--rdzv-id",
        opts.run_id or opts.cluster,
        "--rdzv-conf",
        ",".join(f"{k}={v}" for k, v in conf.items()),
        "--nnodes",
        opts.nnodes,
        "--nproc-per-node",
        str(opts.nproc_per_node),
        "--max-restarts",
        str(MAX_RESTARTS),
        "--monitor-interval",
        "0.1",
        "--start-method",
        "fork",
        "--shutdown-timeout",
        str(SHUTDOWN_TIMEOUT_S),
        "--signals-to-handle",
        "SIGINT,SIGHUP,SIGQUIT",
    ]
    if opts.local_addr:
        args += ["--local-addr", opts.local_addr]
    module = None
    if len(command) >= 2 and _is_python(command[0]) and command[1].endswith(".py"):
        args += ["--run-path", command[1], *command[2:]]
    elif len(command) >= 3 and _is_python(command[0]) and command[1] == "-m":
        module = command[2]
        args += ["--run-path", "spotrun-module", *command[3:]]  # the script slot is replaced by the module
    else:
        args += ["--no-python", *command]
    return LaunchPlan(args, module, opts.standby_file)


def _run_module(module: str, *args: str) -> None:
    """Entry point of a forked worker for `python -m MODULE ARGS`."""
    import runpy

    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class _Signals:
    """SIGUSR1: leave at the next rendezvous. SIGTERM: leave now, then stop the workers."""

    def __init__(self) -> None:
        self.leave_requested = False
        self.leaving: threading.Thread | None = None

    def install(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGTERM, self._on_term)
        os.register_at_fork(after_in_child=self._reset_in_child)

    @staticmethod
    def _reset_in_child() -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _on_usr1(self, signum: int, frame: Any) -> None:
        self.leave_requested = True
        handler = rendezvous.current_handler()
        if handler is not None:
            handler.request_leave()

    def _on_term(self, signum: int, frame: Any) -> None:
        handler = rendezvous.current_handler()
        if handler is not None and self.leaving is None:
            self.leaving = threading.Thread(target=handler.leave, name="spotrun-leave", daemon=True)
            self.leaving.start()
        self.leave_requested = True
        raise SignalException(f"Process {os.getpid()} got signal: SIGTERM (leave now)", sigval=signal.Signals.SIGTERM)


def _parked(plan: LaunchPlan, signals: _Signals) -> bool:
    """Wait while this warm spare's standby file exists; True if it was told to leave instead."""
    if plan.standby_file is None or not os.path.exists(plan.standby_file):
        return False
    _log.info("warm spare: parked outside the rendezvous until %s is removed", plan.standby_file)
    while os.path.exists(plan.standby_file):
        if signals.leave_requested:
            return True
        time.sleep(STANDBY_POLL_S)
    _log.info("warm spare activated: joining the rendezvous")
    return False


def _bound_worker_stops() -> None:
    """Make torch's agent give its workers SHUTDOWN_TIMEOUT_S, not 30 s, between SIGTERM and
    SIGKILL when it restarts them (a broken round: a peer is gone). torch passes --shutdown-timeout
    only to its final shutdown; a worker that outlives SIGTERM (blocked in an NCCL collective whose
    peer died, with a Python SIGTERM handler that never gets to run) would otherwise hold this
    node out of the survivors' next round for 30 s. Patches the private
    `LocalElasticAgent._stop_workers`; a torch without `_shutdown` keeps its own behaviour."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    if not callable(getattr(LocalElasticAgent, "_shutdown", None)):
        return

    def stop_workers(self: LocalElasticAgent, worker_group: Any) -> None:
        self._shutdown(timeout=getattr(self, "_shutdown_timeout", SHUTDOWN_TIMEOUT_S))

    LocalElasticAgent._stop_workers = stop_workers  # type: ignore[method-assign]


def _rendezvous_again_when_broken() -> None:
    """Make torch's agent rendezvous again, instead of failing, when the round it just joined lost
    a member before the workers started (`RoundBrokenError` from the etcd store: a joiner
    hard-killed as the round completed never writes its keys; see
    `SpotrunRendezvousHandler._round_lost_member`). Without it the wait ran into the store
    timeout (300 s, training stopped) and then the launcher failed. Patches the private
    `SimpleElasticAgent._rendezvous`, which torch calls for every (re)start of the workers; a torch
    without it keeps its own behaviour. Idempotent."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from spotrun.elastic.rendezvous.store import RoundBrokenError

    original = getattr(SimpleElasticAgent, "_rendezvous", None)
    if not callable(original) or getattr(original, "_spotrun_retries", False):
        return

    def rendezvous(self: SimpleElasticAgent, worker_group: Any) -> None:
        while True:
            try:
                original(self, worker_group)
                return
            except RoundBrokenError as exc:
                _log.warning("the new round lost a member before the workers started; rendezvous again: %s", exc)

    rendezvous._spotrun_retries = True  # type: ignore[attr-defined]
    SimpleElasticAgent._rendezvous = rendezvous  # type: ignore[method-assign]


def _launch(plan: LaunchPlan) -> Any:
    _bound_worker_stops()
    _rendezvous_again_when_broken()
    args = torchrun.parse_args(plan.torchrun_args)
    config, cmd, cmd_args = torchrun.config_from_args(args)
    entry: Callable[..., Any] | str = cmd
    if plan.module is not None:
        entry, cmd_args = _run_module, [plan.module, *cmd_args[1:]]
    return elastic_launch(config=config, entrypoint=entry)(*cmd_args)


def main(argv: list[str] | None = None) -> int:
    """Run the launcher; returns the process exit code (see the module doc)."""
    logging.basicConfig(
        level=os.environ.get("SPOTRUN_LAUNCH_LOG", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    plan = build_plan(sys.argv[1:] if argv is None else argv)
    signals = _Signals()
    signals.install()
    signals.leave_requested |= bool(_early_signals)
    code: int = ExitCode.FAILED  # or 128 + a signal's number, as a shell reports it
    closed = False
    try:
        if _parked(plan, signals) or signals.leave_requested:
            _log.info("told to leave before joining")
            return ExitCode.OK
        _launch(plan)
        code, closed = ExitCode.OK, True
        _log.info("job finished")
    except SignalException as exc:
        if exc.sigval == signal.SIGTERM:
            code = ExitCode.OK
            _log.info("left the rendezvous on SIGTERM")
        else:
            code = 128 + int(exc.sigval)
    except RendezvousClosedError:
        code = ExitCode.OK
        _log.info("the rendezvous is closed: the job has finished")
    except ChildFailedError as exc:
        _log.error("workers failed: %s", exc)
    except Exception as exc:
        handler = rendezvous.current_handler()
        if handler is not None and handler.left and signals.leave_requested:
            code = ExitCode.OK  # torch's agent returns None after RendezvousGracefulExitError and trips over it
            _log.info("left the rendezvous at the next round (SIGUSR1)")
        else:
            _log.exception("launcher failed: %s", exc)
    finally:
        if signals.leaving is not None:
            signals.leaving.join(10)
        handler = rendezvous.current_handler()
        if handler is not None:
            handler.finish(closed=closed)
    return code


if __name__ == "__main__":
    sys.exit(main())
