"""`spotrun up / status / down` end to end: real embedded etcd, real sshd VMs, real SSH bootstrap."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from local_recipe import local_recipe
from polling import wait_until

from spotrun.controller.bootstrap import BootstrapPlan, bootstrap_all
from spotrun.controller.ssh import HostKeyMismatch, SshTarget, SshTimeouts, connect
from spotrun.controller.ssh_keys import ensure_keypair
from spotrun.state.records import NodeRecord, NodeState

pytestmark = pytest.mark.slow


def _cli(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "spotrun", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "SPOTRUN_HOME": str(home), "NO_COLOR": "1"},
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _recipe(tmp_path: Path, name: str, target: int = 3, setup: str = "echo ran >> setup.log") -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text("print('hello')\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(local_recipe(name, target=target, setup=setup))
    return path


def _live_pids(pids: list[int]) -> list[int]:
    """Pids that still run (zombies left to a non-reaping PID 1 do not count)."""
    live = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            live.append(pid)
    return live


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def home(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    yield home
    for record in (home / "clusters").glob("*/cluster.json"):
        _cli(home, "down", record.parent.name, "--purge", check=False)
    subprocess.run(
        [sys.executable, "-m", "spotrun", "etcd", "stop"],
        env={**os.environ, "SPOTRUN_HOME": str(home)},
        capture_output=True,
        timeout=60,
    )


def _provider(home: Path):
    from spotrun.providers.local.provider import LocalProvider

    return LocalProvider(root=home / "local")


def test_up_status_rerun_down(tmp_path: Path, home: Path) -> None:
    recipe = _recipe(tmp_path, "life")
    first = json.loads(_cli(home, "up", str(recipe), "--no-train", "--json").stdout)
    assert len(first["nodes"]) == 3 and sorted(first["launched"]) == sorted(first["nodes"])

    status = json.loads(_cli(home, "status", "life", "--json").stdout)
    assert status["target"] == 3 and status["alive"] == 3
    assert {n["state"] for n in status["nodes"]} == {"running"}
    assert status["costs"]["burn_per_hour"] == pytest.approx(0.30)
    assert status["costs"]["on_demand_per_hour"] == pytest.approx(1.20)

    instances = _provider(home).instances("life")
    homes = [Path(i.extra["vm_dir"]) / "home" for i in instances]
    for vm_home in homes:
        assert (vm_home / "work" / "train.py").read_text() == "print('hello')\n"
        assert (vm_home / "work" / "setup.log").read_text() == "ran\n"

    again = json.loads(_cli(home, "up", str(recipe), "--no-train", "--json").stdout)
    assert again["launched"] == [] and again["bootstrapped"] == []
    assert sorted(again["nodes"]) == sorted(first["nodes"])
    assert all((h / "work" / "setup.log").read_text() == "ran\n" for h in homes), "setup ran twice"

    pids = [i.extra["init_pid"] for i in instances]
    ports = [i.ssh_port for i in instances] + [int(i.metadata_url.rsplit(":", 1)[1]) for i in instances]
    etcd_state = json.loads((home / "etcd" / "state.json").read_text())
    pids.append(etcd_state["pid"])
    ports.append(etcd_state["client_port"])

    down = _cli(home, "down", "life")
    assert "terminated 3 VMs" in down.stdout and "embedded etcd stopped" in down.stdout
    wait_until(lambda: not _live_pids(pids) and not any(_port_open(p) for p in ports), 10, 0.1)
    assert _live_pids(pids) == []
    assert [p for p in ports if _port_open(p)] == []
    assert not (home / "clusters" / "life").exists()
    assert {i.state.value for i in _provider(home).instances("life")} == {"terminated"}
    assert _cli(home, "status").stdout.startswith("no clusters")


def test_failed_setup_leaves_no_half_built_cluster(tmp_path: Path, home: Path) -> None:
    recipe = _recipe(tmp_path, "broken", target=2, setup="echo about to fail; exit 3")
    result = _cli(home, "up", str(recipe), "--no-train", check=False)
    assert result.returncode == 6, result.stderr
    assert "failed to bootstrap" in result.stderr and "about to fail" in result.stderr
    assert "Traceback" not in result.stderr
    assert all(i.state.value in ("terminated", "failed") for i in _provider(home).instances("broken"))
    assert not (home / "clusters" / "broken").exists()
    assert not (home / "etcd" / "state.json").exists(), "the embedded etcd should stop with its only cluster"


def test_unknown_cluster_is_one_line(home: Path) -> None:
    result = _cli(home, "down", "nope", check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("spotrun: error: no cluster named 'nope'") and result.stderr.count("\n") == 1


@pytest.fixture
def one_vm(tmp_path: Path):
    from spotrun.providers import LaunchSpec, Offer

    provider = _provider(tmp_path)
    key = tmp_path / "id_ed25519"
    public = ensure_keypair(key, "test")
    offer = Offer("local", "local", "local-a", "local-cpu-2", 2, 0, None, 0.02, 0.08)
    [vm_id] = provider.launch(LaunchSpec("pin", offer, 1, public, "pin-1"))
    [inst] = [i for i in provider.instances("pin") if i.id == vm_id]
    yield inst, key
    provider.purge("pin")


def test_host_key_mismatch_is_refused_without_retry(tmp_path: Path, one_vm) -> None:
    inst, key = one_vm
    wrong = ensure_keypair(tmp_path / "other_host_key", "impostor").split()
    retries: list[str] = []
    target = SshTarget(inst.id, inst.host, inst.ssh_port, inst.ssh_user, f"{wrong[0]} {wrong[1]}")
    with pytest.raises(HostKeyMismatch, match="does not match"):
        connect(target, key, SshTimeouts(boot=30), on_retry=retries.append)
    assert retries == []
    good = SshTarget(inst.id, inst.host, inst.ssh_port, inst.ssh_user, inst.host_public_key)
    with connect(good, key) as session:
        assert session.run("echo pinned").tail == ["pinned"]
        # The cluster's shared directory (checkpoints) is the same host directory in every VM.
        assert session.run(f"echo from-vm > {inst.extra['shared_dir']}/probe").exit_status == 0
    assert (tmp_path / "local" / "shared" / "pin" / "probe").read_text() == "from-vm\n"


class _Lines:
    def __init__(self, names):
        self.events: list[tuple[str, str, str]] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def phase(self, vm, phase):
        self.events.append(("phase", vm, phase))

    def line(self, vm, text):
        self.events.append(("line", vm, text))

    def failed(self, vm, error):
        self.events.append(("failed", vm, error))


def test_vm_that_never_answers_fails_within_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    key = tmp_path / "id"
    public = ensure_keypair(key, "t").split()
    work = tmp_path / "w"
    work.mkdir()
    plan = BootstrapPlan("dead", work, None, {}, lambda vm: ["true"], key, SshTimeouts(boot=2.0))
    reporter = _Lines([])
    [outcome] = bootstrap_all(
        [SshTarget("ghost", "127.0.0.1", port, "root", f"{public[0]} {public[1]}")], plan, reporter
    )
    assert not outcome.ok and outcome.phase == "connect"
    assert "no SSH at 127.0.0.1" in outcome.error
    assert ("failed", "ghost", outcome.error) in reporter.events
    assert any(kind == "line" and "retrying" in text for kind, _, text in reporter.events)


def test_vm_gone_while_bootstrapped_stops_the_retries_at_once(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    key = tmp_path / "id"
    public = ensure_keypair(key, "t").split()
    work = tmp_path / "w"
    work.mkdir()
    asked: list[str] = []

    def gone(vm: str) -> bool:  # the provider reports the VM preempted while it boots
        asked.append(vm)
        return True

    plan = BootstrapPlan("dead", work, None, {}, lambda vm: ["true"], key, SshTimeouts(boot=60.0), vm_gone=gone)
    t0 = time.monotonic()
    [outcome] = bootstrap_all(
        [SshTarget("ghost", "127.0.0.1", port, "root", f"{public[0]} {public[1]}")], plan, _Lines([])
    )
    assert time.monotonic() - t0 < 10, "a gone VM does not hold the controller for the SSH boot timeout"
    assert not outcome.ok and outcome.phase == "connect" and "the VM is gone" in outcome.error
    assert asked == ["ghost"]


@pytest.mark.parametrize("protocol", ["aws", "gcp", "azure"])
def test_notice_from_each_protocol_reaches_etcd(tmp_path: Path, store, cluster: str, etcd_server, protocol) -> None:
    from spotrun.providers.local.metadata import MetadataServer, arm_notice

    from spotrun.node.agent import Agent, AgentConfig

    server = MetadataServer(tmp_path, {"id": "vm-1", "name": "vm-1"})
    server.start()
    store.put_node(NodeRecord("vm-1", cluster, "local", "local-a", "t", 0.1, 0.4, launched_at=time.time()))
    stop = threading.Event()
    agent = Agent(AgentConfig(cluster, "vm-1", [etcd_server.endpoint], 5, protocol, server.url), stop)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: "vm-1" in store.list_alive(cluster), 10)
        armed = arm_notice(tmp_path, 20)
        notice = wait_until(lambda: store.get_notice(cluster, "vm-1"), 10)
        assert notice is not None and notice.source == protocol
        if protocol != "gcp":  # GCP's notice carries no deadline; the watcher assumes its fixed 30 s
            assert notice.deadline == pytest.approx(armed.deadline, abs=1.0)
        assert wait_until(lambda: store.get_node(cluster, "vm-1").state == NodeState.NOTICE, 5)
        assert any(e.kind == "notice" for e in store.list_events(cluster))
    finally:
        stop.set()
        thread.join(10)
        server.close()
    assert "vm-1" not in store.list_alive(cluster), "a stopped agent revokes its liveness at once"
