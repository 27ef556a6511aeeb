"""common.data.synthetic: a deterministic synthetic market whose statistics are the spec's, whose
truth is the t density it claims, and whose files the data.source = "files" reader takes as they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from common.config import Config
from common.data.files import load_files, read_candle_file
from common.data.synthetic import SyntheticSpec, generate_asset, iter_assets, oracle_nll, read_truth, t_nll, write_files
from common.errors import UserError

# No GARCH, no regimes: only the t innovations (to isolate one effect at a time).
PLAIN = dict(garch_alpha=0.0, garch_beta=0.0, p_stress=0.0)


def returns(asset) -> np.ndarray:
    return np.diff(np.log(asset.candles["close"].to_numpy()))


def test_same_seed_same_frames_and_one_asset_alone_equals_the_stream():
    spec = SyntheticSpec(assets=3, candles=300, interval="1h", gap_prob=0.1, seed=7)
    first, second = list(iter_assets(spec)), list(iter_assets(spec))
    for a, b in zip(first, second):
        pd.testing.assert_frame_equal(a.candles, b.candles)
        pd.testing.assert_frame_equal(a.truth, b.truth)
    alone = generate_asset(spec, 2)
    assert alone.symbol == first[2].symbol == "SYN0002"
    pd.testing.assert_frame_equal(alone.candles, first[2].candles)
    pd.testing.assert_frame_equal(alone.truth, first[2].truth)
    other = generate_asset(SyntheticSpec(assets=3, candles=300, interval="1h", gap_prob=0.1, seed=8), 2)
    assert not np.allclose(other.candles["close"].to_numpy()[:100], alone.candles["close"].to_numpy()[:100])
    assert not np.allclose(first[0].candles["close"].to_numpy(), first[1].candles["close"].to_numpy())
    with pytest.raises(UserError, match="asset index 3"):
        generate_asset(spec, 3)


def test_categories_cycle_and_symbols_sort():
    spec = SyntheticSpec(assets=5, candles=10, categories=("crypto", "fx"))
    assets = list(iter_assets(spec))
    assert [a.category for a in assets] == ["crypto", "fx", "crypto", "fx", "crypto"]
    assert [a.symbol for a in assets] == sorted(a.symbol for a in assets)


def test_ohlc_invariants_utc_grid_and_gap_fraction():
    spec = SyntheticSpec(assets=1, candles=20_000, interval="15m", gap_prob=0.1, start="2024-03-01 09:30")
    asset = generate_asset(spec, 0)
    c = asset.candles
    assert list(c.columns) == ["open", "high", "low", "close", "volume"] and (c.dtypes == np.float64).all()
    assert (c[["open", "high", "low", "close", "volume"]].to_numpy() > 0).all()
    assert (c["high"] >= np.maximum(c["open"], c["close"])).all()
    assert (c["low"] <= np.minimum(c["open"], c["close"])).all()
    assert str(c.index.tz) == "UTC" and c.index[0] == pd.Timestamp("2024-03-01 09:30", tz="UTC")
    steps = np.diff(c.index.asi8) // (900 * 10**9)
    assert (np.diff(c.index.asi8) % (900 * 10**9) == 0).all() and (steps >= 1).all()
    assert abs(1 - len(c) / spec.candles - 0.1) < 0.015
    assert asset.truth.index.equals(c.index)
    assert np.isnan(asset.truth["nll_next"].iloc[-1]) and np.isfinite(asset.truth["nll_next"].iloc[:-1]).all()
    assert (np.diff(generate_asset(SyntheticSpec(candles=50), 0).candles.index.asi8) == 86400 * 10**9).all()


def test_heavy_tails_and_volatility_clustering():
    r = returns(generate_asset(SyntheticSpec(assets=1, candles=20_000, nu=5.0, **PLAIN), 0))
    assert stats.kurtosis(r) > 1.0  # t(5): 6 in theory; a Gaussian gives ~0
    acf = lambda x: np.corrcoef(np.abs(x[1:]), np.abs(x[:-1]))[0, 1]  # noqa: E731
    assert abs(acf(r)) < 0.05  # no GARCH, no regimes: no clustering
    clustered = returns(
        generate_asset(SyntheticSpec(assets=1, candles=20_000, garch_alpha=0.1, garch_beta=0.85, p_stress=0.0), 0)
    )
    assert acf(clustered) > 0.1


def test_assets_co_move_with_the_market_factor():
    def corr(beta: float) -> float:
        a, b = iter_assets(SyntheticSpec(assets=2, candles=20_000, market_beta=beta, **PLAIN))
        return np.corrcoef(returns(a), returns(b))[0, 1]

    assert corr(0.8) > 0.45  # ~0.54: beta**2 = 0.64 shrunk by each asset's own t mixing
    assert abs(corr(0.0)) < 0.05


def test_intraday_seasonality_is_a_u_over_the_day():
    asset = generate_asset(SyntheticSpec(assets=1, candles=24 * 1500, interval="1h", seasonality=1.5, **PLAIN), 0)
    hour = asset.candles.index.hour[1:]
    by_hour = pd.Series(np.abs(returns(asset))).groupby(np.asarray(hour)).mean()
    middle = by_hour.loc[10:13].mean()
    assert by_hour.loc[0] > 1.6 * middle and by_hour.loc[23] > 1.6 * middle
    assert by_hour.loc[6] > middle and by_hour.loc[18] > middle


def test_standardized_residuals_have_the_t_variance():
    nu = 8.0
    asset = generate_asset(SyntheticSpec(assets=1, candles=50_000, interval="1h", nu=nu, gap_prob=0.05), 0)
    truth = asset.truth.iloc[:-1]
    z = (returns(asset) - truth["mu"].to_numpy()) / truth["sigma"].to_numpy()
    assert abs(z.var() - nu / (nu - 2)) < 0.06
    assert abs(z.mean()) < 0.02


def test_nll_next_is_the_t_log_density():
    asset = generate_asset(SyntheticSpec(assets=1, candles=200, nu=4.5, drift=0.001, interval="4h"), 0)
    r, truth = returns(asset), asset.truth
    for t in (0, 17, 100, 198):
        row = truth.iloc[t]
        expected = -stats.t.logpdf(r[t], df=row["nu"], loc=row["mu"], scale=row["sigma"])
        assert row["nll_next"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert oracle_nll(truth) == pytest.approx(truth["nll_next"].iloc[:-1].mean())
    assert t_nll(np.array([0.0]), 0.0, 1.0, 4.5)[0] == pytest.approx(-stats.t.logpdf(0.0, df=4.5))


def test_oracle_nll_over_a_range_and_several_assets():
    assets = list(iter_assets(SyntheticSpec(assets=2, candles=100)))
    truths = [a.truth for a in assets]
    split = "2020-02-15"
    after = np.concatenate([t.loc[t.index >= pd.Timestamp(split, tz="UTC"), "nll_next"].dropna() for t in truths])
    assert oracle_nll(truths, start=split) == pytest.approx(after.mean())
    with pytest.raises(UserError, match="no candle"):
        oracle_nll(truths, start="2030-01-01")


def test_written_files_read_back_unchanged(tmp_path: Path):
    spec = SyntheticSpec(assets=2, candles=120, interval="1h", gap_prob=0.05, categories=("crypto",))
    paths = write_files(spec, tmp_path)
    assert [p.name for p in paths] == ["SYN0000.parquet", "SYN0001.parquet"]
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]  # no temp files left
    for asset, path in zip(iter_assets(spec), paths):
        frames, fixes, naive = read_candle_file(path, "1h")
        assert not naive and fixes[asset.symbol] == {"unparsable_timestamp": 0, "off_interval": 0}
        pd.testing.assert_frame_equal(frames[asset.symbol], asset.candles, check_freq=False)
        pd.testing.assert_frame_equal(read_truth(tmp_path, asset.symbol), asset.truth, check_freq=False)
    cfg = Config()
    cfg.data.source, cfg.data.files_dir, cfg.data.universe = "files", str(tmp_path), "files"
    cfg.data.interval, cfg.data.default_category = "1h", "crypto"
    market = load_files(cfg.data, tmp_path)
    assert [a.symbol for a in market.assets] == ["SYN0000", "SYN0001"]  # truth/ is a folder: not read


@pytest.mark.parametrize(
    "field, value",
    [
        ("assets", 0),
        ("candles", 1),
        ("interval", "2h"),
        ("nu", 2.0),
        ("garch_alpha", -0.1),
        ("garch_beta", 0.95),
        ("p_stress", 1.5),
        ("stress_vol", 0.0),
        ("market_beta", 1.2),
        ("seasonality", -1.0),
        ("gap_prob", 1.0),
        ("categories", ("moon",)),
        ("start", "not a date"),
        ("process", "heston"),
    ],
)
def test_bad_specs_name_the_field(field: str, value: object):
    with pytest.raises(UserError, match=f"SyntheticSpec.{field} "):
        SyntheticSpec(**{field: value})


# --------------------------------------------------------------------------- the rich process

RICH = SyntheticSpec(assets=2, candles=30_000, interval="1h", process="rich", seed=3, categories=("crypto",))


@pytest.fixture(scope="module")
def rich_pair():
    return generate_asset(RICH, 0), generate_asset(RICH, 1)


def test_the_rich_process_is_deterministic_and_its_truth_is_calibrated(rich_pair):
    again = generate_asset(RICH, 1)  # a follower made alone remakes its leader's shocks
    pd.testing.assert_frame_equal(again.candles, rich_pair[1].candles)
    for asset in rich_pair:  # the realized next return's PIT under the truth: uniform
        r = np.append(returns(asset), np.nan)
        t = asset.truth
        ok = np.isfinite(r) & t["mu"].notna().to_numpy()
        pit = stats.t.cdf((r[ok] - t["mu"].to_numpy()[ok]) / t["sigma"].to_numpy()[ok], RICH.nu)
        assert stats.kstest(pit, "uniform").pvalue > 0.001
        assert np.allclose(
            t["nll_next"].to_numpy()[ok], t_nll(r[ok], t["mu"].to_numpy()[ok], t["sigma"].to_numpy()[ok], RICH.nu)
        )


def test_the_rich_process_has_long_memory_leverage_and_lead_lag(rich_pair):
    leader, follower = (returns(a) for a in rich_pair)
    size = np.abs(leader)
    assert np.corrcoef(size[:-50], size[50:])[0, 1] > 0.08  # |r| still remembers 50 candles back
    next_sigma = rich_pair[0].truth["sigma"].to_numpy()[1:-1]  # sigma of r_{t+1}, row by row with r_t
    assert np.corrcoef(leader[:-1], next_sigma)[0, 1] < -0.02  # leverage: a down move raises the next sigma
    assert np.corrcoef(follower[1:], leader[:-1])[0, 1] > 0.1  # the follower echoes its leader's last move
    assert abs(np.corrcoef(leader[1:], follower[:-1])[0, 1]) < 0.05  # and not the other way round
    plain = generate_asset(SyntheticSpec(assets=1, candles=30_000, interval="1h", seed=3), 0)
    assert plain.truth["mu"].nunique() == 1  # the default process keeps its constant mean
