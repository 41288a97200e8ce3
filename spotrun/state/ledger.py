"""Cost arithmetic over the ledger: burn rate, total so far, savings against on-demand."""

from __future__ import annotations

import time
from dataclasses import dataclass

from spotrun.state.records import LedgerSegment


@dataclass(frozen=True)
class CostSummary:
    burn_per_hour: float  # what the open segments cost per hour now
    on_demand_per_hour: float  # what the same capacity would cost on demand
    total: float  # spent so far
    on_demand_total: float

    @property
    def savings_pct(self) -> float:
        """Percentage saved against on-demand for the same capacity and time (0 when nothing ran)."""
        return 100.0 * (1 - self.total / self.on_demand_total) if self.on_demand_total > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "burn_per_hour": round(self.burn_per_hour, 6),
            "on_demand_per_hour": round(self.on_demand_per_hour, 6),
            "total": round(self.total, 6),
            "on_demand_total": round(self.on_demand_total, 6),
            "savings_pct": round(self.savings_pct, 2),
        }


def summarize(segments: list[LedgerSegment], now: float | None = None) -> CostSummary:
    """Sum segments; an open segment (end None) counts up to `now`."""
    now = time.time() if now is None else now
    burn = sum(s.price_per_hour for s in segments if s.end is None)
    burn_od = sum(s.on_demand_per_hour for s in segments if s.end is None)
    hours = [((s.end if s.end is not None else now) - s.start) / 3600.0 for s in segments]
    total = sum(max(0.0, h) * s.price_per_hour for h, s in zip(hours, segments, strict=True))
    total_od = sum(max(0.0, h) * s.on_demand_per_hour for h, s in zip(hours, segments, strict=True))
    return CostSummary(burn, burn_od, total, total_od)


def reprice(
    segments: list[LedgerSegment], price_per_hour: float, on_demand_per_hour: float, at: float
) -> list[LedgerSegment]:
    """A price refresh: end the open segment at `at` and open one at the new price. Unchanged
    prices (or no open segment) leave the ledger as it is."""
    open_ = [s for s in segments if s.end is None]
    if not open_ or (open_[-1].price_per_hour, open_[-1].on_demand_per_hour) == (price_per_hour, on_demand_per_hour):
        return segments
    node = open_[-1].node
    return [*close_open(segments, at), LedgerSegment(node, price_per_hour, on_demand_per_hour, at)]


def close_open(segments: list[LedgerSegment], end: float) -> list[LedgerSegment]:
    """The same segments with every open one ended at `end` (billing stops)."""
    from dataclasses import replace

    return [replace(s, end=end) if s.end is None else s for s in segments]
