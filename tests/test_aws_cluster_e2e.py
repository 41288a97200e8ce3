"""`spotrun up / status / down` on an AWS recipe, end to end, with the control plane on a head VM.

EC2 is moto's server; its instances really run (tests/ec2_vms.py: a network namespace and an
sshd VM per instance, on a bridge the test creates), so spotrun does on them what it does on
AWS: launches spot workers and an on-demand head through libcloud, SSHes in with the host keys
it put in the user data, starts etcd and the controller on the head, and from then on reaches
them only through an SSH tunnel. A spot interruption is EC2's: the metadata endpoint's notice,
then termination with Server.SpotInstanceTermination.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("moto.server")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("sshd"),
        reason="needs root, iproute2 and sshd (network namespaces, sshd VMs)",
    ),
]

from ec2_vms import HOST_IP, Ec2Vms  # noqa: E402

ACCOUNT, REGION = "123456789012", "us-east-1"
RECIPE = """\
name: {name}
resources:
  - provider: aws
    region: us-east-1
    instance_type: m5.large
nodes: {{min: 1, max: 3, target: 2, spares: {spares}}}
workdir: work
run: python train.py
control_plane:
  mode: head
  head: {{instance_type: t3.small}}
"""


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from moto.ec2.models import ec2_backends
    from moto.server import ThreadedMotoServer

    name = f"aws-{uuid.uuid4().hex[:6]}"
    backend = ec2_backends[ACCOUNT][REGION]
    with Ec2Vms(backend, tmp_path / "vms", {name}) as vms:
        server = ThreadedMotoServer(ip_address=HOST_IP, port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "SPOTRUN_AWS_REGIONS": REGION,
            "SPOTRUN_AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "SPOTRUN_AWS_SSH_USER": "root",
            "SPOTRUN_AWS_IMAGE": next(iter(backend.amis)),
            "SPOTRUN_HOME": str(tmp_path / "home"),
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION"):
            monkeypatch.delenv(key, raising=False)
        vms.start()
        try:
            yield name, vms, backend, tmp_path
        finally:
            from spotrun.client.down import down
            from spotrun.state import clusterfile

            if name in clusterfile.names():
                down(name)
            server.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotrun", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )


def _tags(backend, instance_id: str) -> dict[str, str]:
    return {t["key"]: t["value"] for t in backend.describe_tags(filters={"resource-id": [instance_id]})}


def _cluster_instances(backend, name: str, *, running: bool = True) -> list:
    return [
        i
        for i in backend.all_instances()
        if _tags(backend, i.id).get("spotrun-cluster") == name and (not running or i._state.name == "running")
    ]


def _wait(check, timeout: float, what: str, vms: Ec2Vms) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout:.0f} s; realizer errors: {vms.errors}"
        time.sleep(0.3)


def _up(cloud, spares: int):
    """`up` (no training) of the fixture's cluster with a one-line train.py; its UpResult."""
    from spotrun.client.up import up
    from spotrun.controller.bootstrap import QuietReporter

    name, _, _, tmp_path = cloud
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text("print('hello')\n")
    recipe = tmp_path / "aws.yaml"
    recipe.write_text(RECIPE.format(name=name, spares=spares))
    return up(recipe, train=False, reporter_factory=QuietReporter)


def test_up_on_aws_with_a_head_vm_replaces_an_interrupted_worker_and_down_leaves_nothing(cloud) -> None:
    from spotrun.client.connect import connect_cluster
    from spotrun.controller import daemon as controller
    from spotrun.state import clusterfile, etcd_server

    name, vms, backend, tmp_path = cloud
    result = _up(cloud, spares=0)

    # Three instances: an on-demand head and two spot workers, all tagged, one key pair, one group.
    running = _cluster_instances(backend, name)
    heads = [i for i in running if _tags(backend, i.id).get("spotrun-label:role") == "head"]
    workers = [i for i in running if i not in heads]
    assert len(heads) == 1 and heads[0].instance_type == "t3.small" and heads[0].lifecycle != "spot"
    assert sorted(i.id for i in workers) == sorted(result.nodes) == sorted(result.launched) and len(workers) == 2
    assert all(i.lifecycle == "spot" and i.instance_type == "m5.large" for i in workers)
    assert {i.key_name for i in running} == {next(iter({i.key_name for i in running}))}
    assert all(any(g.name == f"spotrun-{name}" for g in i.security_groups) for i in running)

    # Nothing of the cluster runs here: etcd and the controller are on the head.
    record = clusterfile.load(name)
    assert record.head and record.endpoints == [] and record.head["id"] == heads[0].id
    assert controller.running_pid(name) is None and etcd_server.status() is None

    status = _cli("status", name, "--json")
    assert status.returncode == 0, status.stderr
    nodes = {n["id"]: n for n in json.loads(status.stdout)["nodes"]}
    assert set(nodes) == set(result.nodes) and all(n["alive"] for n in nodes.values())

    # A spot interruption with a 4 s notice: the head's controller replaces the worker.
    victim = result.nodes[0]
    vms.interrupt(victim, 4.0)
    with connect_cluster(name) as store:
        _wait(
            lambda: victim not in store.list_alive(name) and len(store.list_alive(name)) == 2,
            90,
            "a replacement alive",
            vms,
        )
        kinds = [e.kind for e in store.list_events(name)]
        alive = store.list_alive(name)
    assert "notice" in kinds and "launch" in kinds
    # Drained before its deadline, the controller terminated it (else EC2 would have, at the deadline).
    assert backend.get_instance(victim)._state.name == "terminated"
    assert len(_cluster_instances(backend, name)) == 3 and victim not in alive

    # down: every instance, the key pair and the security group go; the history stays here.
    down = _cli("down", name)
    assert down.returncode == 0, down.stderr
    assert _cluster_instances(backend, name) == []
    assert not [k for k in backend.key_pairs if k.startswith(f"spotrun-{name}-")]
    assert not [g for g in backend.describe_security_groups() if g.name == f"spotrun-{name}"]
    history = json.loads(next((tmp_path / "home" / "history").glob(f"{name}-*.json")).read_text())
    assert heads[0].id in history["ledger"] and history["cost"]["total"] > 0
    vms.wait_idle()
    assert vms.vms == {}


def test_a_warm_spare_on_aws_takes_an_interrupted_workers_place(cloud) -> None:
    from spotrun.client.connect import connect_cluster

    name, vms, backend, _ = cloud
    result = _up(cloud, spares=1)

    # The head's controller launches the spare; it is a spot VM marked standby, with a live agent.
    with connect_cluster(name) as store:
        _wait(
            lambda: len(store.list_standby(name)) == 1 and store.list_standby(name) <= store.list_alive(name),
            90,
            "a warm spare with a live agent",
            vms,
        )
        spare = next(iter(store.list_standby(name)))
    assert spare not in result.nodes and backend.get_instance(spare).lifecycle == "spot"
    status = _cli("status", name, "--json")
    assert status.returncode == 0, status.stderr
    nodes = {n["id"]: n for n in json.loads(status.stdout)["nodes"]}
    assert nodes[spare]["standby"] is True and not any(nodes[n]["standby"] for n in result.nodes)

    # An interruption: the spare takes the victim's place at once, and a new spare is launched.
    victim = result.nodes[0]
    vms.interrupt(victim, 4.0)
    with connect_cluster(name) as store:
        _wait(
            lambda: any(e.kind == "activate" and e.node == spare for e in store.list_events(name)),
            60,
            "the spare activated",
            vms,
        )
        assert spare not in store.list_standby(name)
        _wait(
            lambda: (
                backend.get_instance(victim)._state.name == "terminated"
                and len(store.list_standby(name) & store.list_alive(name)) == 1
            ),
            90,
            "a new warm spare",
            vms,
        )
        new_spare = next(iter(store.list_standby(name)))
        activate = next(e for e in store.list_events(name) if e.kind == "activate")
    assert new_spare not in (spare, victim) and f"replace noticed {victim}" in activate.message
    assert len(_cluster_instances(backend, name)) == 4, "head, two workers (one the former spare), one spare"
