"""Per-target scores on the test split: the inputs (SplitTokens, eval_inputs), the windows the
model reads (split_windows) and the scores of the model and of a token baseline on every target.
common.evaluation.evaluate sums them up; its docstring says which targets and how they are ranked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from common.distributed.precision import autocast as precision_autocast, resolve_precision
from common.special_tokens import PAD_TOKEN

__all__ = [
    "Scores",
    "SplitTokens",
    "TOP_K",
    "Windows",
    "eval_inputs",
    "score_baseline",
    "score_log_probs",
    "score_model",
    "split_windows",
]

TOP_K = 5
_CHUNK_ELEMENTS = 1 << 22  # rows x vocab floats per baseline chunk (32 MB in float64)


@dataclass
class SplitTokens:
    """One asset's test tokens and the actual normalized move of each token's candle.

    moves[i] is move/sigma of candle i (`tokenizer.features`), NaN where undefined (BOS, MISSING).
    """

    tokens: np.ndarray
    moves: np.ndarray
    features: Optional[np.ndarray] = None  # (n, 3) time and volume ids, when the model reads them

    def __post_init__(self) -> None:
        # kept as given (a run's int16 memory map stays one): split_windows copies only the
        # windows it scores, so an evaluation capped at k batches holds k batches, not the split
        self.tokens = np.asarray(self.tokens)
        self.moves = np.asarray(self.moves, dtype=np.float64)
        if not np.issubdtype(self.tokens.dtype, np.integer):
            raise ValueError(f"tokens must be integers, got {self.tokens.dtype}")
        if self.tokens.ndim != 1 or self.tokens.shape != self.moves.shape:
            raise ValueError(f"tokens {self.tokens.shape} and moves {self.moves.shape} must be 1-D and aligned")


def eval_inputs(
    tokens: Mapping[str, np.ndarray],
    moves: Mapping[str, np.ndarray],
    ranges: Mapping[str, Mapping[str, Sequence[int]]],
    features: Optional[Mapping[str, np.ndarray]] = None,
) -> tuple[dict[str, SplitTokens], dict[str, np.ndarray]]:
    """(test split per asset, train tokens per asset) from whole-series arrays and split ranges.

    tokens / moves: symbol -> the asset's whole series of tokens and actual moves (aligned, as
    in the run folder's tokens/); ranges: symbol -> {"train": (begin, end), "test": ...},
    end exclusive. Moves must come from the whole series (sigma needs the past), not the slice.
    """
    test, train = {}, {}
    for symbol, toks in tokens.items():
        if "train" in ranges[symbol]:
            b, e = ranges[symbol]["train"]
            train[symbol] = np.asarray(toks[b:e])
        if "test" in ranges[symbol]:
            b, e = ranges[symbol]["test"]
            test[symbol] = SplitTokens(
                toks[b:e], moves[symbol][b:e], features[symbol][b:e] if features is not None else None
            )
    return test, train


@dataclass
class Scores:
    """Per-target results of one predictor, all (N,): the unit every metric is summed from."""

    nll: np.ndarray  # -log p(target), nats
    top1: np.ndarray  # bool: target ranked first
    top5: np.ndarray  # bool: target in the top 5
    move: np.ndarray  # expected next move, sum_v p(v) move(v)

    @classmethod
    def concat(cls, parts: Sequence["Scores"]) -> "Scores":
        return cls(
            *(
                np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0)
                for f in ("nll", "top1", "top5", "move")
            )
        )


def score_log_probs(log_probs: torch.Tensor, targets: torch.Tensor, token_moves: torch.Tensor) -> Scores:
    """Score (n, V) log-probabilities against (n,) targets; token_moves (V,) has 0 for specials."""
    log_probs = log_probs.float() if log_probs.dtype in (torch.float16, torch.bfloat16) else log_probs
    target_lp = log_probs.gather(1, targets[:, None])  # (n, 1)
    ids = torch.arange(log_probs.size(1), device=log_probs.device)
    # rank = ids strictly more likely + equally likely ids with a lower id (stable-sort order)
    rank = (log_probs > target_lp).sum(1) + ((log_probs == target_lp) & (ids < targets[:, None])).sum(1)
    move = log_probs.exp() @ token_moves.to(log_probs.dtype)  # (n,)
    return Scores(
        nll=-target_lp[:, 0].double().cpu().numpy(),
        top1=(rank < 1).cpu().numpy(),
        top5=(rank < TOP_K).cpu().numpy(),
        move=move.double().cpu().numpy(),
    )


def score_baseline(baseline: Any, prev: np.ndarray, targets: np.ndarray, token_moves: torch.Tensor) -> Scores:
    rows = max(1, _CHUNK_ELEMENTS // len(token_moves))
    parts = []
    for i in range(0, len(targets), rows):
        lp = torch.from_numpy(baseline.log_probs(prev[i : i + rows]))
        parts.append(score_log_probs(lp, torch.from_numpy(targets[i : i + rows]), token_moves.double()))
    return Scores.concat(parts)


# --------------------------------------------------------------------------- the model


@dataclass
class Windows:
    """Every test target once, as (W, T) windows; PAD targets are padding."""

    x: np.ndarray  # (W, T) inputs
    y: np.ndarray  # (W, T) targets
    moves: np.ndarray  # (W, T) actual move of each target's candle
    asset: np.ndarray  # (W,) index into symbols
    symbols: list
    start: np.ndarray  # (W,) position of each window's first input in its asset's test tokens
    features: Optional[np.ndarray] = None  # (W, T, 3) ids of the inputs, when the model reads them


def split_windows(
    test: Mapping[str, SplitTokens],
    context_length: int,
    score_last: Optional[int] = None,
    max_windows: Optional[int] = None,
) -> Windows:
    """Every target once, in windows of T = context_length. By default the windows do not overlap,
    so a target sees 1 to T tokens of context (T/2 on average). score_last=k: a window starts
    every k tokens and scores only its last k targets (the first window all T), so every target
    after the first T sees at least T - k + 1 tokens: the model's skill at its full context, at
    about T/k times the cost. max_windows: at most that many windows, evenly spaced over all of
    them in asset order; only those are copied out of the token arrays."""
    T = context_length
    step = T if score_last is None else score_last
    if not 1 <= step <= T:
        raise ValueError(f"score_last must be in [1, {T}], got {score_last}")
    symbols = list(test)
    starts_of = [_window_starts(len(test[s].tokens), T, step) for s in symbols]
    total = sum(len(st) for st in starts_of)
    keep = None
    if max_windows is not None and total > max_windows:
        keep = np.unique(np.linspace(0, total - 1, max_windows).round().astype(np.int64))
    xs, ys, ms, owner, first, fs = [], [], [], [], [], []
    offset = 0
    for a, (symbol, starts) in enumerate(zip(symbols, starts_of)):
        if keep is not None:  # this asset's share of the kept windows
            mine = keep[(keep >= offset) & (keep < offset + len(starts))] - offset
            offset += len(starts)
            starts, chosen = starts[mine], mine
        else:
            chosen = np.arange(len(starts))
        if len(starts) == 0:
            continue
        x, y, m, f = _asset_windows(test[symbol], starts, chosen, T, step)
        xs.append(x)
        ys.append(y)
        ms.append(m)
        if f is not None:
            fs.append(f)
        owner.append(np.full(len(starts), a))
        first.append(starts)
    if not xs:
        empty = np.zeros((0, T), np.int64)
        return Windows(empty, empty, np.zeros((0, T)), np.zeros(0, np.int64), symbols, np.zeros(0, np.int64))
    return Windows(
        np.concatenate(xs),
        np.concatenate(ys),
        np.concatenate(ms),
        np.concatenate(owner),
        symbols,
        np.concatenate(first),
        np.concatenate(fs) if fs else None,
    )


def _asset_windows(
    split: SplitTokens, starts: np.ndarray, chosen: np.ndarray, T: int, step: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """One asset's windows starting at `starts` (its windows' numbers `chosen`): the inputs, the targets
    (PAD past the end, and where an earlier window scored them), the targets' moves and, when the split
    has them, the inputs' feature ids."""
    toks, moves, feats = split.tokens, split.moves, split.features
    n = len(toks)
    idx = starts[:, None] + np.arange(T + 1)  # (w, T + 1); past the end: a PAD target, ignored
    inside = idx < n
    safe = np.minimum(idx, n - 1)
    chunk = np.where(inside, np.asarray(toks[safe.ravel()]).reshape(idx.shape).astype(np.int64), PAD_TOKEN)
    y = chunk[:, 1:].copy()
    if step < T:
        y[chosen > 0, : T - step] = PAD_TOKEN  # scored by an earlier window, with less context
    m = np.where(inside, moves[safe.ravel()].reshape(idx.shape), np.nan)[:, 1:]
    f = None
    if feats is not None:
        f = np.asarray(feats[safe[:, :-1].ravel()]).reshape(*idx[:, :-1].shape, -1).astype(np.int64)
        f = np.where(inside[:, :-1, None], f, 0)
    return chunk[:, :-1], y, m, f


def _window_starts(n: int, T: int, step: int) -> np.ndarray:
    """Where one asset's windows of T + 1 tokens start (windows [s, s + T] share their boundary
    token); with step < T, after the first window each adds the step targets after the last."""
    if n <= 1:
        return np.zeros(0, np.int64)
    if step < T:
        return np.concatenate([[0], np.arange(step, max(n - T, 0) + step, step)]).astype(np.int64)
    return np.arange(0, n - 1, T, dtype=np.int64)


@torch.no_grad()
def score_model(
    model: torch.nn.Module,
    w: Windows,
    asset_ids: np.ndarray,
    category_ids: np.ndarray,
    token_moves: torch.Tensor,
    batch_size: int,
    device: torch.device,
) -> Scores:
    token_moves = token_moves.float().to(device)
    # the precision training.precision=auto picks: bf16 on Ampere+, fp16 on V100/T4, fp32 on the CPU
    autocast = precision_autocast(resolve_precision("auto", device), device)
    parts = []
    for i in range(0, len(w.x), batch_size):
        x = torch.from_numpy(w.x[i : i + batch_size]).to(device)
        y = torch.from_numpy(w.y[i : i + batch_size]).to(device)
        a = torch.from_numpy(asset_ids[w.asset[i : i + batch_size]]).to(device)
        c = torch.from_numpy(category_ids[w.asset[i : i + batch_size]]).to(device)
        extra = {} if w.features is None else {"features": torch.from_numpy(w.features[i : i + batch_size]).to(device)}
        with autocast:
            logits, _ = model(x, a, c, **extra)
        keep = y != PAD_TOKEN  # (B, T); row-major order matches the flattened targets
        log_probs = F.log_softmax(logits[keep].float(), dim=-1)  # (n, V)
        parts.append(score_log_probs(log_probs, y[keep], token_moves))
    return Scores.concat(parts)
