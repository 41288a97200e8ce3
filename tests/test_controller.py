"""The controller against real local VMs and a real etcd (agents without training, for speed)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from local_recipe import local_recipe
from polling import wait_until

from spotrun.controller.bootstrap import QuietReporter
from spotrun.controller.daemon import running_pid, start_daemon, stop_daemon
from spotrun.controller.loop import Controller
from spotrun.controller.provisioning import Provisioner
from spotrun.controller.scaling import set_target
from spotrun.recipe.schema import Recipe
from spotrun.state import clusterfile
from spotrun.state.control_plane import connect_endpoints
from spotrun.state.etcd import LeaseKeeper
from spotrun.state.schema import RdzvPart, rdzv_key
from spotrun.state.spec import put_recipe, recipe_from_spec

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, etcd_server):
    """A fresh $SPOTRUN_HOME and a recipe factory; every cluster made is torn down afterwards."""
    from spotrun.client.down import down
    from spotrun.client.up import up

    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text("print('hi')\n")
    made: list[str] = []

    def make(name: str, target: int = 2, spares: int = 0, **sections) -> str:
        """`sections`: more top-level recipe keys (budget, chaos)."""
        path = tmp_path / f"{name}.yaml"
        path.write_text(local_recipe(name, target=target, spares=spares, endpoint=etcd_server.endpoint, **sections))
        made.append(name)
        up(path, train=False, reporter_factory=QuietReporter)
        stop_daemon(name)  # tests drive the controller themselves unless they start the daemon
        return name

    yield make
    for name in made:
        if name in clusterfile.names():
            down(name, purge=True)


def _controller(name: str):
    record = clusterfile.load(name)
    store = connect_endpoints(record.endpoints, record.tls)
    return Controller(name, store, reporter_factory=QuietReporter), store


def _live(store, name: str) -> list:
    provisioner = Provisioner(recipe_from_spec(store, name), clusterfile.load(name), store)
    return [i for i in provisioner.instances() if not i.state.is_gone]


def _until(check, timeout: float = 30.0, step: float = 0.1):
    """`wait_until` that fails the test when the condition is not met in time."""
    value = wait_until(check, timeout, step)
    assert value, "condition not met in time"
    return value


def test_notice_is_replaced_before_the_node_dies(cluster_env) -> None:
    from spotrun.client.nodes import preempt

    name = cluster_env("mbb", target=2)
    controller, store = _controller(name)
    with store:
        victim = store.list_nodes(name)[0].id
        deadline = preempt(name, victim, 20.0)  # well above the agent's leave margin (5 s)
        _until(lambda: store.get_notice(name, victim))
        controller.reconcile_once()
        launched_at = time.time()
        assert launched_at < deadline, "the replacement must start before the noticed VM dies"
        assert len(store.list_alive(name)) == 3, "replacement bootstrapped while the noticed node still runs"
        replacement = [n for n in store.list_nodes(name) if n.extra.get("replaces") == victim]
        assert len(replacement) == 1
        # Its replacement is alive, so the noticed node is swapped out now, not at its deadline.
        controller.reconcile_once()
        _until(lambda: store.get_node(name, victim).reason == "left the training job")
        controller.reconcile_once()
        assert store.get_node(name, victim).state.value == "terminated"
        assert len(_live(store, name)) == 2
        kinds = [e.kind for e in store.list_events(name)]
        assert "notice" in kinds and "launch" in kinds and "terminate" in kinds


def test_hard_kill_is_replaced_and_ledger_closed(cluster_env) -> None:
    from spotrun.client.nodes import preempt

    name = cluster_env("kill", target=2)
    controller, store = _controller(name)
    with store:
        victim = store.list_nodes(name)[0].id
        preempt(name, victim, 0)  # no notice: the VM is gone at once
        controller.reconcile_once()
        assert store.get_node(name, victim).state.value == "preempted"
        assert all(s.end is not None for s in store.get_ledger(name, victim))
        assert len(_live(store, name)) == 2 and len(store.list_alive(name)) == 2
        assert controller.reconcile_once() == [], "a settled cluster needs nothing"


def _rendezvous_member(store, name: str, node: str) -> LeaseKeeper:
    """What a node's launcher holds in the rendezvous; 30 s, so only a release can end it in a test."""
    return LeaseKeeper(store, rdzv_key(name, name, RdzvPart.ALIVE, node), json.dumps({"node": node}), 30)


def test_gone_node_leaves_the_rendezvous_at_once(cluster_env) -> None:
    from spotrun.client.nodes import preempt

    name = cluster_env("release", target=2)
    controller, store = _controller(name)
    with store:
        victim, survivor = (n.id for n in store.list_nodes(name))
        member = _rendezvous_member(store, name, victim)
        kept = _rendezvous_member(store, name, survivor)
        preempt(name, victim, 0)
        controller.reconcile_once()
        assert store.get(rdzv_key(name, name, RdzvPart.ALIVE, victim)) is None, "survivors need not wait for its lease"
        assert store.get(rdzv_key(name, name, RdzvPart.ALIVE, survivor)) is not None
        member.stop(revoke=True)
        kept.stop(revoke=True)


def test_gone_node_holds_the_rendezvous_until_the_activated_spare_is_in(cluster_env) -> None:
    import threading

    from spotrun.client.nodes import preempt

    name = cluster_env("handover", target=2, spares=1)
    controller, store = _controller(name)
    with store:
        controller.reconcile_once()  # `up` launches no spare: the controller does
        spare = next(iter(store.list_standby(name)))
        victim = next(n.id for n in store.list_nodes(name) if n.id != spare)
        member = _rendezvous_member(store, name, victim)
        preempt(name, victim, 0)
        actions = controller.reconcile_once()
        assert any(type(a).__name__ == "Activate" and a.node == spare for a in actions)
        # Until the spare's launcher is in the rendezvous, the gone node's key keeps the
        # survivors' round open for it.
        assert store.get(rdzv_key(name, name, RdzvPart.ALIVE, victim)) is not None
        stop = threading.Event()
        loop = threading.Thread(target=controller.run, args=(stop,), daemon=True)
        loop.start()
        try:
            arrived = _rendezvous_member(store, name, spare)
            _until(lambda: store.get(rdzv_key(name, name, RdzvPart.ALIVE, victim)) is None, timeout=10)
        finally:
            stop.set()
            loop.join(10)
        assert store.get(rdzv_key(name, name, RdzvPart.ALIVE, spare)) is not None
        arrived.stop(revoke=True)
        member.stop(revoke=True)


def test_scale_up_and_down_most_expensive_first(cluster_env) -> None:
    name = cluster_env("scale", target=2)
    controller, store = _controller(name)
    with store:
        set_target(store, name, 4)
        controller.reconcile_once()
        assert len(_live(store, name)) == 4
        set_target(store, name, 1)
        actions = controller.reconcile_once()
        assert sum(type(a).__name__ == "Drain" for a in actions) == 3
        _until(lambda: sum(n.reason == "left the training job" for n in store.list_nodes(name)) == 3)
        controller.reconcile_once()
        assert len(_live(store, name)) == 1


def test_a_changed_spec_reaches_the_running_controller(cluster_env) -> None:
    """A re-run of `up` writes a new spec; the controller's next launch uses its resources, setup
    and env, not the ones it started with."""
    name = cluster_env("respec", target=1)
    controller, store = _controller(name)
    with store:
        controller.reconcile_once()  # nothing to do, but the controller now holds the first recipe
        data = json.loads(recipe_from_spec(store, name).to_json())
        data["resources"] = [
            {"provider": "local", "instance_type": "cpu-large", "prices": {"spot": 0.2, "on_demand": 0.8}}
        ]
        data["env"] = {"GREETING": "hello from the new spec"}
        data["setup"] = 'echo "$GREETING" > greeting.txt'
        put_recipe(store, Recipe.model_validate(data))
        set_target(store, name, 2)
        controller.reconcile_once()
        (new,) = [i for i in _live(store, name) if i.instance_type == "cpu-large"]
        greeting = Path(new.extra["vm_dir"]) / "home" / "work" / "greeting.txt"  # the setup ran in ~/work
        assert greeting.read_text() == "hello from the new spec\n"
        assert store.get_node(name, new.id).price_per_hour == pytest.approx(0.2)
        assert len(store.list_alive(name)) == 2


def test_killed_controller_during_launch_neither_duplicates_nor_leaks(cluster_env, etcd_server) -> None:
    name = cluster_env("crash", target=1)
    with connect_endpoints([etcd_server.endpoint]) as store:
        pid = start_daemon(name)
        # Not the caller's cwd: a source checkout there would shadow the installed package.
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        set_target(store, name, 4)
        # Kill it as soon as its launch intent is recorded (mid-launch).
        _until(lambda: store.get_prefix(f"/spotrun/{name}/launches/"), timeout=30, step=0.005)
        os.kill(pid, signal.SIGKILL)
        _until(lambda: running_pid(name) is None)
        start_daemon(name)
        try:
            _until(lambda: len(store.list_alive(name)) == 4, timeout=60)
        except AssertionError as exc:
            from spotrun.paths import cluster_dir

            history = "\n".join(f"{e.kind}: {e.message}" for e in store.list_events(name))
            raise AssertionError(f"{history}\n{(cluster_dir(name) / 'controller.log').read_text()[-3000:]}") from exc
        time.sleep(3)  # a few more passes: still no extra VM
        assert len(_live(store, name)) == 4
        assert store.get_prefix(f"/spotrun/{name}/launches/") == []
        stop_daemon(name)


def test_budget_per_hour_blocks_scale_up_with_an_event(cluster_env) -> None:
    name = cluster_env("cheap", target=1, budget={"max_per_hour": 0.25})
    controller, store = _controller(name)
    with store:
        set_target(store, name, 4)
        controller.reconcile_once()
        assert len(_live(store, name)) == 2, "0.25 $/h allows two nodes at 0.10 $/h"
        budget = [e.message for e in store.list_events(name) if e.kind == "budget"]
        assert budget and "max_per_hour 0.25" in budget[0]


def test_budget_total_stops_the_cluster(cluster_env) -> None:
    name = cluster_env("spent", target=2, budget={"max_total": 0.000001})
    controller, store = _controller(name)
    with store:
        time.sleep(0.1)  # two nodes at 0.10 $/h pass a micro-dollar quickly
        controller.reconcile_once()
        _until(lambda: all(n.reason == "left the training job" for n in store.list_nodes(name)))
        controller.reconcile_once()
        assert _live(store, name) == []
        assert store.get_target(name) == 0
        assert any(e.kind == "budget" and "stopping" in e.message for e in store.list_events(name))


def test_trace_replay_preempts_and_limits_capacity(cluster_env, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 10}, "data": [3, 1, 1, 3]}))
    chaos = {"trace": str(trace), "time_scale": 0.3, "trace_notice": 0}
    name = cluster_env("replay", target=3, chaos=chaos)  # ticks last 3 s: drop to 1 at 3 s, back to 3 at 9 s
    controller, store = _controller(name)
    with store:
        controller.reconcile_once()  # starts the replay clock
        _until(lambda: controller.reconcile_once() is not None and len(_live(store, name)) == 1, timeout=20)
        time.sleep(1.0)
        controller.reconcile_once()
        assert len(_live(store, name)) == 1, "no capacity: the replacement launch is refused"
        assert any(e.kind == "capacity" for e in store.list_events(name))
        _until(lambda: controller.reconcile_once() is not None and len(_live(store, name)) == 3, timeout=30)
        messages = [e.message for e in store.list_events(name) if e.kind == "chaos"]
        assert messages[0].startswith("trace: capacity 1; preempting") and messages[1] == "trace: capacity 3"
