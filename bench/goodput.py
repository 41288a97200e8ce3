"""Goodput: the quickstart job through a fixed preemption schedule, spotrun against relaunch-all.

Four runs of the same job (bench/_bench_train.py: the quickstart CNN, `--steps` steps of a
global batch of 48, `--delay` s of emulated accelerator time per step at world 3, 1.5x that at
world 2: see _bench_train.py) on 3 local VMs (real sshd VMs, agents, etcd
rendezvous, a private etcd), one after the other:

- undisturbed: no preemption; the controller runs. Wall time T0 = first step -> last step.
- spotrun: the controller keeps the cluster at 3 while the schedule preempts (the agents act on
  notices, the trainer saves agreed and emergency checkpoints), with `--spares` (default 1) warm
  spares: billed, parked outside the job, never a schedule's victim. Wall time T1.
- spotrun without spares: the same with `nodes.spares: 0` (case `goodput without spares`).
- baseline "relaunch-all" (what SkyPilot's managed jobs do): the same script with `--plain`
  (periodic checkpoints every `--every` steps only: no emergency save, and no notice reaches a
  VM, so no agreed checkpoint either). The controller is stopped after each `up`. Each
  preemption kills its VM at its deadline (a notice is ignored, as SkyPilot ignores it: the
  cluster trains on until the VM dies), then at once (detection is instant, which favours the
  baseline: SkyPilot polls) the whole cluster goes down (`spotrun down`, checkpoints kept) and
  comes back (`spotrun up`, 3 fresh VMs), resuming from the newest periodic checkpoint.
  Wall time T_baseline.

The schedule (`--schedule`, `AT:NOTICE[:INDEX]` entries) is in seconds after the run's first
step, the same for every disturbed run; INDEX picks the victim among the live, not yet noticed
training VMs (never a spare) in launch order (mod their count). Victims may hold rank 0.

Time is compressed: an 8 s notice stands for AWS's 2 minutes (15x). At the same scale every VM
takes `--boot` = 8 s from launch to SSH (local VMs' `boot_s`: about 2 minutes of a real GPU VM's
boot), for spotrun's replacements and the baseline's relaunches alike, and the default schedule
(5 preemptions, 2 without notice, 20 s apart in a ~100 s job) is one preemption every 5 minutes:
far harsher than any public spot trace. `--boot 0 --steps 1000 --schedule
6:8:0,14:0:1,22:8:2,30:0:0,38:8:1` is the earlier, denser setting (instant VMs, 8 s apart).

Cases (one JSON line each, bench format of the design notes):
  goodput              useful steps per wall-second relative to undisturbed: T0/T1 and T0/T_baseline
  goodput without spares  the same for spotrun with no warm spare
  steps recomputed     step numbers completed more than once (rank 0's log lines, all nodes)
  cost per 1000 steps  $ from the ledger (every segment of every VM of the run, from launch to
                       the last step, spares included), / steps * 1000. Local VMs are priced
                       `--price` $/h each.
Goal: goodput >= 0.9 for spotrun, and >= 1.5x the baseline's.

Run as root: .venv/bin/python bench/goodput.py [--only spotrun,no-spare,baseline] [--spares 1] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _format import emit
from _shared import SHARED_STEPS_ENV, local_recipe, wait_until
from _steps import Kind, Line, Timeline
from _workdir import job_workdir, make_data

from spotrun.controller.bootstrap import QuietReporter

NODES = 3
GOAL_GOODPUT, GOAL_RATIO = 0.9, 1.5
DEFAULT_SCHEDULE = "10:8:0,30:0:1,50:8:2,70:0:0,90:8:1"


@dataclass(frozen=True)
class Entry:
    at: float  # seconds after the run's first step
    notice: float  # 0: hard kill
    index: int  # victim: live, not noticed VMs in launch order, mod their count


def parse_schedule(text: str) -> list[Entry]:
    entries = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        entries.append(Entry(float(parts[0]), float(parts[1]), int(parts[2]) if len(parts) > 2 else len(entries)))
    return sorted(entries, key=lambda e: e.at)


@dataclass
class Result:
    name: str
    first: float | None = None  # time of the first step line
    last: float | None = None  # time of the line of the final step
    lines: int = 0  # step lines printed by rank 0, repeats included
    recomputed: int = 0
    cost: float | None = None
    on_demand_cost: float | None = None
    vms: int = 0
    fired: list[dict] = field(default_factory=list)
    stalls: list[dict] = field(default_factory=list)
    world_s: dict[int, float] = field(default_factory=dict)
    step_s: float | None = None  # median seconds per step
    reached: int = 0  # highest step completed
    boots: int = 0  # worker starts of rank 0 (1 + every re-formation or relaunch)
    trainer_init_s: list[float] = field(default_factory=list)  # per rank start: process group, DDP, resume
    error: str | None = None

    @property
    def wall(self) -> float | None:
        return self.last - self.first if self.first is not None and self.last is not None else None


# -- the three runs -------------------------------------------------------------------------------


def _stop_controller(cluster: str) -> None:
    from spotrun.controller.daemon import running_pid, stop_daemon

    # A daemon started a moment ago may not have exec'd yet (its cmdline is still ours): wait.
    wait_until(lambda: running_pid(cluster) is not None, 5.0)
    stop_daemon(cluster)


def _live(cluster: str, exclude: set[str]) -> list[str]:
    """Running VMs of the cluster in launch order, from the provider."""
    from spotrun.client.nodes import find_nodes

    _, found = find_nodes(cluster, None)
    return [inst.id for _, inst in found if inst.state.value == "running" and inst.id not in exclude]


class Run:
    """One cluster: writes its recipe, brings it up, follows its steps, reads its ledger."""

    def __init__(self, name: str, tmp: Path, endpoint: str, args, *, plain: bool, spares: int = 0) -> None:
        self.name, self.args = name, args
        self.recipe = tmp / f"{name}.yaml"
        self.recipe.write_text(
            local_recipe(
                name,
                target=NODES,
                spares=spares,
                spot=args.price,
                on_demand=args.price * 3,
                boot_s=args.boot,
                run=f"python train.py --steps {args.steps} --delay {args.delay} --ref-world {NODES}"
                + (" --plain" if plain else ""),
                env=SHARED_STEPS_ENV,
                checkpoint={"dir": "checkpoints", "every_steps": args.every, "keep": 3},
                endpoint=endpoint,
            )
        )
        self.endpoint = endpoint
        home = Path(os.environ["SPOTRUN_HOME"])
        self.steps_dir = home / "local" / "shared" / name / "steps"  # the step lines, one log per node
        self.timeline = Timeline(lambda: {p.stem: p for p in sorted(self.steps_dir.glob("*.log"))})
        self.result = Result(name)
        self.vms: set[str] = set()

    def up(self, *, controller: bool) -> float:
        from spotrun.client.up import up

        start = time.perf_counter()
        result = up(self.recipe, train=True, reporter_factory=QuietReporter)
        self.vms.update(result.nodes)
        if not controller:
            _stop_controller(self.name)
        return time.perf_counter() - start

    def wait_first(self, timeout: float) -> float:
        def seen() -> float | None:
            self.timeline.refresh()
            steps = self.timeline.steps()
            return steps[0].t if steps else None

        first = wait_until(seen, timeout)
        if first is None:
            raise RuntimeError(f"{self.name}: no training step within {timeout:.0f} s")
        self.result.first = first
        return first

    def standby(self) -> set[str]:
        """The warm spares: VMs outside the training job, never a schedule's victim."""
        from spotrun.state.store import connect

        store = connect([self.endpoint])
        try:
            return store.list_standby(self.name)
        finally:
            store.close()

    def finished(self) -> float | None:
        """When the final step was done, if it was."""
        self.timeline.refresh()
        return min((s.t for s in self.timeline.steps() if s.step == self.args.steps), default=None)

    def conclude(self) -> None:
        """Figures from the step lines and the ledger (billed up to the last step)."""
        from spotrun.state.ledger import summarize
        from spotrun.state.store import connect

        r, steps, boots = self.result, self.timeline.steps(), self.timeline.of(Kind.BOOT)
        r.lines, r.boots = len(steps), len(boots)
        r.trainer_init_s = [x.t - x.t0 for x in self.timeline.lines if x.kind is Kind.RANK]
        r.reached = max((s.step for s in steps), default=0)
        r.recomputed = len(steps) - len({s.step for s in steps})
        gaps = [b.t - a.t for a, b in pairwise(steps)]
        r.step_s = statistics.median(gaps) if gaps else None
        for s, gap in zip(steps, gaps, strict=False):  # the last step has no gap after it
            r.world_s[s.world] = r.world_s.get(s.world, 0.0) + gap
        # Stalls: gaps of more than 5 median steps; where the time between two steps went.
        if r.step_s:
            for a, b in pairwise(steps):
                if b.t - a.t > 5 * r.step_s:
                    ready = [x.t for x in boots if a.t <= x.t <= b.t]
                    r.stalls.append(
                        {
                            "at_s": round(a.t - r.first, 2),
                            "s": round(b.t - a.t, 2),
                            "world": f"{a.world}->{b.world}",
                            "step": f"{a.step}->{b.step}",
                            **({"workers_ready_after_s": round(max(ready) - a.t, 2)} if ready else {}),
                        }
                    )
        store = connect([self.endpoint])
        try:
            segments = [s for segs in store.list_ledger(self.name).values() for s in segs]
        finally:
            store.close()
        until = r.last if r.last is not None else time.time()
        clipped = [s for s in segments if s.start < until]
        cost = summarize([_clip(s, until) for s in clipped], now=until)
        r.cost, r.on_demand_cost, r.vms = cost.total, cost.on_demand_total, len({s.node for s in segments})

    def _dump_events(self, path: Path) -> None:
        try:
            path.write_text(_events_text(self.endpoint, self.name))
        except Exception as exc:
            path.write_text(f"could not read events: {exc}\n")

    def down(self, keep: Path | None = None) -> None:
        from spotrun.client.down import down
        from spotrun.state import clusterfile

        if keep is not None:  # purge deletes the shared dir and the VM dirs
            from spotrun.providers.local.provider import LocalProvider

            home = Path(os.environ["SPOTRUN_HOME"]) / "local"
            ids = {i.id for i in LocalProvider(root=home).instances(self.name)}
            (keep / self.name).mkdir(parents=True, exist_ok=True)
            self._dump_events(keep / self.name / "events.txt")
            from spotrun.paths import cluster_dir

            if (cluster_dir(self.name) / "controller.log").exists():
                shutil.copy(cluster_dir(self.name) / "controller.log", keep / self.name / "controller.log")
            for log in [*self.steps_dir.glob("*.log"), *home.glob("vms/*/home/.spotrun/*.log")]:
                vm = log.parts[-4] if log.parent.name == ".spotrun" else None
                if vm is None or vm in ids:
                    where = keep / self.name / (vm or "steps")
                    where.mkdir(parents=True, exist_ok=True)
                    shutil.copy(log, where / log.name)
        if self.name in clusterfile.names():
            down(self.name, purge=True)


def _events_text(endpoint: str, cluster: str) -> str:
    from spotrun.state.store import connect

    store = connect([endpoint])
    try:
        return "".join(f"{e.at:.3f} {e.kind:10} {e.node or '-':24} {e.message}\n" for e in store.list_events(cluster))
    finally:
        store.close()


def _clip(segment, until: float):
    from dataclasses import replace

    return replace(segment, end=min(segment.end, until)) if segment.end is not None else segment


def run_undisturbed(run: Run, timeout: float) -> None:
    run.up(controller=True)
    run.wait_first(180)
    run.result.last = wait_until(run.finished, timeout, 0.1)
    if run.result.last is None:
        raise RuntimeError(f"undisturbed: step {run.args.steps} not reached in {timeout:.0f} s")


def run_spotrun(run: Run, schedule: list[Entry], timeout: float) -> None:
    from spotrun.client.nodes import preempt

    run.up(controller=True)
    first = run.wait_first(180)
    noticed: set[str] = set()
    pending = list(schedule)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (last := run.finished()) is not None:
            run.result.last = last
            break
        now = time.time()
        while pending and now >= first + pending[0].at:
            entry = pending.pop(0)
            live = _live(run.name, noticed | run.standby())
            if not live:
                run.result.fired.append({"at_s": entry.at, "skipped": "no live VM"})
                continue
            victim = live[entry.index % len(live)]
            ranked = _rank0(run)
            preempt(run.name, victim, entry.notice)
            if entry.notice > 0:
                noticed.add(victim)
            run.result.fired.append(
                {"at_s": round(time.time() - first, 2), "notice_s": entry.notice, "victim_rank0": victim == ranked}
            )
        time.sleep(0.1)
    else:
        raise RuntimeError(f"spotrun: step {run.args.steps} not reached in {timeout:.0f} s")
    run.result.vms = len(run.vms)


def _rank0(run: Run) -> str | None:
    run.timeline.refresh()
    return run.timeline.rank0_source()


def run_baseline(run: Run, schedule: list[Entry], timeout: float) -> None:
    """Relaunch-all: on each VM death, down the whole cluster and up a fresh one.

    The schedule's victim is picked when its entry comes (its notice time) and dies at its
    deadline; a victim that an earlier relaunch already tore down has nothing left to lose
    (two VMs dying together cost one relaunch, as they would with SkyPilot)."""
    from spotrun.client.down import down
    from spotrun.client.nodes import preempt

    run.up(controller=False)
    first = run.wait_first(180)
    pending = list(schedule)
    deaths: list[tuple[float, Entry, str | None]] = []  # (seconds after the first step, entry, victim)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (last := run.finished()) is not None:
            run.result.last = last
            break
        now = time.time()
        while pending and now >= first + pending[0].at:
            entry = pending.pop(0)
            live = _live(run.name, set())
            deaths.append((entry.at + entry.notice, entry, live[entry.index % len(live)] if live else None))
            deaths.sort(key=lambda d: d[0])
        if deaths and now >= first + deaths[0][0]:
            due, entry, victim = deaths.pop(0)
            if victim is None or victim not in _live(run.name, set()):
                run.result.fired.append(
                    {
                        "at_s": round(now - first, 2),
                        "scheduled_s": due,
                        "notice_s": entry.notice,
                        "skipped": "victim already gone with an earlier relaunch",
                    }
                )
                continue
            run.timeline.refresh()
            before = max((s.step for s in run.timeline.steps()), default=0)
            killed = time.time()
            preempt(run.name, victim, 0)
            down(run.name)  # checkpoints (shared dir) and ledger stay
            down_s = time.time() - killed
            up_s = run.up(controller=False)
            resumed = wait_until(partial(_first_after, run, killed + down_s), 120, 0.05)
            boot = [b for b in run.timeline.of(Kind.BOOT) if b.t0 >= killed]
            run.result.fired.append(
                {
                    "at_s": round(killed - first, 2),
                    "scheduled_s": due,
                    "notice_s": entry.notice,
                    "down_s": round(down_s, 2),
                    "up_s": round(up_s, 2),
                    **({"resumed_from": min(b.step for b in boot), "last_step_before": before} if boot else {}),
                    **({"kill_to_first_step_s": round(resumed.t - killed, 2)} if resumed else {}),
                }
            )
        time.sleep(0.1)
    else:
        raise RuntimeError(f"baseline: step {run.args.steps} not reached in {timeout:.0f} s")


def _first_after(run: Run, t: float) -> Line | None:
    run.timeline.refresh()
    after = [s for s in run.timeline.steps() if s.t > t]
    return min(after) if after else None


# -- main -----------------------------------------------------------------------------------------


def _attempt(label: str, fn, run: Run, *a, keep: Path | None = None) -> None:
    try:
        fn(run, *a)
        run.conclude()
    except Exception as exc:
        run.result.error = f"{type(exc).__name__}: {exc}"
        print(f"{label} failed: {run.result.error}", file=sys.stderr)
        with contextlib.suppress(Exception):
            run.conclude()
    finally:
        try:
            run.down(keep)
        except Exception as exc:
            print(f"{label}: down failed: {exc}", file=sys.stderr)


def report(
    und: Result, spot: Result | None, base: Result | None, schedule: list[Entry], args, bare: Result | None = None
) -> None:
    """`spot` ran with `args.spares` warm spares, `bare` (if run) with none."""
    t0 = und.wall
    gp = lambda r: (t0 / r.wall) if (r is not None and r.wall and t0) else None  # noqa: E731
    ours, theirs = gp(spot), gp(base)
    setup = {
        "nodes": NODES,
        "spares": args.spares,
        "steps": args.steps,
        "delay_s": args.delay,
        "periodic_every_steps": args.every,
        "boot_s": args.boot,
        "schedule": [f"{e.at:g}s notice {e.notice:g}s" for e in schedule],
    }
    extra: dict = {
        "t_undisturbed_s": _r(t0),
        "t_spotrun_s": _r(spot.wall if spot else None),
        "t_baseline_s": _r(base.wall if base else None),
        "goal": GOAL_GOODPUT,
        "goal_ratio_to_baseline": GOAL_RATIO,
        **setup,
    }
    if ours and theirs:
        extra["ratio_to_baseline"] = round(ours / theirs, 2)
    for r in (und, spot, bare, base):
        if r is not None and r.error:
            extra[f"{r.name}_error"] = r.error
            extra[f"{r.name}_reached_step"] = r.reached
    _line("goodput", "ratio", ours, theirs, extra)
    if bare is not None:
        _line(
            "goodput without spares",
            "ratio",
            gp(bare),
            theirs,
            {
                "t_spotrun_s": _r(bare.wall),
                "spares": 0,
                **({"ratio_to_baseline": round(gp(bare) / theirs, 2)} if gp(bare) and theirs else {}),
            },
        )
    _line(
        "steps recomputed",
        "steps",
        spot.recomputed if spot else None,
        base.recomputed if base else None,
        {
            "undisturbed": und.recomputed,
            "without_spares": bare.recomputed if bare else None,
            "spotrun_step_lines": spot.lines if spot else None,
            "baseline_step_lines": base.lines if base else None,
        },
    )
    per = lambda r: r.cost / args.steps * 1000 if r is not None and r.cost is not None and r.last else None  # noqa: E731
    _line(
        "cost per 1000 steps",
        "$",
        per(spot),
        per(base),
        {
            "undisturbed": _r(per(und), 6),
            "without_spares": _r(per(bare), 6),
            "price_per_vm_hour": args.price,
            "vms_billed": {r.name: r.vms for r in (und, spot, bare, base) if r is not None},
            "note": "ledger segments of every VM of the run (spares included), launch -> last step",
        },
    )
    detail = {
        r.name: {
            "median_step_s": _r(r.step_s, 4),
            "world_s": {k: round(v, 1) for k, v in sorted(r.world_s.items())},
            "worker_starts": r.boots,
            "stall_s": round(sum(s["s"] for s in r.stalls), 2),
            "trainer_init_s": {
                "median": _r(statistics.median(r.trainer_init_s) if r.trainer_init_s else None, 3),
                "max": _r(max(r.trainer_init_s, default=None), 3),
            },
            "stalls_n": len(r.stalls),
            "largest_stalls": sorted(r.stalls, key=lambda s: -s["s"])[:6],
            "events": r.fired,
        }
        for r in (und, spot, bare, base)
        if r is not None
    }
    print(json.dumps({"bench": "goodput", "case": "where the time goes", "detail": detail}), flush=True)


def _line(case: str, unit: str, ours, theirs, extra: dict) -> None:
    if ours is not None:
        emit("goodput", case, unit, ours, theirs, **extra)
    else:
        print(
            json.dumps(
                {
                    "bench": "goodput",
                    "case": case,
                    "unit": unit,
                    "spotrun": None,
                    "baseline": None if theirs is None else round(theirs, 4),
                    **extra,
                }
            ),
            flush=True,
        )


def _r(value, digits: int = 2):
    return None if value is None else round(value, digits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        default="spotrun,no-spare,baseline",
        help="disturbed runs to make, of spotrun (with --spares), no-spare (spotrun without "
        "spares), baseline (default: all three)",
    )
    parser.add_argument("--spares", type=int, default=1, help="warm spares of the spotrun run (nodes.spares)")
    parser.add_argument("--steps", type=int, default=2500, help="training steps of every run")
    parser.add_argument(
        "--delay",
        type=float,
        default=0.03,
        help="emulated accelerator time per step at world 3 (s; scales with each node's share)",
    )
    parser.add_argument("--every", type=int, default=50, help="periodic checkpoint every N steps (all runs)")
    parser.add_argument("--schedule", default=DEFAULT_SCHEDULE, help="AT:NOTICE[:INDEX],... after the first step")
    parser.add_argument("--price", type=float, default=1.0, help="spot $/hour of one VM (on-demand: 3x)")
    parser.add_argument(
        "--boot",
        type=float,
        default=8.0,
        help="emulated launch-to-SSH time of every VM (s; 0: local VMs' own, under 1 s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=400.0,
        help="max seconds of training per run (a disturbed run also stops at 3 x T0)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs) and print its path")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/goodput.py needs root (the local provider's VMs use namespaces)")
    schedule = parse_schedule(args.schedule)
    only = set(filter(None, args.only.split(",")))
    if not only or only - {"spotrun", "no-spare", "baseline"}:
        raise SystemExit("--only: a comma list of spotrun, no-spare, baseline")
    tmp = Path(tempfile.mkdtemp(prefix="spotrun-bench-goodput-"))
    try:
        os.environ["SPOTRUN_HOME"] = str(tmp / "home")
        keep = tmp / "logs" if args.keep else None
        data = tmp / "data.pt"
        make_data(data, 3000)
        job_workdir(tmp / "work", data)
        from spotrun.state.etcd_server import EtcdProcess

        spot = bare = base = None
        with EtcdProcess(tmp / "etcd") as etcd:
            und = Run("gp-undisturbed", tmp, etcd.endpoint, args, plain=False)
            _attempt("undisturbed", run_undisturbed, und, args.timeout, keep=keep)
            # A disturbed run that takes 3 x T0 has a goodput under 0.33: stop it there (a hang).
            limit = min(args.timeout, 3 * und.result.wall) if und.result.wall else args.timeout
            if "spotrun" in only:
                spot = Run("gp-spotrun", tmp, etcd.endpoint, args, plain=False, spares=args.spares)
                _attempt("spotrun", run_spotrun, spot, schedule, limit, keep=keep)
            if "no-spare" in only and args.spares > 0:
                bare = Run("gp-spotrun-nospare", tmp, etcd.endpoint, args, plain=False)
                _attempt("spotrun without spares", run_spotrun, bare, schedule, limit, keep=keep)
            if "baseline" in only:
                base = Run("gp-baseline", tmp, etcd.endpoint, args, plain=True)
                _attempt("baseline", run_baseline, base, schedule, limit, keep=keep)
        report(
            und.result,
            spot.result if spot else None,
            base.result if base else None,
            schedule,
            args,
            bare.result if bare else None,
        )
    finally:
        if args.keep:
            print(f"logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
