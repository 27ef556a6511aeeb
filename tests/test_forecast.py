"""Forecasting: KV-cache parity, vectorized decoding with the exact volatility state, the
Forecaster's table (determinism, shapes, quantiles, P(up), no look-ahead, analytic quantiles
from a model with fixed logits) and `marketgpt forecast` end to end on a tiny trained run."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from common.cli import main
from common.config import ModelConfig, load_config
from common.data.universe import Asset
from common.errors import UserError
from common.forecasting.forecast_io import QUANTILES, History, future_timestamps, histories_at
from common.forecasting.forecaster import Forecaster
from common.model.gpt import MarketGPT
from common.model.sampling import SamplingSettings, draw_tokens, prefill_length, sample_paths
from common.paths import REPO_ROOT
from common.special_tokens import BOS_TOKEN, MISSING_TOKEN, NUM_SPECIAL_TOKENS, PAD_TOKEN
from common.tokens.features import VOL_LEVEL_BINS, VOLUME_BINS, calendar_ids
from common.tokens.ids import RunInfo
from common.tokens.tokenizer import OHLCTokenizer

sys.path.insert(0, str(REPO_ROOT / "bench"))
from bench_forecast import old_decode_path  # noqa: E402  (decode_path before it was vectorized)

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")

TINY = {
    "experiment": "tiny",
    "model": {
        "vocab_size": 64,
        "context_length": 16,
        "d_model": 32,
        "num_layers": 2,
        "num_heads": 2,
        "d_ff": 64,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
    },
    "training": {
        "batch_size": 16,
        "epochs": 1,
        "max_steps_per_epoch": 3,
        "eval_max_batches": 2,
        "warmup_steps": 1,
        "log_every_steps": 3,
        "scorecard_origins": 0,
        "vol_reversion": False,
    },
    "data": {"source": "sample", "interval": "1d"},
}


def candles(n: int, seed: int, vol: float = 0.02, start: str = "2020-01-01", freq: str = "D") -> pd.DataFrame:
    """Random-walk candles with wicks (canonical frame)."""
    rng = np.random.default_rng(seed)
    ret = vol * rng.standard_t(4, n) / math.sqrt(2)
    close = 100 * np.exp(np.cumsum(ret))
    open_ = close * np.exp(-ret * rng.uniform(0.2, 1.0, n))
    wick = vol * np.abs(rng.standard_normal((2, n)))
    index = pd.date_range(start, periods=n, freq=freq, tz="UTC", name="timestamp")
    return pd.DataFrame(
        {
            "open": open_,
            "high": np.maximum(open_, close) * np.exp(wick[0]),
            "low": np.minimum(open_, close) * np.exp(-wick[1]),
            "close": close,
            "volume": 1.0,
        },
        index=index,
    )


def fitted_tokenizer(vocab: int = 64) -> OHLCTokenizer:
    return OHLCTokenizer(vocab, 4, vol_halflife=10.0, vol_warmup=5).fit({f"A{i}": candles(400, i) for i in range(4)})


# ---------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("positional", ["learned", "rope", "recipe"])  # recipe: rope, RMSNorm, QK-norm, SwiGLU
@pytest.mark.parametrize("horizon", [5, 23])  # 23 > T // 2: the cache fills and is rebuilt, twice
@pytest.mark.parametrize("inputs", [False, True])  # model.time_features + volume_input + vol_level_input
# chunks of rows: two contexts' samples (sharing their prefixes), then one context's; or each
# context's 3 samples in parts of 2 and 1
@pytest.mark.parametrize("samples, max_batch, chunks", [(2, 4, 2), (3, 2, 6)])
def test_cached_logits_equal_uncached_at_every_step(positional, horizon, inputs, samples, max_batch, chunks):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40,
        context_length=12,
        d_model=32,
        num_layers=2,
        num_heads=2,
        d_ff=64,
        asset_embed_dim=4,
        category_embed_dim=4,
        positional="learned" if positional == "learned" else "rope",
        dropout=0.1,
        time_features=inputs,
        volume_input=inputs,
        vol_level_input=inputs,
        **({"norm": "rms", "qk_norm": True, "mlp": "swiglu"} if positional == "recipe" else {}),
    )
    model = MarketGPT(cfg, num_assets=3, num_categories=2).train()
    contexts = torch.randint(NUM_SPECIAL_TOKENS, 40, (3, 20))
    a, c = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])
    seen = []
    P = prefill_length(12, horizon, 20)
    # every candle (context, then future step) its own ids, so a misaligned slice changes the logits
    bins = (24, 7, VOLUME_BINS + 1, VOL_LEVEL_BINS + 1)
    features = torch.stack([torch.randint(0, n, (3, 20 + horizon)) for n in bins], dim=-1)

    def check(step, rows, seq, window, logits):
        end = seq.shape[1]  # seq is contexts[:, 20 - P:] and the steps drawn so far
        f = features[rows, 20 - P + end - window : 20 - P + end] if inputs else None
        ref = model(seq[:, -window:], a[rows], c[rows], last_only=True, features=f)[0]
        assert logits.shape[1] == 37  # ids past the last that may be drawn get no logits
        seen.append((step, window, (ref[:, -1, :37] - logits).abs().max().item()))

    out = sample_paths(
        model,
        contexts,
        a,
        c,
        SamplingSettings(horizon, samples, seed=1, max_batch=max_batch),
        on_step=check,
        features=features if inputs else None,
        banned=torch.arange(40) >= 37,  # a tokenizer's unused tail
    )
    assert out.max() < 37
    assert out.shape == (3, samples, horizon) and model.training  # the mode is restored
    assert len(seen) == chunks * horizon  # every step of every chunk
    assert max(err for _, _, err in seen) < 1e-5
    windows = [w for _, w, _ in seen[:horizon]]
    assert windows[0] == P and max(windows) == min(12, P + horizon - 1) and min(windows) >= 6
    if horizon > 12 - P:
        assert windows.count(6) >= 1  # the window was full and rebuilt from the last T // 2 tokens


def test_a_bf16_forecast_keeps_its_cache_in_bf16_and_its_logits_close_to_fp32(monkeypatch):
    """--precision bf16: sampling under bf16 autocast. The KV cache is bf16 (no cast per step)
    and every step's next-token distribution stays within 0.01 (total variation) of the fp32
    uncached forward on the same tokens; the logits differ, so bf16 did run."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40,
        context_length=12,
        d_model=32,
        num_layers=2,
        num_heads=2,
        d_ff=64,
        asset_embed_dim=4,
        category_embed_dim=4,
        positional="rope",
    )
    model = MarketGPT(cfg, num_assets=3, num_categories=2).eval()
    with torch.no_grad():
        model.wte.weight.mul_(8)  # logits with a spread of about 1, like a trained model's (tied head)
    contexts = torch.randint(NUM_SPECIAL_TOKENS, 40, (3, 20))
    a, c = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])
    cache_dtypes, logit_err, tv = [], [], []
    new_cache = model.new_cache
    monkeypatch.setattr(
        model, "new_cache", lambda *args, **kw: cache_dtypes.append(kw.get("dtype")) or new_cache(*args, **kw)
    )

    def check(step, rows, seq, window, logits):
        with torch.autocast("cpu", enabled=False):
            ref = model(seq[:, -window:], a[rows], c[rows], last_only=True)[0][:, -1]
        logit_err.append((ref - logits.float()).abs().max().item())
        tv.append(0.5 * (ref.softmax(-1) - logits.float().softmax(-1)).abs().sum(-1).max().item())

    with torch.autocast("cpu", dtype=torch.bfloat16):
        sample_paths(model, contexts, a, c, SamplingSettings(8, 3, seed=1, max_batch=4), on_step=check)
    assert cache_dtypes and set(cache_dtypes) == {torch.bfloat16}
    assert len(tv) == 3 * 8 and max(tv) < 0.01, max(tv)  # 3 chunks (one context each) x 8 steps
    assert min(logit_err) > 1e-4  # bf16 rounding is visible: the autocast path ran


def test_every_sample_lands_in_its_contexts_rows_however_the_rows_are_chunked():
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40,
        context_length=12,
        d_model=32,
        num_layers=2,
        num_heads=2,
        d_ff=64,
        asset_embed_dim=4,
        category_embed_dim=4,
    )
    model = MarketGPT(cfg, num_assets=3, num_categories=2).eval()
    contexts = torch.randint(NUM_SPECIAL_TOKENS, 40, (3, 20))
    a, c = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])
    greedy = SamplingSettings(5, 1, temperature=0)
    alone = torch.stack(
        [sample_paths(model, contexts[i : i + 1], a[i : i + 1], c[i : i + 1], greedy)[0, 0] for i in range(3)]
    )  # (3, 5): each context's greedy path, sampled on its own
    for samples, max_batch in [(3, 2), (3, 6), (2, 5), (4, 100)]:
        out = sample_paths(model, contexts, a, c, SamplingSettings(5, samples, temperature=0, max_batch=max_batch))
        assert torch.equal(out, alone[:, None].expand(3, samples, 5)), (samples, max_batch)


def test_given_uniforms_decide_every_draw_in_both_samplers():
    """sample_paths(uniforms=...) draws each row's step from its own uniform: the seed and the
    chunking do not matter, a larger uniform never draws a smaller id from the same logits, and
    the torch-free draw inverts the same CDF."""
    from common.forecasting.infer import draw_tokens_np

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, context_length=12, d_model=32, num_layers=2, num_heads=2, d_ff=64)
    model = MarketGPT(cfg, num_assets=3, num_categories=2).eval()
    contexts = torch.randint(NUM_SPECIAL_TOKENS, 40, (3, 20))
    a, c = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])
    u = torch.rand((3, 4, 5), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = sample_paths(model, contexts, a, c, SamplingSettings(5, 4, seed=0), uniforms=u)
    for seed, max_batch in [(1, None), (2, 3), (3, 1)]:
        got = sample_paths(model, contexts, a, c, SamplingSettings(5, 4, seed=seed, max_batch=max_batch), uniforms=u)
        assert torch.equal(got, want), (seed, max_batch)
    assert not torch.equal(sample_paths(model, contexts, a, c, SamplingSettings(5, 4, seed=0)), want)
    low, high = (
        sample_paths(model, contexts, a, c, SamplingSettings(1, 1), uniforms=torch.full((3, 1, 1), q))
        for q in (0.05, 0.95)
    )
    assert (low <= high).all() and (low < high).any()
    logits = torch.randn(500, 40, generator=torch.Generator().manual_seed(2))
    banned = torch.zeros(40, dtype=torch.bool)
    banned[:NUM_SPECIAL_TOKENS] = True
    rows = torch.rand((500, 1), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ids = draw_tokens(logits, 1.0, None, None, banned, None, u=rows)
    np_ids = draw_tokens_np(logits.numpy(), 1.0, None, None, banned.numpy(), np.random.default_rng(0), u=rows.numpy())
    assert (ids.numpy() == np_ids).mean() > 0.99  # float32 and float64 CDFs: equal but at a boundary


def test_truncation_keeps_the_likeliest_ids_and_bans_hold():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.3, 0.2]])).expand(2000, 4)
    banned = torch.tensor([False, False, False, True])
    g = torch.Generator().manual_seed(0)
    # id 3 banned: 0.1, 0.4, 0.3 renormalize to 0.125, 0.5, 0.375; p = 0.6 needs ids 1 and 2
    assert set(draw_tokens(logits, 1.0, None, 0.6, banned, g).tolist()) == {1, 2}
    assert set(draw_tokens(logits, 1.0, None, 0.5, banned, g).tolist()) == {1}
    assert set(draw_tokens(logits, 1.0, 1, None, banned, g).tolist()) == {1}
    assert set(draw_tokens(logits, 1.0, None, None, banned, g).tolist()) == {0, 1, 2}
    assert set(draw_tokens(logits, 0.0, None, None, banned, g).tolist()) == {1}


def test_cache_refuses_tokens_beyond_the_window():
    model = MarketGPT(
        ModelConfig(
            vocab_size=16,
            context_length=4,
            d_model=8,
            num_layers=1,
            num_heads=2,
            d_ff=16,
            asset_embed_dim=2,
            category_embed_dim=2,
        )
    )
    cache = model.new_cache(1)
    ids = torch.zeros(1, dtype=torch.long)
    model(torch.full((1, 4), 5), ids, ids, cache=cache)
    with pytest.raises(ValueError, match="exceeds model.context_length"):
        model(torch.full((1, 1), 5), ids, ids, cache=cache)


# ---------------------------------------------------------------------- decoding


def test_vectorized_decode_path_equals_the_loop_per_path():
    tok = fitted_tokenizer()
    rng = np.random.default_rng(0)
    tokens = rng.integers(NUM_SPECIAL_TOKENS, tok.vocab_size, size=(50, 30))  # includes unused ids (NaN)
    tokens[rng.random(tokens.shape) < 0.05] = MISSING_TOKEN
    states = [tok.vol_state(candles(30 + 7 * i, i), "X") for i in range(50)]
    closes = tok.decode_path(tokens, *(np.array(v) for v in zip(*states)))
    for i, s in enumerate(states):
        np.testing.assert_allclose(closes[i], old_decode_path(tok, tokens[i], *s), rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(tok.decode_path(tokens[3], *states[3]), closes[3], rtol=0, equal_nan=True)


@pytest.mark.parametrize("history_len", [9, 300])  # EWMA weights far from / near converged
def test_decoded_candles_reencode_to_the_sampled_tokens(history_len):
    """decode_ohlc carries the volatility state exactly: its candles, appended to the history,
    encode back to the sampled move bins, and to the shape bins where the range covers the body."""
    tok = fitted_tokenizer()
    history = candles(history_len, 7)
    state = tok.vol_state(history, "X")
    rng = np.random.default_rng(1)
    sampled = rng.integers(NUM_SPECIAL_TOKENS, tok.num_used_ids, size=(6, 40))
    ohlc = tok.decode_ohlc(sampled, *state)
    for p in range(len(sampled)):
        idx = pd.date_range(history.index[-1] + pd.Timedelta(days=1), periods=40, freq="D", tz="UTC")
        future = pd.DataFrame({k: ohlc[k][p] for k in ("open", "high", "low", "close")} | {"volume": 0.0}, index=idx)
        again = tok.encode(pd.concat([history, future]), "X")[history_len:]
        moves, shapes = tok.split_token(again)
        want_moves, want_shapes = tok.split_token(sampled[p])
        np.testing.assert_array_equal(moves, want_moves)
        move_z, shape_z = tok.decode(sampled[p])
        covers = np.abs(shape_z) > np.abs(move_z) * 1.001  # range wider than the body: the shape is exact
        np.testing.assert_array_equal(shapes[covers], want_shapes[covers])
        assert (ohlc["high"][p] >= np.maximum(ohlc["open"][p], ohlc["close"][p])).all()
        assert (ohlc["low"][p] <= np.minimum(ohlc["open"][p], ohlc["close"][p])).all()


# ---------------------------------------------------------------------- Forecaster on a fixed-logit model


def _fixed_logit_forecaster(logits: torch.Tensor, tok: OHLCTokenizer, tmp_path) -> Forecaster:
    """A real MarketGPT whose next-token logits are `logits` whatever the input: the final norm
    outputs the constant unit vector e0 (weight 0, bias e0) and the tied head's column 0 is `logits`."""
    raw = json.loads(json.dumps(TINY))
    raw["model"].update(vocab_size=len(logits), bias=True)
    (tmp_path / "fixed.json").write_text(json.dumps(raw))
    cfg = load_config(tmp_path / "fixed.json")
    info = RunInfo.of_assets([Asset("X", "sample", "us_stock", "x"), Asset("C", "sample", "crypto", "c")])
    model = MarketGPT(cfg.model, num_assets=2, num_categories=2)
    with torch.no_grad():
        model.ln_f.weight.zero_()
        model.ln_f.bias.zero_()
        model.ln_f.bias[0] = 1.0
        model.wte.weight[:, 0] = logits
    return Forecaster(model, tok, info, cfg)


def _token(tok: OHLCTokenizer, ret_bin: int, shape_bin: int = 0) -> int:
    return NUM_SPECIAL_TOKENS + ret_bin * tok.shape_bins + shape_bin


def test_a_certain_token_gives_the_analytic_path_with_the_carried_volatility(tmp_path):
    tok = fitted_tokenizer()
    t = _token(tok, tok.ret_bins - 2, 1)
    logits = torch.full((tok.vocab_size,), -1e4)
    logits[t] = 0.0
    fc = _fixed_logit_forecaster(logits, tok, tmp_path)
    fc.within_bin = False  # the bin's median: one analytic path
    history = candles(200, 3)
    result = fc.forecast([History("X", history)], horizon=6, samples=5, seed=0, return_paths=True)
    # Independent reference: pandas' EWMA over the history's squared returns, extended by the new ones.
    z = tok.decode(np.array([t]))[0][0]
    rets = list(np.diff(np.log(history["close"].to_numpy())))
    closes, c = [], history["close"].iloc[-1]
    for _ in range(6):
        sigma = math.sqrt(pd.Series(np.square(rets)).ewm(halflife=tok.vol_halflife, adjust=True).mean().iloc[-1])
        c *= math.exp(z * sigma)
        rets.append(z * sigma)
        closes.append(c)
    table = result.table
    for p in QUANTILES:
        np.testing.assert_allclose(table[f"p{p}"], closes, rtol=1e-10)
    np.testing.assert_allclose(result.paths["close"][0, :, 1:], np.tile(closes, (5, 1)), rtol=1e-10)
    assert (table["std_log_return"] < 1e-12).all() and (table["p_up"] == float(z > 0)).all()


def test_three_token_distribution_gives_its_analytic_quantiles(tmp_path):
    tok = fitted_tokenizer()
    low, mid, high = _token(tok, 0), _token(tok, tok.ret_bins // 2), _token(tok, tok.ret_bins - 1)
    logits = torch.full((tok.vocab_size,), -1e4)
    logits[[low, mid, high]] = torch.log(torch.tensor([0.2, 0.6, 0.2]))
    logits[[PAD_TOKEN, BOS_TOKEN, MISSING_TOKEN]] = 5.0  # likely, but a forecast never samples them
    fc = _fixed_logit_forecaster(logits, tok, tmp_path)
    fc.within_bin = False  # the bins' medians: three values
    history = candles(300, 4)
    state = tok.vol_state(history, "X")
    S = 4000
    result = fc.forecast({"X": history}, horizon=1, samples=S, seed=3, return_paths=True)
    row = result.table.iloc[0]
    z = tok.decode(np.array([low, mid, high]))[0]
    value = state.last_close * np.exp(z * state.sigma)
    expect = {5: value[0], 10: value[0], 25: value[1], 50: value[1], 75: value[1], 90: value[2], 95: value[2]}
    for p, v in expect.items():
        assert row[f"p{p}"] == pytest.approx(v, rel=1e-12), p
    mean = float(np.dot([0.2, 0.6, 0.2], z * state.sigma))
    sd = math.sqrt(float(np.dot([0.2, 0.6, 0.2], (z * state.sigma - mean) ** 2)))
    assert row["mean_log_return"] == pytest.approx(mean, abs=5 * sd / math.sqrt(S))
    assert row["std_log_return"] == pytest.approx(sd, rel=0.05)
    assert set(np.unique(result.tokens)) <= {low, mid, high}


# ---------------------------------------------------------------------- Forecaster on a trained run


def train_tiny(root: Path, spec: dict) -> tuple[Path, Path]:
    """Train `spec` as root/case/configs/tiny.json; returns the config and its run folder."""
    config = root / "case" / "configs" / "tiny.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(spec))
    assert main(["train", "--config", str(config)]) == 0
    (run,) = (config.parent.parent / "checkpoints").glob("tiny_*")
    return config, run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("fc"), TINY)[1]


@pytest.fixture(scope="module")
def forecaster(run_dir):
    return Forecaster.from_run(run_dir)


def test_forecast_table_and_paths(forecaster):
    histories = forecaster.load_history(["AAPL", "^GSPC"], as_of="2012-06-01")
    whole = forecaster.load_history(["AAPL"])[0].candles
    (again,) = histories_at("AAPL", whole, ["2012-06-01T00:00Z"])  # a walk-forward's cut, same history
    pd.testing.assert_frame_equal(again.candles, histories[0].candles)
    r1 = forecaster.forecast(histories, horizon=7, samples=50, seed=11, return_paths=True)
    r2 = forecaster.forecast(histories, horizon=7, samples=50, seed=11, return_paths=True)
    pd.testing.assert_frame_equal(r1.table, r2.table)  # determinism
    np.testing.assert_array_equal(r1.tokens, r2.tokens)
    assert not forecaster.forecast(histories, 7, 50, seed=12).table.equals(r1.table)
    table, paths = r1.table, r1.paths
    assert len(table) == 2 * 7 and list(table["step"]) == list(range(1, 8)) * 2
    assert paths["close"].shape == (2, 50, 8) and paths["high"].shape == (2, 50, 7) and r1.tokens.shape == (2, 50, 7)
    assert np.isfinite(paths["close"]).all()
    q = table[[f"p{p}" for p in QUANTILES]].to_numpy()
    assert (np.diff(q, axis=1) >= 0).all()  # quantiles never cross
    for i, h in enumerate(histories):
        last = h.candles["close"].dropna().iloc[-1]
        assert (paths["close"][i, :, 0] == last).all()  # every path starts from the last real close
        part = table[table["symbol"] == h.symbol]
        np.testing.assert_array_equal(part["p_up"], (paths["close"][i, :, 1:] > last).mean(axis=0))
        np.testing.assert_allclose(part["p50"], np.median(paths["close"][i, :, 1:], axis=0))
        assert (part["as_of"] == h.candles.index[-1]).all()
        assert h.candles.index[-1] <= pd.Timestamp("2012-06-01", tz="UTC")
        assert (pd.DatetimeIndex(part["timestamp"]).day_of_week < 5).all()  # stocks: trading days


def test_shared_draws_give_the_assets_of_a_date_the_same_uniforms(forecaster):
    """shared_draws: the draws are seeded by the origin's close, so an asset's forecast is the
    same alone or beside others of its date, and one history twice draws the same samples;
    without it the two draw apart. A misspelt market_future is refused."""
    pair = forecaster.load_history(["AAPL", "IBM"], as_of="2012-06-01")
    try:
        forecaster.shared_draws = True
        together = forecaster.forecast(pair, 5, 30, seed=4, return_paths=True).tokens
        for i, h in enumerate(pair):
            np.testing.assert_array_equal(
                forecaster.forecast([h], 5, 30, seed=4, return_paths=True).tokens[0], together[i]
            )
        twice = forecaster.forecast([pair[0], pair[0]], 5, 30, seed=4, return_paths=True).tokens
        np.testing.assert_array_equal(twice[0], twice[1])
        forecaster.shared_draws = False
        twice = forecaster.forecast([pair[0], pair[0]], 5, 30, seed=4, return_paths=True).tokens
        assert not np.array_equal(twice[0], twice[1])
        forecaster.market_future = "analog"
        with pytest.raises(UserError, match="market_future 'analog': expected one of analogs, held, unknown"):
            forecaster.forecast(pair, 5, 30, seed=4)
    finally:
        forecaster.shared_draws, forecaster.market_future = False, "analogs"


def test_within_bin_draws_widen_the_paths_and_are_seeded_by_the_close(forecaster):
    """within_bin (the default): the same tokens as by the bins' medians, each decoded by a draw
    within its bins: the paths' spread grows (the medians lose the moves' second moment), an
    asset's forecast is the same alone or beside another (with shared_draws, whose tokens are
    seeded so too), the same call twice the same; a tokenizer without the within-bin quantiles
    decodes by medians."""
    assert forecaster.within_bin and forecaster.tokenizer.within_bins
    pair = forecaster.load_history(["AAPL", "IBM"], as_of="2012-06-01")
    drawn = forecaster.forecast(pair, 10, 200, seed=3, return_paths=True)
    inner = forecaster.tokenizer.move_binning.inner
    try:
        forecaster.within_bin = False
        medians = forecaster.forecast(pair, 10, 200, seed=3, return_paths=True)
        forecaster.within_bin = True
        np.testing.assert_array_equal(drawn.tokens, medians.tokens)
        spread = lambda r: np.log(r.paths["close"][:, :, -1] / r.paths["close"][:, :, 0]).std(axis=1)  # noqa: E731
        assert np.all(spread(drawn) > spread(medians))
        np.testing.assert_array_equal(
            forecaster.forecast(pair, 10, 200, seed=3, return_paths=True).paths["close"], drawn.paths["close"]
        )
        forecaster.shared_draws = True  # tokens too drawn by the origin's close, not its place in the call
        both = forecaster.forecast(pair, 10, 200, seed=3, return_paths=True)
        alone = forecaster.forecast([pair[1]], 10, 200, seed=3, return_paths=True)
        np.testing.assert_array_equal(alone.paths["close"][0], both.paths["close"][1])
        forecaster.shared_draws = False
        forecaster.tokenizer.move_binning.inner = None  # a run fitted before the quantiles were stored
        old = forecaster.forecast(pair, 10, 200, seed=3, return_paths=True)
        np.testing.assert_array_equal(old.paths["close"], medians.paths["close"])
    finally:
        forecaster.within_bin, forecaster.shared_draws = True, False
        forecaster.tokenizer.move_binning.inner = inner


def test_from_run_precision_auto_follows_the_runs_training_log(run_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    log = json.loads((run / "training_log.json").read_text())
    assert log["precision"] == "fp32" and Forecaster.from_run(run).precision == "fp32"  # trained on the CPU
    (run / "training_log.json").write_text(json.dumps({**log, "precision": "bf16"}))  # as on an A100
    for caps, expected in (({"avx512_bf16": True}, "bf16"), ({"avx2": True}, "fp32")):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda caps=caps: caps)
        assert Forecaster.from_run(run).precision == expected
        assert Forecaster.from_run(run, precision="fp32").precision == "fp32"
    (run / "training_log.json").unlink()  # an old or damaged run folder: fp32
    assert Forecaster.from_run(run).precision == "fp32"


def test_changing_candles_after_as_of_never_changes_the_forecast(forecaster, monkeypatch):
    import common.data.loading as loading

    as_of = "2012-06-01"
    before = forecaster.forecast(forecaster.load_history(["AAPL", "IBM"], as_of), 5, 40, seed=2).table
    real = loading.load_market_data

    def doctored(data, case_dir):
        market = real(data, case_dir)
        for symbol, frame in market.candles.items():
            frame = frame.copy()
            later = frame.index > pd.Timestamp(as_of, tz="UTC")
            frame.loc[later, ["open", "high", "low", "close"]] *= 3.0
            frame.loc[frame.index[later][:5], "close"] = np.nan  # broken rows after the origin too
            market.candles[symbol] = frame
        return market

    monkeypatch.setattr(loading, "load_market_data", doctored)
    after = forecaster.forecast(forecaster.load_history(["AAPL", "IBM"], as_of), 5, 40, seed=2).table
    pd.testing.assert_frame_equal(before, after)


def test_the_last_real_close_is_the_start_after_a_gap(forecaster):
    history = candles(100, 9, freq="h", vol=0.005)
    history.iloc[-3:, :4] = np.nan  # the last three bars are missing (MISSING tokens)
    r = forecaster.forecast([History("AAPL", history)], 3, 20, return_paths=True)
    assert (r.paths["close"][0, :, 0] == history["close"].iloc[-4]).all()


def test_future_timestamps_follow_the_calendar():
    fri = pd.Timestamp("2024-05-31", tz="UTC")
    assert list(future_timestamps(fri, "1d", "us_stock", 3).day) == [3, 4, 5]
    assert list(future_timestamps(fri, "1d", "crypto", 3).day) == [1, 2, 3]
    hours = future_timestamps(pd.Timestamp("2024-05-31 22:00", tz="UTC"), "1h", "crypto", 3)
    assert list(hours.hour) == [23, 0, 1]


# ---------------------------------------------------------------------- the command


def _forecast(capsys, *args) -> tuple[int, str, str]:
    code = main(["forecast", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_end_to_end_is_byte_reproducible(run_dir, tmp_path, capsys):
    args = [run_dir, "--symbols", "AAPL,^GSPC", "--horizon", "5", "--samples", "32", "--seed", "4", "--save-paths"]
    code, out, err = _forecast(capsys, *args, "--out", tmp_path / "a")
    assert code == 0, err
    assert "AAPL" in out and "P50" in out and "P(up)" in out
    files = {p.name for p in (tmp_path / "a").iterdir()}
    assert files == {"forecast.parquet", "forecast.csv", "forecast.json", "paths.npz", "fan_AAPL.png", "fan_GSPC.png"}
    table = pd.read_parquet(tmp_path / "a" / "forecast.parquet")
    assert len(table) == 10 and {
        "timestamp",
        "p5",
        "p95",
        "mean_log_return",
        "std_log_return",
        "p_up",
        "expected_range",
    } <= set(table.columns)
    meta = json.loads((tmp_path / "a" / "forecast.json").read_text())
    assert meta["seed"] == 4 and meta["samples"] == 32 and len(meta["checkpoint_sha256"]) == 64
    assert meta["tokenizer"]["version"] == 1 and meta["as_of"] == "latest"
    assert meta["precision"] == "fp32"  # auto: the run trained in fp32 (on the CPU)
    assert _forecast(capsys, *args, "--out", tmp_path / "b")[0] == 0
    assert (tmp_path / "a" / "forecast.parquet").read_bytes() == (tmp_path / "b" / "forecast.parquet").read_bytes()
    code, out, err = _forecast(
        capsys,
        run_dir,
        "--symbols",
        "AAPL",
        "--horizon",
        "2",
        "--samples",
        "4",
        "--top-k",
        "5",
        "--as-of",
        "2010-01-05",
    )
    assert code == 0 and "overconfident" in err
    assert (run_dir / "forecasts" / "2010-01-05T0000" / "forecast.csv").is_file()
    assert _forecast(capsys, *args, "--precision", "bf16", "--out", tmp_path / "bf16")[0] == 0
    assert json.loads((tmp_path / "bf16" / "forecast.json").read_text())["precision"] == "bf16"
    assert _forecast(capsys, *args, "--precision", "bf16", "--out", tmp_path / "bf16_again")[0] == 0
    assert (tmp_path / "bf16" / "forecast.parquet").read_bytes() == (
        tmp_path / "bf16_again" / "forecast.parquet"
    ).read_bytes()  # reproducible in bf16 too
    assert np.load(tmp_path / "bf16" / "paths.npz")["tokens"].shape == (2, 32, 5)


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marketgpt forecast: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--symbols", "APPL"], ["unknown symbol 'APPL'", "'AAPL'"]),
        (["--symbols", "AAPL", "--as-of", "1985-01-01"], ["before its data starts"]),
        (["--symbols", "AAPL", "--as-of", "2999-01-01"], ["in the future"]),
        (["--symbols", "AAPL", "--as-of", "tomorrow-ish"], ["not a date"]),
        (["--horizon", "0"], ["--horizon 0", "between 1 and"]),
        (["--horizon", "100000"], ["--horizon 100000"]),
        (["--samples", "0"], ["--samples 0"]),
        (["--temperature", "-1", "--symbols", "AAPL"], ["--temperature"]),
        (["--precision", "fp16"], ["--precision 'fp16'", "auto, fp32, bf16"]),
        (["--precision", "half", "--backend", "onnx"], ["--precision 'half'", "auto, fp32, bf16"]),
        (["--barrier=-3%,+5%"], ["--barrier '-3%,+5%'", "upper first"]),
        (["--barrier", "+5%,+3%"], ["below 0%"]),
        (["--barrier", "5,-3"], ["two percentages", "+5%,-3%"]),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(run_dir, capsys, args, needles):
    _one_line_error(*_forecast(capsys, run_dir, *args)[::2], *needles)


def test_barrier_and_drawdown_from_the_sampled_paths(run_dir, tmp_path, capsys):
    from common.forecasting.price_paths import barrier_outcomes, barrier_probabilities, max_drawdown

    code, out, err = _forecast(
        capsys,
        run_dir,
        "--symbols",
        "AAPL,^GSPC",
        "--horizon",
        "6",
        "--samples",
        "64",
        "--barrier",
        "+2%,-1.5%",
        "--drawdown",
        "--save-paths",
        "--out",
        tmp_path,
    )
    assert code == 0, err
    assert "P(upper 1st)" in out and "by the candles' high/low" in out and "Maximum drawdown" in out
    barrier, drawdown = pd.read_csv(tmp_path / "barrier.csv"), pd.read_csv(tmp_path / "drawdown.csv")
    assert barrier["symbol"].tolist() == drawdown["symbol"].tolist() == ["AAPL", "^GSPC"]
    assert (barrier["prices"] == "high/low").all() and (barrier["samples"] == 64).all()
    np.testing.assert_allclose(barrier[["p_upper_first", "p_lower_first", "p_neither"]].sum(axis=1), 1)
    paths = np.load(tmp_path / "paths.npz")  # the same numbers from the saved paths
    for i in range(2):
        hl = {"high": paths["high"][i], "low": paths["low"][i]}
        p = barrier_probabilities(barrier_outcomes(paths["close"][i], 0.02, -0.015, **hl))
        assert barrier.loc[i, "p_upper_first"] == pytest.approx(p["p_upper_first"])
        assert barrier.loc[i, "p_lower_first"] == pytest.approx(p["p_lower_first"])
        dd = max_drawdown(paths["close"][i], **hl)
        assert drawdown.loc[i, "mean"] == pytest.approx(dd.mean()) and drawdown.loc[i, "p90"] <= dd.max()
    assert 0 < barrier[["p_upper_first", "p_lower_first"]].to_numpy().sum()  # the tiny model does move


def test_short_history_says_how_many_candles(run_dir, capsys, forecaster):
    first = forecaster.load_history(["AAPL"])[0].candles.index[3]
    _one_line_error(
        *_forecast(capsys, run_dir, "--symbols", "AAPL", "--as-of", first.isoformat())[::2],
        "AAPL: 4 candles",
        "22 needed",
    )


def test_broken_runs_and_unwritable_out(run_dir, tmp_path, capsys):
    no_best = tmp_path / "no_best"
    shutil.copytree(run_dir, no_best, ignore=shutil.ignore_patterns("forecasts", "tensorboard"))
    (no_best / "best_model.pt").unlink()
    _one_line_error(*_forecast(capsys, no_best)[::2], "no best_model.pt")

    old_tok = tmp_path / "old_tok"
    shutil.copytree(run_dir, old_tok, ignore=shutil.ignore_patterns("forecasts", "tensorboard"))
    raw = json.loads((old_tok / "tokenizer.json").read_text())
    (old_tok / "tokenizer.json").write_text(json.dumps(raw | {"version": 99}))
    _one_line_error(*_forecast(capsys, old_tok)[::2], "version 99 is not supported")

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    _one_line_error(
        *_forecast(capsys, run_dir, "--symbols", "AAPL", "--horizon", "2", "--samples", "2", "--out", blocker / "out")[
            ::2
        ],
        "is not writable",
    )
    assert blocker.read_text() == "not a folder"


@pytest.fixture(scope="module")
def feature_run(tmp_path_factory):
    """A tiny run with model.time_features, volume_input and vol_level_input, its end-of-training
    scorecard on."""
    spec = json.loads(json.dumps(TINY))
    spec["model"].update(time_features=True, volume_input=True, vol_level_input=True)
    spec["training"].update(scorecard_origins=2, scorecard_samples=4)
    return train_tiny(tmp_path_factory.mktemp("fcf"), spec)[1]


def test_a_run_with_time_and_volume_inputs_forecasts(feature_run, tmp_path, capsys):
    from common.tokens.token_set import TokenSet

    results = json.loads((feature_run / "test_results.json").read_text())
    assert "scorecard_error" not in results and (feature_run / "scorecard.json").is_file()
    fc = Forecaster.from_run(feature_run)
    (h,) = fc.load_history(["AAPL"], as_of="2012-06-01")
    n, category = len(h.candles), fc.assets["AAPL"].category
    ids = fc.candle_features(h.candles, category, 4)
    # the context's ids are training's own (same candles, same fitted volume edges, the
    # vol level from the history up to the origin alone) ...
    shard = TokenSet.load(feature_run / "tokens").features["AAPL"]
    assert ids.shape == (n + 4, 4) and shard.shape[1] == 4 and len(shard) > n
    np.testing.assert_array_equal(ids[:n], shard[:n])
    assert ids[:n, 2].max() > 1 and len(set(ids[:n, 3]) - {0}) > 3
    # ... the future's: the forecast's own timestamps' calendar, volume unknown (0), the
    # origin's vol level held
    when = future_timestamps(h.candles.index[-1], "1d", category, 4)
    np.testing.assert_array_equal(ids[n:, :2], calendar_ids(when, "1d"))
    assert (ids[n:, 2] == 0).all() and (ids[n:, 3] == ids[n - 1, 3]).all()

    r = fc.forecast([h], 4, 16, seed=0, return_paths=True)
    assert np.isfinite(r.paths["close"]).all()
    np.testing.assert_array_equal(r.table["timestamp"], when)
    fc.volume_edges = [e + 0.5 for e in fc.volume_edges]  # other volume ids reach the model: another forecast
    assert not np.array_equal(fc.forecast([h], 4, 16, seed=0, return_paths=True).tokens, r.tokens)

    code, out, err = _forecast(
        capsys, feature_run, "--symbols", "AAPL", "--horizon", "3", "--samples", "8", "--out", tmp_path / "out"
    )
    assert code == 0 and "P50" in out, err
    code = main(["scorecard", str(feature_run), "--horizons", "1", "--origins", "2", "--samples", "4"])
    out, err = capsys.readouterr()
    assert code == 0 and "H=1:" in out, err

    old = tmp_path / "old"  # a run from before the volume edges were stored
    shutil.copytree(feature_run, old, ignore=shutil.ignore_patterns("forecasts", "tensorboard"))
    info = json.loads((old / "data_info.json").read_text())
    del info["volume_edges"]
    (old / "data_info.json").write_text(json.dumps(info))
    _one_line_error(*_forecast(capsys, old)[::2], "model.volume_input is on", "no volume_edges", "retrain")


def test_bench_generalization_scores_a_run_with_time_and_volume_inputs(feature_run):
    from bench_generalization import split_scores

    scores = split_scores(feature_run, "val")  # the model reads the candles' feature ids too
    assert len(scores["model"]) == len(scores["unigram"]) == len(scores["position"]) > 0
    assert np.isfinite(scores["model"]).all()


def test_bench_forecast_smoke_writes_its_rows(tmp_path):
    """bench/bench_forecast.py runs end to end at toy sizes (nothing here times anything)."""
    out = tmp_path / "forecast.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "bench_forecast.py"),
            "--assets",
            "2",
            "--samples",
            "4",
            "--horizon",
            "3",
            "--ref-samples",
            "1",
            "--threads",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    figures = {r["figure"]: r["value"] for r in result["rows"]}
    assert figures["KV cache / generate paths/s"] > 0 and figures["peak memory"] > 0
    assert result["figures"]["samples"] == 4 and result["figures"]["horizon"] == 3


def test_onnx_and_pt2_exports_of_a_run_with_candle_ids_forecast_as_the_run(feature_run, tmp_path):
    # the exported forward takes each candle's ids as a 4th input; greedy forecasts take the
    # samplers' draws out: the onnx export's table equals the run's, through the KV cache
    from common.forecasting.infer import ExportedForecaster

    assert main(["export", str(feature_run), "--format", "onnx", "--out", str(tmp_path / "onnx")]) == 0
    card = json.loads((tmp_path / "onnx" / "model_card.json").read_text())
    assert "features" in card["inputs"] and card["volume_edges"]
    fc, ref = ExportedForecaster.from_export(tmp_path / "onnx"), Forecaster.from_run(feature_run)
    assert fc.volume_edges == ref.volume_edges
    histories = ref.load_history(["AAPL", "^GSPC"], as_of="2012-06-01")
    want = ref.forecast(histories, horizon=12, samples=3, temperature=0.0).table
    pd.testing.assert_frame_equal(fc.forecast(histories, horizon=12, samples=3, temperature=0.0).table, want)
    assert main(["export", str(feature_run), "--format", "pt2", "--out", str(tmp_path / "pt2")]) == 0


def test_hf_export_of_a_run_with_calendar_and_volume_inputs_round_trips(feature_run, tmp_path):
    # the hf folder holds the torch model itself: its extra inputs and the fitted volume edges travel with it
    assert main(["export", str(feature_run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    fc, ref = Forecaster.from_pretrained(tmp_path / "hf"), Forecaster.from_run(feature_run)
    assert fc.volume_edges == ref.volume_edges and fc.volume_edges is not None
    histories = ref.load_history(["AAPL"], as_of="2012-06-01")
    got = fc.forecast(histories, 4, 16, seed=3, return_paths=True)
    want = ref.forecast(histories, 4, 16, seed=3, return_paths=True)
    pd.testing.assert_frame_equal(got.table, want.table)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    headline = json.loads((feature_run / "scorecard.json").read_text())["verdicts"][0]
    readme = (tmp_path / "hf" / "README.md").read_text()
    assert "Scorecard headline" in readme and f"- {headline}" in readme
