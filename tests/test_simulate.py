"""`spotrun simulate`: each policy on small hand-made traces, against answers worked out by hand.

Common setup (unless a test says otherwise): one local zone at 0.36 $/h spot (0.0001 $/s) and
1.80 $/h on demand (0.0005 $/s); nodes min 1, max 2, target 2; 100 steps; checkpoint every 10
steps; figures: step_s 2 (1 s per step at world 2, 2 s at world 1), bootstrap 5 s, notice
recovery 2 s, hard-kill recovery 4 s, scale-up 3 s, checkpoints free. Trace ticks are 10 s.

The undisturbed run: 2 VMs launched at 0, ready at 5, 100 steps at 1 step/s: done at 105 s,
2 x 105 s x 0.0005 $/s = 0.105 $ on demand.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from spotrun.controller.traces import Trace
from spotrun.errors import SpotrunError
from spotrun.recipe.run_command import steps_from_run
from spotrun.simulate.figures import DEFAULT_FIGURES, Figures, load_figures, record_figures
from spotrun.simulate.policies import run_simulation
from spotrun.simulate.report import render_table, terminal_chart, to_json, write_chart

FIGURES = Figures(
    recovery_notice_s=2.0, recovery_hard_kill_s=4.0, scale_up_s=3.0, bootstrap_s=5.0, checkpoint_s=0.0, step_s=2.0
)

# One node of two drops at tick 3 (t = 30 s) for 2 ticks, then capacity stays at 2.
DIP = Trace(10.0, (2, 2, 2, 1, 1) + (2,) * 30, "dip")
FULL = Trace(10.0, (2,) * 40, "full")

RESOURCE = """\
  - provider: local
    instance_type: {type}
    prices: {{spot: {spot}, on_demand: 1.8}}
"""


def recipe(tmp_path: Path, *, spot=(0.36,), extra: str = "") -> Path:
    resources = "".join(RESOURCE.format(type=f"cpu-{i}", spot=price) for i, price in enumerate(spot))
    path = tmp_path / "sim.yaml"
    path.write_text(
        f"name: sim\nresources:\n{resources}nodes: {{min: 1, max: 2, target: 2}}\n"
        f"run: python train.py --steps 100\ncheckpoint: {{every_steps: 10}}\n{extra}"
    )
    return path


def row(result, policy: str) -> dict:
    return next(p for p in json.loads(to_json(result))["policies"] if p["policy"] == policy)


def test_one_node_drops_for_two_ticks_with_notice(tmp_path: Path) -> None:
    result = run_simulation(recipe(tmp_path), [DIP], figures=FIGURES, notice_s=5.0)
    assert result.undisturbed_s == pytest.approx(105.0)

    # spotrun: notice at 25 s for vm-2 (the replacement launch finds no capacity). At 30 s vm-2
    # leaves after an agreed checkpoint (step 25, nothing lost); vm-1 trains alone from 32 s
    # (2 s pause) at 0.5 step/s. At 50 s capacity returns: vm-3 launched, ready at 55 s (step
    # 25 + 23 s x 0.5 = 36.5), joins: 3 s pause, then 63.5 steps at 1/s -> 121.5 s.
    # Billed: vm-1 121.5 s + vm-2 30 s + vm-3 71.5 s = 223 s x 0.0001 $/s.
    spot = row(result, "spotrun")
    assert spot["finished"] and spot["time_s"] == pytest.approx(121.5)
    assert spot["goodput"] == pytest.approx(105 / 121.5, abs=1e-4)
    assert spot["total_usd"] == pytest.approx(0.0223)
    assert spot["usd_per_1000_steps"] == pytest.approx(0.223)
    assert (spot["preemptions_survived"], spot["steps_lost"]) == (1, 0)

    # relaunch-all: vm-2 dies at 30 s (step 25; last checkpoint 20: 5 steps lost), vm-1 is torn
    # down; no zone has room for 2 until 50 s; vm-3 + vm-4 ready at 55 s, 80 steps -> 135 s.
    # Billed: 30 + 30 + 85 + 85 = 230 s.
    relaunch = row(result, "relaunch-all")
    assert relaunch["time_s"] == pytest.approx(135.0)
    assert relaunch["goodput"] == pytest.approx(105 / 135, abs=1e-4)
    assert relaunch["total_usd"] == pytest.approx(0.023)
    assert (relaunch["preemptions_survived"], relaunch["steps_lost"]) == (1, 5)

    # checkpoint-restart: the same loss and restart, but vm-1 waits (billed) for vm-3:
    # 135 + 30 + 85 = 250 s.
    restart = row(result, "checkpoint-restart")
    assert restart["time_s"] == pytest.approx(135.0)
    assert restart["total_usd"] == pytest.approx(0.025)
    assert (restart["preemptions_survived"], restart["steps_lost"]) == (1, 5)

    on_demand = row(result, "on-demand")
    assert on_demand["time_s"] == pytest.approx(105.0) and on_demand["goodput"] == pytest.approx(1.0)
    assert on_demand["total_usd"] == pytest.approx(0.105)
    assert on_demand["usd_per_1000_steps"] == pytest.approx(1.05)
    assert on_demand["preemptions_survived"] == 0


def test_hard_kill_without_notice_keeps_survivor_steps(tmp_path: Path) -> None:
    # A 0 s notice is no notice: vm-2 is killed at 30 s (step 25) while training. vm-1 holds the
    # replica (emergency save: nothing lost), trains alone from 34 s (4 s pause) at 0.5 step/s;
    # vm-3 (launched 50 s) joins at 55 s at step 35.5, 3 s pause, 64.5 steps -> 122.5 s.
    # Billed: 122.5 + 30 + 72.5 = 225 s.
    result = run_simulation(recipe(tmp_path), [DIP], ["spotrun"], figures=FIGURES, notice_s=0.0)
    spot = row(result, "spotrun")
    assert spot["time_s"] == pytest.approx(122.5)
    assert spot["total_usd"] == pytest.approx(0.0225)
    assert (spot["preemptions_survived"], spot["steps_lost"]) == (1, 0)


def test_replacement_in_another_zone_is_made_before_break(tmp_path: Path) -> None:
    # Zone 0 (0.36 $/h) loses one slot for good at 30 s; zone 1 (0.72 $/h, 0.0002 $/s) is full.
    # Notice (20 s lead) at 10 s: plan() launches vm-3 in zone 1 at once; ready at 15 s, so
    # plan() drains vm-2 then: one membership change (2 s pause at step 10), world stays 2,
    # 90 steps from 17 s -> 107 s. Billed: vm-1 107 s + vm-2 15 s at 0.0001, vm-3 97 s at 0.0002.
    drop = Trace(10.0, (2, 2, 2) + (1,) * 30, "drop")
    result = run_simulation(recipe(tmp_path, spot=(0.36, 0.72)), [drop, FULL], figures=FIGURES, notice_s=20.0)
    spot = row(result, "spotrun")
    assert spot["time_s"] == pytest.approx(107.0)
    assert spot["total_usd"] == pytest.approx(0.0316)
    assert (spot["preemptions_survived"], spot["steps_lost"]) == (1, 0)
    assert min(s.world for s in result.policy("spotrun").samples if 5 <= s.t <= 107) == 2

    # checkpoint-restart: vm-2 dies at 30 s (5 steps lost); vm-3 in zone 1 at 30 s, ready 35 s,
    # 80 steps -> 115 s. Billed: 115 + 30 s at 0.0001, 85 s at 0.0002.
    restart = row(result, "checkpoint-restart")
    assert restart["time_s"] == pytest.approx(115.0)
    assert restart["total_usd"] == pytest.approx(0.0315)
    # relaunch-all: both torn down at 30 s; zone 0 has room for 1 only, so vm-3 + vm-4 go to
    # zone 1, ready 35 s -> 115 s. Billed: 30 + 30 s at 0.0001, 2 x 85 s at 0.0002.
    relaunch = row(result, "relaunch-all")
    assert relaunch["time_s"] == pytest.approx(115.0)
    assert relaunch["total_usd"] == pytest.approx(0.040)


def test_budget_per_hour_limits_the_cluster_through_plan(tmp_path: Path) -> None:
    # max_per_hour 0.5 with 0.36 $/h VMs: plan() allows one launch. 100 steps at 2 s -> 205 s.
    path = recipe(tmp_path, extra="budget: {max_per_hour: 0.5}\n")
    spot = row(run_simulation(path, [FULL], ["spotrun"], figures=FIGURES), "spotrun")
    assert spot["time_s"] == pytest.approx(205.0)
    assert spot["total_usd"] == pytest.approx(0.0205)


def test_budget_total_stops_the_cluster(tmp_path: Path) -> None:
    # Two VMs burn 0.0002 $/s: 0.01 $ is spent at 50 s, when plan() stops the cluster at step 45.
    path = recipe(tmp_path, extra="budget: {max_total: 0.01}\n")
    spot = row(run_simulation(path, [FULL], ["spotrun"], figures=FIGURES), "spotrun")
    assert not spot["finished"] and spot["time_s"] is None and spot["goodput"] is None
    assert spot["steps_done"] == pytest.approx(45.0, abs=1e-3)
    assert spot["total_usd"] == pytest.approx(0.01, abs=1e-6)
    assert "max_total" in spot["note"]


def test_checkpoint_pause_and_every_seconds(tmp_path: Path) -> None:
    # checkpoint_s 1 with every_steps 10: 9 pauses before step 100 (the last step needs none): 114 s.
    figures = Figures(**{**FIGURES.to_dict(), "checkpoint_s": 1.0})
    result = run_simulation(recipe(tmp_path), [FULL], ["on-demand"], figures=figures)
    assert result.policy("on-demand").time_s == pytest.approx(114.0)
    # every_seconds 30 instead: checkpoints at 35, 66, 97 s (the clock restarts after each
    # 1 s pause): 100 + 3 = 103 s of training from 5 s -> 108 s.
    path = recipe(tmp_path)
    path.write_text(path.read_text().replace("every_steps: 10", "every_seconds: 30"))
    result = run_simulation(path, [FULL], ["on-demand"], figures=figures)
    assert result.policy("on-demand").time_s == pytest.approx(108.0)


def test_capacity_that_never_comes_back_does_not_finish(tmp_path: Path) -> None:
    dead = Trace(10.0, (2, 2, 2) + (0,) * 10, "dead")  # repeats: 2 for 30 s every 130 s
    result = run_simulation(recipe(tmp_path), [dead], ["relaunch-all"], figures=FIGURES, max_hours=0.1)
    relaunch = result.policy("relaunch-all")
    assert not relaunch.finished and relaunch.time_s is None
    assert relaunch.steps_done < 100
    assert "did not reach 100 steps" in relaunch.note


def test_results_are_reproducible(tmp_path: Path) -> None:
    from spotrun.controller.traces import poisson_trace

    traces = [poisson_trace(4, 24, 0.5, gap_seconds=300, seed=3)]
    path = recipe(tmp_path)
    one = to_json(run_simulation(path, traces, steps=20000, figures=FIGURES), timeline=True)
    two = to_json(run_simulation(path, traces, steps=20000, figures=FIGURES), timeline=True)
    assert one == two


def test_steps_come_from_the_run_command_or_the_caller(tmp_path: Path) -> None:
    assert steps_from_run("python train.py --steps 9000") == 9000
    assert steps_from_run("python train.py --steps=12 --lr 3") == 12
    assert steps_from_run("python train.py") is None
    assert steps_from_run("torchrun x.py --max-steps=500") == 500  # the TUI's step goal: the same parser
    assert steps_from_run("python train.py --eval-steps 5 --steps 1.5") is None
    assert steps_from_run("sh -c 'python train.py --steps 30'") == 30
    path = recipe(tmp_path)
    assert run_simulation(path, [FULL], ["on-demand"], figures=FIGURES, steps=50).steps == 50
    path.write_text(path.read_text().replace(" --steps 100", ""))
    with pytest.raises(SpotrunError, match="number of steps"):
        run_simulation(path, [FULL], figures=FIGURES)


def test_bad_policy_and_missing_prices_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(SpotrunError, match="unknown policy 'skypilot'"):
        run_simulation(recipe(tmp_path), [FULL], ["skypilot"], figures=FIGURES)
    path = recipe(tmp_path)
    path.write_text(path.read_text().replace("    prices: {spot: 0.36, on_demand: 1.8}\n", ""))
    with pytest.raises(SpotrunError, match="has no prices"):
        run_simulation(path, [FULL], figures=FIGURES)
    result = run_simulation(path, [FULL], ["on-demand"], figures=FIGURES, prices=(0.36, 1.8))
    assert result.policy("on-demand").total_usd == pytest.approx(0.105)


def test_figures_file_overrides_and_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    figures, sources = load_figures()
    assert figures == DEFAULT_FIGURES and set(sources.values()) == {"default"}
    written = record_figures({"bootstrap_s": 42.0, "step_s_by_world": {"2": 0.7}, "measured_at": "x"})
    record_figures({"scale_up_s": 1.5})
    assert written == tmp_path / "home" / "bench-figures.json"
    figures, sources = load_figures(overrides={"step_s": 3.0, "checkpoint_s": None})
    assert (figures.bootstrap_s, figures.scale_up_s, figures.step_s) == (42.0, 1.5, 3.0)
    assert figures.step_time(2) == 0.7 and figures.step_time(3) == 1.0
    assert sources["bootstrap_s"] == str(written) and sources["step_s"] == "override"
    assert sources["checkpoint_s"] == "default"
    with pytest.raises(SpotrunError, match="step_s must be a number of seconds > 0"):
        load_figures(overrides={"step_s": 0})
    (tmp_path / "bad.json").write_text('{"bootstrap_s": "slow"}')
    with pytest.raises(SpotrunError, match="bootstrap_s must be a number"):
        load_figures(tmp_path / "bad.json")
    with pytest.raises(SpotrunError, match="cannot read bench figures"):
        load_figures(tmp_path / "missing.json")


def test_figures_from_a_file_drive_the_simulation(tmp_path: Path) -> None:
    (tmp_path / "figures.json").write_text(json.dumps(FIGURES.to_dict()))
    result = run_simulation(recipe(tmp_path), [DIP], ["spotrun"], figures_file=tmp_path / "figures.json", notice_s=5.0)
    assert result.policy("spotrun").time_s == pytest.approx(121.5)
    assert result.figure_sources["step_s"] == str(tmp_path / "figures.json")


def test_table_json_and_charts(tmp_path: Path) -> None:
    result = run_simulation(recipe(tmp_path), [DIP], figures=FIGURES, notice_s=5.0)
    table = render_table(result)
    for name in ("spotrun", "relaunch-all", "checkpoint-restart", "on-demand", "goodput", "$/1000 steps"):
        assert name in table
    assert "2.0 min" in table and "0.864 " in table  # times are human; goodput has 3 decimals
    assert "0.0223" in table  # small totals keep 4 decimals
    data = json.loads(to_json(result, timeline=True))
    assert data["figures"]["step_s"] == 2.0 and data["zones"][0]["notice_s"] == 5.0
    assert data["policies"][0]["timeline"][0] == [0.0, 2, 0, 0.0]
    svg = write_chart(result, tmp_path / "chart.svg")
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg") and len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 9
    text = terminal_chart(result, width=40, height=8)
    assert "legend: * spotrun, o relaunch-all, + checkpoint-restart, x on-demand" in text
    assert "capacity" in text.splitlines()[10] and "2222" in text
    with pytest.raises(SpotrunError, match="unknown format"):
        write_chart(result, tmp_path / "chart.gif")


def test_warm_spare_is_billed_never_trains_and_is_refilled(tmp_path: Path) -> None:
    # nodes max 3, target 2, spares 1; capacity 3, 2 from 30 s to 50 s, then 3. At 0 all three VMs
    # launch (vm-3 the spare); vm-1 and vm-2 train from 5 s at 1 step/s (a parked spare never
    # makes world 3). At 30 s (step 25) a training VM is reclaimed, never the spare: vm-2, the
    # newest by id. vm-3 is activated at once and joins the survivor's re-formation: one 4 s
    # pause, then 75 steps at world 2 -> 109 s. No capacity for a new spare until 50 s: vm-4
    # parks from 55 s. Billed: vm-1 109 + vm-2 30 + vm-3 109 + vm-4 59 = 307 s.
    path = recipe(tmp_path)
    path.write_text(path.read_text().replace("{min: 1, max: 2, target: 2}", "{min: 1, max: 3, target: 2, spares: 1}"))
    dip = Trace(10.0, (3, 3, 3, 2, 2) + (3,) * 30, "dip3")
    spot = row(run_simulation(path, [dip], ["spotrun"], figures=FIGURES, notice_s=0.0), "spotrun")
    assert spot["time_s"] == pytest.approx(109.0)
    assert spot["total_usd"] == pytest.approx(0.0307)
    assert (spot["preemptions_survived"], spot["steps_lost"]) == (1, 0)
