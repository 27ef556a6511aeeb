"""model.time_features / volume_input / vol_level_input: the ids, train-only volume edges, the
vol-level ids (causal, the tokenizer's own sigma), the token folder's 3 or 4 columns, the run folder,
model-info, and the sanity test: on a synthetic hourly series whose volatility follows the hour
of day, a small model with time features gets close to the hour-conditional entropy, and the
same model without them stays near the unigram."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from common.config import ModelConfig, load_config
from common.model.gpt import MarketGPT
from common.model.sizing import describe_model
from common.paths import REPO_ROOT
from common.special_tokens import PAD_TOKEN
from common.tokens.features import (
    VOL_LEVEL_BINS,
    VOL_LEVEL_EDGES,
    VOL_LEVEL_SLOW,
    VOLUME_BINS,
    VolLevel,
    calendar_ids,
    candle_features,
    relative_volume,
    run_features,
    vol_level_ids,
    volume_ids,
)
from common.tokens.token_set import TokenSet
from common.tokens.tokenizer import OHLCTokenizer
from common.tokens.volatility import candle_features as scaled_candles


def test_calendar_ids_are_hour_and_weekday_intraday_month_and_weekday_daily():
    index = pd.DatetimeIndex(["2024-01-01 00:00", "2024-01-01 13:00", "2024-03-09 23:00"], tz="UTC")
    assert calendar_ids(index, "1h").tolist() == [[0, 0], [13, 0], [23, 5]]  # 2024-01-01 is a Monday
    assert calendar_ids(index, "1d").tolist() == [[0, 0], [0, 0], [2, 5]]
    # a New York index is read in UTC
    assert calendar_ids(index.tz_convert("America/New_York"), "1h").tolist()[1] == [13, 0]


def test_volume_ids_use_the_past_only_and_train_only_edges():
    rng = np.random.default_rng(0)
    n = 400
    frame = pd.DataFrame(
        {"volume": rng.lognormal(0, 0.5, n)}, index=pd.date_range("2024-01-01", periods=n, freq="h", tz="UTC")
    )
    frame.iloc[100, 0] = np.nan  # a missing candle
    features, edges = run_features({"A": frame}, {"A": (0, 300)}, "1h")
    ids = features["A"][:, 2]
    assert (ids[:20] == 0).all() and ids[100] == 0  # warm-up and missing candles: no reading
    assert set(ids[21:]) - {0} <= set(range(1, VOLUME_BINS + 1)) and len(edges) == VOLUME_BINS - 1
    # the test period's volumes never move the edges, and a candle's id never sees the future
    changed = frame.copy()
    changed.iloc[300:, 0] *= 50
    features2, edges2 = run_features({"A": changed}, {"A": (0, 300)}, "1h")
    assert edges2 == edges and (features2["A"][:300] == features["A"][:300]).all()
    assert np.isnan(relative_volume(np.zeros(30))).all()
    assert volume_ids(np.array([np.nan, -10.0, 10.0]), edges).tolist() == [0, 1, VOLUME_BINS]


def _walk_frame(n: int, seed: int = 0) -> pd.DataFrame:
    """Daily candles whose volatility steps up, then down: every vol level is visited."""
    rng = np.random.default_rng(seed)
    vol = np.where((np.arange(n) // 150) % 2 == 1, 0.04, 0.01)
    close = 100 * np.exp(np.cumsum(vol * rng.standard_normal(n)))
    open_ = close * np.exp(vol * rng.standard_normal(n) * 0.3)
    high, low = np.maximum(open_, close) * 1.001, np.minimum(open_, close) * 0.999
    index = pd.date_range("2020-01-01", periods=n, freq="D", tz="UTC")
    return pd.DataFrame({"open": open_, "high": high, "low": low, "close": close, "volume": 1.0}, index=index)


def test_vol_level_ids_are_the_tokenizer_sigma_against_its_slow_ewma_and_use_the_past_only():
    vol = VolLevel(vol_halflife=5.0, vol_warmup=3)  # warm after 50 returns
    frame = _walk_frame(700)
    frame.iloc[400:403, :4] = np.nan  # missing candles keep the level of the one before
    ids = vol_level_ids(frame, vol)
    warm = int(VOL_LEVEL_SLOW * vol.vol_halflife)
    assert (ids[:warm] == 0).all() and (ids[warm:] > 0).all() and (ids[400:403] == ids[399]).all()
    assert set(ids[warm:]) == set(range(1, VOL_LEVEL_BINS + 1))  # the steps of volatility reach every bin

    # candle t's id is log(sigma / sigma_long) once candle t has closed: the state the tokenizer
    # carries into candle t + 1 (VolState.sigma), at its own halflife and at VOL_LEVEL_SLOW x it
    for t in (warm, 250, 399, 401, 403, 650):
        past = frame.iloc[: t + 1]
        fast, slow = (
            scaled_candles(past, "A", None, h, vol.vol_warmup, want_state=True).state.sigma
            for h in (vol.vol_halflife, VOL_LEVEL_SLOW * vol.vol_halflife)
        )
        want = np.searchsorted(VOL_LEVEL_EDGES, math.log(fast / slow), side="right") + 1
        assert ids[t] == want, t
        # causal: the candles after t do not move it, and the prefix alone gives the same ids
        changed = frame.copy()
        changed.iloc[t + 1 :, :4] *= np.exp(np.linspace(0.0, 3.0, len(frame) - t - 1))[:, None]
        assert (vol_level_ids(changed, vol)[: t + 1] == ids[: t + 1]).all()
        assert (vol_level_ids(past, vol) == ids[: t + 1]).all()
    # a 4th column only when asked for
    assert candle_features(frame, "1d", [0.0] * (VOLUME_BINS - 1)).shape == (700, 3)
    four = candle_features(frame, "1d", [0.0] * (VOLUME_BINS - 1), vol=vol)
    assert four.shape == (700, 4) and (four[:, 3] == ids).all()
    assert (vol_level_ids(frame.iloc[:warm], vol) == 0).all()  # too short to be warm


def test_token_set_keeps_features(tmp_path):
    tokens = TokenSet(
        ["A"],
        {"A": np.arange(5)},
        {"A": np.zeros(5)},
        {"A": {"train": (0, 3), "val": (3, 4), "test": (4, 5)}},
        {"A": np.arange(15).reshape(5, 3)},
    )
    tokens.save(tmp_path / "tokens")
    back = TokenSet.load(tmp_path / "tokens")
    assert back.features["A"].tolist() == tokens.features["A"].tolist()
    TokenSet(["A"], tokens.tokens, tokens.moves, tokens.ranges).save(tmp_path / "plain")
    assert TokenSet.load(tmp_path / "plain").features is None
    # with the vol-level column: index.json says 4 columns
    four = TokenSet(["A"], tokens.tokens, tokens.moves, tokens.ranges, {"A": np.arange(20).reshape(5, 4)})
    four.save(tmp_path / "four")
    assert json.loads((tmp_path / "four" / "index.json").read_text())["feature_columns"] == 4
    assert TokenSet.load(tmp_path / "four").features["A"].tolist() == four.features["A"].tolist()
    # a token folder written before the column count was recorded holds 3 columns
    index = json.loads((tmp_path / "tokens" / "index.json").read_text())
    del index["feature_columns"]
    (tmp_path / "tokens" / "index.json").write_text(json.dumps(index))
    assert TokenSet.load(tmp_path / "tokens").features["A"].tolist() == tokens.features["A"].tolist()


def test_the_case_configs_read_the_market_only_and_model_info_says_what_each_adds():
    # the cross-section and each asset's peer pay at 10^6 training tokens (bench/results/
    # 2026-12-05-defaults, 2026-12-06-market-peer); the calendar, volume and volatility-level
    # inputs were not shown to pay and stay off
    for path in REPO_ROOT.glob("case_*/configs/*.json"):
        m = load_config(path).model
        want = path.name != "sweep_rich.json"  # the recipe bench's fixed baseline
        got = (m.market_context, m.market_peer, m.time_features, m.volume_input, m.vol_level_input)
        assert got == (want, want, False, False, False), path
    cfg = load_config(REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json", ["model.market_context=false"])
    C = cfg.model.d_model
    assert (
        f"time_features off (would add +{31 * C:,} parameters); volume_input off (would add "
        f"+{(VOLUME_BINS + 1) * C:,} parameters); vol_level_input off (would add "
        f"+{(VOL_LEVEL_BINS + 1) * C:,} parameters); market_context off (would add +{27 * C:,} "
        f"parameters); market_peer off (would add +{9 * C:,} parameters), not read without market_context"
        in describe_model(cfg)
    )
    # each input's table(s) and line; the peer is a part of the market context, on with it
    lines = {"time_features": [31 * C], "market_context": [27 * C, 9 * C]}
    for key, added in lines.items():
        on = load_config(
            REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json",
            ["model.market_context=false", f"model.{key}=true"],
        )
        base, more = (MarketGPT(c.model, num_assets=20).num_parameters() for c in (cfg, on))
        assert more - base == sum(added) and f"{key} on (+{added[0]:,} parameters)" in describe_model(on)
    assert f"market_peer on (+{9 * C:,} parameters)" in describe_model(on)


def test_a_model_with_features_says_so_when_called_without_them():
    model = MarketGPT(
        ModelConfig(vocab_size=64, context_length=8, d_model=16, num_layers=1, num_heads=2, d_ff=32, time_features=True)
    )
    with pytest.raises(ValueError, match=r"reads model.time_features .* shape \(1, 4, 3\)"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))


def test_the_vol_level_column_is_read_by_a_model_with_vol_level_input_only():
    base = dict(vocab_size=64, context_length=8, d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.0)
    x, a = torch.randint(3, 64, (2, 4)), torch.zeros(2, dtype=torch.long)
    three = torch.randint(0, 7, (2, 4, 3))
    four = torch.cat([three, torch.randint(1, VOL_LEVEL_BINS + 1, (2, 4, 1))], dim=-1)
    torch.manual_seed(0)
    timed = MarketGPT(ModelConfig(**base, time_features=True)).eval()
    # a model without vol_level_input takes a 4-column shard's features and ignores the 4th
    assert torch.equal(timed(x, a, a, features=three)[0], timed(x, a, a, features=four)[0])
    leveled = MarketGPT(ModelConfig(**base, vol_level_input=True)).eval()
    with pytest.raises(ValueError, match=r"shape \(2, 4, 4\)"):
        leveled(x, a, a, features=three)
    other = four.clone()
    other[..., 3] = four[..., 3] % VOL_LEVEL_BINS + 1  # another level: other logits
    assert not torch.equal(leveled(x, a, a, features=four)[0], leveled(x, a, a, features=other)[0])


# --------------------------------------------------------------------------- sanity test


def _hourly_series(n: int, seed: int = 0) -> pd.DataFrame:
    """24/7 hourly candles whose volatility is 0.25% or 2% depending on the hour (a fixed,
    shuffled pattern, so the phase is hard to read off a few recent candles)."""
    rng = np.random.default_rng(seed)
    scale = np.where(rng.permutation(24) < 12, 0.0025, 0.02)
    index = pd.date_range("2023-01-01", periods=n, freq="h", tz="UTC")
    sigma = scale[index.hour]
    ret = sigma * rng.standard_normal(n)
    close = 100 * np.exp(np.cumsum(ret))
    open_ = np.concatenate([[100.0], close[:-1]])
    wick = sigma * np.abs(rng.standard_normal((2, n)))
    return pd.DataFrame(
        {
            "open": open_,
            "high": np.maximum(open_, close) * (1 + wick[0]),
            "low": np.minimum(open_, close) * (1 - wick[1]),
            "close": close,
            "volume": np.ones(n),
        },
        index=index,
    )


def _cross_entropy(train: np.ndarray, test: np.ndarray, vocab: int) -> float:
    counts = np.bincount(train, minlength=vocab) + 0.5  # add-half smoothing, as a baseline would
    p = counts / counts.sum()
    return float(-np.log(p[test]).mean())


def _train_and_score(tokens: np.ndarray, features: np.ndarray, cut: int, use_time: bool, T: int = 16) -> float:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40,
        context_length=T,
        d_model=32,
        num_layers=1,
        num_heads=2,
        d_ff=64,
        dropout=0.0,
        asset_embed_dim=4,
        category_embed_dim=4,
        time_features=use_time,
    )
    model = MarketGPT(cfg)
    opt = model.configure_optimizer(0.0, 3e-3, (0.9, 0.95), "cpu")
    tok, feat = torch.from_numpy(tokens), torch.from_numpy(features)
    offsets = torch.arange(T + 1)
    ids = torch.zeros(64, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)

    def run(starts: torch.Tensor):
        chunk, f = tok[starts[:, None] + offsets], feat[starts[:, None] + offsets[:-1]]
        extra = {"features": f} if use_time else {}
        return model(chunk[:, :-1], ids[: len(starts)], ids[: len(starts)], chunk[:, 1:], **extra)[1]

    for _ in range(250):
        loss = run(torch.randint(0, cut - T - 1, (64,), generator=gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():  # every test target once: non-overlapping windows after the cut
        starts = torch.arange(cut, len(tokens) - T - 1, T)
        return float(np.mean([float(run(starts[i : i + 64])) for i in range(0, len(starts), 64)]))


def test_time_features_learn_the_hour_of_day_volatility_pattern():
    frame = _hourly_series(24 * 200)
    cut = int(len(frame) * 0.8)
    tokenizer = OHLCTokenizer(vocab_size=40, shape_bins=2).fit({"SYN": frame.iloc[:cut]})
    tokens = tokenizer.encode(frame, asset="SYN").astype(np.int64)
    features, _ = run_features({"SYN": frame}, {"SYN": (0, cut)}, "1h")
    features = features["SYN"]
    # the known gap: unigram vs the hour-conditional unigram of the next candle, fitted on train
    target_hour = features[:, 0]
    valid = np.arange(len(tokens)) >= 40  # past the tokenizer's warm-up (special tokens)
    train, test = valid & (np.arange(len(tokens)) < cut), np.arange(len(tokens)) >= cut + 17
    unigram = _cross_entropy(tokens[train], tokens[test], 40)
    by_hour = (
        np.mean(
            [
                _cross_entropy(tokens[train & (target_hour == h)], tokens[test & (target_hour == h)], 40)
                * (test & (target_hour == h)).sum()
                for h in range(24)
            ]
        )
        * 24
        / test.sum()
    )
    gap = unigram - by_hour
    assert gap > 0.3, (unigram, by_hour)  # the pattern is strong

    with_time = _train_and_score(tokens, features, cut, use_time=True)
    without = _train_and_score(tokens, features, cut, use_time=False)
    assert with_time < unigram - 0.6 * gap, (with_time, unigram, by_hour)
    assert without > unigram - 0.25 * gap, (without, unigram, by_hour)
    assert not math.isnan(with_time) and PAD_TOKEN not in tokens[cut:]


def test_the_token_folders_base_feature_columns_are_the_features_modules():
    from common.tokens.features import NUM_FEATURES
    from common.tokens.token_set import BASE_FEATURE_COLUMNS

    assert BASE_FEATURE_COLUMNS == NUM_FEATURES
