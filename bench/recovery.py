"""Recovery: how fast training continues after a notice, a hard kill and a scale-up.

One run does both sides, one after the other, on the quickstart model (bench/_bench_train.py,
global rank 0 prints `STEP <n> WORLD <w> T <time>` for every step):

- spotrun: `spotrun up` of 3 local VMs (real sshd VMs, agents, etcd rendezvous, pre-warmed
  launcher). The controller daemon is stopped while the notice and the kill are measured, so the
  world really shrinks 3 -> 2 (with it running, a replacement would race the survivors); it is
  started again to refill the cluster to 3 between cases, and runs for the scale-up.
- baseline: the same script under plain `torchrun --rdzv-backend=c10d --nnodes=1:4
  --max-restarts=100`, torch's default settings otherwise, periodic checkpoints only (no
  emergency save); 3 torchrun agents as host processes in their own sessions. The c10d store
  lives in the first agent (`is_host=1`; all agents share 127.0.0.1, so it is named rather than
  inferred from the host name), and that agent is never killed: with it gone plain torchrun
  cannot recover at all. Refills start one more agent.

Schedule, the same on both sides (victims never hold global rank 0 or the baseline's store):
  notice   spotrun: `preempt NODE --notice 8`; the clock starts when the noticed agent records
           its "leaving" event (5 s before the deadline). baseline: SIGTERM to one torchrun agent.
  refill   back to 3 nodes (spotrun: the controller launches a replacement; baseline: a new agent)
  hard kill spotrun: `preempt NODE --notice 0` (the whole VM dies); baseline: SIGKILL the agent and
           its workers. The clock starts at the kill.
  refill   back to 3 nodes
  scale up spotrun: `scale 4`, the clock starts at the new node's "ready" event (its agent is up and
  its launcher waits in the rendezvous, i.e. the node is ready to train);
           baseline: a 4th agent, the clock starts at its rendezvous join attempt (or its start).
Each figure = event -> first completed step at the new world size (seconds); steps_lost = steps
printed more than once on the merged timeline, counted for the case in whose window the repeat
falls. Baseline waits are bounded (--baseline-timeout, 180 s); a case that does not recover is
reported with `"baseline": null` and `baseline_timed_out_s`, or `baseline_failed` (the last error
torchrun logged) when the job died before the bound (its store host or every agent exited).

What plain torchrun (c10d, defaults, torch 2.13) needs, as observed here, and why the bound is 180 s:
- one re-formation after losing a node: ~15 s until the dead node's keep-alive lapses (5 s x 3),
  then the 30 s last call of the `--nnodes=1:4` round, then the workers' start: ~40-47 s;
- the agents share one TCPStore with their workers (TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset), and a
  re-formed gloo group can read the previous incarnation's peer address from it ("Connection
  refused" in connectFullMesh, more likely when the CPUs are busy and one worker starts late). That
  worker group fails, the agents re-rendezvous once more (another >= 30 s) and their restart
  counts diverge: ~80 s with one such extra round (seen), > 90 s with two. The old 90 s bound cut
  such runs off as "timed out"; `baseline_detail` now counts the rounds (`rendezvous_rounds`,
  `worker_group_failures`) so a slow figure says why it is slow;
- scale up: a node that joins a later round with the shared store waits for that round's
  MASTER_ADDR, which the rank-0 agent (bootstrapped in round 0) never writes; the rank-0 agent
  times out after 60 s in _assign_worker_ranks and exits with the store, and the whole job dies.
  This is reported as `baseline_failed`, not as a slow recovery.

Run as root: .venv/bin/python bench/recovery.py [--only spotrun|baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _format import emit
from _shared import local_recipe, wait_until
from _steps import Kind, Timeline
from _torchrun_job import BaselineJob
from _workdir import job_workdir, make_data

from spotrun.controller.bootstrap import QuietReporter

CLUSTER = "recovery"
CASES = ("notice", "hard kill", "scale up")
GOALS = {"notice": 2.0, "hard kill": 5.0, "scale up": 3.0}

# -- what the step lines say ----------------------------------------------------------------------


def steps_lost(timeline: Timeline, windows: list[tuple[str, float]]) -> dict[str, int]:
    """Repeated step numbers per window; `windows` = (name, start time), sorted by time."""
    seen: set[int] = set()
    lost = {name: 0 for name, _ in windows}
    for line in timeline.steps():
        if line.step in seen:
            owner = [name for name, start in windows if start <= line.t]
            if owner:
                lost[owner[-1]] += 1
        seen.add(line.step)
    return lost


def breakdown(timeline: Timeline, event: float, world: int) -> dict[str, float]:
    """Where the time went: event -> new worker started -> trainer ready (group + resume) -> step."""
    boot = timeline.first(event, world, Kind.BOOT)
    step = timeline.first(event, world)
    if boot is None or step is None or not event <= boot.t0 <= step.t:
        return {}
    out = {
        "to_worker_start_s": round(boot.t0 - event, 3),
        "worker_init_s": round(boot.t - boot.t0, 3),
        "to_first_step_s": round(step.t - boot.t, 3),
        "resumed_from": boot.step,
    }
    # Further re-formations at the same size right after (each one a stall): count them and time
    # the event -> first step of the last one ("steady").
    boots = sorted(
        (x for x in timeline.of(Kind.BOOT) if x.world == world and event < x.t0 < event + 10), key=lambda x: x.t
    )
    if len(boots) > 1:
        steady = timeline.first(boots[-1].t, world)
        out["reformations"] = len(boots)
        if steady is not None:
            out["to_steady_s"] = round(steady.t - event, 3)
    return out


@dataclass
class Side:
    """One side's figures: case -> seconds (None: did not recover in time) plus context."""

    seconds: dict[str, float | None] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    context: dict[str, dict] = field(default_factory=dict)
    refills: list[float | None] = field(default_factory=list)
    error: str | None = None


# -- spotrun --------------------------------------------------------------------------------------


def run_spotrun(tmp: Path, data: Path, endpoint: str, args) -> Side:
    from spotrun.client.down import down
    from spotrun.client.nodes import preempt
    from spotrun.client.up import up
    from spotrun.controller.daemon import running_pid, start_daemon, stop_daemon
    from spotrun.controller.scaling import set_target
    from spotrun.state.store import connect

    side = Side()
    home = Path(os.environ["SPOTRUN_HOME"])
    job_workdir(tmp / "work", data)
    recipe = tmp / "recovery.yaml"
    recipe.write_text(
        local_recipe(
            CLUSTER,
            target=3,
            run=f"python train.py --delay {args.delay}",
            env={"OMP_NUM_THREADS": 1},
            checkpoint={"dir": "checkpoints", "every_steps": args.every, "keep": 3},
            endpoint=endpoint,
        )
    )
    vms = home / "local" / "vms"
    timeline = Timeline(lambda: {p.parts[-4]: p for p in vms.glob("*/home/.spotrun/train.log")})
    store = None
    waiting: dict[str, float] = {}
    windows: list[tuple[str, float]] = []

    def events(kind: str) -> list:
        return [e for e in store.list_events(CLUSTER) if e.kind == kind]

    def victim(exclude: set[str]) -> str:
        timeline.refresh()
        rank0 = timeline.rank0_source()
        alive = sorted(store.list_alive(CLUSTER) - exclude - {rank0})
        return alive[0]

    def stop_controller() -> None:
        # A daemon started a moment ago may not have exec'd yet: its /proc cmdline is still ours,
        # running_pid() says None and stop_daemon() stops nothing. Wait until it is recognisable.
        wait_until(lambda: running_pid(CLUSTER) is not None, 5.0)
        stop_daemon(CLUSTER)
        if running_pid(CLUSTER) is not None:
            raise RuntimeError("spotrun: the controller daemon did not stop")

    def refill(after: float, known: set[str]) -> None:
        """Controller on: it replaces the lost node; time its join -> first step at world 3."""
        start_daemon(CLUSTER)
        join = wait_until(lambda: [e for e in events("join") if e.node not in known and e.at > after], 90, 0.1)
        first = timeline.wait_first(join[0].at, 3, 90) if join else None
        side.refills.append(round(first.t - join[0].at, 3) if first else None)
        windows.append(("refill", join[0].at if join else after))
        known.update(e.node for e in events("join"))
        timeline.wait_steps(3, 20, 60)

    try:
        up(recipe, train=True, reporter_factory=QuietReporter)
        stop_controller()
        store = connect([endpoint])
        known = set(store.list_alive(CLUSTER))

        def on_waiting(kind: str, node: str) -> None:
            if kind == "put":
                waiting.setdefault(node, time.time())

        watch = store.watch_rdzv_waiting(CLUSTER, on_waiting)
        if not timeline.wait_steps(3, args.warm_steps, 180):
            raise RuntimeError("spotrun: 3 nodes never trained together")

        # notice
        noticed = victim(set())
        sent = time.time()
        deadline = preempt(CLUSTER, noticed, args.notice)
        leaving = wait_until(lambda: [e for e in events("leaving") if e.node == noticed], args.notice + 5)
        start = leaving[0].at if leaving else sent
        windows.append(("notice", start))
        first = timeline.wait_first(start, 2, 60)
        side.seconds["notice"] = round(first.t - start, 3) if first else None
        side.context["notice"] = {
            "world_before": 3,
            "world_after": 2,
            "notice_s": args.notice,
            "leave_after_notice_s": round(start - sent, 3),
            "victim_rank0": False,
            **breakdown(timeline, start, 2),
        }
        timeline.wait_steps(2, 20, 60)
        time.sleep(max(0.0, deadline + 1.0 - time.time()))  # the VM dies at its deadline
        refill(deadline, known)

        # hard kill
        stop_controller()
        killed = victim({noticed})
        at_step = timeline.wait_mid_interval(args.every)
        start = time.time()
        preempt(CLUSTER, killed, 0)
        windows.append(("hard kill", start))
        first = timeline.wait_first(start, 2, 60)
        side.seconds["hard kill"] = round(first.t - start, 3) if first else None
        side.context["hard kill"] = {
            "world_before": 3,
            "world_after": 2,
            "victim_rank0": False,
            "event_at_step": at_step,
            **breakdown(timeline, start, 2),
        }
        timeline.wait_steps(2, 20, 60)
        refill(start, known)

        # scale up (the controller stays on)
        asked = time.time()
        set_target(store, CLUSTER, 4)
        join = wait_until(lambda: [e for e in events("ready") if e.node not in known and e.at > asked], 90, 0.1)
        if join is None:
            raise RuntimeError("spotrun: no new node became ready after scale 4")
        start = join[0].at
        windows.append(("scale up", start))
        first = timeline.wait_first(start, 4, 60)
        side.seconds["scale up"] = round(first.t - start, 3) if first else None
        new = join[0].node
        side.context["scale up"] = {
            "world_before": 3,
            "world_after": 4,
            "scale_to_join_s": round(start - asked, 3),
            **({"join_to_rdzv_waiting_s": round(waiting[new] - start, 3)} if new in waiting else {}),
            **breakdown(timeline, start, 4),
        }
        timeline.wait_steps(4, 20, 30)
        watch.cancel()
        timeline.refresh()
        side.lost = steps_lost(timeline, windows)
    except Exception as exc:
        side.error = f"{type(exc).__name__}: {exc}"
        print(f"spotrun side failed: {side.error}", file=sys.stderr)
    finally:
        if store is not None:
            store.close()
        if args.keep:  # purge deletes the VM dirs
            for log in vms.glob("*/home/.spotrun/*.log"):
                (tmp / "spot-logs" / log.parts[-4]).mkdir(parents=True, exist_ok=True)
                shutil.copy(log, tmp / "spot-logs" / log.parts[-4] / log.name)
        try:
            down(CLUSTER, purge=True)
        except Exception as exc:
            print(f"spotrun down failed: {exc}", file=sys.stderr)
    return side


# -- baseline: plain torchrun ---------------------------------------------------------------------


def run_baseline(tmp: Path, data: Path, args) -> Side:
    """Each case on a fresh 3-node job: plain torchrun does not always survive one event (a stuck
    re-rendezvous, workers hung in init), so one failure must not take the next cases with it."""
    side = Side()
    timeout = args.baseline_timeout
    for case in CASES:
        job = BaselineJob(tmp, data, case, args)
        try:
            if not job.start_three():
                raise RuntimeError("3 torchrun nodes never trained together")
            clock_from, victim = None, None
            at_step = job.timeline.wait_mid_interval(args.every)
            if case == "notice":  # plain torchrun has no notice handling: SIGTERM when spotrun would leave
                victim = job.victim()
                t = time.time()
                job.nodes[victim].signal(signal.SIGTERM)
                world = 2
            elif case == "hard kill":
                victim = job.victim()
                t = time.time()
                job.nodes[victim].kill()
                world = 2
            else:
                node = job.start("b3")
                t, world = node.started, 4
            event = t
            first, died = job.wait_first(t, world, timeout, victim)
            if case == "scale up":
                t = node.joined_at or node.started
                clock_from = "rendezvous join" if node.joined_at else "agent start"
                first = job.timeline.first(t, world)
            agents = job.agent_log(event)
            if first is None:
                side.seconds[case] = None
                side.context[case] = {
                    "event_at_step": at_step,
                    **agents,
                    **(
                        {
                            "baseline_failed": f"the torchrun job died {time.time() - event:.0f} s after the event "
                            "without a step at the new size"
                        }
                        if died
                        else {"baseline_timed_out_s": timeout}
                    ),
                }
            else:
                side.seconds[case] = round(first.t - t, 3)
                side.context[case] = {
                    "event_at_step": at_step,
                    **(
                        {"clock_from": clock_from, "agent_start_to_join_s": round(t - node.started, 3)}
                        if clock_from
                        else {}
                    ),
                    **breakdown(job.timeline, t, world),
                    **{k: v for k, v in agents.items() if k != "last_error"},
                }
                job.timeline.wait_steps(world, 10, 30)
            job.timeline.refresh()
            side.lost[case] = steps_lost(job.timeline, [("before", 0.0), (case, t)])[case]
        except Exception as exc:
            side.seconds[case] = None
            side.context[case] = {"baseline_error": f"{type(exc).__name__}: {exc}"}
        finally:
            job.stop()
    return side


# -- main -----------------------------------------------------------------------------------------


def report(spot: Side, base: Side) -> None:
    for case in CASES:
        ours, theirs = spot.seconds.get(case), base.seconds.get(case)
        extra: dict = {
            "steps_lost": spot.lost.get(case),
            "baseline_steps_lost": base.lost.get(case),
            "goal_s": GOALS[case],
        }
        extra.update(spot.context.get(case, {}))
        if ours is not None and theirs is not None and ours > 0:
            extra["speedup"] = round(theirs / ours, 1)
        if base.context.get(case):
            extra["baseline_detail"] = base.context[case]
        if case in base.seconds:
            extra["baseline_setup"] = (
                "plain torchrun c10d, fresh 3-node job; its c10d store host is never the victim "
                "(plain torchrun cannot recover without it)"
            )
        if ours is None:
            extra["spotrun_error"] = spot.error or ("did not recover in time" if case in spot.seconds else "not run")
        if ours is not None:
            emit("recovery", case, "s", ours, theirs, **extra)
        else:  # emit() takes a number; keep the same shape with null
            print(
                json.dumps(
                    {"bench": "recovery", "case": case, "unit": "s", "spotrun": None, "baseline": theirs, **extra}
                ),
                flush=True,
            )
    if spot.refills:
        emit(
            "recovery",
            "refill",
            "s",
            _mean(spot.refills) or 0.0,
            note="spotrun only: the controller's replacement joins (2 -> 3) between cases, join event -> "
            "first step at world 3; the baseline runs each case on a fresh 3-node job instead",
            all=spot.refills,
            steps_lost=spot.lost.get("refill"),
        )


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 3) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("spotrun", "baseline"), help="run one side only")
    parser.add_argument("--notice", type=float, default=8.0, help="notice seconds for the `notice` case")
    parser.add_argument("--delay", type=float, default=0.03, help="sleep per training step (s)")
    parser.add_argument("--every", type=int, default=20, help="periodic checkpoint every N steps (both sides)")
    parser.add_argument("--warm-steps", type=int, default=40, help="steps at world 3 before the first event")
    parser.add_argument(
        "--baseline-timeout",
        type=float,
        default=180.0,
        help="max wait per baseline recovery (s); see the module docstring for why 180",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs) and print its path")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/recovery.py needs root (the local provider's VMs use namespaces)")
    from spotrun.simulate.figures import figures_path, record_figures

    figures = figures_path()  # the user's, before SPOTRUN_HOME points at the temp dir
    tmp = Path(tempfile.mkdtemp(prefix="spotrun-bench-recovery-"))
    try:
        os.environ["SPOTRUN_HOME"] = str(tmp / "home")
        data = tmp / "data.pt"
        make_data(data, 3000)
        spot = base = Side()
        if args.only != "baseline":
            from spotrun.state.etcd_server import EtcdProcess

            with EtcdProcess(tmp / "etcd") as etcd:
                spot = run_spotrun(tmp, data, etcd.endpoint, args)
        if args.only != "spotrun":
            base = run_baseline(tmp, data, args)
        report(spot, base)
        measured = {
            key: spot.seconds.get(case)
            for key, case in (
                ("recovery_notice_s", "notice"),
                ("recovery_hard_kill_s", "hard kill"),
                ("scale_up_s", "scale up"),
            )
        }
        if any(v is not None for v in measured.values()):  # `spotrun simulate` reads these
            print(
                f"figures recorded in {record_figures({k: v for k, v in measured.items() if v is not None}, figures)}",
                file=sys.stderr,
            )
    finally:
        if args.keep:
            print(f"logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
