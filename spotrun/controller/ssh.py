"""SSH to VMs: the only module that imports paramiko.

Host keys are always pinned from what the provider reported (never AutoAddPolicy): a mismatch
is refused at once and never retried. Connecting retries with backoff and jitter while a VM
boots, within an overall deadline.
"""

from __future__ import annotations

import base64
import io
import random
import socket
import tarfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spotrun import log
from spotrun.errors import BootstrapError

if TYPE_CHECKING:  # paramiko itself loads only when a session opens
    import paramiko

_log = log.get("remote")

LineSink = Callable[[str], None]


@dataclass(frozen=True)
class SshTarget:
    """Where and how to reach one VM; `host_key` is its OpenSSH public host key ("type base64")."""

    name: str
    host: str
    port: int
    user: str
    host_key: str


@dataclass(frozen=True)
class SshTimeouts:
    connect: float = 10.0
    banner: float = 10.0
    auth: float = 10.0
    command: float = 600.0
    boot: float = 120.0  # how long to keep retrying while a VM boots


# The timeouts a caller gets when it names none (shared: SshTimeouts is frozen).
DEFAULT_TIMEOUTS = SshTimeouts()


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    tail: list[str]


class HostKeyMismatch(BootstrapError):
    """The VM presented a host key other than the pinned one: never retried."""


def _pinned_client(target: SshTarget) -> paramiko.SSHClient:
    import paramiko

    parts = target.host_key.split()
    if len(parts) < 2:
        raise BootstrapError(
            f"{target.name}: the provider reported no SSH host key to pin",
            hint="the VM may still be booting; spotrun never connects without a pinned key",
        )
    key = paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    client = paramiko.SSHClient()
    hostname = target.host if target.port == 22 else f"[{target.host}]:{target.port}"
    client.get_host_keys().add(hostname, key.get_name(), key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def _load_private_key(path: Path) -> paramiko.Ed25519Key:
    import paramiko

    return paramiko.Ed25519Key.from_private_key_file(str(path))


class Session:
    """One authenticated SSH connection to a VM. Use as a context manager."""

    def __init__(self, target: SshTarget, client: paramiko.SSHClient, timeouts: SshTimeouts) -> None:
        self.target = target
        self._client = client
        self._timeouts = timeouts

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def run(
        self,
        command: str,
        *,
        on_line: LineSink | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        tail: int = 20,
    ) -> CommandResult:
        """Run `command`, stream merged stdout/stderr lines to `on_line`; blocks until it exits.

        Raises BootstrapError when it runs past `timeout` (default: timeouts.command).
        """
        limit = timeout if timeout is not None else self._timeouts.command
        channel = self._client.get_transport().open_session(timeout=self._timeouts.connect)
        channel.set_combine_stderr(True)
        channel.settimeout(1.0)
        channel.exec_command(command)
        if stdin is not None:
            channel.sendall(stdin)
            channel.shutdown_write()
        lines: deque[str] = deque(maxlen=tail)
        deadline = time.monotonic() + limit
        pending = b""
        while True:
            if time.monotonic() > deadline:
                channel.close()
                raise BootstrapError(
                    f"{self.target.name}: command timed out after {limit:.0f} s: {command[:60]}",
                    hint="last output: " + " | ".join(lines),
                )
            try:
                chunk = channel.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                self._emit(raw, lines, on_line)
        if pending:
            self._emit(pending, lines, on_line)
        return CommandResult(channel.recv_exit_status(), list(lines))

    @staticmethod
    def _emit(raw: bytes, lines: deque[str], on_line: LineSink | None) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        lines.append(line)
        if on_line:
            on_line(line)

    def forward(self, remote_host: str, remote_port: int) -> Tunnel:
        """A local loopback port that reaches `remote_host:remote_port` as seen from the VM;
        it lives until the tunnel or this session is closed."""
        return Tunnel(self, remote_host, remote_port)

    def check(
        self,
        command: str,
        *,
        what: str,
        on_line: LineSink | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """`run`, raising BootstrapError with the output tail when the exit status is not 0."""
        result = self.run(command, on_line=on_line, stdin=stdin, timeout=timeout)
        if result.exit_status != 0:
            raise BootstrapError(
                f"{self.target.name}: {what} failed (exit {result.exit_status})",
                hint="last output: " + " | ".join(result.tail[-5:]),
            )
        return result

    def put_tree(self, local_dir: Path, remote_dir: str, *, exclude: Iterable[str] = ()) -> None:
        """Copy `local_dir` into `remote_dir` (created) as one tar stream over the exec channel."""
        blob = tar_tree(local_dir, exclude)
        self.check(f"mkdir -p {remote_dir} && tar -xzf - -C {remote_dir}", what="upload", stdin=blob)


class Tunnel:
    """SSH local port forwarding (`ssh -L`) inside this process: a listener on 127.0.0.1 whose
    connections are carried over the session's transport as direct-tcpip channels. Closing it
    closes the session too."""

    def __init__(self, session: Session, remote_host: str, remote_port: int) -> None:
        import threading

        self.session, self.remote = session, (remote_host, remote_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"tunnel-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        import threading

        while not self._closed.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            try:
                channel = self.session._client.get_transport().open_channel(
                    "direct-tcpip", self.remote, peer, timeout=self.session._timeouts.connect
                )
            except Exception as exc:  # the VM refused or the transport died: drop this connection only
                _log.debug(
                    "tunnel channel failed", extra=log.kv(remote=f"{self.remote[0]}:{self.remote[1]}", error=exc)
                )
                conn.close()
                continue
            threading.Thread(target=_pump, args=(conn, channel), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self.session.close()

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pump(conn: socket.socket, channel: paramiko.Channel) -> None:
    """Copy bytes both ways between a local socket and an SSH channel until either side closes."""
    import select

    import paramiko

    try:
        while True:
            ready, _, _ = select.select([conn, channel], [], [], 30.0)
            for source, sink in ((conn, channel), (channel, conn)):
                if source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    sink.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):  # either side went away: the tunnel closed
        return
    finally:
        channel.close()
        conn.close()


def tar_tree(local_dir: Path, exclude: Iterable[str] = ()) -> bytes:
    """A gzip tar of the directory's contents, with stable ordering so its hash means its content."""
    skip = set(exclude) | {"__pycache__", ".git", ".venv"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for path in sorted(local_dir.rglob("*")):
            rel = path.relative_to(local_dir)
            if skip.intersection(rel.parts):
                continue
            info = tar.gettarinfo(str(path), arcname=str(rel))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isfile():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def connect(
    target: SshTarget,
    key_path: Path,
    timeouts: SshTimeouts = DEFAULT_TIMEOUTS,
    *,
    on_retry: Callable[[str], None] | None = None,
    gone: Callable[[], bool] | None = None,
) -> Session:
    """Open an authenticated, host-key-pinned session, retrying while the VM boots.

    Blocks up to `timeouts.boot`, less when `gone` (asked after each failed attempt) says the VM
    is gone for good. Raises HostKeyMismatch at once on a wrong host key and BootstrapError when
    the VM never answers or is gone.
    """
    import paramiko

    pkey = _load_private_key(key_path)
    deadline = time.monotonic() + timeouts.boot
    delay, attempt, last = 0.2, 0, "no attempt"
    while True:
        attempt += 1
        client = _pinned_client(target)
        try:
            client.connect(
                target.host,
                target.port,
                username=target.user,
                pkey=pkey,
                timeout=timeouts.connect,
                banner_timeout=timeouts.banner,
                auth_timeout=timeouts.auth,
                allow_agent=False,
                look_for_keys=False,
            )
            return Session(target, client, timeouts)
        except (paramiko.BadHostKeyException, paramiko.SSHException) as exc:
            client.close()
            if _is_host_key_problem(exc):
                raise HostKeyMismatch(
                    f"{target.name}: host key of {target.host}:{target.port} does not match "
                    "the key the provider reported; refusing to connect",
                    hint="the VM may have been replaced; run `spotrun down` and `up` again",
                ) from exc
            last = f"{type(exc).__name__}: {exc}"
        except (OSError, EOFError) as exc:
            client.close()
            last = f"{type(exc).__name__}: {exc}"
        if gone is not None and gone():
            raise BootstrapError(
                f"{target.name}: the VM is gone (the provider says so); stopped retrying SSH",
                hint=f"last error: {last}",
            )
        if time.monotonic() + delay > deadline:
            raise BootstrapError(
                f"{target.name}: no SSH at {target.host}:{target.port} after "
                f"{timeouts.boot:.0f} s and {attempt} attempts",
                hint=f"last error: {last}",
            )
        if on_retry:
            on_retry(f"ssh attempt {attempt} failed ({last}); retrying in {delay:.1f} s")
        _log.debug("ssh retry", extra=log.kv(vm=target.name, attempt=attempt, error=last))
        time.sleep(delay * random.uniform(0.5, 1.5))
        delay = min(delay * 2, 5.0)


def _is_host_key_problem(exc: Exception) -> bool:
    import paramiko

    if isinstance(exc, paramiko.BadHostKeyException):
        return True
    # RejectPolicy raises a plain SSHException for a key not in the pinned set.
    return "not found in known_hosts" in str(exc)
