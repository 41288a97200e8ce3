"""Ledger arithmetic against hand-computed cases."""

from __future__ import annotations

import pytest

from spotrun.state.ledger import close_open, reprice, summarize
from spotrun.state.records import LedgerSegment

H = 3600.0


def test_closed_and_open_segments() -> None:
    segments = [
        LedgerSegment("a", 0.10, 0.40, start=0, end=2 * H),  # 0.20 $ (0.80 on demand)
        LedgerSegment("b", 0.30, 1.00, start=H),
    ]  # open: 0.30 $/h for 3 h at now=4h -> 0.90 $
    summary = summarize(segments, now=4 * H)
    assert summary.total == pytest.approx(1.10)
    assert summary.on_demand_total == pytest.approx(0.80 + 3.00)
    assert summary.burn_per_hour == pytest.approx(0.30) and summary.on_demand_per_hour == pytest.approx(1.00)
    assert summary.savings_pct == pytest.approx(100 * (1 - 1.10 / 3.80))


def test_price_change_mid_run() -> None:
    ledger = [LedgerSegment("a", 0.10, 0.40, start=0)]
    ledger = reprice(ledger, 0.25, 0.40, at=H)  # spot price rose after one hour
    ledger = reprice(ledger, 0.25, 0.40, at=1.5 * H)  # a refresh with the same price changes nothing
    assert len(ledger) == 2 and ledger[0].end == H and ledger[1].start == H
    summary = summarize(ledger, now=3 * H)
    assert summary.total == pytest.approx(0.10 + 0.25 * 2)
    assert summary.burn_per_hour == pytest.approx(0.25)
    closed = close_open(ledger, 3 * H)
    assert summarize(closed, now=10 * H).total == pytest.approx(0.60), "billing stops at the end"
    assert summarize(closed, now=10 * H).burn_per_hour == 0


def test_nothing_ran() -> None:
    assert summarize([], now=0).savings_pct == 0.0
