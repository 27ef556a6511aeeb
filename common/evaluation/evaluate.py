"""Test-split evaluation: the model's metrics next to naive baselines on the same targets.

`evaluate_best` scores a run folder's best model and writes report.png and test_results.json:
at the end of training (common.commands.train), and again later by `marketgpt evaluate RUN_DIR`
(`evaluate_run_dir`). Its core:

    test, train_tokens = eval_inputs(token_set.tokens, token_set.moves, token_set.ranges)
    results = evaluate_run(model, tokenizer, test, train_tokens, info,
                           context_length, batch_size, device, max_batches)
    atomic_write_json(run_dir / TEST_RESULTS_JSON, results)

The inputs, the windows the model reads and the per-target scores live in
common.evaluation.token_scoring (eval_inputs, split_windows, score_model, score_baseline); this
module sums them up. `evaluate_run` returns the JSON-ready dict that is test_results.json (no NaN anywhere: an
undefined number is null). Top level: test_loss, test_accuracy (fraction in [0, 1]),
test_accuracy_pct, top5_accuracy, perplexity, num_tokens; then "baselines", "directional",
"per_asset", "per_category" and "settings".

Targets. Each asset's test tokens are cut into windows of context_length + 1 tokens that share
their boundary token (starts 0, T, 2T, ...), so every test token except the asset's first is
predicted exactly once, from the test tokens before it in its window: the first targets of a
window see little context, and none reaches back into the val split. That is the standard
non-overlapping evaluation; a sliding window would give more context at T times the cost.
The last window of an asset is padded (unlike the trainer's val windows, which drop the tail),
so no test token is left out. PAD targets are ignored; BOS and MISSING targets count like any
other token, for the model and every baseline alike.

Metrics. loss: mean cross-entropy in nats; perplexity = exp(loss); accuracy / top-5: the
target is the most likely token / among the 5 most likely, ties broken toward the lower token
id (the order a stable sort gives), so a baseline with flat probabilities is scored
deterministically.

Baselines (common.evaluation.baselines: unigram, repeat_last, markov1) are fit on TRAIN tokens only and
scored on exactly the model's targets.

Token skill ("token_skill"). The model's loss skill 1 - loss/baseline loss against unigram and
markov1 on the same targets, with a paired circular block-bootstrap 95% interval
(common.evaluation.metrics.skill_interval): blocks of consecutive test positions, every asset's target at
one position resampled together, because neighbouring tokens share their volatility state.
The unigram is no naive baseline: a token is the candle's move over the EWMA volatility, so the
unigram is in effect EWMA volatility times the empirical standardized residuals.

Directional. A token decodes to its bin's representative move (move/sigma, `tokenizer.decode`);
a predictor's expected next move is sum_v p(v) * move(v) (special ids count 0). Its sign is
compared with the sign of the actual move (`tokenizer.features`); targets whose actual move is
zero or undefined (BOS, MISSING) are left out. A 95% Wilson interval comes with each accuracy;
always_up is the fraction of actual moves that are positive.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch

from common.atomic import atomic_write_json
from common.distributed.env import pick_device
from common.errors import UserError
from common.evaluation.baselines import BASELINES, fit_baselines
from common.evaluation.metrics import block_length, skill_interval, wilson_interval
from common.evaluation.report import write_report
from common.evaluation.result_lines import SKILL_BASELINES
from common.evaluation.token_scoring import (
    Scores,
    SplitTokens,
    Windows,
    eval_inputs,
    score_baseline,
    score_model,
    split_windows,
)
from common.model.gpt import MarketGPT
from common.run.checkpoint import load_checkpoint
from common.run.files import TEST_RESULTS_JSON
from common.run.folder import Run
from common.run.log import RunLog
from common.special_tokens import PAD_TOKEN
from common.tokens.ids import RunInfo

__all__ = ["evaluate_best", "evaluate_run", "evaluate_run_dir"]

_SKILL_BOOT = 1000


# --------------------------------------------------------------------------- aggregation


def _perplexity(loss: Optional[float]) -> Optional[float]:
    if loss is None or loss > 700:  # exp overflows a float beyond ~709
        return None
    return math.exp(loss)


def _mean(values: np.ndarray) -> Optional[float]:
    return float(values.mean()) if len(values) else None


def _metrics(s: Scores) -> dict:
    loss = _mean(s.nll)
    return {
        "loss": loss,
        "accuracy": _mean(s.top1),
        "top5_accuracy": _mean(s.top5),
        "perplexity": _perplexity(loss),
        "num_tokens": int(len(s.nll)),
    }


def _directional(predicted: np.ndarray, actual_up: np.ndarray) -> dict:
    hits = int(np.sum((predicted > 0) == actual_up))
    n = len(actual_up)
    low, high = wilson_interval(hits, n)
    return {"accuracy": hits / n if n else None, "ci95_low": low, "ci95_high": high, "n": n}


def _group(scores: dict[str, Scores], groups: np.ndarray, names: Sequence[str], moves: np.ndarray) -> dict:
    """Model loss/accuracy, baselines' accuracy and token counts for each group id."""
    out = {}
    for g, name in enumerate(names):
        sel = groups == g
        model = scores["model"]
        counted = np.isfinite(moves[sel]) & (moves[sel] != 0)
        loss = _mean(model.nll[sel])
        out[name] = {
            "num_tokens": int(sel.sum()),
            "loss": loss,
            "accuracy": _mean(model.top1[sel]),
            "top5_accuracy": _mean(model.top5[sel]),
            "perplexity": _perplexity(loss),
            "directional_accuracy": _directional(model.move[sel][counted], moves[sel][counted] > 0)["accuracy"],
            "baseline_accuracy": {b: _mean(scores[b].top1[sel]) for b in BASELINES},
        }
    return out


def _token_skill(scores: dict[str, Scores], position: np.ndarray) -> dict:
    """Loss skill 1 - model/baseline (cross-entropy, nats) against unigram and markov1, with a
    paired block-bootstrap 95% interval: blocks of consecutive test positions, every asset's
    targets at a position resampled together (neighbouring tokens share their volatility).
    None where undefined: no targets, or an infinite loss (a target given probability 0)."""

    def skill(name: str) -> Optional[dict]:
        model, base = scores["model"].nll, scores[name].nll
        if not len(position) or not (np.isfinite(model).all() and np.isfinite(base).all()) or base.sum() <= 0:
            return None
        return skill_interval(model, base, position, horizon=1, stride=1, n_boot=_SKILL_BOOT, seed=0)

    out: dict = {name: skill(name) for name in SKILL_BASELINES}
    n_positions = len(np.unique(position))
    out["method"] = {
        "skill": "1 - model loss / baseline loss",
        "bootstrap": "paired circular block",
        "block_positions": block_length(n_positions, 1, 1) if n_positions else None,
        "resamples": _SKILL_BOOT,
    }
    return out


# --------------------------------------------------------------------------- entry point


def evaluate_run(
    model: torch.nn.Module,
    tokenizer: Any,
    test: Mapping[str, SplitTokens],
    train_tokens: Mapping[str, np.ndarray],
    info: RunInfo,
    context_length: int,
    batch_size: int,
    device: torch.device | str,
    max_batches: Optional[int] = None,
) -> dict:
    """Evaluate `model` (unwrapped, not DDP) on the test split; returns test_results.json's dict.

    test: asset symbol -> SplitTokens; train_tokens: symbol -> train token array (baselines only);
    info: the run's asset_info.json, whose asset and category ids the model embeds (a run of
    several intervals: one interval's series at a time, under their assets' symbols).
    max_batches caps the model's batches for quick runs: then an evenly spaced subset of the
    windows is scored, and the baselines are scored on exactly those targets.
    """
    vocab_size = int(tokenizer.vocab_size)
    token_moves = _token_moves(tokenizer, vocab_size)
    w = split_windows(test, context_length, max_windows=None if max_batches is None else max_batches * batch_size)

    # flat per-target arrays, in the row-major order score_model produces
    mask = w.y != PAD_TOKEN
    targets, prev, moves = w.y[mask], w.x[mask], w.moves[mask]
    owner = np.broadcast_to(w.asset[:, None], w.y.shape)[mask]
    position = (w.start[:, None] + np.arange(1, context_length + 1))[mask]  # of each target in its asset's test

    records = {r.symbol: r for r in info.assets}
    a_ids = np.array([records[s].id for s in w.symbols], dtype=np.int64)
    c_ids = np.array([records[s].category_id for s in w.symbols], dtype=np.int64)
    categories = {s: r.category for s, r in records.items()}
    scores = {"model": _eval_mode_scores(model, w, a_ids, c_ids, token_moves, batch_size, torch.device(device))}
    baselines = fit_baselines(train_tokens, vocab_size)
    for name in BASELINES:
        scores[name] = score_baseline(baselines[name], prev, targets, token_moves)

    total = _metrics(scores["model"])
    per_asset, per_category = _breakdowns(scores, w.symbols, categories, owner, moves)
    return {
        "test_loss": total["loss"],
        "test_accuracy": total["accuracy"],
        "test_accuracy_pct": None if total["accuracy"] is None else 100 * total["accuracy"],
        "top5_accuracy": total["top5_accuracy"],
        "perplexity": total["perplexity"],
        "num_tokens": total["num_tokens"],
        "num_assets": len(w.symbols),
        "baselines": {name: _metrics(scores[name]) for name in BASELINES},
        "token_skill": _token_skill(scores, position),
        "directional": _directional_all(scores, moves),
        "per_asset": per_asset,
        "per_category": per_category,
        "settings": _settings(context_length, max_batches, len(w.x), train_tokens, baselines),
    }


def _token_moves(tokenizer: Any, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) float64: each id's decoded move, 0 for the ids that decode to none (NaN)."""
    move_table, _ = tokenizer.decode(np.arange(vocab_size))
    return torch.from_numpy(np.nan_to_num(np.asarray(move_table, np.float64), nan=0.0))


def _settings(
    context_length: int,
    max_batches: Optional[int],
    windows: int,
    train_tokens: Mapping[str, np.ndarray],
    baselines: dict,
) -> dict:
    """test_results.json's "settings": how the model and the baselines were scored."""
    return {
        "context_length": context_length,
        "max_batches": max_batches,
        "windows": int(windows),
        "targets": "every test token but each asset's first, once; PAD ignored; BOS/MISSING counted",
        "baselines_fit_on": "train",
        "train_tokens": int(sum(len(t) for t in train_tokens.values())),
        "repeat_last_eps": baselines["repeat_last"].eps,
        "markov1_smoothing": "witten-bell, unigram backoff",
    }


def _eval_mode_scores(
    model: torch.nn.Module,
    w: Windows,
    a_ids: np.ndarray,
    c_ids: np.ndarray,
    token_moves: torch.Tensor,
    batch_size: int,
    device: torch.device,
) -> Scores:
    """score_model with the model in eval mode, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        return score_model(model, w, a_ids, c_ids, token_moves, batch_size, device)
    finally:
        model.train(was_training)


def _directional_all(scores: dict[str, Scores], moves: np.ndarray) -> dict:
    """Directional accuracy of the model, always-up and each baseline, over the moves that are nonzero."""
    counted = np.isfinite(moves) & (moves != 0)
    up = moves[counted] > 0
    directional = {
        "num_moves": int(counted.sum()),
        "model": _directional(scores["model"].move[counted], up),
        "always_up": _directional(np.ones(len(up)), up),
    }
    for name in BASELINES:
        directional[name] = _directional(scores[name].move[counted], up)
    return directional


def _breakdowns(
    scores: dict[str, Scores],
    symbols: Sequence[str],
    categories: Mapping[str, str],
    owner: np.ndarray,
    moves: np.ndarray,
) -> tuple[dict, dict]:
    """(per_asset, per_category) of test_results.json; owner: each target's index into symbols."""
    cat_names = sorted(set(categories[s] for s in symbols))
    cat_of_asset = np.array([cat_names.index(categories[s]) for s in symbols], dtype=np.int64)
    per_category = _group(scores, cat_of_asset[owner], cat_names, moves)
    per_category = {c: {"num_assets": sum(categories[s] == c for s in symbols), **per_category[c]} for c in cat_names}
    per_asset = _group(scores, owner, symbols, moves)
    per_asset = {s: {"category": categories[s], **per_asset[s]} for s in symbols}
    return per_asset, per_category


# --------------------------------------------------------------------------- a run folder


def evaluate_best(
    run: Run, device: torch.device, status: Optional[str] = None, extra: Optional[Mapping[str, Any]] = None
) -> dict:
    """The run's best_model.pt on the test split (`run.tokens`) next to the baselines; writes
    report.png, then test_results.json (so a run with test_results.json has had its report drawn)
    and returns the results. status: the training status the report shows, when the log does
    not say it yet; extra: keys added to test_results.json (the end-of-training scorecard's error)."""

    cfg, run_dir, tokens, info, tokenizer = run.cfg, run.path, run.tokens, run.info, run.tokenizer
    assert tokens is not None, "evaluate_best needs the run opened with its token set"
    best = load_checkpoint(run.best_model, map_location=device)
    model = MarketGPT.for_run(cfg.model, info).to(device)
    model.load_state_dict(best["model"])
    test, train = eval_inputs(tokens.tokens, tokens.moves, tokens.ranges, tokens.features)
    test = {s: t for s, t in test.items() if len(t.tokens)}  # an asset without test candles is left out
    per_interval = {}
    for k, interval in enumerate(info.intervals or [None]):
        # a run of several intervals: each interval's series on their own, under their assets' symbols
        model.default_interval = k
        results = evaluate_run(
            model,
            tokenizer,
            _at(test, info, interval),
            _at(train, info, interval),
            info,
            cfg.model.context_length,
            cfg.training.batch_size,
            device,
            cfg.training.eval_max_batches,
        )
        per_interval[interval] = results
    # the top level: the run's first (default) interval; "per_interval" has each one's results
    results = per_interval[next(iter(per_interval))]
    if info.intervals:
        results = {**results, "interval": info.intervals[0], "per_interval": per_interval}
    results = {**results, "best_epoch": best["epoch"], "best_val_loss": best["val_loss"], **(extra or {})}
    try:
        write_report(run_dir, RunLog.read(run_dir), results, status)
    except Exception as e:  # the numbers are saved; a picture that fails must not fail the run
        print(f"warning: report.png not written ({type(e).__name__}: {e})", file=sys.stderr)
        results["report_error"] = f"{type(e).__name__}: {e}"  # so --resume auto doesn't redraw it forever
    atomic_write_json(run_dir / TEST_RESULTS_JSON, results)
    return results


def _at(by_series: Mapping[str, Any], info: RunInfo, interval: Optional[str]) -> dict:
    """The series of one interval, keyed by their assets' symbols (interval None: all, as they are)."""
    if interval is None:
        return dict(by_series)
    names = info.interval_series(interval)
    return {names[s]: v for s, v in by_series.items() if s in names}


def evaluate_run_dir(run_dir: str | os.PathLike, device: torch.device | str | None = None) -> dict:
    """`marketgpt evaluate RUN_DIR`: recompute test_results.json and report.png of a run folder
    from its own config.json, tokenizer.json, asset_info.json, tokens/ and best_model.pt,
    through evaluate_best, the path training takes at its end."""
    run = Run.open(run_dir, tokens=True)
    try:
        return evaluate_best(run, torch.device(device) if device else pick_device())
    except OSError as e:
        raise UserError(
            f"cannot write test_results.json in {run.path} ({e.strerror or e}); "
            "copy the run folder somewhere writable and evaluate the copy"
        ) from None
