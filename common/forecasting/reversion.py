"""Volatility reversion: the sampled paths' spread pulled toward the asset's long-run level.

The model reads moves in units of the asset's current EWMA volatility, so its paths carry today's
level forward; over 20 steps a calm or turbulent stretch tends back to the usual level, as
log-HAR's monthly term says. Per origin and step k, with v the variance of the samples' log return
from the origin and v_long the variance of the asset's last `long_run` one-step returns (its
candles up to the origin only):

    target = (1 - W_k) v + W_k k v_long,   W_k = k / (k + tau)
    x' = m + sqrt(target / v) (x - m)      (m the samples' median: the centre does not move)

tau (in steps) is the one number fitted, on the validation split at the end of training
(common.evaluation.vol_reversion), by the samples' CRPS; it is written to reversion.json in the
run folder, travels with exports, and every forecast of the run applies it (ForecasterCore).
No reversion.json (a run from before, or a fit that chose none), or a forecast at another of the
run's intervals than the one it was fitted on: the paths as sampled.
bench/results/2026-12-07-vol-reversion measured the pull per horizon (W = 0.3 at 20 steps, 0.1 at
5, ~0 at 1 on the quickstart, every seed): W_k = k / (k + tau) with tau near 45 gives all three.

Each step's spread is scaled on its own (the marginals); a candle's opening gap to the previous
close and its wicks beyond open and close are kept as sampled.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from common.errors import UserError
from common.run.files import REVERSION_JSON

__all__ = ["REVERSION_JSON", "Reversion", "long_run_variance", "load_reversion", "revert_paths", "revert_returns"]

LONG_RUN = 500  # one-step returns whose variance is the asset's long-run level (two years of daily candles)


@dataclass(frozen=True)
class Reversion:
    """W_k = k / (k + tau) of the way to the long-run variance at step k, for forecasts at
    `interval` (the run's interval it was fitted on; None: any)."""

    tau: float
    long_run: int = LONG_RUN
    interval: Optional[str] = None

    def weights(self, horizon: int) -> np.ndarray:
        k = np.arange(1, horizon + 1, dtype=np.float64)
        return k / (k + self.tau)


def long_run_variance(close: np.ndarray, long_run: int = LONG_RUN) -> float:
    """The variance of the last `long_run` log returns between valid closes (NaN with fewer than 2)."""
    close = np.asarray(close, dtype=np.float64)
    r = np.diff(np.log(close[np.isfinite(close) & (close > 0)]))[-long_run:]
    return float(np.var(r)) if len(r) > 1 else math.nan


def revert_returns(x: np.ndarray, v_long: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """x (N, S, H): each sample's log return from the origin to steps 1..H; v_long (N,) one-step
    long-run variances (NaN: that origin unchanged); weights (H,). The reverted returns."""
    steps = np.arange(1, x.shape[2] + 1)
    m = np.median(x, axis=1, keepdims=True)
    v = np.var(x, axis=1, keepdims=True)
    long = np.asarray(v_long, dtype=np.float64)[:, None, None] * steps
    target = np.where(np.isfinite(long), (1 - weights) * v + weights * long, v)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(v > 0, np.sqrt(target / v), 1.0)
    return x + (s - 1) * (x - m)  # exactly x where s is 1


def revert_paths(
    close: np.ndarray, ohlc: dict[str, np.ndarray], v_long: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Decoded paths reverted: close (N, S, H + 1) with step 0 the origin's close, ohlc's arrays
    (N, S, H). The closes move as revert_returns says; each open keeps its gap to the previous
    close, each high and low its distance beyond max / min(open, close)."""
    x = np.log(close[:, :, 1:] / close[:, :, :1])
    new_close = np.concatenate([close[:, :, :1], close[:, :, :1] * np.exp(revert_returns(x, v_long, weights))], axis=2)
    open_ = new_close[:, :, :-1] * (ohlc["open"] / close[:, :, :-1])
    c = new_close[:, :, 1:]
    high = np.maximum(open_, c) * (ohlc["high"] / np.maximum(ohlc["open"], ohlc["close"]))
    low = np.minimum(open_, c) * (ohlc["low"] / np.minimum(ohlc["open"], ohlc["close"]))
    return new_close, {**ohlc, "open": open_, "high": high, "low": low, "close": c}


def load_reversion(folder: Optional[Path], checkpoint_sha256: Optional[str] = None) -> Optional[Reversion]:
    """The folder's reversion.json as a Reversion; None when there is none, when its fit chose no
    pull (tau null), or when it was fitted for another best_model.pt (a line on stderr says so).
    A UserError when the file is damaged."""
    path = Path(folder) / REVERSION_JSON if folder is not None else None
    if path is None or not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        tau, long_run, interval = raw["tau"], int(raw["long_run"]), raw.get("interval")
        if tau is not None and not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
            raise ValueError(f"tau {tau!r} is not a positive number or null")
        if long_run < 2:
            raise ValueError(f"long_run {long_run} is below 2")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{path} is damaged ({type(e).__name__}: {e}); delete it to forecast the paths as sampled, "
            "or retrain the run to fit it again"
        ) from None
    fitted_for = raw.get("checkpoint_sha256")
    if checkpoint_sha256 and fitted_for and fitted_for != checkpoint_sha256:
        print(
            f"warning: {path} was fitted for another best_model.pt (sha256 {fitted_for[:12]}); "
            "forecasting the paths as sampled",
            file=sys.stderr,
        )
        return None
    return None if tau is None else Reversion(float(tau), long_run, None if interval is None else str(interval))
