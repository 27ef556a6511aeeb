"""Evaluation metrics, naive baselines and the PNG report, checked against hand-computed values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from common.config import ModelConfig
from common.evaluation import evaluate as ev
from common.evaluation.baselines import fit_baselines
from common.evaluation.evaluate import evaluate_run
from common.evaluation.metrics import wilson_interval
from common.evaluation.report import write_report
from common.evaluation.result_lines import summarize_results
from common.evaluation.token_scoring import SplitTokens, eval_inputs
from common.markets import CATEGORIES
from common.model.gpt import MarketGPT
from common.run.log import RunLog
from common.special_tokens import BOS_TOKEN, MISSING_TOKEN, PAD_TOKEN
from common.tokens.ids import AssetRecord, RunInfo
from common.tokens.tokenizer import OHLCTokenizer

torch.set_num_threads(1)

V = 8  # ids 0..2 special, 3..7 candle tokens
# the fixed next-token distribution of FixedModel, by token id
PROBS = np.array([0.0, 0.1, 0.05, 0.4, 0.2, 0.1, 0.1, 0.05])
# decoded move of each token: specials NaN, as OHLCTokenizer.decode gives them
MOVES = np.array([np.nan, np.nan, np.nan, 1.0, -1.0, 2.0, -0.5, 0.25])


class FakeTokenizer:
    vocab_size = V

    def decode(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return MOVES[tokens], np.zeros(len(tokens))


class FixedModel(torch.nn.Module):
    """Same logits at every position; records what evaluation asked of it."""

    def __init__(self, probs: np.ndarray = PROBS) -> None:
        super().__init__()
        with np.errstate(divide="ignore"):
            self.logits = torch.tensor(np.log(probs), dtype=torch.float32)
        self.calls: list[tuple] = []

    def forward(self, idx, asset_ids, category_ids, targets=None):
        assert not self.training, "evaluation must run in eval mode"
        assert not torch.is_grad_enabled(), "evaluation must run under no_grad"
        self.calls.append((tuple(idx.shape), asset_ids.tolist(), category_ids.tolist()))
        B, T = idx.shape
        return self.logits.expand(B, T, V).clone(), None


def run_info(categories: dict, category_ids: dict | None = None) -> RunInfo:
    """The RunInfo of assets `categories` (symbol -> category), ids in order; category ids as
    asset_info.json numbers them unless given."""
    if category_ids is None:
        present = set(categories.values())
        category_ids = {c: i for i, c in enumerate(c for c in CATEGORIES if c in present)}
    records = tuple(AssetRecord(i, s, "sample", c, category_ids[c], s) for i, (s, c) in enumerate(categories.items()))
    return RunInfo(records, dict(category_ids))


def run(test, train=None, model=None, context_length=2, batch_size=4, categories=None, category_ids=None, **kw):
    train = train if train is not None else {s: np.array([3, 4, 5, 3]) for s in test}
    info = run_info(categories or {s: "crypto" for s in test}, category_ids)
    return evaluate_run(
        model or FixedModel(), FakeTokenizer(), test, train, info, context_length, batch_size, "cpu", **kw
    )


def split(tokens, moves=None) -> SplitTokens:
    tokens = np.asarray(tokens)
    return SplitTokens(tokens, np.full(len(tokens), np.nan) if moves is None else np.asarray(moves, float))


# --------------------------------------------------------------------------- model metrics by hand


def test_fixed_distribution_gives_hand_computed_metrics():
    # targets 4, 3, 5, 3, 2 (the first token has no context); p = .2, .4, .1, .4, .05
    results = run({"AAA": split([3, 4, 3, 5, 3, 2])}, context_length=2)
    assert results["num_tokens"] == 5
    loss = -(math.log(0.2) + math.log(0.4) + math.log(0.1) + math.log(0.4) + math.log(0.05)) / 5
    assert results["test_loss"] == pytest.approx(loss, rel=1e-6)
    assert results["perplexity"] == pytest.approx(math.exp(loss), rel=1e-6)
    assert results["test_accuracy"] == pytest.approx(2 / 5)  # argmax is token 3
    assert results["test_accuracy_pct"] == pytest.approx(40.0)
    # ranking: 3 (.4), 4 (.2), then the .1 ties in id order 1, 5, 6: token 2 (.05) is out
    assert results["top5_accuracy"] == pytest.approx(4 / 5)


def test_every_target_is_predicted_once_with_windows_sharing_their_boundary():
    model = FixedModel()
    tokens = np.array([3, 4, 3, 5, 3, 2, 6])
    results = run({"AAA": split(tokens)}, model=model, context_length=3, batch_size=1)
    assert results["num_tokens"] == len(tokens) - 1
    assert [c[0] for c in model.calls] == [(1, 3), (1, 3)]  # windows [0..3] and [3..6]
    assert results["settings"]["windows"] == 2


def test_pad_targets_are_ignored_and_bos_missing_count():
    results = run({"AAA": split([3, BOS_TOKEN, PAD_TOKEN, MISSING_TOKEN, 3])}, context_length=8)
    assert results["num_tokens"] == 3  # BOS, MISSING and 3 are targets; PAD is not
    loss = -(math.log(0.05) + math.log(0.1) + math.log(0.4)) / 3
    assert results["test_loss"] == pytest.approx(loss, rel=1e-6)
    for name in ev.BASELINES:
        assert results["baselines"][name]["num_tokens"] == 3


def test_model_directional_accuracy_against_always_up():
    # expected move = .4*1 + .2*-1 + .1*2 + .1*-.5 + .05*.25 > 0: the model always says up.
    # actual moves of targets 1..5: +0.5, -0.3, 0 (left out), +1.0, NaN (left out)
    test = {"AAA": split([3, 4, 3, 5, 3, 6], [np.nan, 0.5, -0.3, 0.0, 1.0, np.nan])}
    d = run(test)["directional"]
    assert d["num_moves"] == 3
    assert d["model"]["n"] == 3 and d["model"]["accuracy"] == pytest.approx(2 / 3)
    assert d["always_up"]["accuracy"] == pytest.approx(2 / 3)
    low, high = wilson_interval(2, 3)
    assert (d["always_up"]["ci95_low"], d["always_up"]["ci95_high"]) == pytest.approx((low, high))


def test_model_that_predicts_down_gets_the_down_moves():
    probs = np.array([0.0, 0.0, 0.0, 0.1, 0.9, 0.0, 0.0, 0.0])  # expected move .1 - .9 < 0
    test = {"AAA": split([3, 4, 3, 5, 3, 6], [np.nan, 0.5, -0.3, -2.0, 1.0, -0.1])}
    d = run(test, model=FixedModel(probs))["directional"]
    assert d["model"]["accuracy"] == pytest.approx(3 / 5)
    assert d["always_up"]["accuracy"] == pytest.approx(2 / 5)


# --------------------------------------------------------------------------- Wilson interval


def test_wilson_interval_known_values():
    z2 = 1.959963984540054**2
    assert wilson_interval(0, 10) == pytest.approx((0.0, z2 / (10 + z2)))  # 0.2775
    assert wilson_interval(10, 10) == pytest.approx((10 / (10 + z2), 1.0))  # 0.7225
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # textbook table
    assert wilson_interval(0, 0) == (None, None)


def test_wilson_interval_narrows_and_contains_the_estimate():
    low100, high100 = wilson_interval(60, 100)
    low1k, high1k = wilson_interval(600, 1000)
    assert low100 < 0.6 < high100 and low1k < 0.6 < high1k
    assert high1k - low1k < high100 - low100


# --------------------------------------------------------------------------- baselines


def test_unigram_is_add_one_smoothed_train_frequency():
    b = fit_baselines({"A": np.array([3, 3, 4])}, vocab_size=6)["unigram"]
    # counts 3:2, 4:1 plus one for each of the 5 non-PAD ids, over 3 + 5
    assert b.probs == pytest.approx([0, 1 / 8, 1 / 8, 3 / 8, 2 / 8, 1 / 8])


def test_repeat_last_eps_is_the_train_non_repeat_rate():
    b = fit_baselines({"A": np.array([3, 3, 4, 4, 4, 5])}, vocab_size=6)["repeat_last"]
    assert b.eps == pytest.approx(2 / 5)  # 3->3, 4->4, 4->4 repeat; 3->4, 4->5 don't
    lp = np.exp(b.log_probs(np.array([4])))[0]
    assert lp == pytest.approx([0, 0.1, 0.1, 0.1, 0.6, 0.1])


def test_markov1_is_witten_bell_with_unigram_backoff():
    b = fit_baselines({"A": np.array([3, 4, 3, 5])}, vocab_size=6)
    u = b["unigram"].probs  # counts 3:2, 4:1, 5:1 -> (c + 1) / 9
    assert u == pytest.approx([0, 1 / 9, 1 / 9, 3 / 9, 2 / 9, 2 / 9])
    p = np.exp(b["markov1"].log_probs(np.array([3, 5])))
    # after 3: seen 4 and 5 once each, 2 distinct successors: (c + 2 u) / (2 + 2)
    assert p[0] == pytest.approx((np.array([0, 0, 0, 0, 1, 1]) + 2 * u) / 4)
    assert p[1] == pytest.approx(u)  # 5 is never followed by anything in train: back off
    assert p.sum(1) == pytest.approx([1, 1])


def test_transitions_do_not_cross_assets():
    b = fit_baselines({"A": np.array([3, 4]), "B": np.array([5, 6])}, vocab_size=8)["markov1"]
    assert b.counts[4, 5] == 0 and b.counts[3, 4] == 1 and b.counts[5, 6] == 1


def test_baseline_accuracies_on_hand_made_sequences():
    cycle_train = {"A": np.tile([3, 4, 5], 20)}
    # targets 3, 3, 4, 4, 4, 5 after 3, 3, 3, 4, 4, 4
    test = {"A": split([3, 3, 3, 4, 4, 4, 5])}
    r = run(test, train=cycle_train, context_length=4)
    assert r["baselines"]["repeat_last"]["accuracy"] == pytest.approx(4 / 6)  # 3->3, 3->3, 4->4, 4->4
    # unigram: 3, 4, 5 equally frequent, so the tie goes to the lowest id, 3
    assert r["baselines"]["unigram"]["accuracy"] == pytest.approx(2 / 6)
    # markov1 learned the cycle 3->4->5->3 on train; on the same cycle it is always right
    cyc = run({"A": split(np.tile([3, 4, 5], 5))}, train=cycle_train, context_length=4)
    assert cyc["baselines"]["markov1"]["accuracy"] == 1.0
    assert cyc["baselines"]["markov1"]["top5_accuracy"] == 1.0


def test_baselines_are_fit_on_train_only():
    train = {"A": np.tile([3, 4, 5], 20)}
    # the test period runs the cycle backwards: fit on train, markov1 is always wrong there
    backwards = run({"A": split(np.tile([5, 4, 3], 5))}, train=train, context_length=4)
    assert backwards["baselines"]["markov1"]["accuracy"] == 0.0
    assert backwards["settings"]["train_tokens"] == 60


def test_fitted_tables_do_not_change_with_the_test_period(monkeypatch):
    fitted = []

    def spy(train_tokens, vocab_size):
        fitted.append(fit_baselines(train_tokens, vocab_size))
        return fitted[-1]

    monkeypatch.setattr(ev, "fit_baselines", spy)
    train = {"A": np.array([3, 4, 5, 5, 6, 3, 7, 4]), "B": np.array([6, 6, 3])}
    run({"A": split([3, 4, 5, 6]), "B": split([7, 7])}, train=train)
    run({"A": split([7, 6, 6, 6, 5, 5, 4]), "B": split([3, 3, 3, 3])}, train=train)
    assert len(fitted) == 2
    a, b = fitted
    np.testing.assert_array_equal(a["unigram"].probs, b["unigram"].probs)
    np.testing.assert_array_equal(a["markov1"].counts, b["markov1"].counts)
    assert a["repeat_last"].eps == b["repeat_last"].eps


# --------------------------------------------------------------------------- breakdowns


def _weighted(groups: dict, key: str) -> float:
    """The groups' `key`, weighted by their token counts."""
    return sum(g[key] * g["num_tokens"] for g in groups.values()) / sum(g["num_tokens"] for g in groups.values())


def test_per_asset_and_per_category_add_up_to_the_totals():
    rng = np.random.default_rng(1)
    test = {s: split(rng.integers(1, V, n), rng.normal(size=n)) for s, n in (("A", 9), ("B", 14), ("C", 6))}
    categories = {"A": "crypto", "B": "crypto", "C": "us_stock"}
    train = {s: rng.integers(1, V, 30) for s in test}
    r = run(test, train=train, categories=categories, context_length=3, batch_size=2)

    for groups in (r["per_asset"], r["per_category"]):
        n = np.array([g["num_tokens"] for g in groups.values()])
        assert n.sum() == r["num_tokens"] == 9 - 1 + 14 - 1 + 6 - 1
        assert _weighted(groups, "loss") == pytest.approx(r["test_loss"])
        assert _weighted(groups, "accuracy") == pytest.approx(r["test_accuracy"])
        for b in ev.BASELINES:
            acc = sum(g["baseline_accuracy"][b] * g["num_tokens"] for g in groups.values()) / n.sum()
            assert acc == pytest.approx(r["baselines"][b]["accuracy"])
    assert r["per_asset"]["C"]["category"] == "us_stock"
    assert r["per_category"]["crypto"]["num_assets"] == 2
    assert r["per_category"]["crypto"]["num_tokens"] == 8 + 13


def test_category_ids_reach_the_model():
    model = FixedModel()
    test = {"A": split([3, 4]), "B": split([3, 4])}
    run(test, model=model, categories={"A": "fx", "B": "crypto"}, batch_size=1, category_ids={"crypto": 4, "fx": 7})
    assert [(c[1], c[2]) for c in model.calls] == [([0], [7]), ([1], [4])]


def test_max_batches_scores_model_and_baselines_on_the_same_targets():
    model = FixedModel()
    test = {s: split(np.full(21, 3)) for s in ("A", "B", "C")}  # 5 windows each at context 4
    r = run(test, model=model, context_length=4, batch_size=2, max_batches=2)
    assert len(model.calls) == 2
    assert r["settings"]["windows"] == 4
    assert r["num_tokens"] == 16
    assert {b["num_tokens"] for b in r["baselines"].values()} == {16}
    assert len([a for a in r["per_asset"].values() if a["num_tokens"]]) == 3  # spread over assets


def test_asset_with_too_few_test_tokens_gives_nulls_not_nans():
    r = run({"A": split([3, 4, 5]), "B": split([3])})
    assert r["per_asset"]["B"]["num_tokens"] == 0 and r["per_asset"]["B"]["loss"] is None
    json.dumps(r, allow_nan=False)


def test_eval_inputs_slices_by_range():
    tokens = {"A": np.arange(10)}
    moves = {"A": np.arange(10) * 0.5}
    test, train = eval_inputs(tokens, moves, {"A": {"train": (0, 6), "val": (6, 8), "test": (8, 10)}})
    np.testing.assert_array_equal(train["A"], np.arange(6))
    np.testing.assert_array_equal(test["A"].tokens, [8, 9])
    np.testing.assert_array_equal(test["A"].moves, [4.0, 4.5])


# --------------------------------------------------------------------------- a real model, end to end


def _candles(rng: np.random.Generator, n: int) -> pd.DataFrame:
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    open_ = np.r_[100.0, close[:-1]]
    wiggle = np.exp(np.abs(rng.normal(0, 0.004, (2, n))))
    index = pd.date_range("2021-01-01", periods=n, freq="D", tz="UTC", name="timestamp")
    return pd.DataFrame(
        {
            "open": open_,
            "high": np.maximum(open_, close) * wiggle[0],
            "low": np.minimum(open_, close) / wiggle[1],
            "close": close,
            "volume": np.ones(n),
        },
        index=index,
    )


def test_tiny_marketgpt_end_to_end_matches_its_own_loss():
    rng = np.random.default_rng(0)
    frames = {"BTC/USDT": _candles(rng, 200), "ETH/USDT": _candles(rng, 160)}
    ranges = {
        s: {"train": (0, 120), "val": (120, len(f) - 33), "test": (len(f) - 33, len(f))} for s, f in frames.items()
    }
    tok = OHLCTokenizer(vocab_size=35, shape_bins=4, vol_warmup=5)
    tok.fit({s: f.iloc[:120] for s, f in frames.items()})
    tokens = {s: tok.encode(f, s) for s, f in frames.items()}
    moves = {s: tok.features(f, s)[0] for s, f in frames.items()}
    test, train = eval_inputs(tokens, moves, ranges)

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=35, context_length=32, d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.1)
    model = MarketGPT(cfg, num_assets=2, num_categories=1)
    model.train()
    r = evaluate_run(model, tok, test, train, run_info({s: "crypto" for s in frames}), 32, 8, "cpu")
    assert model.training  # the caller's mode is restored
    json.dumps(r, allow_nan=False)

    # each asset has 33 test tokens = exactly one window of context + 1, so its per-asset loss
    # is the model's own mean cross-entropy on that window (dropout off)
    model.eval()
    with torch.no_grad():
        for a, s in enumerate(frames):
            t = torch.from_numpy(test[s].tokens.astype(np.int64))[None]
            _, loss = model(t[:, :-1], torch.tensor([a]), torch.tensor([0]), t[:, 1:])
            assert r["per_asset"][s]["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert r["num_tokens"] == 64
    assert 0.0 <= r["test_accuracy"] <= r["top5_accuracy"] <= 1.0
    assert r["directional"]["num_moves"] == 64  # test candles are warm: every move is defined
    for b in r["baselines"].values():
        assert math.isfinite(b["loss"]) and b["perplexity"] == pytest.approx(math.exp(b["loss"]))


# --------------------------------------------------------------------------- report


def test_report_png_is_written_atomically(tmp_path):
    rng = np.random.default_rng(2)
    test = {"A": split(rng.integers(1, V, 40), rng.normal(size=40))}
    results = run(test, train={"A": rng.integers(1, V, 50)}, context_length=8)
    log = {
        "status": "finished",
        "best_epoch": 2,
        "best_val_loss": 2.0,
        "epochs": [
            {"epoch": 1, "train_loss": 2.5, "val_loss": 2.2},
            {"epoch": 2, "train_loss": 2.1, "val_loss": 2.0},
            {"epoch": 3, "train_loss": 1.9, "val_loss": None},
        ],
    }
    path = write_report(tmp_path, RunLog(log), results)
    assert path == tmp_path / "report.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 600 and height > 400
    assert [p.name for p in tmp_path.iterdir()] == ["report.png"]  # no temp file left behind


def test_report_of_a_run_without_epochs_or_moves(tmp_path):
    results = run({"A": split([3, 4])})
    path = write_report(tmp_path, RunLog({"status": "running", "epochs": []}), results)
    assert path.read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- marketgpt evaluate RUN_DIR


def _fake_run_folder(root) -> tuple:
    """A run folder in the trainer's format (config, tokenizer, asset_info, tokens/, best model)."""
    from common.atomic import atomic_write_json
    from common.config import Config, config_to_dict, save_config
    from common.run.checkpoint import save_checkpoint
    from common.tokens.token_set import TokenSet

    rng = np.random.default_rng(3)
    frames = {"BTC/USDT": _candles(rng, 120), "^GSPC": _candles(rng, 100)}
    ranges = {s: {"train": (0, 60), "val": (60, len(f) - 25), "test": (len(f) - 25, len(f))} for s, f in frames.items()}
    cfg = Config(experiment="fake")
    cfg.model = ModelConfig(vocab_size=35, context_length=8, d_model=16, num_layers=1, num_heads=2, d_ff=32)
    cfg.training.batch_size = 4
    cfg.tokenizer.shape_bins, cfg.tokenizer.vol_warmup = 4, 5
    tok = OHLCTokenizer.from_config(cfg.tokenizer, cfg.model.vocab_size)
    tok = tok.fit({s: f.iloc[:60] for s, f in frames.items()})
    symbols = list(frames)
    tokens = TokenSet(
        symbols,
        {s: tok.encode(f, s) for s, f in frames.items()},
        {s: tok.features(f, s)[0] for s, f in frames.items()},
        ranges,
    )
    info = {
        "assets": [
            {
                "id": 0,
                "symbol": "BTC/USDT",
                "source": "sample",
                "category": "crypto",
                "category_id": 1,
                "name": "Bitcoin",
            },
            {"id": 1, "symbol": "^GSPC", "source": "sample", "category": "index", "category_id": 0, "name": "S&P 500"},
        ],
        "symbols": {"BTC/USDT": 0, "^GSPC": 1},
        "categories": {"index": 0, "crypto": 1},
        "num_assets": 2,
        "num_categories": 2,
    }
    run = root / "fake_20250101_000000"
    run.mkdir()
    save_config(cfg, run / "config.json")
    tok.save(run / "tokenizer.json")
    atomic_write_json(run / "asset_info.json", info)
    tokens.save(run / "tokens")
    atomic_write_json(
        run / "training_log.json",
        {
            "status": "finished",
            "best_epoch": 1,
            "best_val_loss": 3.4,
            "epochs": [{"epoch": 1, "train_loss": 3.5, "val_loss": 3.4}],
        },
    )
    torch.manual_seed(0)
    model = MarketGPT(cfg.model, num_assets=2, num_categories=2)
    save_checkpoint(
        {
            "format": "marketgpt-best-model",
            "model": model.state_dict(),
            "epoch": 1,
            "val_loss": 3.4,
            "config": config_to_dict(cfg),
        },
        run / "best_model.pt",
    )
    return run, model, tokens


def test_cli_evaluate_recomputes_test_results_and_report(tmp_path, capsys):
    from common.cli import main

    run, model, tokens = _fake_run_folder(tmp_path)
    assert main(["evaluate", str(run)]) == 0
    out = capsys.readouterr().out
    assert "baseline markov1" in out and str(run) in out

    results = json.loads((run / "test_results.json").read_text())
    assert results["num_tokens"] == 2 * 24 and results["best_epoch"] == 1
    assert set(results["per_category"]) == {"crypto", "index"}
    assert (run / "report.png").read_bytes()[:4] == b"\x89PNG"
    # the model saw the run's asset and category ids: BTC/USDT is asset 0, category 1 (crypto)
    model.eval()
    t = torch.from_numpy(tokens.tokens["BTC/USDT"][-25:].astype(np.int64))
    with torch.no_grad():
        nll = [
            model(t[None, s : s + 8], torch.tensor([0]), torch.tensor([1]), t[None, s + 1 : s + 9])[1].item()
            for s in range(0, 24, 8)
        ]
    assert results["per_asset"]["BTC/USDT"]["loss"] == pytest.approx(np.mean(nll), rel=1e-5)


def test_cli_evaluate_explains_an_unfinished_or_wrong_folder(tmp_path, capsys):
    from common.cli import main

    run, _, _ = _fake_run_folder(tmp_path)
    (run / "best_model.pt").unlink()
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "best_model.pt" in err and "not finished an epoch" in err and err.count("\n") == 1
    assert main(["evaluate", str(tmp_path / "nope")]) == 2
    assert "no such run folder" in capsys.readouterr().err
    assert not (run / "test_results.json").exists()


def test_cli_evaluate_refuses_a_corrupted_best_model(tmp_path, capsys):
    from common.cli import main

    run, _, _ = _fake_run_folder(tmp_path)
    data = (run / "best_model.pt").read_bytes()
    (run / "best_model.pt").write_bytes(data[: len(data) // 2])
    assert main(["evaluate", str(run)]) == 2
    assert "best_model.pt" in capsys.readouterr().err


# --------------------------------------------------------------------------- token skill with intervals


def _iid(probs: np.ndarray, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(V, size=n, p=probs / probs.sum())


def test_token_skill_is_one_minus_the_loss_ratio_with_a_bootstrap_interval():
    test = {s: split([3, 4, 3, 5, 3, 6, 7, 3, 4, 4, 5]) for s in ("A", "B")}
    r = run(test, context_length=4)
    for name in ("unigram", "markov1"):
        skill = r["token_skill"][name]
        assert skill["value"] == pytest.approx(1 - r["test_loss"] / r["baselines"][name]["loss"], rel=1e-9)
        lo, hi = skill["ci95"]
        assert lo <= skill["value"] <= hi and skill["verdict"] in ("beats", "no edge", "worse")
    assert r["token_skill"]["method"]["resamples"] == 1000
    assert "Loss skill 1 - model/baseline" in summarize_results(Path("run"), {**r, "best_epoch": 1})


def test_token_skill_verdicts_follow_the_true_distribution():
    true = np.array([0, 0, 0, 0.4, 0.3, 0.15, 0.1, 0.05])
    flat = np.array([0, 0, 0, 1, 1, 1, 1, 1]) / 5.0
    test = {s: split(_iid(true, 600, k)) for k, s in enumerate("ABC")}
    # the model knows the true distribution, the unigram learned a flat one on train
    good = run(test, train={"A": np.tile([3, 4, 5, 6, 7], 40)}, model=FixedModel(true), context_length=16)
    assert good["token_skill"]["unigram"]["verdict"] == "beats" and good["token_skill"]["unigram"]["ci95"][0] > 0
    # the other way round: a flat model against a unigram fit on the true distribution
    bad = run(test, train={"A": _iid(true, 5000, 9)}, model=FixedModel(flat), context_length=16)
    assert bad["token_skill"]["unigram"]["verdict"] == "worse" and bad["token_skill"]["unigram"]["ci95"][1] < 0


def test_token_skill_is_null_when_a_target_had_probability_zero():
    probs = np.array([0, 0, 0, 0.5, 0.5, 0, 0, 0])  # token 5 impossible for the model
    r = run({"A": split([3, 4, 5, 3, 4])}, model=FixedModel(probs), context_length=4)
    assert r["token_skill"]["unigram"] is None and r["token_skill"]["markov1"] is None
    json.dumps(r["token_skill"], allow_nan=False)  # no NaN or infinity


def test_split_windows_at_full_context_score_every_target_once():
    """score_last=k: overlapping windows, every target scored once, each after the first window
    with at least T - k + 1 tokens of context; the default windows do not overlap."""
    from common.evaluation.token_scoring import SplitTokens, split_windows
    from common.special_tokens import PAD_TOKEN

    for n in (1, 2, 16, 17, 40, 65, 129):
        toks = np.arange(n) + 10
        for T, k in ((16, 4), (16, 16), (16, 1), (8, 3), (16, None)):
            w = split_windows({"a": SplitTokens(toks, np.zeros(n))}, T, score_last=k)
            scored = w.y != PAD_TOKEN
            assert list(w.y[scored]) == list(toks[1:]), (n, T, k)
            context = np.broadcast_to(np.arange(1, T + 1), w.y.shape)[scored]
            if k is not None:
                assert (context[T:] >= T - k + 1).all()
            elif n > T + 1:
                assert context[T] == 1  # a new window starts with no context
    with pytest.raises(ValueError):
        split_windows({"a": SplitTokens(np.arange(5), np.zeros(5))}, 4, score_last=5)


def test_a_capped_evaluation_copies_only_the_windows_it_scores(tmp_path):
    """max_windows picks the same evenly spaced windows as cutting down the full set, from the
    int16 memory maps as they are: a rank scoring 2,000 batches of a 10^8-candle test split
    holds those batches, not every test window as int64."""
    from common.evaluation.token_scoring import SplitTokens, split_windows

    rng = np.random.default_rng(0)
    n = {"a": 50, "b": 3, "c": 97, "d": 1}
    flat = np.lib.format.open_memmap(tmp_path / "t.npy", mode="w+", dtype=np.int16, shape=(sum(n.values()),))
    flat[:] = rng.integers(5, 60, len(flat))
    test, o = {}, 0
    for s, k in n.items():
        test[s] = SplitTokens(flat[o : o + k], rng.normal(size=k), rng.integers(0, 9, (k, 3)))
        o += k
    assert np.shares_memory(test["a"].tokens, flat) and test["a"].tokens.dtype == np.int16  # no copy
    for T, k in ((8, None), (8, 3)):
        full = split_windows(test, T, score_last=k)
        for cap in (1, 5, len(full.x) - 1, len(full.x), len(full.x) + 4):
            w = split_windows(test, T, score_last=k, max_windows=cap)
            keep = (
                np.unique(np.linspace(0, len(full.x) - 1, cap).round().astype(np.int64))
                if cap < len(full.x)
                else np.arange(len(full.x))
            )
            for field in ("x", "y", "moves", "asset", "start", "features"):
                np.testing.assert_array_equal(
                    getattr(w, field), getattr(full, field)[keep], err_msg=f"{field} {T} {k} {cap}"
                )
            assert w.x.dtype == np.int64 and w.symbols == list(n)


def test_the_baselines_are_fit_one_asset_at_a_time():
    """A rank's memory must not grow with the corpus: the fit holds one asset's tokens, not int64
    copies of every training token (some 50 bytes a candle pooled: 3.5 GB at 70M candles)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    train = {f"A{i}": rng.integers(1, 64, 250_000).astype(np.int16) for i in range(16)}  # 4M tokens
    tracemalloc.start()
    try:
        baselines = fit_baselines(train, 64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, peak / 2**20  # one asset's share, not the 4M tokens' 200 MB
    pooled = np.concatenate(list(train.values())).astype(np.int64)
    assert np.allclose(baselines["unigram"].probs[1:], (np.bincount(pooled, minlength=64)[1:] + 1) / (len(pooled) + 63))
