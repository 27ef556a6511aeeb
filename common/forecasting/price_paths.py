"""Path questions that sampled price paths answer and quantiles cannot (pure numpy).

    outcome = barrier_outcomes(close, upper=0.05, lower=-0.03, high=high, low=low)  # +1, -1, 0 per path
    barrier_probabilities(outcome)   # p_upper_first, p_lower_first, p_neither
    dd = max_drawdown(close, high=high, low=low)                                      # per path, in [0, 1)
    drawdown_summary(dd)             # mean, p50, p90, p99, P(drawdown > x)

Shapes, as common.forecasting.forecaster returns them: close (S, H + 1) with column 0 the start
(the last real close), open, high, low (S, H). Without high and low, only the closes are used.

Within one candle the order of its prices is unknown; we take the usual backtesting convention:
a candle that closes at or above its open went open -> low -> high -> close, one that closes below
went open -> high -> low -> close. Both questions are answered on that sequence of prices, so a
candle that spans both barriers counts as lower-first when it closed up (its low came first) and
upper-first when it closed down; `p_same_candle` says how often that decided it.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np

from common.errors import UserError

__all__ = [
    "DRAWDOWN_QUANTILES",
    "DRAWDOWN_THRESHOLDS",
    "parse_barriers",
    "price_sequence",
    "barrier_outcomes",
    "barrier_probabilities",
    "barrier_probability_table",
    "brier_score",
    "max_drawdown",
    "drawdown_summary",
]

DRAWDOWN_QUANTILES = (0.5, 0.9, 0.99)
DRAWDOWN_THRESHOLDS = (0.02, 0.05, 0.10, 0.20)  # P(drawdown > x) is reported for these x

_PERCENT = re.compile(r"\s*([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*%\s*")


def parse_barriers(text: str) -> tuple[float, float]:
    """'+5%,-3%' -> (0.05, -0.03): the upper barrier above the start, then the lower one below it."""
    parts = str(text).split(",")
    matches = [_PERCENT.fullmatch(p) for p in parts]
    if len(parts) != 2 or not all(matches):
        raise UserError(f"--barrier {text!r}: expected two percentages, the upper then the lower, e.g. +5%,-3%")
    upper, lower = (float(m.group(1)) / 100 for m in matches if m is not None)
    if upper <= 0 or lower >= 0:
        raise UserError(
            f"--barrier {text!r}: the upper barrier must be above 0% and the lower one below 0% "
            "(upper first), e.g. +5%,-3%"
        )
    if lower <= -1:
        raise UserError(f"--barrier {text!r}: the lower barrier must be above -100%")
    return upper, lower


def price_sequence(
    close: np.ndarray,
    high: Optional[np.ndarray] = None,
    low: Optional[np.ndarray] = None,
    open_: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The prices each path is taken to visit, in order: (S, H + 1) closes alone, or (S, 3H + 1)
    start, then per candle open, low, high (up candle) or open, high, low (down candle), close... with
    the open left out when it is the previous close (sampled paths have no gaps)."""
    close = np.atleast_2d(np.asarray(close, dtype=float))
    if high is None or low is None:
        return close
    high, low = np.atleast_2d(high).astype(float), np.atleast_2d(low).astype(float)
    prev = close[:, :-1]
    opened = prev if open_ is None else np.atleast_2d(open_).astype(float)
    up = close[:, 1:] >= opened
    first, second = np.where(up, low, high), np.where(up, high, low)
    steps = np.stack([opened, first, second, close[:, 1:]], axis=2)  # (S, H, 4)
    if open_ is None:
        steps = steps[:, :, 1:]  # the open is the previous close already in the sequence
    return np.concatenate([close[:, :1], steps.reshape(len(close), -1)], axis=1)


def _points_per_step(close: np.ndarray, seq: np.ndarray) -> int:
    return (seq.shape[1] - 1) // (np.atleast_2d(close).shape[1] - 1)


def barrier_outcomes(
    close: np.ndarray,
    upper: float,
    lower: float,
    high: Optional[np.ndarray] = None,
    low: Optional[np.ndarray] = None,
    open_: Optional[np.ndarray] = None,
) -> dict[str, np.ndarray]:
    """Per path: outcome +1 when the price reaches start * (1 + upper) before start * (1 + lower),
    -1 the other way round, 0 when neither is reached within the horizon; step = the candle (1..H)
    of that first touch (0 for neither); same_candle = both barriers touched in that one candle."""
    close = np.atleast_2d(np.asarray(close, dtype=float))
    seq = price_sequence(close, high, low, open_)
    start = close[:, :1]
    hit_up, hit_down = seq >= start * (1 + upper), seq <= start * (1 + lower)
    n = seq.shape[1]
    first_up = np.where(hit_up.any(axis=1), hit_up.argmax(axis=1), n)
    first_down = np.where(hit_down.any(axis=1), hit_down.argmax(axis=1), n)
    outcome = np.where(first_up < first_down, 1, np.where(first_down < first_up, -1, 0))
    k = _points_per_step(close, seq)
    step_of = lambda i: (i - 1) // k + 1  # noqa: E731  (sequence index -> candle, index 0 is the start)
    first = np.minimum(first_up, first_down)
    step = np.where(outcome != 0, step_of(first), 0)
    same = (outcome != 0) & (step_of(first_up) == step_of(first_down))
    return {"outcome": outcome, "step": step, "same_candle": same}


def barrier_probabilities(outcomes: dict[str, np.ndarray]) -> dict[str, float]:
    """The fractions of paths: upper first, lower first, neither (they sum to 1), same candle."""
    o = outcomes["outcome"]
    return {
        "p_upper_first": float((o == 1).mean()),
        "p_lower_first": float((o == -1).mean()),
        "p_neither": float((o == 0).mean()),
        "p_same_candle": float(outcomes["same_candle"].mean()),
    }


def barrier_probability_table(log_returns: np.ndarray, upper: float, lower: float) -> np.ndarray:
    """(n, 3) P(upper first), P(lower first), P(neither) per origin from (n, S, h) close-to-start log
    returns (step 1..h; closes only, as the scorecard's forecasters give them)."""
    r = np.asarray(log_returns, dtype=float)
    n, s, h = r.shape
    close = np.exp(np.concatenate([np.zeros((n * s, 1)), r.reshape(n * s, h)], axis=1))
    outcome = barrier_outcomes(close, upper, lower)["outcome"].reshape(n, s)
    return np.stack([(outcome == 1).mean(1), (outcome == -1).mean(1), (outcome == 0).mean(1)], axis=1)


def brier_score(probs: np.ndarray, outcome: np.ndarray) -> np.ndarray:
    """Per origin, the multi-category Brier score sum_k (p_k - 1[outcome = k])^2, in [0, 2]; probs
    columns upper first, lower first, neither; outcome +1, -1, 0 as barrier_outcomes gives it."""
    probs = np.asarray(probs, dtype=float)
    hit = np.stack([outcome == 1, outcome == -1, outcome == 0], axis=1).astype(float)
    return ((probs - hit) ** 2).sum(axis=1)


def max_drawdown(
    close: np.ndarray,
    high: Optional[np.ndarray] = None,
    low: Optional[np.ndarray] = None,
    open_: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Per path, the largest fall from a running peak (the start included) to a later price:
    max over t of 1 - price_t / max(price_0..price_t), on the same price sequence as the barriers."""
    seq = price_sequence(close, high, low, open_)
    return 1.0 - (seq / np.maximum.accumulate(seq, axis=1)).min(axis=1)


def drawdown_summary(
    drawdown: np.ndarray,
    quantiles: Sequence[float] = DRAWDOWN_QUANTILES,
    thresholds: Sequence[float] = DRAWDOWN_THRESHOLDS,
) -> dict[str, float]:
    """Mean, quantiles (p50, p90, p99) and P(drawdown > x) of the per-path maximum drawdowns."""
    d = np.asarray(drawdown, dtype=float)
    out = {"mean": float(d.mean())}
    out.update({f"p{round(q * 100):g}": float(np.quantile(d, q)) for q in quantiles})
    out.update({f"p_gt_{round(x * 100):g}pct": float((d > x).mean()) for x in thresholds})
    return out
