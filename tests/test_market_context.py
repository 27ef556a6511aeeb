"""model.market_context: the cross-section's ids, causal by close time, equal in every path."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from common.cli import main
from common.config import ModelConfig
from common.errors import UserError
from common.forecasting.forecaster import Forecaster
from common.forecasting.history import load_histories
from common.model.gpt import MarketGPT
from common.tokens.features import MARKET_BINS, feature_columns
from common.tokens.market_context import (
    DISPERSION_EDGES,
    MIN_ANALOGS,
    MOVE_EDGES,
    PEER_EDGES,
    MarketContext,
    SeriesMoves,
    _summary_ids,
    close_times,
)
from common.tokens.token_set import TokenSet

from test_forecast import TINY, train_tiny

DAY = 86_400 * 10**9


def _days(start: str, n: int, step_days: int = 1) -> np.ndarray:
    return pd.date_range(start, periods=n, freq=f"{step_days}D", tz="UTC").as_unit("ns").asi8


def _random_series(rng: np.random.Generator, stamps: np.ndarray, interval: str = "1d") -> SeriesMoves:
    n = len(stamps)
    move = rng.standard_normal(n)
    move[rng.random(n) < 0.1] = np.nan  # missing candles
    level = rng.normal(0, 0.3, n)
    level[:5] = np.nan  # not warm
    return SeriesMoves(interval, stamps, move, level)


def test_a_daily_candle_closes_at_the_end_of_its_utc_date_an_intraday_one_after_its_interval():
    stamps = pd.DatetimeIndex(["2024-03-01 00:00", "2024-03-01 14:30"], tz="UTC").as_unit("ns").asi8
    assert list(close_times(stamps, "1d")) == [stamps[0] + DAY, stamps[0] + DAY]
    assert list(close_times(stamps, "1h")) == [s + 3600 * 10**9 for s in stamps]


def test_the_ids_summarize_the_fresh_cross_section_and_say_unknown_without_two_series():
    t = _days("2024-01-01", 3)
    series = {
        "A": SeriesMoves("1d", t, np.array([0.9, 0.1, np.nan]), np.array([0.2, 0.2, 0.2])),
        "B": SeriesMoves("1d", t, np.array([0.3, np.nan, np.nan]), np.array([0.0, np.nan, 0.0])),
        "C": SeriesMoves("1d", t[:1], np.array([-0.6]), np.array([0.1])),
    }
    ids = MarketContext(series).own_ids("A")
    moves = np.array([0.9, 0.3, -0.6])
    expect_move = np.searchsorted(MOVE_EDGES, moves.mean(), side="right") + 1
    expect_disp = np.searchsorted(DISPERSION_EDGES, moves.std(ddof=1), side="right") + 1
    assert list(ids[0, :2]) == [expect_move, expect_disp]
    # day 2: only A moved (B missing, C has no candle): fewer than two series, unknown; A and B
    # have a level (B's NaN is not a reading, its day-1 level is a day old), so the level is known
    # only on days 1 and 3
    assert list(ids[1, :2]) == [0, 0] and ids[1, 2] == 0
    assert ids[2, 2] > 0 and list(ids[2, :2]) == [0, 0]


def test_a_position_never_sees_a_candle_that_closed_after_its_own():
    """Every id at time t is unchanged when everything that closed after t changes: the context of
    a series' candles up to T is byte-identical after any series' later candles change."""
    rng = np.random.default_rng(0)
    daily = {f"S{i}": _random_series(rng, _days("2024-01-01", 200)) for i in range(6)}
    daily["W"] = _random_series(rng, _days("2024-01-03", 40, 5))  # weekly-ish: often stale
    hourly = {
        f"H{i}": _random_series(rng, pd.date_range("2024-01-01", periods=300, freq="h", tz="UTC").asi8, "1h")
        for i in range(3)
    }
    series = {**daily, **hourly}
    full = MarketContext(series)
    for name, s in series.items():
        closes = close_times(s.stamps, s.interval)
        cut = closes[len(closes) // 2]
        changed = {}
        for other, o in series.items():  # every series' candles closing after `cut` redrawn
            later = close_times(o.stamps, o.interval) > cut
            move, level = o.move.copy(), o.level.copy()
            move[later], level[later] = rng.standard_normal(later.sum()) * 3, 1.0
            changed[other] = SeriesMoves(o.interval, o.stamps, move, level)
        before = full.own_ids(name)[closes <= cut]
        after = MarketContext(changed).own_ids(name)[closes <= cut]
        np.testing.assert_array_equal(before, after)
        assert (full.own_ids(name) > 0).any()
    # a time between the candles' closes is computed on its own, as the table's are
    some = close_times(daily["S0"].stamps, "1d")[::7]
    np.testing.assert_array_equal(full.ids("1d", some + 3600 * 10**9), full._compute("1d", some + 3600 * 10**9))
    np.testing.assert_array_equal(full.ids("1d", some), full._compute("1d", some))


def _reference_ids(series: dict, interval: str, t: np.ndarray) -> np.ndarray:
    """The ids by the definition, one time and one series at a time: each series' last finite
    reading closed at or before t and after t - one interval."""
    fresh = 86_400 * 10**9 if interval == "1d" else 3600 * 10**9
    moves = np.full((len(t), len(series)), np.nan)
    levels = np.full((len(t), len(series)), np.nan)
    for k, name in enumerate(sorted(series)):
        s = series[name]
        if s.interval != interval:
            continue
        closes = close_times(s.stamps, s.interval)
        for i, ti in enumerate(t):
            for values, out in ((s.move, moves), (s.level, levels)):
                ok = np.isfinite(values) & (closes <= ti) & (closes > ti - fresh)
                if ok.any():
                    out[i, k] = values[np.flatnonzero(ok)[-1]]
    return _summary_ids(moves, levels)


def test_the_ids_follow_their_definition_for_regular_and_irregular_series():
    """A cleaned series (one candle per interval) is read in place, NaN meaning no reading; one
    with two candles closing within an interval (two stamps of one date) keeps its finite readings
    only: both answer as the definition does, whether given as a mapping or one series at a time."""
    rng = np.random.default_rng(2)
    series = {f"S{i}": _random_series(rng, _days("2024-01-01", 60)) for i in range(4)}
    twice = np.sort(np.concatenate([_days("2024-01-01", 30), _days("2024-01-01", 30) + 15 * 3600 * 10**9]))
    series["T"] = _random_series(rng, twice)
    series["T"].move[1::2] = np.nan  # the date's later candle often missing: its earlier one is fresh
    t = np.unique(np.concatenate([close_times(s.stamps, "1d") for s in series.values()]))
    t = np.concatenate([t, t[::5] + 7 * 3600 * 10**9])
    context = MarketContext(iter(series.items()))
    np.testing.assert_array_equal(context.ids("1d", t), _reference_ids(series, "1d", t))
    np.testing.assert_array_equal(MarketContext(series).ids("1d", t), _reference_ids(series, "1d", t))
    assert (context.ids("1d", t) > 0).all(axis=1).mean() > 0.5


def test_daily_pools_hold_every_market_of_the_date_and_hourly_pools_their_own_interval():
    rng = np.random.default_rng(1)
    t = _days("2024-01-01", 10)
    a, b = _random_series(rng, t), _random_series(rng, t)
    hourly = _random_series(rng, pd.date_range("2024-01-01", periods=240, freq="h", tz="UTC").asi8, "1h")
    alone = MarketContext({"A": a, "B": b}).own_ids("A")
    # an hourly series does not enter a daily pool; a European and a US candle of one date are
    # one cross-section, closed at the end of the date
    np.testing.assert_array_equal(alone, MarketContext({"A": a, "B": b, "H": hourly}).own_ids("A"))
    shifted = b._replace(stamps=b.stamps + 14 * 3600 * 10**9)  # B dated the same days, stamped later
    np.testing.assert_array_equal(alone, MarketContext({"A": a, "B": shifted}).own_ids("A"))
    # the result does not depend on the order the series are given in
    np.testing.assert_array_equal(alone, MarketContext({"B": b, "A": a}).own_ids("A"))


def test_analog_futures_follow_past_closes_like_the_origin_and_read_nothing_after_it():
    """MarketContext.analogs: each drawn future is the ids that followed a past close whose ids are
    among the nearest to the origin's, complete by the origin's close; a change after it changes
    nothing; without a complete past future the origin's ids are held."""
    rng = np.random.default_rng(3)
    series = {f"S{i}": _random_series(rng, _days("2024-01-01", 300)) for i in range(5)}
    context = MarketContext(series)
    times, table = context._table("1d")
    origin, horizon = int(times[200]), 5
    futures = context.analogs("1d", origin, horizon, 400, np.random.default_rng(0))
    assert futures.shape == (400, horizon, 3)
    last = 200 - horizon  # the last start whose future has closed by the origin's close
    distance = np.abs(table[: last + 1] - table[200]).sum(axis=1)
    near = np.flatnonzero(distance <= np.sort(distance)[MIN_ANALOGS - 1])
    followed = {table[s + 1 : s + 1 + horizon].tobytes() for s in near}
    assert all(f.tobytes() in followed for f in futures)
    assert len({f.tobytes() for f in futures}) > 10  # many analogs, not one
    # everything after the origin's close redrawn: the same futures
    changed = {}
    for name, o in series.items():
        later = close_times(o.stamps, "1d") > origin
        move = o.move.copy()
        move[later] = rng.standard_normal(later.sum()) * 3
        changed[name] = o._replace(move=move)
    again = MarketContext(changed).analogs("1d", origin, horizon, 400, np.random.default_rng(0))
    np.testing.assert_array_equal(again, futures)
    early = context.analogs("1d", int(times[3]), horizon, 7, np.random.default_rng(0))
    assert (early == table[3]).all()  # no past future complete yet: the origin's ids held


def _lead_lag(n: int, seed: int = 5, lam: float = 0.3) -> dict[str, SeriesMoves]:
    """Four daily series: F follows L (its move carries lam x L's move of the day before), U and V
    move alone."""
    rng = np.random.default_rng(seed)
    stamps = _days("2020-01-01", n)
    e = {k: rng.standard_normal(n) for k in "LFUV"}
    e["F"][1:] += lam * e["L"][:-1]
    return {k: SeriesMoves("1d", stamps, v, np.zeros(n)) for k, v in e.items()}


def test_a_peer_is_the_series_whose_last_move_predicts_the_next_fitted_on_training_candles_only():
    series = _lead_lag(3000)
    context = MarketContext(series)
    train = {k: 2000 for k in series}
    peers = context.fit_peers(train)
    assert peers["F"] == "L" and set(peers) == set(series) and all(k != p for k, p in peers.items())
    # what follows the training candles is never read: anything there, the same peers
    changed = {k: s._replace(move=np.r_[s.move[:2000], s.move[2000:][::-1] * 5]) for k, s in series.items()}
    lagged = dict(changed, U=changed["U"]._replace(move=np.r_[series["U"].move[:2000], changed["L"].move[1999:-1]]))
    assert MarketContext(lagged).fit_peers(train) == peers
    assert MarketContext(lagged).fit_peers({k: 3000 for k in series})["U"] == "L"  # ... which it would find
    # too few training candles: no peer; an interval of one series: none
    assert "F" not in MarketContext(series).fit_peers(dict(train, F=50))
    hourly = SeriesMoves("1h", series["U"].stamps, series["U"].move, series["U"].level)
    assert "H" not in MarketContext(dict(series, H=hourly)).fit_peers(dict(train, H=2000))


def test_the_peer_column_is_the_peers_last_fresh_move_binned_and_own_ids_append_it():
    series = _lead_lag(300)
    context = MarketContext(series)
    closes = close_times(series["F"].stamps, "1d")
    ids = context.peer_ids("L", "1d", closes)
    np.testing.assert_array_equal(ids, np.searchsorted(PEER_EDGES, series["L"].move, side="right") + 1)
    # as of a close between two candles: the last one closed; one older than an interval: unknown
    assert context.peer_ids("L", "1d", closes[[5]] + DAY // 2)[0] == ids[5]
    assert context.peer_ids("L", "1d", closes[[-1]] + 2 * DAY)[0] == 0
    assert (context.peer_ids(None, "1d", closes) == 0).all() and (context.peer_ids("X", "1d", closes) == 0).all()
    assert (context.peer_ids("L", "1h", closes) == 0).all()  # a peer of another interval is none
    own = context.own_ids("F", {"F": "L"})
    assert own.shape == (300, 4)
    np.testing.assert_array_equal(own[:, :3], context.own_ids("F"))
    np.testing.assert_array_equal(own[:, 3], ids)


def test_the_market_columns_are_read_by_a_model_with_market_context_only():
    base = dict(vocab_size=64, context_length=8, d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.0)
    x, a = torch.randint(3, 64, (2, 4)), torch.zeros(2, dtype=torch.long)
    cols = feature_columns(vol_level=True, market_context=True)
    features = torch.randint(1, 7, (2, 4, cols))
    torch.manual_seed(0)
    plain = MarketGPT(ModelConfig(**base, time_features=True)).eval()
    assert torch.equal(plain(x, a, a, features=features)[0], plain(x, a, a, features=features[..., :3])[0])
    market = MarketGPT(ModelConfig(**base, market_context=True)).eval()
    with pytest.raises(ValueError, match=r"market_context.*shape \(2, 4, 6\)"):
        market(x, a, a, features=features[..., :3])
    both = MarketGPT(ModelConfig(**base, market_context=True, vol_level_input=True)).eval()
    for model, first in ((market, 3), (both, 4)):
        other = features.clone()
        other[..., first] = features[..., first] % MARKET_BINS + 1  # another market move: other logits
        assert not torch.equal(model(x, a, a, features=features)[0], model(x, a, a, features=other)[0])


def test_market_mask_hides_a_tail_of_a_training_windows_market_ids_and_nothing_else():
    base = dict(vocab_size=64, context_length=32, d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.0)
    B, T = 64, 32
    x, a = torch.randint(3, 64, (B, T)), torch.zeros(B, dtype=torch.long)
    features = torch.randint(1, MARKET_BINS + 1, (B, T, feature_columns(False, market_context=True, market_peer=True)))
    torch.manual_seed(0)
    model = MarketGPT(ModelConfig(**base, market_context=True, market_peer=True, market_mask=0.5))
    clear = model.eval()(x, a, a, features=features)[0]  # evaluation reads every market id

    def trained(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return model.train()(x, a, a, features=features)[0]

    masked = trained(1)
    assert torch.equal(masked, trained(1)) and not torch.equal(masked, trained(2))  # drawn from torch's seed
    spans = []
    for b in range(B):
        if torch.equal(masked[b], clear[b]):
            spans.append(0)
            continue
        # the window's market ids (the peer's too) hidden from one position on: the logits before it
        # are untouched, and id 0 from there to the end gives exactly the training logits
        hit = []
        for k in range(1, 21):
            hidden = features[b : b + 1].clone()
            hidden[:, T - k :, 3:] = 0
            if torch.allclose(model.eval()(x[b : b + 1], a[:1], a[:1], features=hidden)[0][0], masked[b], atol=1e-6):
                hit.append(k)
        assert len(hit) == 1, (b, hit)
        spans.append(hit[0])
    assert 16 < sum(k > 0 for k in spans) < 48 and len(set(spans) - {0}) > 8  # about half, of many lengths


# ------------------------------------------------------------------ a run with market context


@pytest.fixture(scope="module")
def market_run(tmp_path_factory):
    """A tiny run on the shipped sample with model.market_context and market_peer, its
    end-of-training scorecard on."""
    spec = json.loads(json.dumps(TINY))
    spec["model"].update(market_context=True, market_peer=True)
    spec["training"].update(scorecard_origins=2, scorecard_samples=4)
    return train_tiny(tmp_path_factory.mktemp("market"), spec)[1]


AS_OF = "2012-06-01"


@pytest.mark.parametrize("shards", [True, False], ids=["shards", "in memory"])
def test_a_market_context_run_of_one_series_is_refused_before_it_trains(tmp_path, capsys, shards):
    spec = json.loads(json.dumps(TINY))
    spec["model"].update(market_context=True)
    spec["data"] = {
        "source": "synthetic",
        "interval": "1h",
        "start_date": "2024-01-01",
        "shards": shards,
        "synthetic": {"assets": 1, "candles": 2000, "categories": ["crypto"]},
    }
    config = tmp_path / "case" / "configs" / "one.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(spec))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "1h has 1 (SYN0000)" in err and "--set model.market_context=false" in err
    assert not list((tmp_path / "case").glob("checkpoints/*/best_model.pt"))


def _later_changed(frames: dict[str, pd.DataFrame], cut: pd.Timestamp) -> dict[str, pd.DataFrame]:
    """Every asset's candles after `cut` replaced by others (prices doubled, then jittered)."""
    out = {}
    for s, f in frames.items():
        f = f.copy()
        later = f.index > cut
        f.loc[later, ["open", "high", "low", "close"]] *= 2.0 + np.arange(later.sum())[:, None] % 3 * 0.1
        out[s] = f
    return out


def test_a_market_context_run_trains_forecasts_and_never_reads_a_later_candle(market_run, tmp_path, capsys):
    results = json.loads((market_run / "test_results.json").read_text())
    assert "scorecard_error" not in results and (market_run / "scorecard.json").is_file()
    fc = Forecaster.from_run(market_run)
    everything = dict(
        load_histories(fc.cfg.data, market_run, {s: fc.assets[s].category for s in fc.symbols}, fc.symbols, None)
    )
    (h,) = fc.load_history(["AAPL"], as_of=AS_OF)
    n = len(h.candles)
    # the history's ids are training's own: the market read from the run's data source, whole
    ids = fc.candle_features(h.candles, fc.assets["AAPL"].category, 4, "AAPL")
    shard = TokenSet.load(market_run / "tokens").features["AAPL"]
    assert ids.shape == (n + 4, 7) and shard.shape[1] == 7
    np.testing.assert_array_equal(ids[:n], shard[:n])
    # fitted and kept in the run: every asset with a long enough training split has a peer (META's is short)
    assert set(fc.info.peers) == set(fc.symbols) - {"META"} and fc.info.peers["AAPL"] != "AAPL"
    assert len(set(ids[:n, 6])) > 3  # the peer's moves
    assert len(set(ids[:n, 3])) > 3 and (ids[n:, 3:] == ids[n - 1, 3:]).all()  # the origin's market, held
    want = fc.forecast([h], 4, 16, seed=0, return_paths=True)

    # the look-ahead check: every asset's candles after the origin changed, the same forecast
    fc.set_market(_later_changed(everything, h.candles.index[-1]))
    got = fc.forecast([h], 4, 16, seed=0, return_paths=True)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    pd.testing.assert_frame_equal(got.table, want.table)
    # with the origin's ids held over the future too; its first step is the analog forecast's (a
    # sample's future ids are read from the second step on)
    assert fc.market_future == "analogs"
    fc.market_future = "held"
    held = fc.forecast([h], 4, 16, seed=0, return_paths=True)
    fc.set_market(everything)
    np.testing.assert_array_equal(fc.forecast([h], 4, 16, seed=0, return_paths=True).tokens, held.tokens)
    np.testing.assert_array_equal(held.tokens[..., 0], want.tokens[..., 0])
    # or no market at all over the future (id 0, what model.market_mask trains a model to read)
    fc.market_future = "unknown"
    unknown = fc.forecast([h], 4, 16, seed=0, return_paths=True)
    np.testing.assert_array_equal(unknown.tokens[..., 0], want.tokens[..., 0])
    assert not np.array_equal(unknown.tokens, held.tokens)
    assert not fc._shared_draws([{"as_of": h.candles.index[-1], "symbol": "AAPL"}], 8, 4, seed=0)["path_features"].any()
    fc.market_future = "analogs"
    # the origins of one close (two assets, one date) share their market futures, sample for sample
    # (their market ids; each its own peer's at the same closes)
    last, before = ({"as_of": t, "symbol": "AAPL"} for t in h.candles.index[[-1, -2]])
    other = dict(last, symbol=next(s for s in fc.info.peers if fc.info.peers[s] != fc.info.peers["AAPL"]))
    paths = fc._shared_draws([last, other, before], 64, 4, seed=0)["path_features"]
    assert np.array_equal(paths[0, ..., :3], paths[1, ..., :3]) and not np.array_equal(paths[0], paths[2])
    assert not np.array_equal(paths[0, ..., 3], paths[1, ..., 3])
    assert fc._shared_draws([last], 4, 4, seed=-3)["path_features"].shape == (1, 4, 4, 4)  # a negative seed too
    # ... and a change before it reaches the model: the market is read
    fc.set_market(_later_changed(everything, h.candles.index[-40]))
    assert not np.array_equal(fc.candle_features(h.candles, "us_stock", 4, "AAPL"), ids)

    # predict_df reads its frame's items and its market frame's: every asset up to the origin, the same forecast
    def long(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
        cut = {s: f[f.index <= h.candles.index[-1]] for s, f in frames.items()}
        return pd.concat([f.assign(item_id=s) for s, f in cut.items()]).rename_axis("timestamp").reset_index()

    others = long({s: f for s, f in everything.items() if s != "AAPL"})
    table = fc.predict_df(long({"AAPL": everything["AAPL"]}), 4, samples=16, seed=0, market=others)
    np.testing.assert_allclose(table["mean"], want.paths["close"][0, :, 1:].mean(axis=0))
    with pytest.raises(UserError, match="at least 2 assets"):
        fc.predict_df(long({"AAPL": everything["AAPL"]}), 4, samples=4)

    # the CLI's forecast and scorecard, and an hf export forecasting as its run; onnx refused
    assert main(["forecast", str(market_run), "--symbols", "AAPL", "--horizon", "3", "--samples", "8"]) == 0
    assert main(["scorecard", str(market_run), "--horizons", "1", "--origins", "2", "--samples", "4"]) == 0
    assert main(["export", str(market_run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    hf = Forecaster.from_pretrained(tmp_path / "hf")
    hf.set_market(everything)
    pd.testing.assert_frame_equal(hf.forecast([h], 4, 16, seed=0, return_paths=True).table, want.table)
    # the onnx export reads the market ids as the run does: greedy forecasts are the same table
    from common.forecasting.infer import ExportedForecaster

    assert main(["export", str(market_run), "--format", "onnx", "--out", str(tmp_path / "onnx")]) == 0
    onnx = ExportedForecaster.from_export(tmp_path / "onnx")
    onnx.set_market(everything)
    fc.set_market(everything)
    greedy = fc.forecast([h], 6, 2, temperature=0.0).table
    pd.testing.assert_frame_equal(onnx.forecast([h], 6, 2, temperature=0.0).table, greedy)
