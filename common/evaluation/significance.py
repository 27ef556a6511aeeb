"""Significance of the scorecard's comparisons: Diebold-Mariano tests, the Model Confidence Set,
and Holm's correction across the verdicts of one scorecard.

The tests run on one loss per origin **date**: the sum over the assets that have an origin that
date (the same origins for every forecaster), so the mean loss difference has the sign of the
pooled CRPS skill, and all assets of a date move together as in the skill's bootstrap.

- Diebold-Mariano (Diebold and Mariano 1995) with the Harvey-Leybourne-Newbold correction
  (HLN 1997): d_t = L_model,t - L_base,t; DM = mean(d) / sqrt(V / n) with the long-run variance
  V = g_0 + 2 sum_{k=1}^{h-1} g_k (g_k the lag-k autocovariance, divided by n), h the forecast
  horizon counted in origin steps (ceil(H / stride)): forecasts made fewer than h steps apart
  overlap, so d_t is MA(h-1). HLN: DM* = DM sqrt((n + 1 - 2h + h(h - 1) / n) / n), two-sided
  p-value from Student's t with n - 1 degrees of freedom. The truncated (uniform-weight) variance
  is the one the HLN factor is derived for; where it comes out non-positive, the Newey-West
  (Bartlett) weights with the same lags replace it, and the result says so.
- Model Confidence Set (Hansen, Lunde and Nason 2011): `arch.bootstrap.MCS`, range statistic,
  stationary bootstrap with the skill's block length, seeded.
- Holm (1979) step-down adjusted p-values: family-wise error control under any dependence
  between the tests (one scorecard's horizons share origins and baselines).
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from common.evaluation.metrics import block_length

__all__ = [
    "FAMILY_ALPHA",
    "MCS_ALPHA",
    "MCS_MIN_DATES",
    "date_sums",
    "diebold_mariano",
    "family_verdict",
    "hln_factor",
    "holm",
    "long_run_variance",
    "model_confidence_set",
    "overlap_steps",
    "significance_card",
]

FAMILY_ALPHA = 0.05  # the family-wise error rate of one scorecard's verdicts
MCS_ALPHA = 0.10  # the MCS keeps forecasters not rejected at this size: a 90% set
MCS_MIN_DATES = 10  # fewer origin dates than this: no MCS (its bootstrap has nothing to resample)


def overlap_steps(horizon: int, stride: int) -> int:
    """The horizon in origin steps, ceil(H / stride): origins closer than this share part of their
    target window. H itself when every candle is an origin."""
    return max(1, math.ceil(horizon / max(stride, 1)))


def date_sums(loss: np.ndarray, dates: np.ndarray) -> np.ndarray:
    """Per-origin losses summed per origin date, in date order."""
    _, inverse = np.unique(np.asarray(dates), return_inverse=True)
    return np.bincount(inverse, weights=np.asarray(loss, dtype=np.float64))


def long_run_variance(d: np.ndarray, lags: int, kernel: str = "uniform") -> float:
    """g_0 + 2 sum_{k=1}^{lags} w_k g_k of the demeaned series, g_k = sum(e_t e_{t-k}) / n;
    w_k = 1 ("uniform", Diebold-Mariano's truncated estimator) or 1 - k / (lags + 1) ("bartlett",
    Newey-West)."""
    d = np.asarray(d, dtype=np.float64)
    n = len(d)
    e = d - d.mean()
    total = e @ e / n
    for k in range(1, min(lags, n - 1) + 1):
        w = 1.0 if kernel == "uniform" else 1.0 - k / (lags + 1)
        total += 2.0 * w * (e[k:] @ e[:-k]) / n
    return float(total)


def hln_factor(n: int, h: int) -> Optional[float]:
    """Harvey-Leybourne-Newbold's small-sample factor sqrt((n + 1 - 2h + h(h - 1) / n) / n); None
    when the sample is too short for the horizon (the bracket is not positive)."""
    inner = (n + 1 - 2 * h + h * (h - 1) / n) / n
    return math.sqrt(inner) if inner > 0 else None


def diebold_mariano(model: np.ndarray, baseline: np.ndarray, h: int) -> dict:
    """The DM test with HLN's correction of equal expected loss of two loss series on the same
    dates; h: the horizon in steps of the series (h - 1 autocovariances). Negative statistic:
    the model's loss is lower. statistic and p_value are None when untestable (fewer than 2
    dates, no variance, or too few dates for h)."""
    d = np.asarray(model, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = len(d)
    out = {
        "statistic": None,
        "p_value": None,
        "mean_diff": float(d.mean()) if n else None,
        "n_dates": n,
        "lags": h - 1,
        "variance": "uniform",
    }
    if n < 2:
        return out
    v = long_run_variance(d, h - 1, "uniform")
    if v <= 0:
        out["variance"] = "bartlett"
        v = long_run_variance(d, h - 1, "bartlett")
    factor = hln_factor(n, h)
    if v <= 1e-300 or factor is None:
        return out
    from scipy.stats import t as student_t  # seconds to import: only when a scorecard is scored

    stat = float(d.mean() / math.sqrt(v / n) * factor)
    out.update(statistic=stat, p_value=float(2 * student_t.sf(abs(stat), n - 1)))
    return out


def holm(p_values: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjusted p-values, in the given order; None stays None (not in the family)."""
    present = {i: p for i, p in enumerate(p_values) if p is not None}
    m = len(present)
    out: list[Optional[float]] = [None] * len(p_values)
    running = 0.0
    for rank, i in enumerate(sorted(present, key=present.__getitem__)):
        running = max(running, min(1.0, (m - rank) * present[i]))  # monotone: never below an earlier one
        out[i] = running
    return out


def family_verdict(mean_diff: Optional[float], p_adjusted: Optional[float], alpha: float = FAMILY_ALPHA) -> str:
    """'beats' / 'worse' when the adjusted p-value is below alpha and the model's loss is lower /
    higher, else 'no edge'."""
    if p_adjusted is None or mean_diff is None or p_adjusted >= alpha:
        return "no edge"
    return "beats" if mean_diff < 0 else "worse"


def model_confidence_set(
    losses: Mapping[str, np.ndarray], *, block: int, reps: int, seed: int, alpha: float = MCS_ALPHA
) -> dict:
    """`arch.bootstrap.MCS` (range statistic, stationary bootstrap) over per-date loss series:
    which forecasters remain in the (1 - alpha) set, and each one's MCS p-value."""
    names = list(losses)
    n = len(next(iter(losses.values()))) if names else 0
    out: dict = {
        "alpha": alpha,
        "included": None,
        "pvalues": None,
        "method": "R",
        "reps": reps,
        "block": block,
        "n_dates": n,
    }
    if n < MCS_MIN_DATES:
        out["note"] = f"{n} origin dates: too few for the MCS (at least {MCS_MIN_DATES})"
        return out
    table = np.column_stack([losses[k] for k in names])
    diffs = table[:, :, None] - table[:, None, :]
    if (np.ptp(diffs, axis=0) + np.eye(len(names)) == 0).any():  # arch's MCS divides by their zero variance
        out["note"] = "two forecasters' losses differ by a constant (the same forecaster twice?): no MCS"
        return out
    from arch.bootstrap import MCS  # seconds to import: only when a scorecard is scored

    mcs = MCS(
        pd.DataFrame(table, columns=names),
        size=alpha,
        reps=reps,
        block_size=block,
        method="R",
        bootstrap="stationary",
        seed=seed,
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        mcs.compute()
    pvalues = mcs.pvalues["Pvalue"]
    out.update(included=[k for k in names if k in set(mcs.included)], pvalues={k: float(pvalues[k]) for k in names})
    return out


def significance_card(
    losses: Mapping[str, np.ndarray], dates: np.ndarray, *, horizon: int, stride: int, n_boot: int, seed: int
) -> dict:
    """Per horizon: {"dm": {"crps": {baseline: DM result}}, "mcs": MCS result} from the per-origin
    CRPS of "model" and each baseline on the same origins. The Holm adjustment and the verdicts
    come later, across all horizons (`common.evaluation.scorecard`)."""
    sums = {name: date_sums(loss, dates) for name, loss in losses.items()}
    h = overlap_steps(horizon, stride)
    dm = {name: diebold_mariano(sums["model"], s, h) for name, s in sums.items() if name != "model"}
    n_dates = len(sums["model"])
    mcs = model_confidence_set(sums, block=block_length(n_dates, horizon, stride), reps=n_boot, seed=seed)
    return {"dm": {"crps": dm}, "mcs": mcs}
