"""Simulation against a real replay: does `spotrun simulate` predict the goodput of a real run?

One run, in a temporary $SPOTRUN_HOME, on the quickstart model (recipes/quickstart/train.py):

1. undisturbed: `up` of nodes.target local VMs, time from the `up` call to the last step.
2. replay: the same job again while a capacity trace is replayed, time-scaled
   (`spotrun.controller.traces.trace_events`): a drop preempts the newest live VMs with a notice so they die
   at the drop (`node_ops.preempt`) and lowers the target to the new capacity
   (`scaling.set_target`, the local cloud has no capacity limit of its own); a rise raises it
   again. Measured goodput = undisturbed time / replay time.
3. simulation: `spotrun.simulate.policies.simulate` of the same trace, time-scaled, with the figures of this run
   (bootstrap = the undisturbed `up` time, step time at the target world size from the
   undisturbed run) and the recorded bench figures for the rest. Simulated goodput likewise.

Prints one line in the bench format: case "goodput", `spotrun` = measured, `baseline` =
simulated (goal: within 10 %). Run: .venv/bin/python bench/simulate_vs_real.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _format import emit
from _shared import local_recipe

from spotrun.controller.bootstrap import QuietReporter

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "simvsreal"
# 300 s ticks; 3 nodes: one lost for 2 ticks, later two lost for 1 tick.
TRACE = (3, 3, 2, 2, 3, 3, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3)


def _store(cluster: str):
    from spotrun.state import clusterfile
    from spotrun.state.control_plane import connect_endpoints

    record = clusterfile.load(cluster)
    return connect_endpoints(record.endpoints, record.tls)


def _step(store, cluster: str) -> int:
    return max((p.step for p in store.list_progress(cluster)), default=0)


def _run(recipe: Path, steps: int, events, timeout: float) -> tuple[float, float, list[tuple[float, int]]]:
    """(seconds from the `up` call to the last step, seconds `up` took, [(t, step)]). Replays
    `events` (from the `up` call) in a thread."""
    from spotrun.client.down import down
    from spotrun.client.up import up

    start = time.monotonic()
    fired = threading.Event()
    thread = threading.Thread(target=_replay, args=(events, start, fired), daemon=True)
    thread.start()
    try:
        up(recipe, reporter_factory=QuietReporter)
        up_s = time.monotonic() - start
        store = _store(CLUSTER)
        seen: list[tuple[float, int]] = []
        while True:
            step = _step(store, CLUSTER)
            now = time.monotonic() - start
            if not seen or seen[-1][1] != step:
                seen.append((now, step))
            if step >= steps:
                break
            if now > timeout:
                raise SystemExit(f"{steps} steps not reached in {timeout:.0f} s (at step {step})")
            time.sleep(0.1)
        store.close()
        return now, up_s, seen
    finally:
        fired.set()
        down(CLUSTER, purge=True)


def _replay(events, start: float, stop: threading.Event) -> None:
    from spotrun.client.nodes import preempt
    from spotrun.controller.placement import providers_of
    from spotrun.controller.scaling import set_target
    from spotrun.state.spec import recipe_from_spec

    capacity = None
    for event in events:
        if stop.wait(max(0.0, start + event.at_s - time.monotonic())):
            return
        try:
            store = _store(CLUSTER)
        except Exception as exc:
            print(f"replay: {exc}", file=sys.stderr)
            continue
        try:
            recipe = recipe_from_spec(store, CLUSTER)
            capacity = recipe.nodes.target if capacity is None else capacity
            noticed = {n.node for n in store.list_notices(CLUSTER)}
            if event.action == "preempt":
                capacity -= event.count
                set_target(store, CLUSTER, max(recipe.nodes.min, capacity))
                live = [
                    i
                    for p in providers_of(recipe.resources)
                    for i in p.instances(CLUSTER)
                    if not i.state.is_gone and i.id not in noticed
                ]
                for inst in sorted(live, key=lambda i: (i.launched_at, i.id), reverse=True)[: event.count]:
                    preempt(CLUSTER, inst.id, event.notice_s)
            else:
                capacity += event.count
                set_target(store, CLUSTER, min(recipe.nodes.max, capacity))
        except Exception as exc:
            print(f"replay {event}: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--tick", type=float, default=6.0, help="replay seconds per 300 s trace tick")
    parser.add_argument("--notice", type=float, default=4.0, help="notice in replay seconds")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()

    from spotrun.controller.traces import Trace, trace_events
    from spotrun.recipe.schema import load_recipe
    from spotrun.simulate.figures import load_figures
    from spotrun.simulate.policies import simulate

    scale = args.tick / 300.0
    trace = Trace(300.0, TRACE, "bench")
    with tempfile.TemporaryDirectory(prefix="spotrun-simvsreal-") as tmp:
        os.environ["SPOTRUN_HOME"] = str(Path(tmp) / "home")
        recipe = Path(tmp) / "recipe.yaml"
        recipe.write_text(
            local_recipe(
                CLUSTER,
                target=args.nodes,
                max_nodes=args.nodes,
                spot=0.12,
                workdir=ROOT / "recipes" / "quickstart",
                run=f"python train.py --steps {args.steps}",
                env={"OMP_NUM_THREADS": 1},
                checkpoint={"every_steps": 20, "keep": 3},
            )
        )
        plain_s, _up_s, seen = _run(recipe, args.steps, [], args.timeout)
        first = next(t for t, s in seen if s > 0)
        step_at_target = (plain_s - first) / max(1, args.steps - next(s for t, s in seen if s > 0))
        replay_s, _, _ = _run(
            recipe, args.steps, trace_events(trace, scale, args.nodes, notice_s=args.notice), args.timeout
        )
        figures, sources = load_figures(
            overrides={
                "bootstrap_s": first,
                "step_s": step_at_target * args.nodes,
                "step_s_by_world": {str(args.nodes): step_at_target},
            }
        )
        scaled = Trace(args.tick, TRACE, "bench")
        result = simulate(
            load_recipe(recipe), [scaled], ["spotrun"], figures=figures, figure_sources=sources, notice_s=args.notice
        )
    simulated = result.undisturbed_s / result.policy("spotrun").time_s
    measured = plain_s / replay_s
    emit(
        "simulate_vs_real",
        "goodput",
        "ratio",
        measured,
        simulated,
        error_pct=round(100 * abs(simulated - measured) / measured, 1),
        goal_pct=10,
        undisturbed_s=round(plain_s, 2),
        replay_s=round(replay_s, 2),
        simulated_undisturbed_s=round(result.undisturbed_s, 2),
        simulated_replay_s=round(result.policy("spotrun").time_s, 2),
        figures={k: v for k, v in figures.to_dict().items()},
        default_figures=sorted(k for k, v in sources.items() if v == "default"),
    )


if __name__ == "__main__":
    main()
