"""Universe files: fixture folders of good and bad files, the shipped universes, asset_info."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from common.config import load_config
from common.data.universe import Asset, load_universe
from common.errors import UserError
from common.markets import CATEGORIES
from common.paths import CASES, REPO_ROOT, case_config
from common.tokens.ids import RunInfo

FIXTURES = Path(__file__).parent / "fixtures" / "universes"
GOOD = sorted((FIXTURES / "good").glob("*.csv"))
BAD_FILES = sorted((FIXTURES / "bad").glob("*.csv"))

# Every bad fixture: (expected_counts passed to load_universe, fragments the message must contain).
BAD = {
    "first_line_not_header.csv": (
        None,
        ["line 1:", "bad header 'AAPL,yfinance,us_stock,Apple'", "symbol,source,category,name"],
    ),
    "header_missing_column.csv": (None, ["line 2:", "bad header 'symbol,source,category'"]),
    "only_comments.csv": (None, ["empty universe file", "symbol,source,category,name"]),
    "header_only.csv": (None, ["lists no assets"]),
    "too_many_fields.csv": (None, ["line 3:", "expected 4 fields", "found 5", "quote a name"]),
    "too_few_fields.csv": (None, ["line 3:", "expected 4 fields", "found 3"]),
    "empty_symbol.csv": (None, ["line 4:", "empty symbol"]),
    "unknown_source.csv": (None, ["line 2:", "unknown source 'yfinanse' for AAPL", "did you mean 'yfinance'?"]),
    "unknown_category.csv": (None, ["line 3:", "unknown category 'cripto' for ETH/USDT", "did you mean 'crypto'?"]),
    "duplicate_symbol.csv": (None, ["line 6:", "duplicate symbol 'AAPL'", "already on line 2"]),
    "duplicate_symbol_other_case.csv": (None, ["line 3:", "duplicate symbol 'btc/usdt'", "already on line 2"]),
    "ccxt_symbol_without_quote.csv": (None, ["line 2:", "'BTCUSDT'", "BASE/QUOTE"]),
    "count_mismatch.csv": ({"us_stock": 2, "crypto": 2}, ["line 4:", "category 'crypto' has 1 assets", "expects 2"]),
    "category_not_expected.csv": ({"crypto": 2}, ["line 4:", "category 'commodity' has 1 assets", "expects 0"]),
}


def test_every_bad_fixture_has_an_expectation():
    assert {p.name for p in BAD_FILES} == set(BAD)


@pytest.mark.parametrize("path", BAD_FILES, ids=[p.name for p in BAD_FILES])
def test_bad_universe_names_file_line_and_problem(path: Path):
    counts, fragments = BAD[path.name]
    with pytest.raises(UserError) as err:
        load_universe(path, counts)
    message = str(err.value)
    assert message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.mark.parametrize("path", GOOD, ids=[p.name for p in GOOD])
def test_good_universe_loads_clean_assets(path: Path):
    assets = load_universe(path)
    assert assets and all(isinstance(a, Asset) for a in assets)
    for a in assets:
        assert a.symbol == a.symbol.strip() and a.symbol
        assert a.category in CATEGORIES
        assert a.name  # an empty name falls back to the symbol
    # Same file, same counts: the count check passes with the file's own counts.
    counts: dict[str, int] = {}
    for a in assets:
        counts[a.category] = counts.get(a.category, 0) + 1
    assert load_universe(path, counts) == assets


def test_padding_quotes_comments_and_bom_are_handled():
    assets = load_universe(FIXTURES / "good" / "comments_and_padding.csv")
    assert assets == [
        Asset("SAP.DE", "yfinance", "eu_stock", "SAP"),
        Asset("BRK-B", "yfinance", "us_stock", "Berkshire Hathaway, Class B"),
        Asset("GC=F", "yfinance", "commodity", "Gold futures"),
        Asset("005930.KS", "yfinance", "emerging", "005930.KS"),
    ]


def test_missing_file_says_so(tmp_path: Path):
    path = tmp_path / "nope.csv"
    with pytest.raises(UserError, match="nope.csv: universe file not found"):
        load_universe(path)


def test_counts_for_a_category_absent_from_the_file(tmp_path: Path):
    path = FIXTURES / "good" / "minimal.csv"
    with pytest.raises(UserError) as err:
        load_universe(path, {"us_stock": 1, "crypto": 1, "commodity": 3})
    assert "category 'commodity' has 0 assets" in str(err.value) and "expects 3" in str(err.value)


def test_counts_naming_an_unknown_category():
    with pytest.raises(UserError, match="unknown category 'cryto'.*did you mean 'crypto'"):
        load_universe(FIXTURES / "good" / "minimal.csv", {"us_stock": 1, "cryto": 1})


@pytest.mark.parametrize("case", CASES)
def test_shipped_universes_match_their_configs(case: str):
    folder = REPO_ROOT / case
    cfg = load_config(case_config(folder))
    assert cfg.data.universe_counts, "each case declares its per-category counts"
    assets = load_universe(folder / cfg.data.universe, cfg.data.universe_counts)
    assert len(assets) == sum(cfg.data.universe_counts.values())
    for a in assets:
        assert a.source == ("ccxt" if a.category == "crypto" else "yfinance")
        if a.source == "ccxt":
            assert a.symbol.endswith("/USDT")


def test_smaller_cases_are_subsets_of_case_a():
    full = {a.symbol: a for a in load_universe(REPO_ROOT / "case_a_full_market" / "universe.csv")}
    for case in ("case_b_reduced", "case_c_crypto"):
        for a in load_universe(REPO_ROOT / case / "universe.csv"):
            assert full[a.symbol] == a


def test_asset_info_ids_follow_universe_and_category_order():
    assets = [
        Asset("ETH/USDT", "ccxt", "crypto", "Ethereum"),
        Asset("AAPL", "yfinance", "us_stock", "Apple"),
        Asset("GC=F", "yfinance", "commodity", "Gold"),
        Asset("BTC/USDT", "ccxt", "crypto", "Bitcoin"),
    ]
    info = RunInfo.of_assets(assets).to_json()
    # Categories keep CATEGORIES order (us_stock < commodity < crypto), not first appearance.
    assert info["categories"] == {"us_stock": 0, "commodity": 1, "crypto": 2}
    assert [r["symbol"] for r in info["assets"]] == [a.symbol for a in assets]
    assert [r["id"] for r in info["assets"]] == [0, 1, 2, 3]
    assert [r["category_id"] for r in info["assets"]] == [2, 0, 1, 2]
    assert info["symbols"] == {"ETH/USDT": 0, "AAPL": 1, "GC=F": 2, "BTC/USDT": 3}
    assert info["num_assets"] == 4 and info["num_categories"] == 3
    assert json.loads(json.dumps(info)) == info  # JSON-ready, nothing lost
    assert RunInfo.of_assets(list(assets)).to_json() == info  # deterministic
    assert RunInfo.from_json(info) == RunInfo.of_assets(assets)  # read back as written
    # model.market_peer's peers: written when there are any, read back; a run of several intervals
    # keys them by series, and a forecast at one interval asks by symbol
    peered = dataclasses.replace(RunInfo.of_assets(assets), peers={"AAPL": "GC=F"})
    assert "peers" not in info and RunInfo.from_json(peered.to_json()) == peered
    assert peered.peer_of("AAPL", "1d") == "GC=F" and peered.peer_of("GC=F", "1d") is None
    series = [Asset(f"{a.symbol}@{iv}", a.source, a.category, a.name) for a in assets for iv in ("1h", "1d")]
    several = dataclasses.replace(RunInfo.of_assets(series, ["1h", "1d"]), peers={"AAPL@1h": "GC=F@1h"})
    assert several.peer_of("AAPL", "1h") == "GC=F" and several.peer_of("AAPL", "1d") is None


def test_asset_info_of_a_shipped_universe():
    assets = load_universe(REPO_ROOT / "case_a_full_market" / "universe.csv")
    info = RunInfo.of_assets(assets).to_json()
    assert info["num_assets"] == 600
    assert list(info["categories"]) == ["us_stock", "eu_stock", "emerging", "commodity", "crypto"]
    for record, asset in zip(info["assets"], assets):
        assert info["categories"][record["category"]] == record["category_id"]
        assert record["symbol"] == asset.symbol and info["symbols"][asset.symbol] == record["id"]


def test_asset_info_refuses_duplicates():
    a = Asset("AAPL", "yfinance", "us_stock", "Apple")
    with pytest.raises(ValueError, match="AAPL"):
        RunInfo.of_assets([a, a])
