"""The model learns a known token process to within a few percent of its conditional entropy.

Series come from a GARCH-like process written straight in the token grid (8 move bins x 2 shape
bins): the volatility state is how many of the last 3 moves were large, it sets the width of
the next move's distribution, and a large move makes a wide candle likelier. The true
predictor's mean NLL on the test series is the process's conditional entropy (estimated on
those very targets); the unigram does not see the state and is clearly worse.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.config import Config, validate
from common.model.gpt import MarketGPT
from common.special_tokens import NUM_SPECIAL_TOKENS

MOVES, SHAPES, LAGS = 8, 2, 3
SCALES = (0.6, 1.5, 3.0, 5.0)  # move spread (in bins) for 0..3 large moves among the last LAGS
T = 16
STEPS = 250


def _move_probs() -> np.ndarray:
    centers = np.arange(MOVES) - (MOVES - 1) / 2
    p = np.exp(-0.5 * (centers[None, :] / np.array(SCALES)[:, None]) ** 2)
    return p / p.sum(1, keepdims=True)  # (states, MOVES)


def _large(m: np.ndarray) -> np.ndarray:
    return np.abs(m - (MOVES - 1) / 2) > 1  # the 3 outer bins on each side


def simulate(n_series: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, true log-prob of each token given its past), both (n_series, length); the
    first LAGS tokens of a series are warm-up (log-prob NaN)."""
    rng = np.random.default_rng(seed)
    pm = _move_probs()
    p_wide = np.where(_large(np.arange(MOVES)), 0.8, 0.2)  # p(shape bin 1 | move)
    moves = np.zeros((n_series, length), np.int64)
    shapes = np.zeros((n_series, length), np.int64)
    logp = np.full((n_series, length), np.nan)
    moves[:, :LAGS] = rng.integers(2, 6, (n_series, LAGS))
    for t in range(LAGS, length):
        state = _large(moves[:, t - LAGS : t]).sum(1)
        cum = pm[state].cumsum(1)
        moves[:, t] = (rng.random((n_series, 1)) > cum).sum(1)
        wide = rng.random(n_series) < p_wide[moves[:, t]]
        shapes[:, t] = wide
        logp[:, t] = np.log(pm[state, moves[:, t]]) + np.log(
            np.where(wide, p_wide[moves[:, t]], 1 - p_wide[moves[:, t]])
        )
    return NUM_SPECIAL_TOKENS + moves * SHAPES + shapes, logp


def _windows(tokens: np.ndarray) -> torch.Tensor:
    """Non-overlapping (T + 1)-token windows after the warm-up, as (W, T + 1)."""
    body = tokens[:, LAGS:]
    n = (body.shape[1] - 1) // T
    starts = np.arange(n) * T
    return torch.from_numpy(np.concatenate([body[:, s : s + T + 1] for s in starts]))


@pytest.fixture
def one_thread():
    # tiny matmuls: one thread is several times faster than two on a loaded 2-core machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("head", ["flat", "factorized"])
def test_model_reaches_the_processes_conditional_entropy(head: str, one_thread: None) -> None:
    torch.manual_seed(0)
    train_tokens, _ = simulate(64, 800, seed=1)
    test_tokens, test_logp = simulate(16, 400, seed=2)
    cfg = Config()
    m = cfg.model
    m.vocab_size, m.context_length, m.d_model, m.num_layers, m.num_heads, m.d_ff = (
        NUM_SPECIAL_TOKENS + MOVES * SHAPES,
        T,
        48,
        2,
        4,
        96,
    )
    m.dropout, m.head = 0.0, head
    cfg.tokenizer.shape_bins = SHAPES
    validate(cfg, "test")
    model = MarketGPT(m)
    opt = model.configure_optimizer(0.0, 3e-3, (0.9, 0.95), "cpu")
    train = _windows(train_tokens)
    zeros = torch.zeros(64, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        b = train[torch.randint(len(train), (64,), generator=g)]
        _, loss = model(b[:, :-1], zeros, zeros, b[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()

    test = _windows(test_tokens)
    model.eval()
    with torch.no_grad():
        z = torch.zeros(len(test), dtype=torch.long)
        logits, _ = model(test[:, :-1], z, z)
        nll = -torch.log_softmax(logits, -1).gather(-1, test[:, 1:, None])[..., 0]
    # skip each window's first LAGS targets: the model cannot see the state's earlier moves there
    model_nll = float(nll[:, LAGS:].mean())
    body_logp = test_logp[:, LAGS:]
    n = (body_logp.shape[1] - 1) // T
    true_logp = np.concatenate([body_logp[:, s * T + 1 : s * T + T + 1] for s in range(n)])
    entropy = float(-true_logp[:, LAGS:].mean())
    counts = np.bincount(train_tokens[:, LAGS:].ravel(), minlength=MOVES * SHAPES + NUM_SPECIAL_TOKENS)
    freq = (counts[NUM_SPECIAL_TOKENS:] + 1) / (counts[NUM_SPECIAL_TOKENS:] + 1).sum()  # add-one over the grid
    freq = np.concatenate([np.ones(NUM_SPECIAL_TOKENS), freq])  # specials never occur in the test
    targets = test[:, 1:][:, LAGS:].numpy()
    unigram = float(-np.log(freq[targets]).mean())
    print(f"{head}: model {model_nll:.4f} nats, process conditional entropy {entropy:.4f}, unigram {unigram:.4f}")
    assert model_nll < entropy * 1.03
    assert model_nll < unigram - 0.1
    assert unigram > entropy + 0.15  # the test can fail: the state matters


# --------------------------------------------------------------------------- the parts


def test_factorized_head_is_a_distribution_over_the_whole_vocabulary() -> None:
    cfg = Config()
    cfg.model.vocab_size, cfg.model.d_model, cfg.model.num_layers, cfg.model.num_heads = 100, 16, 1, 2
    cfg.model.d_ff, cfg.model.context_length, cfg.model.head = 32, 8, "factorized"
    cfg.tokenizer.shape_bins, cfg.tokenizer.ret_bins = 4, 20
    validate(cfg, "test")
    assert (cfg.model.move_bins, cfg.model.shape_bins) == (20, 4)  # recorded for config.json
    model = MarketGPT(cfg.model).eval()
    idx = torch.randint(NUM_SPECIAL_TOKENS, NUM_SPECIAL_TOKENS + 80, (3, 8))
    z = torch.zeros(3, dtype=torch.long)
    logits, loss = model(idx, z, z, idx)
    p = torch.softmax(logits, -1)
    assert logits.shape == (3, 8, 100)
    assert torch.allclose(p.sum(-1), torch.ones(3, 8), atol=1e-5)
    assert torch.allclose(logits.exp().sum(-1), torch.ones(3, 8), atol=1e-5)  # logits are log-probs
    assert p[..., NUM_SPECIAL_TOKENS + 80 :].max() < 1e-30  # ids the tokenizer never emits
    assert abs(loss.item() - (-torch.log_softmax(logits.detach(), -1).gather(-1, idx[..., None]).mean()).item()) < 1e-5


def test_factorized_grid_must_match_the_tokenizer() -> None:
    from common.config import ConfigError

    cfg = Config()
    cfg.model.head, cfg.model.move_bins, cfg.model.shape_bins = "factorized", 50, 8
    with pytest.raises(ConfigError, match="model.move_bins"):
        validate(cfg, "case.json")
    cfg = Config()
    cfg.tokenizer.ret_bins = 500
    with pytest.raises(ConfigError, match="tokenizer.ret_bins"):
        validate(cfg, "case.json")


def test_epoch_stride_takes_every_kth_window_from_a_random_offset_per_epoch() -> None:
    from common.training.batches import build_windows

    tokens = {"A": np.arange(300) % 50 + 3, "B": np.arange(203) % 50 + 3}
    ranges = {"A": {"train": (0, 300)}, "B": {"train": (0, 203)}}
    k = 4
    ranges = {s: {"train": r["train"], "val": (0, 20), "test": (0, 20)} for s, r in ranges.items()}
    w = build_windows(
        tokens, ranges, {"A": 0, "B": 1}, {"A": 0, "B": 0}, 8, strides={"train": 1, "val": 8, "test": 8}, epoch_stride=k
    )
    pos = w.splits["train"].positions
    sizes, offsets = set(), set()
    for epoch in range(12):
        order = w.epoch_order("train", seed=3, epoch=epoch)
        assert torch.equal(order, w.epoch_order("train", seed=3, epoch=epoch))  # resume sees the same
        assert len(set((pos[order] % k).tolist())) == 1  # one offset per epoch
        offsets.add(int(pos[order[0]] % k))
        sizes.add(len(order))
        assert len(set(order.tolist())) == len(order)
    assert sizes == {w.epoch_windows("train")} and offsets == set(range(k))
    assert w.epoch_windows("train") == (292 // k) + (195 // k)  # the fewest any offset gives, per asset
    assert w.num_batches("train", 10, drop_last=True, shuffle=True) == w.epoch_windows("train") // 10
    assert w.num_batches("train", 10, drop_last=True) == w.num_windows("train") // 10  # evaluation: all


def test_fewer_move_bins_leave_the_rest_of_the_vocabulary_unused(tmp_path) -> None:
    import pandas as pd

    from common.tokens.tokenizer import OHLCTokenizer

    rng = np.random.default_rng(0)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, 2000)))
    frame = pd.DataFrame({"open": close * (1 + rng.normal(0, 0.002, 2000)), "close": close})
    frame["high"] = frame[["open", "close"]].max(axis=1) * 1.003
    frame["low"] = frame[["open", "close"]].min(axis=1) * 0.997
    tok = OHLCTokenizer(vocab_size=1024, shape_bins=8, ret_bins=16).fit([frame])
    ids = tok.encode(frame)
    assert ids.max() < NUM_SPECIAL_TOKENS + 16 * 8 and tok.ret_bins == 16
    tok.save(tmp_path / "t.json")
    assert OHLCTokenizer.load(tmp_path / "t.json").ret_bins == 16


def test_vocabulary_line_says_when_the_vocabulary_is_too_fine() -> None:
    from types import SimpleNamespace

    from common.commands.run_size import vocabulary_line

    tokens = SimpleNamespace(ranges={"A": {"train": (0, 30000)}, "B": {"train": (100, 10100)}})
    fine = vocabulary_line(SimpleNamespace(ret_bins=127, shape_bins=8), tokens)
    assert "40,000 training candles: 39.4 candles per id" in fine and "tokenizer.ret_bins=50" in fine
    coarse = vocabulary_line(SimpleNamespace(ret_bins=32, shape_bins=8), tokens)
    assert "156.2 candles per id" in coarse and "too fine" not in coarse


def test_the_factorized_head_can_start_at_the_unigram() -> None:
    from common.model.heads import FactorizedHead

    head = FactorizedHead(16, 100, move_bins=10, shape_bins=4)
    counts = torch.zeros(100)
    counts[NUM_SPECIAL_TOKENS : NUM_SPECIAL_TOKENS + 40] = torch.arange(40.0) * 3
    counts[1] = 5  # a few MISSING tokens
    head.start_at_unigram(counts)
    log_probs = head(torch.zeros(1, 16))[0]  # a hidden state of zeros reads the biases alone
    expected = (counts[:43] + 1) / (counts[:43] + 1).sum()  # add-one over the ids the tokenizer emits
    assert torch.allclose(log_probs[:43].exp(), expected, atol=1e-6)
