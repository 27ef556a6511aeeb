"""`marketgpt` exit codes at the command line: what the README promises scripts can rely on.

`marketgpt data download` runs the real yfinance code against Yahoo chart responses constructed
in the shape of real ones, not recorded (FakeYahoo on a `responses` mock, as tests/test_yahoo.py
and tests/test_download.py do): no network is touched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import responses

from common.cli import main
from common.data.cache import CandleCache

from test_yahoo import FakeYahoo, load_chart


def _case(root: Path, tickers: list[str]) -> tuple[Path, Path]:
    """A case folder whose universe lists `tickers` (Yahoo), and a config for January 2024."""
    case = root / "case_t"
    (case / "configs").mkdir(parents=True)
    (case / "universe.csv").write_text(
        "symbol,source,category,name\n" + "".join(f"{t},yfinance,us_stock,{t}\n" for t in tickers)
    )
    config = case / "configs" / "small.json"
    config.write_text(
        json.dumps(
            {
                "model": {"context_length": 4},
                "data": {"start_date": "2024-01-01", "end_date": "2024-02-01", "interval": "1d"},
            }
        )
    )
    return case, config


@pytest.fixture
def yahoo(monkeypatch):
    """Yahoo knows AAPL and MSFT; any other ticker gets its 404 "No data found" (delisted)."""
    monkeypatch.setenv("MARKETGPT_RETRY_DELAY_S", "0")
    monkeypatch.setenv("MARKETGPT_YAHOO_HTTP", "requests")
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yield FakeYahoo(rsps, {"AAPL": load_chart("aapl_1d.json"), "MSFT": load_chart("msft_1d.json")})


@pytest.mark.parametrize(
    "tickers,code",
    [
        (["AAPL", "MSFT"], 0),
        (["AAPL", "GONE", "MSFT"], 1),
    ],
    ids=["all-ok", "one-failed"],
)
def test_data_download_exits_1_when_some_tickers_fail(tmp_path, yahoo, capsys, tickers, code):
    case, config = _case(tmp_path, tickers)
    assert main(["data", "download", "--case", str(case), "--config", str(config)]) == code
    out = capsys.readouterr().out
    cache = CandleCache(case / "data")
    for ok in ("AAPL", "MSFT"):  # the tickers that worked are saved either way
        assert cache.read("yfinance", "1d", ok) is not None
    if code:
        assert "GONE" in out and cache.read("yfinance", "1d", "GONE") is None
