"""The controller daemon: one detached `python -m spotrun.controller CLUSTER` per cluster,
started by `spotrun up` (or by the head VM's entry point) and stopped by `spotrun down`."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from spotrun import log
from spotrun.errors import SpotrunError
from spotrun.paths import cluster_dir
from spotrun.state import clusterfile


def pid_path(cluster: str) -> Path:
    return cluster_dir(cluster) / "controller.pid"


def running_pid(cluster: str) -> int | None:
    """The pid of this cluster's controller if one runs (checked against its command line)."""
    try:
        pid = int(pid_path(cluster).read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"spotrun.controller" in cmdline and cluster.encode() in cmdline else None


def start_daemon(cluster: str) -> int:
    """Start the controller of `cluster` detached (it outlives spotrun) unless one runs; its pid."""
    import subprocess

    if (pid := running_pid(cluster)) is not None:
        return pid
    # The child keeps its own copy of the descriptor; ours closes once it is started.
    with open(cluster_dir(cluster) / "controller.log", "ab") as log_file:
        # cwd "/": with `-m`, Python puts the cwd first on sys.path, and a source checkout there
        # would shadow the installed package (whose spotrun.providers lives elsewhere in the tree).
        proc = subprocess.Popen(
            [sys.executable, "-m", "spotrun.controller", cluster],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    pid_path(cluster).write_text(str(proc.pid))
    threading.Thread(target=proc.wait, daemon=True).start()  # reap it if it dies while we run
    # Until the child has exec'd, its cmdline is ours and running_pid() would not know it:
    # a stop_daemon() right after would then miss the controller.
    deadline = time.monotonic() + 10
    while running_pid(cluster) is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc.pid


def stop_daemon(cluster: str, timeout: float = 10.0) -> bool:
    """SIGTERM the controller and wait for it; False if none ran."""
    pid = running_pid(cluster)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running_pid(cluster) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if running_pid(cluster) is not None:
        os.kill(pid, signal.SIGKILL)
    pid_path(cluster).unlink(missing_ok=True)
    return True


def main(argv: list[str] | None = None) -> int:
    """`python -m spotrun.controller CLUSTER`: the daemon `spotrun up` starts."""
    from spotrun.state.control_plane import connect_endpoints

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m spotrun.controller CLUSTER\n")
        return 2
    log.setup(1)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from spotrun.controller.loop import Controller

    try:
        record = clusterfile.load(args[0])
        with connect_endpoints(record.endpoints, record.tls) as store:
            Controller(args[0], store).run(stop)
    except SpotrunError as exc:
        sys.stderr.write(f"spotrun-controller: error: {exc}\n")
        return exc.exit_code
    return 0
