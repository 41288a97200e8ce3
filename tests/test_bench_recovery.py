"""The benches' step-log timeline (bench/_steps.py) and bench/recovery.py's arithmetic on it (no
VMs, no torchrun: the benches themselves take minutes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_recovery", BENCH / "recovery.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _timeline(tmp_path: Path, logs: dict[str, str]):
    from _steps import Timeline  # bench/ is on the path once _bench() ran

    paths = {}
    for name, text in logs.items():
        paths[name] = tmp_path / f"{name}.log"
        paths[name].write_text(text)
    timeline = Timeline(lambda: paths)
    timeline.refresh()
    return timeline


def test_parse_timestamped_and_plain_lines(tmp_path: Path) -> None:
    bench = _bench()
    timeline = _timeline(
        tmp_path,
        {
            "a": "noise\nSTEP 1 WORLD 3 T 10.0\n1712.5 STEP 2 WORLD 3 T 10.5\n"
            "BOOT WORLD 2 T0 11.0 T1 11.2 RESUMED 2\nSTEP 3 WORLD 2 T 11.3\nSTEP 4 WOR",  # partial last line
        },
    )
    assert [(x.step, x.world) for x in timeline.steps()] == [(1, 3), (2, 3), (3, 2)]
    assert timeline.first(10.6, 2).step == 3
    assert bench.breakdown(timeline, 10.6, 2) == {
        "to_worker_start_s": 0.4,
        "worker_init_s": 0.2,
        "to_first_step_s": 0.1,
        "resumed_from": 2,
    }
    (tmp_path / "a.log").write_text(
        (tmp_path / "a.log").read_text() + "LD 2 T 11.4\n"
        "BOOT WORLD 2 T0 11.5 T1 11.6 RESUMED 4\nSTEP 5 WORLD 2 T 11.7\n"
    )
    timeline.refresh()
    assert [x.step for x in timeline.steps()][-2:] == [4, 5], "a line split across two reads is parsed once complete"
    again = bench.breakdown(timeline, 10.6, 2)
    assert again["reformations"] == 2 and again["to_steady_s"] == 1.1, "a second re-formation is a stall too"


def test_steps_lost_counts_repeats_in_the_window_they_fall_in(tmp_path: Path) -> None:
    bench = _bench()
    lines = [f"STEP {n} WORLD 3 T {n}.0" for n in range(1, 11)]  # steps 1-10 at t = 1..10
    lines += [f"STEP {n} WORLD 2 T {n + 20}.0" for n in range(6, 13)]  # resumed from 5: 6-10 again
    timeline = _timeline(tmp_path, {"a": "\n".join(lines[:10]) + "\n", "b": "\n".join(lines[10:]) + "\n"})
    assert bench.steps_lost(timeline, [("before", 0.0), ("hard kill", 10.5)]) == {"before": 0, "hard kill": 5}
    assert timeline.rank0_source() == "b"


def test_boot_and_rank_lines_time_each_worker_start(tmp_path: Path) -> None:
    _bench()
    from _steps import Kind

    timeline = _timeline(
        tmp_path,
        {
            "vm-1": "RANK 1 T0 1.0 TD 2.0 T1 2.5\nBOOT WORLD 3 T0 1.0 T1 3.0 RESUMED None\nSTEP 1 WORLD 3 T 3.5\n"
            "RANK 1 T0 1.0 TD x T1 2.5\n",  # malformed: skipped
        },
    )
    assert [x.t - x.t0 for x in timeline.of(Kind.RANK)] == [0.5]  # data loaded -> trainer ready
    (boot,) = timeline.of(Kind.BOOT)
    assert (boot.t0, boot.t, boot.step, boot.world, boot.source) == (1.0, 3.0, 0, 3, "vm-1")
    assert timeline.first(0.0, 3, Kind.BOOT) is boot and timeline.rank0_source() == "vm-1"
