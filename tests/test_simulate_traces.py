"""Spot traces: the public format, seeded generators, and the replay schedule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spotrun.controller.traces import (
    ReplayEvent,
    Trace,
    drought_trace,
    gcp_24h_trace,
    load_trace,
    parse_trace_spec,
    poisson_trace,
    trace_events,
)
from spotrun.errors import SpotrunError

REAL = Path("/work/shared/traces/aws-4node-v100-us-east-1f.json")
DATA = Path(__file__).parent / "data" / "traces"


def test_loads_the_public_format(tmp_path: Path) -> None:
    trace = load_trace(DATA / "dip-2node.json")
    assert trace == Trace(10.0, (2, 2, 2, 1, 1, 2, 2, 2), "dip-2node")
    assert [trace.capacity_at(t) for t in (0, 29.9, 30, 49.9, 50, 80, 110)] == [2, 2, 1, 1, 2, 2, 1]  # repeats
    assert json.loads(trace.to_json()) == {"metadata": {"gap_seconds": 10.0}, "data": [2, 2, 2, 1, 1, 2, 2, 2]}


@pytest.mark.skipif(not REAL.exists(), reason="the shared real trace is not here")
def test_loads_the_real_aws_trace() -> None:
    trace = load_trace(REAL)
    assert trace.gap_seconds == 300 and set(trace.data) <= {0, 1, 2, 3, 4} and len(trace.data) > 3000


@pytest.mark.parametrize(
    "text, message",
    [
        ("not json", "is not JSON"),
        ('{"data": [1]}', "not in the spot-traces format"),
        ('{"metadata": {"gap_seconds": "5"}, "data": [1]}', "gap_seconds must be a number"),
        ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "gap_seconds must be a positive number"),
        ('{"metadata": {"gap_seconds": 5}, "data": []}', "has no data"),
        ('{"metadata": {"gap_seconds": 5}, "data": [1, -1]}', r"data\[1\] must be an integer >= 0"),
    ],
)
def test_bad_trace_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(SpotrunError, match=message):
        load_trace(path)
    with pytest.raises(SpotrunError, match="cannot read trace"):
        load_trace(tmp_path / "missing.json")


def test_replay_events_by_hand() -> None:
    # 300 s ticks at 1/100 speed on 3 nodes; 4 counts as 3. Drop 3 -> 1 at tick 2 (6 s): announced
    # 1 s earlier; back to 3 at tick 4 (12 s); all gone at tick 5 (15 s).
    trace = Trace(300, (4, 4, 1, 1, 4, 0))
    assert trace_events(trace, 0.01, 3, notice_s=1.0) == [
        ReplayEvent(5.0, "preempt", 2, 1.0),
        ReplayEvent(12.0, "restore", 2, 0.0),
        ReplayEvent(14.0, "preempt", 3, 1.0),
    ]
    # A drop at the very start cannot be announced before 0: the notice shrinks.
    assert trace_events(Trace(10, (2, 0)), 0.1, 2, notice_s=5.0) == [ReplayEvent(0.0, "preempt", 2, 1.0)]
    assert trace_events(Trace(10, (1,)), 1.0, 2) == [ReplayEvent(0.0, "preempt", 1, 0.0)]
    with pytest.raises(SpotrunError, match="time_scale > 0"):
        trace_events(trace, 0, 3)


def test_generators_are_seeded_and_reproducible() -> None:
    assert poisson_trace(4, 24, 0.5, seed=1) == poisson_trace(4, 24, 0.5, seed=1)
    assert poisson_trace(4, 24, 0.5, seed=1).data != poisson_trace(4, 24, 0.5, seed=2).data
    assert poisson_trace(4, 2, 0.0).data == (4,) * 24  # no preemptions: always full; 2 h of 300 s ticks
    busy = poisson_trace(4, 200, 1.0, mean_down_s=600, seed=5)
    assert 0 <= min(busy.data) < 4 == max(busy.data)
    assert drought_trace(4, 10, droughts_per_day=0).data == (4,) * 120
    dry = drought_trace(4, 240, droughts_per_day=2, mean_drought_hours=3, level=1, seed=7)
    assert set(dry.data) == {1, 4}


def test_gcp_caps_by_hand() -> None:
    # One slot; random.Random(0).random() = 0.8444218515250481, so the first stop is at
    # 72958.05 s and lasts 600 s: ticks 244 (73200 s) and 245 (73500 s) see 0. The next stop is
    # 24 h + 600 s later, at 159958.05 s: ticks 534 and 535.
    trace = gcp_24h_trace(1, 48, restart_s=600, gap_seconds=300, seed=0)
    assert len(trace.data) == 576
    assert [k for k, v in enumerate(trace.data) if v == 0] == [244, 245, 534, 535]


def test_trace_specs(tmp_path: Path) -> None:
    assert parse_trace_spec("poisson:nodes=4,hours=24,rate=0.5,seed=1") == poisson_trace(4, 24, 0.5, seed=1)
    assert parse_trace_spec("gcp24h:nodes=2,hours=48,seed=3") == gcp_24h_trace(2, 48, seed=3)
    assert parse_trace_spec("drought:nodes=3,hours=12,level=1") == drought_trace(3, 12, level=1)
    assert parse_trace_spec(str(DATA / "dip-2node.json")).name == "dip-2node"
    with pytest.raises(SpotrunError, match=re.escape("needs rate=...")):
        parse_trace_spec("poisson:nodes=4,hours=24")
    with pytest.raises(SpotrunError, match="unknown or malformed 'speed=2'"):
        parse_trace_spec("gcp24h:nodes=4,hours=24,speed=2")
    with pytest.raises(SpotrunError, match="nodes must be a number"):
        parse_trace_spec("drought:nodes=four,hours=24")
