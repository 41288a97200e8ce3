"""The embedded control plane: a single-node etcd that spotrun starts, finds again and stops.

Two ways to run one, on the same start code:

- `EtcdProcess(data_dir)`: an etcd owned by the calling process (tests, benches). `start()`,
  `stop()`, `restart()` (same ports, same data).
- `ensure_running()` / `status()` / `stop()`: the user's embedded etcd under `etcd_dir()`
  (`$SPOTRUN_HOME/etcd`). It runs detached (own session, no terminal) so it outlives spotrun;
  `state.json` records pid, ports and version, and an fcntl lock on `lock` serialises concurrent
  spotrun commands so only one etcd is ever started.

Layout under `etcd_dir()`: `data/` (etcd data dir), `etcd.log`, `state.json` (while running),
`ports.json` (kept after stop, so a restart comes back on the same endpoint), `lock`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spotrun import log
from spotrun.errors import ControlPlaneError
from spotrun.paths import etcd_dir

MIN_VERSION = (3, 4, 22)
INSTALL_HINT = "install it with `sudo apt-get install etcd-server` or point $SPOTRUN_ETCD_BIN at an etcd >= 3.4.22"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0

_log = log.get("etcd")
# Popen objects of etcds this process started, so stop() can reap them and read the exit status.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class EtcdServerInfo:
    """Where a running etcd listens and what it is."""

    endpoint: str
    pid: int
    version: str
    data_dir: str
    client_port: int
    peer_port: int

    def to_dict(self) -> dict[str, Any]:
        return {"running": True, **asdict(self)}


# --- the binary ---------------------------------------------------------------------------


def find_binary() -> Path:
    """`$SPOTRUN_ETCD_BIN`, else `etcd` on PATH. Raises ControlPlaneError if there is none."""
    configured = os.environ.get("SPOTRUN_ETCD_BIN")
    if configured:
        path = Path(configured).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ControlPlaneError(f"$SPOTRUN_ETCD_BIN={configured} is not an executable file", hint=INSTALL_HINT)
        return path
    found = shutil.which("etcd")
    if not found:
        raise ControlPlaneError("etcd is not installed (no `etcd` on PATH)", hint=INSTALL_HINT)
    return Path(found)


def binary_version(binary: Path) -> str:
    """The version `binary --version` prints, e.g. "3.4.23". Blocks up to 10 s. Raises ControlPlaneError."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ControlPlaneError(f"cannot run {binary} --version: {exc}", hint=INSTALL_HINT) from exc
    match = re.search(r"etcd Version:\s*(\d+)\.(\d+)\.(\d+)", out)
    if not match:
        raise ControlPlaneError(f"{binary} --version printed no etcd version", hint=INSTALL_HINT)
    return ".".join(match.groups())


def checked_binary() -> tuple[Path, str]:
    """The etcd binary and its version, refusing versions below MIN_VERSION. Raises ControlPlaneError."""
    binary = find_binary()
    version = binary_version(binary)
    if tuple(int(p) for p in version.split(".")) < MIN_VERSION:
        minimum = ".".join(map(str, MIN_VERSION))
        raise ControlPlaneError(
            f"etcd {version} at {binary} is too old; spotrun needs etcd >= {minimum}", hint=INSTALL_HINT
        )
    return binary, version


# --- small helpers ------------------------------------------------------------------------


# etcd refuses leases shorter than 1.5 election timeouts (2 s at its 1000 ms default). Ours run
# as one member, where the election timeout only paces the start-up self-election, so 500 ms
# costs nothing and lets the rendezvous hold 1 s leases: a node that dies without a word is seen
# gone after 1 s instead of 2.
ELECTION_ARGS = ("--heartbeat-interval", "100", "--election-timeout", "500")


def free_port() -> int:
    """A loopback TCP port that is free right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:`port`, so etcd may bind it.

    SO_REUSEADDR as etcd (Go) sets it: connections in TIME_WAIT after a stop don't count.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def healthy(endpoint: str, timeout: float = 1.0) -> bool:
    """True if `endpoint`/health answers {"health": "true"}. Never raises; blocks up to `timeout`."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    try:
        with opener.open(f"{endpoint}/health", timeout=timeout) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def pid_alive(pid: int) -> bool:
    """True if a process `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --- one etcd process ---------------------------------------------------------------------


class EtcdProcess:
    """A single-node etcd on loopback with its own data dir.

    Ports default to free ones picked at `start()` and stay fixed afterwards, so `restart()` comes
    back on the same endpoint with the same data. `detach=True` puts etcd in its own session so it
    survives this process (used by `ensure_running`). Use as a context manager to always stop it.
    """

    def __init__(
        self,
        data_dir: Path | str,
        client_port: int | None = None,
        peer_port: int | None = None,
        *,
        name: str = "spotrun",
        log_path: Path | str | None = None,
        detach: bool = False,
        binary: Path | None = None,
        listen_host: str = "127.0.0.1",
        advertise_host: str = "127.0.0.1",
    ) -> None:
        """`listen_host` 0.0.0.0 serves other machines too (a head VM), which then dial
        `advertise_host`; this process always checks health through loopback."""
        self.data_dir = Path(data_dir)
        self.client_port = client_port
        self.peer_port = peer_port
        self.name = name
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / f"{self.data_dir.name}.log"
        self.detach = detach
        self.listen_host, self.advertise_host = listen_host, advertise_host
        self._binary = binary
        self.version = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def info(self) -> EtcdServerInfo:
        assert self.proc and self.client_port and self.peer_port, "etcd is not started"
        return EtcdServerInfo(
            self.endpoint, self.proc.pid, self.version, str(self.data_dir), self.client_port, self.peer_port
        )

    def start(self, timeout: float = START_TIMEOUT_S) -> EtcdServerInfo:
        """Start etcd and block until /health is ok. Idempotent while running.

        Raises ControlPlaneError (binary missing or too old, port in use, not healthy in time),
        with the last log lines in the message.
        """
        if self.proc and self.proc.poll() is None:
            return self.info()
        if self._binary is None:
            self._binary, self.version = checked_binary()
        elif not self.version:
            self.version = binary_version(self._binary)
        given = (self.client_port, self.peer_port)
        for attempt in range(3):
            try:
                return self._start_once(timeout)
            except ControlPlaneError as exc:
                # A port we picked ourselves may have been taken in between: pick again.
                if None not in given or "address already in use" not in str(exc) or attempt == 2:
                    raise
                _log.info("port raced away, retrying with new ports", extra=log.kv(port=self.client_port))
                self.client_port, self.peer_port = given
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> EtcdServerInfo:
        self.client_port = self.client_port or free_port()
        self.peer_port = self.peer_port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            logf.write(f"--- spotrun: starting etcd at {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            logf.flush()
            self.proc = subprocess.Popen(
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=self.detach,
                close_fds=True,
            )
        _children[self.proc.pid] = self.proc
        self._wait_healthy(timeout)
        _log.info("etcd started", extra=log.kv(pid=self.proc.pid, endpoint=self.endpoint))
        return self.info()

    def _argv(self) -> list[str]:
        listen = f"http://{self.listen_host}:{self.client_port}"
        advertise = f"http://{self.advertise_host}:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            str(self._binary),
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            listen,
            "--advertise-client-urls",
            advertise,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"{self.name}={peer}",
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"spotrun-{self.name}",
            "--logger",
            "zap",
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "100000",
            *ELECTION_ARGS,
        ]

    def _wait_healthy(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _children.pop(self.proc.pid, None)
                raise ControlPlaneError(
                    f"etcd exited with status {self.proc.returncode} on {self.endpoint}; last log lines "
                    f"({self.log_path}):\n{_tail(self.log_path)}",
                    hint="is the port in use or the data dir locked by another etcd?",
                )
            if healthy(self.endpoint, timeout=0.5):
                return
            time.sleep(0.05)
        self.stop()
        raise ControlPlaneError(
            f"etcd on {self.endpoint} was not healthy within {timeout:.0f} s; last log lines "
            f"({self.log_path}):\n{_tail(self.log_path)}",
            hint="see the log for the cause",
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit status (-15 is a clean
        stop for etcd), None if it was not running. Idempotent; blocks until the process is gone."""
        if self.proc is None:
            return None
        code = terminate(self.proc.pid, timeout)
        self.proc = None
        return code

    def restart(self, timeout: float = START_TIMEOUT_S) -> EtcdServerInfo:
        """Stop, then start again on the same ports and data dir. Raises ControlPlaneError."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> EtcdProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def terminate(pid: int, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """SIGTERM `pid`, wait up to `timeout`, SIGKILL after. Blocks until it is gone.

    Returns its exit status when this process started it (negative = killed by that signal),
    else None.
    """
    child = _children.pop(pid, None)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if child is not None:
        try:
            return child.wait(timeout)
        except subprocess.TimeoutExpired:
            _log.warning("etcd ignored SIGTERM, killing it", extra=log.kv(pid=pid))
            child.kill()
            return child.wait()
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    return None


# --- the embedded etcd under $SPOTRUN_HOME --------------------------------------------------


def _state_path() -> Path:
    return etcd_dir() / "state.json"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Hold an exclusive fcntl lock on etcd_dir()/lock; blocks while another spotrun holds it."""
    with open(etcd_dir() / "lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_state() -> EtcdServerInfo | None:
    try:
        data = json.loads(_state_path().read_text())
        data.pop("running", None)
        return EtcdServerInfo(**data)
    except (OSError, ValueError, TypeError):
        return None


def _read_ports() -> tuple[int | None, int | None]:
    try:
        data = json.loads((etcd_dir() / "ports.json").read_text())
        return int(data["client_port"]), int(data["peer_port"])
    except (OSError, ValueError, TypeError, KeyError):
        return None, None


def _write_state(info: EtcdServerInfo) -> None:
    ports = {"client_port": info.client_port, "peer_port": info.peer_port}
    for name, data in (("ports.json", ports), ("state.json", info.to_dict())):
        tmp = etcd_dir() / f"{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(etcd_dir() / name)


def _is_our_etcd(info: EtcdServerInfo) -> bool:
    """True if `info.pid` is alive and is an etcd serving `info.data_dir` (not a reused pid)."""
    if not pid_alive(info.pid):
        return False
    try:
        argv = Path(f"/proc/{info.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return info.data_dir.encode() in argv


def status() -> EtcdServerInfo | None:
    """The embedded etcd if its process is alive and /health is ok, else None. Never starts it."""
    info = _read_state()
    if info and _is_our_etcd(info) and healthy(info.endpoint):
        return info
    return None


def ensure_running(timeout: float = START_TIMEOUT_S) -> EtcdServerInfo:
    """Return the embedded etcd, starting it if needed. Idempotent and safe to call concurrently.

    Reuses the recorded ports when they are free, so endpoints stored elsewhere stay valid.
    Blocks until etcd is healthy. Raises ControlPlaneError (missing/too old binary, failed start).
    """
    with _locked():
        info = _read_state()
        if info and _is_our_etcd(info):
            if _wait_health(info.endpoint, 5.0):
                return info
            _log.warning("embedded etcd is not healthy, restarting it", extra=log.kv(pid=info.pid))
            terminate(info.pid)
        binary, version = checked_binary()
        client, peer = _read_ports()
        client = client if client and port_is_free(client) else None
        peer = peer if client and peer and port_is_free(peer) else None
        proc = EtcdProcess(
            etcd_dir() / "data", client, peer, log_path=etcd_dir() / "etcd.log", detach=True, binary=binary
        )
        proc.version = version
        started = proc.start(timeout)
        _write_state(started)
        return started


def _wait_health(endpoint: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not healthy(endpoint):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop(timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the embedded etcd (SIGTERM, SIGKILL after `timeout`) and forget its state file.

    Returns False if nothing was running. Idempotent; its data stays on disk.
    """
    with _locked():
        info = _read_state()
        running = bool(info and _is_our_etcd(info))
        if info and running:
            terminate(info.pid, timeout)
            _log.info("etcd stopped", extra=log.kv(pid=info.pid))
        _state_path().unlink(missing_ok=True)
        return running
