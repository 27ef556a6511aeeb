"""Forecaster.predict_df: a long data frame in, one row per item and future timestamp out with
"mean" and the quantile columns (the forecasting libraries' convention); the candles cleaned as
training cleaned them, the same paths as forecast(); each bad frame one error naming the item."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from common.data.cleaning import fill_gaps
from common.data.loading import load_market_data
from common.errors import UserError
from common.forecasting.forecast_io import History, future_timestamps
from common.forecasting.forecaster import Forecaster
from common.forecasting.frames import DEFAULT_LEVELS
from common.markets import interval_step

from test_forecast import TINY, _fixed_logit_forecaster, candles, fitted_tokenizer, train_tiny

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")


def long_frame(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """item_id, timestamp, OHLCV: one row per item and timestamp, as the libraries take them."""
    return pd.concat(
        [f.rename_axis("timestamp").reset_index().assign(item_id=s) for s, f in frames.items()], ignore_index=True
    )[["item_id", "timestamp", "open", "high", "low", "close", "volume"]]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """test_forecast.py's tiny trained run."""
    return train_tiny(tmp_path_factory.mktemp("fc"), TINY)[1]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory) -> Forecaster:
    """A real model whose next-token distribution is spread over the return bins, whatever the input."""
    tok = fitted_tokenizer()
    logits = torch.full((tok.vocab_size,), -1e4)
    logits[4 : tok.num_used_ids] = torch.linspace(-1, 1, tok.num_used_ids - 4)
    return _fixed_logit_forecaster(logits, tok, tmp_path_factory.mktemp("fixed"))


def test_rows_columns_and_the_same_paths_as_forecast(fixed):
    stock, coin = candles(60, 1), candles(60, 2)
    coin = coin.drop(coin.index[[30, 31, 50]])  # crypto holes: training's cleaning fills them as MISSING rows
    out = fixed.predict_df(
        long_frame({"X": stock, "C": coin}), horizon=4, quantile_levels=[0.1, 0.5, 0.9], samples=64, seed=5
    )
    assert list(out.columns) == ["item_id", "timestamp", "mean", "0.1", "0.5", "0.9"]
    assert list(out["item_id"]) == ["X"] * 4 + ["C"] * 4
    filled, _ = fill_gaps(coin, interval_step("1d"))
    assert len(filled) == 60
    ref = fixed.forecast([History("X", stock), History("C", filled)], 4, 64, seed=5, return_paths=True)
    for item, last, category, part in (
        ("X", stock.index[-1], "us_stock", slice(0, 4)),
        ("C", coin.index[-1], "crypto", slice(4, 8)),
    ):
        rows = out[out["item_id"] == item]
        np.testing.assert_array_equal(rows["timestamp"], future_timestamps(last, "1d", category, 4))
        np.testing.assert_allclose(rows["0.1"], ref.table["p10"].iloc[part])  # the same paths as forecast()
        np.testing.assert_allclose(rows["0.5"], ref.table["p50"].iloc[part])
        np.testing.assert_allclose(rows["0.9"], ref.table["p90"].iloc[part])
    np.testing.assert_allclose(out["mean"], ref.paths["close"][:, :, 1:].mean(axis=1).reshape(-1))
    assert (out["0.1"] < out["0.5"]).all() and (out["0.5"] < out["0.9"]).all()  # the paths do spread
    assert (out["timestamp"].iloc[:4].dt.day_of_week < 5).all()  # the stock's calendar: trading days
    frame = long_frame({"X": stock, "C": coin})
    again = fixed.predict_df(frame.set_axis([0] * len(frame)), 4, [0.1, 0.5, 0.9], samples=64, seed=5)
    pd.testing.assert_frame_equal(out, again)  # same seed, same frame; the frame's index labels are not read


def test_default_levels_naive_timestamps_and_an_indexed_frame(fixed):
    frame = long_frame({"X": candles(40, 3)})
    out = fixed.predict_df(frame, horizon=2, samples=16)
    assert list(out.columns) == ["item_id", "timestamp", "mean", *(str(q) for q in DEFAULT_LEVELS)]
    assert out.columns[3:].tolist()[:3] == ["0.1", "0.2", "0.3"] and out["timestamp"].dt.tz is not None
    naive = frame.assign(timestamp=frame["timestamp"].dt.tz_localize(None))  # naive is UTC; naive out
    out_naive = fixed.predict_df(naive, horizon=2, samples=16)
    assert out_naive["timestamp"].dt.tz is None
    np.testing.assert_array_equal(out_naive["timestamp"], out["timestamp"].dt.tz_localize(None))
    pd.testing.assert_frame_equal(out_naive.drop(columns="timestamp"), out.drop(columns="timestamp"))
    indexed = frame.set_index(["item_id", "timestamp"])  # an (item_id, timestamp) index, no volume
    pd.testing.assert_frame_equal(fixed.predict_df(indexed.drop(columns="volume"), horizon=2, samples=16), out)


def _frame_with(change) -> pd.DataFrame:
    frame = long_frame({"X": candles(40, 3), "C": candles(40, 4)})
    return change(frame)


def _swap(frame: pd.DataFrame) -> pd.DataFrame:
    frame.iloc[[45, 46]] = frame.iloc[[46, 45]].to_numpy()
    return frame


BAD_FRAMES = {
    "missing column": (lambda f: f.drop(columns=["high", "low"]), ["lacks column(s) high, low"]),
    "no rows": (lambda f: f.iloc[:0], ["no rows"]),
    "no item id": (lambda f: f.assign(item_id=f["item_id"].where(f.index != 3)), ["1 row(s) have no item_id"]),
    "bad timestamp": (
        lambda f: f.astype({"timestamp": object}).assign(
            timestamp=lambda g: g["timestamp"].where(g.index != 50, "soon")
        ),
        ["item 'C'", "'soon' is not a date"],
    ),
    "unsorted": (_swap, ["item 'C'", "not in increasing order", "sort the frame"]),
    "duplicate": (
        lambda f: pd.concat([f.iloc[:11], f.iloc[[10]], f.iloc[11:]]),
        ["item 'X'", "appears more than once"],
    ),
    "prices not numbers": (
        lambda f: f.astype({"close": object}).assign(close=lambda g: g["close"].where(g.index != 50, "n/a")),
        ["item 'C'", "must hold numbers"],
    ),
    "unknown item": (lambda f: f.replace({"item_id": {"C": "CC"}}), ["item 'CC' is not an asset", "did you mean 'C'?"]),
    "too short": (lambda f: f.drop(index=range(40, 70)), ["item 'C'", "10 candles", "16 needed"]),
    "wrong interval": (
        lambda f: f.assign(
            timestamp=f["timestamp"].where(
                f["item_id"] == "X", pd.date_range("2020-01-01", periods=80, freq="h", tz="UTC")
            )
        ),
        ["item 'C'", "0 days 01:00:00 apart", "forecasts 1d candles"],
    ),
}


@pytest.mark.parametrize("name", BAD_FRAMES)
def test_a_bad_frame_is_one_error_naming_the_item(fixed, name):
    change, needles = BAD_FRAMES[name]
    with pytest.raises(UserError) as e:
        fixed.predict_df(_frame_with(change), horizon=3, samples=8)
    message = str(e.value)
    assert "\n" not in message and message.startswith("predict_df:"), message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("item", ["X", "C"])  # a stock, and crypto (whose gaps cleaning fills)
def test_a_nan_last_close_is_refused_and_no_forecast_lands_on_an_input_time(fixed, item):
    """Cleaning drops a candle without a close: at the end that would move the origin back a
    step and date the first forecast on the frame's own last timestamp. Refused instead, naming
    the item and the time; without that row the forecast starts after the frame's new end."""
    frame = _frame_with(lambda f: f)
    last = frame.index[frame["item_id"] == item][-1]
    frame.loc[last, "close"] = np.nan
    with pytest.raises(UserError) as e:
        fixed.predict_df(frame, horizon=3, samples=8)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"predict_df: item {item!r}: its last candle"), message
    assert f"at {frame.loc[last, 'timestamp']}, has close NaN" in message, message
    kept = frame.drop(index=last)
    out = fixed.predict_df(kept, horizon=3, samples=8)
    for name, rows in out.groupby("item_id"):
        inputs = kept.loc[kept["item_id"] == name, "timestamp"]
        assert rows["timestamp"].min() > inputs.max() and not rows["timestamp"].isin(inputs).any(), name


@pytest.mark.parametrize("levels, horizon", [([0.5, 1.0], 3), ([0.5, 0.5], 3), ([], 3), ("high", 3), ([0.5], 0)])
def test_bad_levels_and_horizons(fixed, levels, horizon):
    with pytest.raises(UserError, match="quantile_levels|--horizon"):
        fixed.predict_df(long_frame({"X": candles(40, 3)}), horizon, levels, samples=8)
    with pytest.raises(UserError, match="DataFrame"):
        fixed.predict_df({"X": candles(40, 3)}, 3)


def test_the_runs_own_raw_candles_forecast_as_the_cli_does(run_dir):
    """The raw candles of the run's data source, cut at an origin: predict_df cleans them as
    load_history does (common.forecasting.history.clean_history), so it samples the same paths."""
    fc = Forecaster.from_run(run_dir)
    as_of = pd.Timestamp("2012-06-01", tz="UTC")
    market = load_market_data(fc.cfg.data, run_dir.parent.parent)
    raw = {s: market.candles[s] for s in ("AAPL", "IBM")}
    raw = {s: f[(f.index.tz_localize("UTC") if f.index.tz is None else f.index) <= as_of] for s, f in raw.items()}
    out = fc.predict_df(long_frame(raw), horizon=5, quantile_levels=[0.05, 0.5, 0.95], samples=40, seed=2)
    table = fc.forecast(fc.load_history(["AAPL", "IBM"], "2012-06-01"), 5, 40, seed=2).table
    np.testing.assert_array_equal(out["timestamp"], table["timestamp"])
    for level, column in (("0.05", "p5"), ("0.5", "p50"), ("0.95", "p95")):
        np.testing.assert_allclose(out[level], table[column], rtol=1e-12)
