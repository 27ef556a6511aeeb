"""data.universe = "exchange", offline: the real ccxt binance code against a fake binance.

`responses` answers ccxt's own HTTP requests: GET /api/v3/exchangeInfo (pairs built from the
BTCUSDT entry of tests/fixtures/binance/exchange_info.json), /api/v3/ticker/24hr and /api/v3/klines
(daily candles generated for the requested range, the newest one still forming). Sockets stay
blocked by pytest-socket; the clock is injected (`now`).
"""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pandas as pd
import pytest
import responses

from common.config import Config, ConfigError, ExchangeUniverseConfig, load_config
from common.data import crypto
from common.data.check import check_usable
from common.data.download import download_case
from common.data.exchange_universe import TICKER_PREFILTER, resolve_exchange_universe, write_exchange_universe
from common.data.loading import load_market_data
from common.data.universe import load_universe, universe_as_of, universe_path
from common.errors import UserError

from test_crypto import BINANCE

REPO = Path(__file__).resolve().parent.parent
DAY_MS = 86_400_000
DAY1 = pd.Timestamp("2024-03-01 12:00", tz="UTC")
DAY2 = pd.Timestamp("2024-04-15 09:00", tz="UTC")
ETH_GROWS = pd.Timestamp("2024-03-01", tz="UTC")  # ETH trades 10x more from this day on

# symbol -> (base, quote, status, close, base volume per day, 24h ticker quote volume, listed)
PAIRS = {
    "BTCUSDT": ("BTC", "USDT", "TRADING", 50_000.0, 1_000.0, 5e7, None),  # 5e7 a day
    "ETHUSDT": ("ETH", "USDT", "TRADING", 3_000.0, 100.0, 3e6, None),  # 3e5 a day, 3e6 from ETH_GROWS
    "SOLUSDT": ("SOL", "USDT", "TRADING", 100.0, 5_000.0, 2e6, None),  # 5e5 a day: one busy day only
    "DOGEUSDT": ("DOGE", "USDT", "TRADING", 0.1, 100_000.0, 1e4, None),  # quiet in the 24h ticker
    "LUNAUSDT": ("LUNA", "USDT", "BREAK", 1.0, 1e9, 1e9, None),  # halted
    "USDCUSDT": ("USDC", "USDT", "TRADING", 1.0, 1e8, 1e8, None),  # a stablecoin
    "NEWUSDT": ("NEW", "USDT", "TRADING", 10.0, 1e6, 1e7, "2024-02-27"),  # 1e7 a day, listed 3 days ago
    "ETHBTC": ("ETH", "BTC", "TRADING", 0.06, 1e5, 6e3, None),  # another quote
}


def exchange_info() -> dict:
    """GET /api/v3/exchangeInfo with PAIRS, each shaped like the fixture's BTCUSDT entry."""
    info = json.loads((BINANCE / "exchange_info.json").read_text(encoding="utf-8"))
    template = next(s for s in info["symbols"] if s["symbol"] == "BTCUSDT")
    info["symbols"] = []
    for market_id, (base, quote, status, *_rest) in PAIRS.items():
        entry = copy.deepcopy(template)
        entry.update(
            symbol=market_id, baseAsset=base, quoteAsset=quote, status=status, isSpotTradingAllowed=status == "TRADING"
        )
        info["symbols"].append(entry)
    return info


def base_volume(market_id: str, t: int) -> float:
    volume = PAIRS[market_id][4]
    return volume * 10 if market_id == "ETHUSDT" and t >= ETH_GROWS.value // 1_000_000 else volume


class FakeBinance:
    """Answers ccxt's requests to api.binance.com as of `now`; counts the klines requests."""

    def __init__(self, rsps: responses.RequestsMock, now: pd.Timestamp, tickers_fail: bool = False):
        self.now, self.klines = now, []
        rsps.add(responses.GET, "https://api.binance.com/api/v3/exchangeInfo", json=exchange_info())
        if tickers_fail:
            rsps.add(responses.GET, "https://api.binance.com/api/v3/ticker/24hr", status=503, body="busy")
        else:
            rsps.add(
                responses.GET,
                "https://api.binance.com/api/v3/ticker/24hr",
                json=[
                    {
                        "symbol": m,
                        "quoteVolume": f"{p[5]:.2f}",
                        "volume": f"{p[5] / p[3]:.4f}",
                        "lastPrice": f"{p[3]}",
                        "openTime": 0,
                        "closeTime": 1,
                    }
                    for m, p in PAIRS.items()
                ],
            )
        rsps.add_callback(responses.GET, re.compile(r"https://api\.binance\.com/api/v3/klines\?.*"), self.candles)

    def candles(self, request):
        query = {k: v[0] for k, v in parse_qs(urlsplit(request.url).query).items()}
        assert query["interval"] == "1d"
        market_id = query["symbol"]
        self.klines.append(market_id)
        listed = PAIRS[market_id][6]
        start = max(int(query["startTime"]), pd.Timestamp(listed, tz="UTC").value // 1_000_000 if listed else 0)
        first = -(-start // DAY_MS) * DAY_MS
        now_ms = self.now.value // 1_000_000
        close = PAIRS[market_id][3]
        rows = [
            [
                t,
                f"{close}",
                f"{close}",
                f"{close}",
                f"{close}",
                f"{base_volume(market_id, t)}",
                t + DAY_MS - 1,
                "0",
                7,
                "0",
                "0",
                "0",
            ]
            for t in range(first, now_ms - now_ms % DAY_MS + 1, DAY_MS)
        ]
        return 200, {}, json.dumps(rows[: int(query["limit"])])


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def filters(**kw) -> ExchangeUniverseConfig:
    return ExchangeUniverseConfig(**{"min_quote_volume": 1e6, "volume_days": 30, "exclude_bases": ["USDC"], **kw})


def resolve(f: ExchangeUniverseConfig, now: pd.Timestamp = DAY1, stream=None):
    return resolve_exchange_universe(
        crypto.make_exchange("binance"), f, now, sleep=lambda s: None, base_delay_s=0, stream=stream
    )


# --------------------------------------------------------------------------- the filters


def test_filters_keep_the_liquid_pairs_most_liquid_first(rsps, tmp_path):
    fake = FakeBinance(rsps, DAY1)
    result = resolve(filters())
    # NEW: 1e7 a day for 3 of 30 days = 1e6 exactly; ETH: 3e5 a day before ETH_GROWS (the window's end)
    assert [s for s, _, _ in result.pairs] == ["BTC/USDT", "NEW/USDT"]
    assert result.pairs[0] == ("BTC/USDT", "BTC", pytest.approx(5e7))
    assert result.pairs[1][2] == pytest.approx(1e6)
    assert result.as_of == "2024-03-01" and result.markets == len(PAIRS)
    assert list(result.removed.values()) == [1, 0, 1, 1, 1, 2, 0]  # ETH/BTC, LUNA, USDC, DOGE, ETH + SOL
    assert "ticker pre-filter" in list(result.removed)[4]
    # DOGE's candles were never asked for: the 24h pre-filter left it out (and the others of steps 1-4)
    assert sorted(set(fake.klines)) == ["BTCUSDT", "ETHUSDT", "NEWUSDT", "SOLUSDT"]
    assert PAIRS["DOGEUSDT"][5] < TICKER_PREFILTER * 1e6 <= PAIRS["SOLUSDT"][5]

    path = write_exchange_universe(tmp_path, result)
    assert path == tmp_path / "universe_exchange_binance_2024-03-01.csv"
    assert universe_as_of(path) == "2024-03-01"
    text = path.read_text(encoding="utf-8")
    assert "Survivorship bias" in text and "# Of 8 markets: quote not USDT: 1 removed" in text
    assets = load_universe(path)
    assert [(a.symbol, a.source, a.category, a.name) for a in assets] == [
        ("BTC/USDT", "ccxt", "crypto", "BTC"),
        ("NEW/USDT", "ccxt", "crypto", "NEW"),
    ]


def test_max_count_and_no_active_filter(rsps):
    FakeBinance(rsps, DAY1)
    result = resolve(filters(max_count=1, active_only=False, exclude_bases=[]))
    assert [s for s, _, _ in result.pairs] == ["LUNA/USDT"]  # halted, but the busiest when active_only is off
    assert result.removed["beyond max_count 1"] == 3  # USDC, BTC, NEW passed the volume filter too


def test_without_tickers_every_pair_is_measured_by_its_candles(rsps):
    fake = FakeBinance(rsps, DAY1, tickers_fail=True)
    stream = io.StringIO()
    result = resolve(filters(), stream=stream)
    assert [s for s, _, _ in result.pairs] == ["BTC/USDT", "NEW/USDT"]
    assert "DOGEUSDT" in fake.klines and "no pre-filter" in stream.getvalue()
    assert not any("ticker" in what for what in result.removed)


def test_a_filter_that_leaves_no_pair_is_one_clear_error(rsps, tmp_path):
    FakeBinance(rsps, DAY1)
    with pytest.raises(UserError) as e:
        resolve(filters(quote="USDT", min_quote_volume=1e12))
    message = str(e.value)
    assert "leaves no pair of binance's 8 markets on 2024-03-01" in message
    assert "quote not USDT: 1 removed" in message and "not active (halted or delisted): 1 removed" in message
    assert "average daily quote volume over 30 days below 1,000,000,000,000 USDT: 0 removed" in message
    assert "ticker pre-filter): 5 removed" in message  # every pair trades less than 1e11 a day
    assert "loosen the filters" in message and "\n" not in message


# --------------------------------------------------------------------------- download, training, plan


def case_config() -> Config:
    cfg = Config()
    d = cfg.data
    d.universe, d.source, d.interval, d.start_date = "exchange", "download", "1d", "2024-01-01"
    d.exchange_universe = filters()
    cfg.model.context_length = 8
    return cfg


def download(cfg: Config, case: Path, now: pd.Timestamp, rsps) -> None:
    FakeBinance(rsps, now)
    download_case(cfg, case, progress=False, sleep=lambda s: None, now=now, stream=io.StringIO())


def test_twice_on_different_days_writes_two_dated_files_and_training_reads_the_newest(
    rsps, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MARKETGPT_RETRY_DELAY_S", "0")
    case, cfg = tmp_path / "case_x", case_config()
    case.mkdir()
    with pytest.raises(UserError, match=r"run `marketgpt data download` first"):
        load_market_data(cfg.data, case)

    download(cfg, case, DAY1, rsps)
    first = case / "universe_exchange_binance_2024-03-01.csv"
    assert universe_path(case, "exchange", "binance") == first
    rsps.reset()
    download(cfg, case, DAY2, rsps)
    second = case / "universe_exchange_binance_2024-04-15.csv"
    assert sorted(p.name for p in case.glob("universe_*.csv")) == [first.name, second.name]
    assert [a.symbol for a in load_universe(first)] == ["BTC/USDT", "NEW/USDT"]
    # by 2024-04-15 ETH has traded 10x more for 30 days
    assert [a.symbol for a in load_universe(second)] == ["BTC/USDT", "NEW/USDT", "ETH/USDT"]
    assert universe_as_of(second) == "2024-04-15"

    capsys.readouterr()
    market = load_market_data(cfg.data, case)  # training's loader
    assert [a.symbol for a in market.assets] == ["BTC/USDT", "NEW/USDT", "ETH/USDT"]
    assert len(market.candles["ETH/USDT"]) > 100  # the cached candles of the newest universe's pairs
    assert "data.universe = 'exchange': universe_exchange_binance_2024-04-15.csv" in capsys.readouterr().err

    usable = check_usable(cfg, case)  # `marketgpt data check`
    assert (
        usable.universe_file == second.name
        and "universe_exchange_binance_2024-04-15.csv as of 2024-04-15" in usable.format()
    )


def test_plan_names_the_universe_file(tmp_path):
    from common.commands.plan_data import data_figures

    case, cfg = tmp_path / "case_x", case_config()
    case.mkdir()
    (case / "universe_exchange_binance_2024-03-01.csv").write_text(
        "# As of 2024-03-01: resolved\nsymbol,source,category,name\nBTC/USDT,ccxt,crypto,BTC\n", encoding="utf-8"
    )
    figures = data_figures(cfg, case)
    assert (
        "estimated" in figures.basis
        and "universe universe_exchange_binance_2024-03-01.csv (as of 2024-03-01)" in figures.basis
    )


# --------------------------------------------------------------------------- the config


def test_the_example_config_loads():
    cfg = load_config(REPO / "case_c_crypto" / "configs" / "crypto_exchange_universe.json")
    assert cfg.data.universe == "exchange" and cfg.data.exchange_universe.quote == "USDT"


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data.exchange_universe.volume_days=0"], "data.exchange_universe.volume_days"),
        (["data.exchange_universe.min_quote_volume=-1"], "data.exchange_universe.min_quote_volume"),
        (["data.exchange_universe.max_count=0"], "data.exchange_universe.max_count"),
        (["data.exchange_universe.quote=usdt"], "data.exchange_universe.quote"),
        (["data.exchange_universe.spot_only=false"], "data.exchange_universe.spot_only"),
        (["data.exchange_universe.exclude_bases=usdc"], "data.exchange_universe.exclude_bases"),
        (['data.universe_counts={"crypto": 20}'], "data.universe_counts"),
        (["data.quote_currency=USD"], "data.quote_currency"),
        (["data.source=sample"], "data.universe"),
    ],
)
def test_bad_exchange_universe_settings_name_the_key(overrides, key):
    path = REPO / "case_c_crypto" / "configs" / "crypto_exchange_universe.json"
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
        load_config(path, overrides)


def test_filters_without_the_exchange_universe_are_refused():
    path = REPO / "case_c_crypto" / "configs" / "crypto_prototype.json"
    assert load_config(path, ["data.exchange_universe.max_count=200"])  # the default: nothing set
    with pytest.raises(ConfigError, match=r"'data.exchange_universe' is read only with data.universe = 'exchange'"):
        load_config(path, ["data.exchange_universe.max_count=50"])


def test_the_case_default_config_stays_the_seed_guides_beside_the_example(tmp_path):
    from common.paths import case_config as default_config

    assert default_config(REPO / "case_c_crypto") == REPO / "case_c_crypto" / "configs" / "crypto_prototype.json"
    (tmp_path / "configs").mkdir()
    for name in ("one.json", "two.json"):
        (tmp_path / "configs" / name).write_text("{}", encoding="utf-8")
    with pytest.raises(UserError, match="expected one config file, found 2; pass --config explicitly"):
        default_config(tmp_path)
