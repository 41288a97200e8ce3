"""The controller keeps a training job at its target through chaos, and through an etcd restart."""

from __future__ import annotations

import time

import pytest
import yaml
from test_training_e2e import Job, job_factory  # noqa: F401  (the fixture is reused here)

from spotrun.state import clusterfile
from spotrun.state.control_plane import connect_endpoints
from spotrun.state.schema import RdzvPart, rdzv_key

pytestmark = pytest.mark.slow

CHAOS = """
chaos:
  preempt:
    - {at: 4, node: 0, notice: 8}
    - {at: 14, node: 1, notice: 0}
    - {at: 22, node: random, notice: 8}
"""


def _provider_view(job: Job):
    from spotrun.providers.local.provider import LocalProvider

    return LocalProvider(root=job.home / "local").instances(job.name)


def test_chaos_run_returns_to_target_and_loses_no_step(job_factory) -> None:
    job = job_factory("chaos", steps=1000, delay=0.03)
    job.recipe.write_text(job.recipe.read_text() + CHAOS)
    job.up(controller=True)
    job.wait(lambda: job.finished(1000), timeout=180, what="step 1000")
    assert [s for _, s, _ in job.steps()] == list(range(1, 1001)), "a step was skipped or ran twice"
    record = clusterfile.load(job.name)
    with connect_endpoints(record.endpoints, record.tls) as store:
        kinds = [e.kind for e in store.list_events(job.name)]
        assert kinds.count("chaos") == 3
        assert kinds.count("launch") >= 4, "each preemption got a replacement"  # 1 at up + 3
        job.wait(lambda: len(store.list_alive(job.name)) == 3, timeout=30, what="target 3 alive")
    instances = _provider_view(job)
    live = [i for i in instances if not i.state.is_gone]
    assert len(live) == 3, "the cluster is back at its target, with no extra VM"
    assert {i.state.value for i in instances if i.state.is_gone} <= {"preempted", "terminated"}
    assert len(instances) == 6


def test_etcd_restart_during_training_loses_nothing(job_factory, etcd_process, monkeypatch) -> None:
    from spotrun.client.nodes import preempt

    job = job_factory("restart", steps=900, delay=0.03)
    recipe = yaml.safe_load(job.recipe.read_text())
    recipe["control_plane"]["endpoints"] = [etcd_process.endpoint]  # an etcd this test may stop
    job.recipe.write_text(yaml.safe_dump(recipe, sort_keys=False))
    job.up(controller=True)
    job.wait(lambda: job.at_world(3) and job.steps()[-1][1] > 40, what="training at world 3")
    etcd_process.stop()
    stopped_at = job.steps()[-1][1]
    time.sleep(3)
    assert job.steps()[-1][1] > stopped_at, "training itself does not need etcd"
    etcd_process.start()
    record = clusterfile.load(job.name)
    with connect_endpoints(record.endpoints, record.tls) as store:
        job.wait(lambda: len(store.list_alive(job.name)) == 3, timeout=30, what="agents back in etcd")
        victim = next(i.id for i in _provider_view(job) if not i.state.is_gone)
        preempt(job.name, victim, 8.0)  # the controller's and agents' watches must work again
        job.wait(
            lambda: (
                store.get_notice(job.name, victim) is not None
                or any(e.kind == "notice" and e.node == victim for e in store.list_events(job.name))
            ),
            timeout=30,
            what="the notice in etcd",
        )
        job.wait(
            lambda: any(e.kind == "launch" and victim in e.message for e in store.list_events(job.name)),
            timeout=30,
            what="a replacement launch",
        )
    job.wait(lambda: job.finished(900), timeout=180, what="step 900")
    assert job.duplicates() == []


def test_warm_spare_takes_a_killed_nodes_place_and_is_refilled(job_factory) -> None:
    from spotrun.client.nodes import preempt

    job = job_factory("spare", steps=700, delay=0.03)
    job.recipe.write_text(job.recipe.read_text().replace("target: 3}", "target: 3, spares: 1}"))
    job.up(controller=True)
    record = clusterfile.load(job.name)
    with connect_endpoints(record.endpoints, record.tls) as store:

        def parked_spares() -> set[str]:
            return store.list_standby(job.name) & store.list_alive(job.name)

        job.wait(lambda: len(parked_spares()) == 1, timeout=60, what="one warm spare with a live agent")
        job.wait(lambda: job.at_world(3) and job.steps()[-1][1] > 60, what="training at world 3")
        spare = next(iter(parked_spares()))
        assert spare not in {p.node for p in store.list_progress(job.name)}, "a parked spare does not train"
        victim = next(p.node for p in store.list_progress(job.name) if p.node != spare)
        killed_at = time.time()
        preempt(job.name, victim, 0)
        lost = rdzv_key(job.name, job.name, RdzvPart.LOST)
        job.wait(lambda: store.get_prefix(lost), timeout=30, what="a survivor's peer-lost report")
        job.wait(
            lambda: any(e.kind == "activate" and e.node == spare for e in store.list_events(job.name)),
            timeout=30,
            what="the spare activated",
        )
        job.wait(
            lambda: spare in {p.node for p in store.list_progress(job.name)}, timeout=30, what="the spare training"
        )
        job.wait(lambda: job.at_world(3, after=killed_at), timeout=30, what="world 3 again")
        job.wait(lambda: len(parked_spares() - {spare}) == 1, timeout=60, what="a new warm spare")
        job.wait(lambda: job.finished(700), timeout=180, what="step 700")
        new_spare = next(iter(store.list_standby(job.name)))
        # The job is over: the spare could only cost money now.
        job.wait(
            lambda: any(
                e.kind == "terminate" and e.node == new_spare and "training finished" in e.message
                for e in store.list_events(job.name)
            ),
            timeout=30,
            what="the spare let go",
        )
    assert [s for _, s, _ in job.steps()] == list(range(1, 701)), "a step was skipped or ran twice"
    assert max(w for *_, w in job.steps()) == 3, "a spare never trains beside the target"
    live = [i.id for i in _provider_view(job) if not i.state.is_gone]
    assert victim not in live and spare in live and len(live) == 3, "the 3 training nodes, no extra VM"
