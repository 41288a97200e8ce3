"""The embedded etcd: binary checks, EtcdProcess, and ensure_running/status/stop under $SPOTRUN_HOME."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spotrun.errors import ControlPlaneError
from spotrun.state import etcd_server as etcd_mod

REPO = Path(__file__).resolve().parent.parent


def _fake_etcd(tmp_path: Path, version: str) -> Path:
    script = tmp_path / "etcd"
    script.write_text(f"#!/bin/sh\necho 'etcd Version: {version}'\necho 'Git SHA: fake'\n")
    script.chmod(0o755)
    return script


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPOTRUN_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "spotrun", "etcd", *args], env=env, capture_output=True, text=True, timeout=60, cwd=REPO
    )


# --- the binary ---------------------------------------------------------------------------


def test_real_binary_version_is_accepted() -> None:
    if not (os.environ.get("SPOTRUN_ETCD_BIN") or shutil.which("etcd")):
        pytest.skip("etcd binary not found")
    _, version = etcd_mod.checked_binary()
    assert tuple(map(int, version.split("."))) >= etcd_mod.MIN_VERSION


def test_too_old_binary_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spotrun_home: Path) -> None:
    monkeypatch.setenv("SPOTRUN_ETCD_BIN", str(_fake_etcd(tmp_path, "3.4.0")))
    with pytest.raises(ControlPlaneError, match=r"etcd 3\.4\.0 .* too old; spotrun needs etcd >= 3\.4\.22") as info:
        etcd_mod.ensure_running()
    assert "apt-get install etcd-server" in str(info.value)
    assert not (spotrun_home / "etcd" / "state.json").exists()
    # and through the CLI: one line, exit code 4, no traceback
    proc = _cli(spotrun_home, "start")
    assert proc.returncode == 4 and "too old" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_binary_names_the_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOTRUN_ETCD_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no etcd here
    with pytest.raises(ControlPlaneError, match="apt-get install etcd-server"):
        etcd_mod.find_binary()
    monkeypatch.setenv("SPOTRUN_ETCD_BIN", str(tmp_path / "nope"))
    with pytest.raises(ControlPlaneError, match="SPOTRUN_ETCD_BIN"):
        etcd_mod.find_binary()


def test_unparsable_version_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "etcd"
    script.write_text("#!/bin/sh\necho hello\n")
    script.chmod(0o755)
    with pytest.raises(ControlPlaneError, match="no etcd version"):
        etcd_mod.binary_version(script)


# --- EtcdProcess --------------------------------------------------------------------------


def test_process_start_restart_stop(etcd_process: etcd_mod.EtcdProcess) -> None:
    port, pid = etcd_process.client_port, etcd_process.pid
    assert etcd_mod.healthy(etcd_process.endpoint)
    assert etcd_process.start().pid == pid  # idempotent while running
    info = etcd_process.restart()
    assert info.client_port == port and info.pid != pid and etcd_mod.healthy(info.endpoint)
    code = etcd_process.stop()
    assert code in (0, -15), f"etcd did not stop cleanly: {code}"
    assert not etcd_mod.healthy(info.endpoint, timeout=0.3)
    assert etcd_process.stop() is None  # idempotent


def test_open_port_is_not_health(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not etcd_mod.healthy(f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=0.3)


def test_port_in_use_fails_with_log_lines(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = etcd_mod.EtcdProcess(tmp_path / "data", client_port=port)
        try:
            with pytest.raises(ControlPlaneError, match="address already in use") as info:
                proc.start(timeout=10)
        finally:
            proc.stop()
    assert f"127.0.0.1:{port}" in str(info.value)


# --- the embedded etcd under $SPOTRUN_HOME --------------------------------------------------


def test_ensure_running_is_idempotent_and_stops_cleanly(spotrun_home: Path) -> None:
    assert etcd_mod.status() is None
    assert etcd_mod.stop() is False
    first = etcd_mod.ensure_running()
    again = etcd_mod.ensure_running()
    assert again.pid == first.pid and again.endpoint == first.endpoint
    info = etcd_mod.status()
    assert info is not None and info.to_dict()["running"] is True and info.version == first.version
    assert Path(info.data_dir) == spotrun_home / "etcd" / "data"
    assert etcd_mod.stop() is True
    assert not etcd_mod.pid_alive(first.pid)
    assert etcd_mod.status() is None and not (spotrun_home / "etcd" / "state.json").exists()
    assert "received signal; shutting down" in (spotrun_home / "etcd" / "etcd.log").read_text()
    # restarted later it comes back on the same endpoint, so recorded endpoints stay valid
    third = etcd_mod.ensure_running()
    assert third.endpoint == first.endpoint and third.pid != first.pid
    assert etcd_mod.stop() is True


def test_ensure_running_moves_off_a_taken_port(spotrun_home: Path) -> None:
    first = etcd_mod.ensure_running()
    etcd_mod.stop()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the old port may be in TIME_WAIT
        sock.bind(("127.0.0.1", first.client_port))  # someone else took it meanwhile
        sock.listen()
        second = etcd_mod.ensure_running()
        try:
            assert second.client_port != first.client_port and etcd_mod.healthy(second.endpoint)
        finally:
            etcd_mod.stop()


def test_concurrent_ensure_running_starts_one_etcd(spotrun_home: Path) -> None:
    results: list[etcd_mod.EtcdServerInfo] = []
    threads = [threading.Thread(target=lambda: results.append(etcd_mod.ensure_running())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.pid for r in results}) == 1 and len(results) == 4
    assert etcd_mod.stop() is True


def test_stale_state_file_is_ignored(spotrun_home: Path) -> None:
    info = etcd_mod.ensure_running()
    etcd_mod.stop()
    # a state file left behind by a crash, pointing at a pid that is not our etcd
    stale = etcd_mod.EtcdServerInfo(
        info.endpoint, os.getpid(), info.version, info.data_dir, info.client_port, info.peer_port
    )
    (spotrun_home / "etcd" / "state.json").write_text(json.dumps(stale.to_dict()))
    assert etcd_mod.status() is None
    fresh = etcd_mod.ensure_running()
    assert fresh.pid != os.getpid() and etcd_mod.healthy(fresh.endpoint)
    assert etcd_mod.stop() is True


def test_embedded_etcd_survives_the_cli_process(spotrun_home: Path) -> None:
    started = _cli(spotrun_home, "start")
    try:
        assert started.returncode == 0, started.stderr
        endpoint = started.stdout.strip()
        assert endpoint.startswith("http://127.0.0.1:")
        # the spotrun process has exited; etcd still serves
        assert etcd_mod.healthy(endpoint)
        status = _cli(spotrun_home, "status")
        assert status.returncode == 0 and endpoint in status.stdout
        info = etcd_mod.status()
        assert info is not None and os.getsid(info.pid) == info.pid  # its own session, no terminal
    finally:
        stopped = _cli(spotrun_home, "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not etcd_mod.healthy(endpoint, timeout=0.3)
    down = _cli(spotrun_home, "status")
    assert down.returncode == 4 and "stopped" in down.stdout
    assert _cli(spotrun_home, "stop").stdout.strip() == "not running"
