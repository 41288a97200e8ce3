"""`spotrun prices`: spot and on-demand prices of every reachable provider, cheapest first.

`list_prices()` asks each provider for its offers (one spot row per offer; the on-demand price
of the same shape is on the row), skips a provider that cannot be reached (missing credentials,
no network) with a note instead of failing, and sorts by spot $/h. `render()` prints a rich table,
`to_json()` the same rows for scripts. Providers load lazily through `spotrun.providers`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from spotrun.errors import ProviderError
from spotrun.fmt import duration


@dataclass(frozen=True)
class PriceRow:
    """One purchasable shape in one zone; prices in USD per instance-hour."""

    provider: str
    region: str
    zone: str
    instance_type: str
    gpus: int
    gpu_name: str | None
    spot_per_hour: float
    on_demand_per_hour: float
    age_s: float | None = None  # seconds since the spot price was fetched; None: static

    @property
    def per_gpu_hour(self) -> float | None:
        """Spot $ per GPU-hour; None for a machine without GPUs."""
        return self.spot_per_hour / self.gpus if self.gpus else None

    @property
    def savings_pct(self) -> float | None:
        """How much cheaper spot is than on-demand, in percent; None when on-demand is unknown."""
        if self.on_demand_per_hour <= 0:
            return None
        return 100.0 * (1.0 - self.spot_per_hour / self.on_demand_per_hour)


@dataclass(frozen=True)
class PriceTable:
    """The rows, cheapest spot first, and one note per provider that was skipped."""

    rows: list[PriceRow]
    notes: list[str] = field(default_factory=list)


def list_prices(
    provider: str | None = None, gpu: str | None = None, *, providers: Sequence[Any] | None = None
) -> PriceTable:
    """Spot offers of `provider` (default: every known one), optionally only those whose GPU
    name contains `gpu` (case-insensitive, e.g. "a100"), sorted by spot $/h.

    A provider that raises ProviderError (no credentials, unreachable) becomes a note; with an
    explicit `provider` that error is raised instead. `providers`: ready provider objects (tests,
    or callers with configuration). Blocking: may call each cloud's price API (cached there).
    """
    explicit = provider is not None
    targets = list(providers) if providers is not None else _providers(provider)
    rows, notes = [], []
    for target in targets:
        try:
            offers = target.offers()
        except ProviderError as exc:
            if explicit:
                raise
            notes.append(f"{target.name}: skipped ({exc})")
            continue
        age = getattr(target, "price_age", None)
        for offer in offers:
            if not offer.spot:
                continue
            if gpu and gpu.lower() not in (offer.gpu_name or "").lower():
                continue
            rows.append(
                PriceRow(
                    offer.provider,
                    offer.region,
                    offer.zone,
                    offer.instance_type,
                    offer.gpus,
                    offer.gpu_name,
                    offer.spot_price,
                    offer.on_demand_price,
                    age(offer) if callable(age) else None,
                )
            )
    rows.sort(key=lambda r: (r.spot_per_hour, r.provider, r.region, r.zone, r.instance_type))
    return PriceTable(rows, notes)


def _providers(name: str | None) -> list[Any]:
    from spotrun.providers import get_provider, known_providers

    names = [name] if name else known_providers()
    found = []
    for n in names:
        try:
            found.append(get_provider(n))
        except ProviderError:
            if name:
                raise
    return found


def to_json(table: PriceTable) -> str:
    """One JSON object: {"rows": [...], "notes": [...]}, with the derived columns included."""
    rows = [{**asdict(r), "per_gpu_hour": r.per_gpu_hour, "savings_pct": r.savings_pct} for r in table.rows]
    return json.dumps({"rows": rows, "notes": table.notes}, indent=1)


def render(table: PriceTable, console: Any = None, *, limit: int | None = None) -> None:
    """Print the rows as a rich table (at most `limit`) to `console` (rich); notes are the caller's."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    out = Table(title="spot prices (USD/h)", show_lines=False)
    for column, justify in (
        ("provider", "left"),
        ("region", "left"),
        ("zone", "left"),
        ("type", "left"),
        ("GPUs", "right"),
        ("spot $/h", "right"),
        ("on-demand $/h", "right"),
        ("$/GPU-h", "right"),
        ("savings", "right"),
        ("age", "right"),
    ):
        out.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in table.rows[:limit]:
        out.add_row(
            row.provider,
            row.region,
            row.zone,
            row.instance_type,
            f"{row.gpus}x {row.gpu_name}" if row.gpus else "-",
            f"{row.spot_per_hour:.4f}",
            f"{row.on_demand_per_hour:.4f}" if row.on_demand_per_hour else "?",
            f"{row.per_gpu_hour:.4f}" if row.per_gpu_hour is not None else "-",
            f"{row.savings_pct:.0f}%" if row.savings_pct is not None else "?",
            "static" if row.age_s is None else duration(row.age_s),
        )
    console.print(out)
