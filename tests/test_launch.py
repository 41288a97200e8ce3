"""The pre-warmed launcher end to end: real etcd, real torchrun agents and gloo workers on this host.

Each launcher runs in its own process group and is killed with it in teardown. The figures
(seconds from an event to the first completed step at the new world size) are printed; the
asserts only hold generous upper bounds so a loaded 2-core machine does not make them flaky.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from spotrun.elastic import launcher as launch
from spotrun.state import schema
from spotrun.state import store as store_mod

SCRIPT = Path(__file__).parent / "elastic_scripts" / "allreduce_steps.py"
STEP = re.compile(r"^STEP (\d+) WORLD (\d+) RANK (\d+) NODE (\S+) T ([\d.]+)$")
BOUND_S = 20.0  # generous; the real figures are printed


@dataclass
class Launcher:
    node: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.time)

    def steps(self) -> list[tuple[int, int, int, float]]:
        """(step, world, rank, time) of every STEP line so far."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            m = STEP.match(line.strip())
            if m:
                out.append((int(m[1]), int(m[2]), int(m[3]), float(m[5])))
        return out

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class Job:
    """Launchers of one run, all on the same etcd and state dir."""

    def __init__(self, etcd: str, cluster: str, tmp: Path, nnodes: str = "1:4", steps: int = 1_000_000) -> None:
        self.etcd, self.cluster, self.tmp, self.nnodes, self.steps = etcd, cluster, tmp, nnodes, steps
        self.state_dir = tmp / "state"
        self.state_dir.mkdir(exist_ok=True)
        self.launchers: dict[str, Launcher] = {}

    def start(self, node: str, *extra: str, script_args: tuple[str, ...] = ()) -> Launcher:
        log = self.tmp / f"{node}.log"
        cmd = [
            sys.executable,
            "-m",
            "spotrun.elastic.launcher",
            "--cluster",
            self.cluster,
            "--node",
            node,
            "--etcd",
            self.etcd,
            "--nnodes",
            self.nnodes,
            "--local-addr",
            "127.0.0.1",
            *extra,
            "--",
            "python",
            str(SCRIPT),
            str(self.state_dir),
            "--steps",
            str(self.steps),
            *script_args,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1", SPOTRUN_LAUNCH_LOG="WARNING", OMP_NUM_THREADS="1")
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        launcher = Launcher(node, proc, log)
        self.launchers[node] = launcher
        return launcher

    def stop_all(self) -> None:
        for launcher in self.launchers.values():
            launcher.kill_group()
        for launcher in self.launchers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.proc.wait(10)

    def first_step_at(self, world: int, after: float, nodes: list[str], timeout: float = 60.0) -> float:
        """Time of the first step completed at `world` after `after` on every one of `nodes`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            firsts = []
            for node in nodes:
                ts = [t for _, w, _, t in self.launchers[node].steps() if w == world and t > after]
                if not ts:
                    break
                firsts.append(min(ts))
            else:
                return max(firsts)
            time.sleep(0.05)
        tails = {n: self.launchers[n].log.read_text(errors="replace")[-3000:] for n in nodes}
        raise AssertionError(f"no step at world {world} after {after} on {nodes} within {timeout} s: {tails}")

    def form(self, world: int, nodes: list[str], st: store_mod.Store, timeout: float = 90.0) -> None:
        """Wait for a step at `world` on `nodes`, admitting late starters the way spotrun's agent does:
        a waiting key makes the trainer restart at a step boundary."""
        waiting = schema.rdzv_key(self.cluster, self.cluster, schema.RdzvPart.WAITING)
        deadline = time.time() + timeout
        while True:
            try:
                self.first_step_at(world, 0, nodes, timeout=0.5)
                return
            except AssertionError:
                if time.time() > deadline:
                    raise
            if st.get_prefix(waiting) and not (self.state_dir / "restart").exists():
                (self.state_dir / "restart").touch()

    def rank0(self, world: int) -> str:
        for node, launcher in self.launchers.items():
            if any(w == world and r == 0 for _, w, r, _ in launcher.steps()[-5:]):
                return node
        raise AssertionError(f"no rank 0 at world {world}")


@pytest.fixture
def job(etcd_server, cluster: str, tmp_path: Path) -> Iterator[Job]:
    j = Job(etcd_server.endpoint, cluster, tmp_path)
    try:
        yield j
    finally:
        j.stop_all()
        with store_mod.connect([etcd_server.endpoint]) as st:
            st.delete_cluster(cluster)


def _report(case: str, seconds: float) -> None:
    print(f"\n[elastic] {case}: {seconds:.2f} s", flush=True)


# --- pure ---------------------------------------------------------------------------------


def test_plan_uses_run_path_for_python_scripts() -> None:
    plan = launch.build_plan(
        [
            "--cluster",
            "c",
            "--node",
            "n1",
            "--etcd",
            "http://127.0.0.1:2379",
            "--etcd",
            "http://h:2379",
            "--nnodes",
            "1:4",
            "--",
            "python",
            "train.py",
            "--lr",
            "0.1",
        ]
    )
    args = plan.torchrun_args
    assert args[args.index("--rdzv-backend") + 1] == "spotrun-etcd"
    assert args[args.index("--rdzv-endpoint") + 1] == "http://127.0.0.1:2379,http://h:2379"
    assert args[args.index("--rdzv-id") + 1] == "c"
    conf = dict(kv.split("=") for kv in args[args.index("--rdzv-conf") + 1].split(","))
    assert conf["last_call_timeout"] == "1" and conf["cluster"] == "c" and conf["node"] == "n1"
    assert args[args.index("--start-method") + 1] == "fork"
    assert args[-4:] == ["--run-path", "train.py", "--lr", "0.1"]
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_plan_other_commands_run_without_python() -> None:
    plan = launch.build_plan(
        ["--cluster", "c", "--node", "n1", "--etcd", "http://e:1", "--nnodes", "2", "--", "./train.sh", "x"]
    )
    assert plan.torchrun_args[-3:] == ["--no-python", "./train.sh", "x"]
    assert plan.torchrun_args[plan.torchrun_args.index("--nnodes") + 1] == "2:2"
    module = launch.build_plan(
        [
            "--cluster",
            "c",
            "--node",
            "n",
            "--etcd",
            "http://e:1",
            "--nnodes",
            "1:2",
            "--",
            "python",
            "-m",
            "pkg.train",
            "a",
        ]
    )
    assert module.module == "pkg.train" and module.torchrun_args[-2:] == ["spotrun-module", "a"]


def test_plan_requires_a_command() -> None:
    with pytest.raises(SystemExit):
        launch.build_plan(["--cluster", "c", "--node", "n", "--etcd", "http://e:1", "--nnodes", "1:2"])


def test_agent_rendezvouses_again_when_the_new_round_lost_a_member(monkeypatch) -> None:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from spotrun.elastic.rendezvous.store import RoundBrokenError

    calls: list[str] = []

    def rendezvous(self, worker_group) -> None:
        calls.append(worker_group)
        if len(calls) == 1:
            raise RoundBrokenError("round 3 lost a member after its ranks were assigned")

    monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", rendezvous)
    launch._rendezvous_again_when_broken()
    patched = SimpleElasticAgent._rendezvous
    launch._rendezvous_again_when_broken()
    assert SimpleElasticAgent._rendezvous is patched, "idempotent: one retry loop, not two nested"
    SimpleElasticAgent._rendezvous(object(), "group")
    assert calls == ["group", "group"], "the broken round is left and a new one joined"

    def failing(self, worker_group) -> None:
        raise RuntimeError("any other failure")

    monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", failing)
    launch._rendezvous_again_when_broken()
    with pytest.raises(RuntimeError):
        SimpleElasticAgent._rendezvous(object(), "group")


# --- end to end ---------------------------------------------------------------------------


@pytest.mark.slow
def test_three_nodes_train_to_the_end(etcd_server, cluster: str, tmp_path: Path) -> None:
    j = Job(etcd_server.endpoint, cluster, tmp_path, nnodes="3:3", steps=30)
    try:
        nodes = [j.start(f"n{i}") for i in range(1, 4)]
        for launcher in nodes:
            assert launcher.proc.wait(90) == 0, launcher.log.read_text()[-3000:]
        for launcher in nodes:
            steps = launcher.steps()
            assert steps[-1][0] == 30 and steps[-1][1] == 3
            assert {w for _, w, _, _ in steps} == {3}
    finally:
        j.stop_all()


@pytest.mark.slow
def test_nodes_with_different_worker_counts_get_node_major_ranks(etcd_server, cluster: str, tmp_path: Path) -> None:
    """A VM of 2 workers and one of 1 (8 x A100 beside 4 x A10G, scaled down): world 3, each node's
    ranks one contiguous block."""
    j = Job(etcd_server.endpoint, cluster, tmp_path, nnodes="2:2", steps=20)
    try:
        nodes = [j.start("n1", "--nproc-per-node", "2"), j.start("n2", "--nproc-per-node", "1")]
        for launcher in nodes:
            assert launcher.proc.wait(90) == 0, launcher.log.read_text()[-3000:]
        ranks = {launcher.node: sorted({r for _, w, r, _ in launcher.steps() if w == 3}) for launcher in nodes}
        assert sorted(ranks.values()) in ([[0], [1, 2]], [[0, 1], [2]]), ranks
        assert len(ranks["n1"]) == 2 and len(ranks["n2"]) == 1, ranks
        assert all(launcher.steps()[-1][0] == 20 for launcher in nodes)
    finally:
        j.stop_all()


@pytest.mark.slow
def test_join_leave_kill_and_rank0_leave(job: Job, etcd_server) -> None:
    """3 nodes; a 4th joins (coordinated); it leaves (SIGTERM); one is hard-killed; rank 0 leaves (SIGUSR1)."""
    st = store_mod.connect([etcd_server.endpoint])
    try:
        for i in range(1, 4):
            job.start(f"n{i}")
        job.form(3, ["n1", "n2", "n3"], st)

        # Join: the newcomer waits (waiting key), the trainer restarts at a step boundary, world 4.
        waiting = schema.rdzv_key(job.cluster, job.cluster, schema.RdzvPart.WAITING, "n4")
        job.start("n4")
        deadline = time.time() + 60
        while st.get(waiting) is None:
            assert time.time() < deadline, job.launchers["n4"].log.read_text()[-3000:]
            time.sleep(0.05)
        seen = time.time()
        (job.state_dir / "restart").touch()
        t4 = job.first_step_at(4, seen, ["n1", "n2", "n3", "n4"])
        _report("join (waiting key seen -> first step at world 4)", t4 - seen)
        assert t4 - seen < BOUND_S
        assert st.get(waiting) is None
    finally:
        st.close()

    # Graceful leave now (SIGTERM).
    t0 = time.time()
    job.launchers["n4"].signal(signal.SIGTERM)
    t3 = job.first_step_at(3, t0, ["n1", "n2", "n3"])
    _report("graceful leave, SIGTERM (signal -> first step at world 3)", t3 - t0)
    assert t3 - t0 < BOUND_S
    assert job.launchers["n4"].proc.wait(15) == 0

    # Hard kill: the whole process group of a node that does not host rank 0.
    rank0 = job.rank0(3)
    victim = next(n for n in ("n3", "n2", "n1") if n != rank0)
    survivors = [n for n in ("n1", "n2", "n3") if n != victim]
    t0 = time.time()
    job.launchers[victim].kill_group()
    t2 = job.first_step_at(2, t0, survivors)
    _report("hard kill, SIGKILL (kill -> first step at world 2)", t2 - t0)
    assert t2 - t0 < BOUND_S

    # The node hosting rank 0 leaves at the next rendezvous (SIGUSR1, then the trainer restarts).
    rank0 = job.rank0(2)
    rest = [n for n in survivors if n != rank0]
    job.launchers[rank0].signal(signal.SIGUSR1)
    time.sleep(0.3)
    t0 = time.time()
    (job.state_dir / "restart").touch()
    t1 = job.first_step_at(1, t0, rest)
    _report("rank-0 node leaves, SIGUSR1 (restart -> first step at world 1)", t1 - t0)
    assert t1 - t0 < BOUND_S
    assert job.launchers[rank0].proc.wait(15) == 0
    before = max(s for s, _, _, _ in job.launchers[rank0].steps())
    after = min(s for s, w, _, t in job.launchers[rest[0]].steps() if w == 1)
    assert after <= before + 1  # resumed from the step counter, no step lost


@pytest.mark.slow
def test_silently_vanished_node_is_dropped_by_its_lease(job: Job, etcd_server) -> None:
    """SIGSTOP a node's whole process group: no connection reset, only its etcd lease expires."""
    st = store_mod.connect([etcd_server.endpoint])
    try:
        job.start("n1")
        job.start("n2")
        job.form(2, ["n1", "n2"], st)
    finally:
        st.close()
    victim = job.launchers["n2"]
    t0 = time.time()
    os.killpg(victim.proc.pid, signal.SIGSTOP)
    t1 = job.first_step_at(1, t0, ["n1"])
    _report("silent vanish, SIGSTOP (stop -> first step at world 1)", t1 - t0)
    assert t1 - t0 < BOUND_S  # not the 60 s collective timeout


@pytest.mark.slow
def test_worker_stuck_in_a_collective_is_killed_within_the_shutdown_bound(job: Job, etcd_server) -> None:
    """A survivor's worker that ignores SIGTERM while blocked in a collective (an NCCL hang): the
    broken round makes its agent stop it, SIGKILL follows after the launcher's 5 s (torch alone: 30 s)."""
    stuck = ("--stuck-on-failure",)
    st = store_mod.connect([etcd_server.endpoint])
    try:
        job.start("n1", script_args=stuck)
        job.start("n2", script_args=stuck)
        job.form(2, ["n1", "n2"], st)
    finally:
        st.close()
    t0 = time.time()
    job.launchers["n2"].kill_group()
    t1 = job.first_step_at(1, t0, ["n1"])
    _report("peer killed, survivor's worker ignores SIGTERM (kill -> first step at world 1)", t1 - t0)
    assert t1 - t0 < BOUND_S < 30, "the stuck worker must be killed at the launcher's bound, not torch's 30 s"


@pytest.mark.slow
def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def test_leave_signal_during_torch_import_exits_0_without_joining(job: Job, etcd_server) -> None:
    launcher = job.start("n1")
    deadline = time.monotonic() + 30
    while not _catches(launcher.proc.pid, signal.SIGUSR1):  # set before torch's import starts
        assert time.monotonic() < deadline and launcher.proc.poll() is None, launcher.log.read_text()
        time.sleep(0.005)
    launcher.signal(signal.SIGUSR1)
    assert launcher.proc.wait(60) == 0, launcher.log.read_text()
    with store_mod.connect([etcd_server.endpoint]) as st:
        assert st.get_prefix(schema.rdzv_key(job.cluster, job.cluster, schema.RdzvPart.ALIVE)) == [], "it never joined"
    assert not launcher.steps()


def test_parked_spare_stays_out_until_activated_or_leaves_without_joining(job: Job, etcd_server) -> None:
    st = store_mod.connect([etcd_server.endpoint])
    try:
        job.start("n1")
        job.form(1, ["n1"], st)
        parked, leaver = job.tmp / "n2.standby", job.tmp / "n3.standby"
        parked.touch()
        leaver.touch()
        job.start("n2", "--standby-file", str(parked))
        job.start("n3", "--standby-file", str(leaver))
        alive = schema.rdzv_key(job.cluster, job.cluster, schema.RdzvPart.ALIVE)
        time.sleep(8)  # past torch's import: a launcher that did not park would be in the rendezvous
        assert {k.rsplit("/", 1)[-1] for k, _, _ in st.get_prefix(alive)} == {"n1"}, "spares stay out"
        assert job.launchers["n1"].steps()[-1][1] == 1
        job.launchers["n3"].signal(signal.SIGUSR1)
        assert job.launchers["n3"].proc.wait(30) == 0, "a spare told to leave while parked exits 0"
        assert not job.launchers["n3"].steps()
        activated = time.time()
        parked.unlink()
        job.form(2, ["n1", "n2"], st)
        _report("spare activated -> first step at world 2", job.first_step_at(2, activated, ["n1", "n2"]) - activated)
    finally:
        st.close()
