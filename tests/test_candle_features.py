"""model.time_features / model.volume_input: the ids, train-only volume edges, the run folder,
model-info, and the sanity test: on a synthetic hourly series whose volatility follows the hour
of day, a small model with time features gets close to the hour-conditional entropy, and the
same model without them stays near the unigram."""

from __future__ import annotations

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
from common.tokens.features import VOLUME_BINS, calendar_ids, relative_volume, run_features, volume_ids
from common.tokens.token_set import TokenSet
from common.tokens.tokenizer import OHLCTokenizer


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


def test_off_in_the_case_configs_and_model_info_says_what_each_adds():
    for path in REPO_ROOT.glob("case_*/configs/*.json"):
        cfg = load_config(path)
        assert not cfg.model.time_features and not cfg.model.volume_input, path
    cfg = load_config(REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json")
    C = cfg.model.d_model
    assert (
        f"time_features off (would add +{31 * C:,} parameters); volume_input off (would add "
        f"+{(VOLUME_BINS + 1) * C:,} parameters)" in describe_model(cfg)
    )
    on = load_config(REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json", ["model.time_features=true"])
    base, more = (MarketGPT(c.model, num_assets=20).num_parameters() for c in (cfg, on))
    assert more - base == 31 * C and f"time_features on (+{31 * C:,} parameters)" in describe_model(on)


def test_a_model_with_features_says_so_when_called_without_them():
    model = MarketGPT(
        ModelConfig(vocab_size=64, context_length=8, d_model=16, num_layers=1, num_heads=2, d_ff=32, time_features=True)
    )
    with pytest.raises(ValueError, match=r"reads model.time_features .* shape \(1, 4, 3\)"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))


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
