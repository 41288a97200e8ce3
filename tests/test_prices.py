"""`spotrun prices` core: rows from the local provider and from AWS (moto's EC2 server)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from spotrun.providers import get_provider

from spotrun.client.prices import PriceRow, list_prices, render, to_json
from spotrun.errors import ProviderError


@pytest.fixture(autouse=True)
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "SPOTRUN_AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def test_row_arithmetic() -> None:
    row = PriceRow("aws", "us-east-1", "us-east-1a", "p4d.24xlarge", 8, "A100", 8.0, 32.0, 12.0)
    assert row.per_gpu_hour == 1.0 and row.savings_pct == 75.0
    cpu = PriceRow("local", "local", "local-a", "local-cpu-2", 0, None, 0.02, 0.0)
    assert cpu.per_gpu_hour is None and cpu.savings_pct is None


def test_unreachable_provider_is_a_note_not_an_error() -> None:
    table = list_prices()
    assert table.rows and {r.provider for r in table.rows} == {"local"}
    assert [r.spot_per_hour for r in table.rows] == sorted(r.spot_per_hour for r in table.rows)
    assert any(n.startswith("aws: skipped (no AWS credentials found") for n in table.notes)
    with pytest.raises(ProviderError, match="no AWS credentials"):
        list_prices("aws")


def test_local_and_aws_rows_sorted_filtered_and_rendered(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    providers = [get_provider("local"), get_provider("aws", region="us-east-1", endpoint_url=moto_url)]
    table = list_prices(providers=providers)
    assert {r.provider for r in table.rows} == {"local", "aws"} and not table.notes
    prices = [r.spot_per_hour for r in table.rows]
    assert prices == sorted(prices)
    aws = [r for r in table.rows if r.provider == "aws"]
    assert all(r.age_s is not None and r.age_s < 60 for r in aws)
    assert {r.zone for r in aws if r.instance_type == "p4d.24xlarge"} >= {"us-east-1a", "us-east-1b"}

    a100 = list_prices(gpu="a100", providers=providers)
    assert a100.rows and all(r.gpu_name and "A100" in r.gpu_name for r in a100.rows)

    data = json.loads(to_json(a100))
    assert data["rows"][0]["per_gpu_hour"] == pytest.approx(a100.rows[0].spot_per_hour / 8)

    from rich.console import Console

    out = io.StringIO()
    render(table, Console(file=out, width=160))
    text = out.getvalue()
    assert "spot $/h" in text and "local-cpu-2" in text and "p4d.24xlarge" in text and "8x A100" in text
