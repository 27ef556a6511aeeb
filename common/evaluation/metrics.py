"""Scores of probabilistic forecasts of H-step log returns, from samples, and their skill.

Every score takes per-origin arrays: `samples` (n, S) of H-step log returns from a forecaster
and `y` (n,) the realized H-step log returns. Per-origin values come back so the caller can pool
them per asset, per category or over everything, and bootstrap them.

- CRPS: scoringrules' `crps_ensemble` with the "pwm" estimator, which equals the fair (unbiased)
  ensemble CRPS in O(S log S): the expected score of the sampled distribution, not of its S points.
- Coverage of central intervals: y inside the sample quantiles ((1 - level) / 2, (1 + level) / 2).
- PIT: the fraction of samples below y (ties count half); uniform for a calibrated forecaster.
- QLIKE: log(s2) + r2 / s2 (Patton 2011), s2 the samples' variance, r2 the squared realized
  return. Robust to the noise of r2 as a variance proxy; lower is better; it can be negative, so
  its skill is a difference of means, not a ratio.
- Rank IC: the Spearman correlation, across assets, of predicted mean and realized return on
  each origin date with at least `min_assets` assets; its mean and a Newey-West t-statistic.
- Wilson interval of a hit rate (directional accuracy): 95% by default.
- Skill 1 - model/baseline with a paired circular block bootstrap over consecutive origin dates:
  losses of all assets on one date stay together (cross-sectional correlation) and blocks of
  consecutive dates keep the autocorrelation that overlapping horizons create.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

__all__ = [
    "COVERAGE_LEVELS",
    "PIT_BINS",
    "block_bootstrap_indices",
    "block_bootstrap_sums",
    "block_length",
    "coverage_flags",
    "crps",
    "newey_west_t",
    "pit_values",
    "pit_histogram",
    "qlike",
    "rank_ic",
    "skill_interval",
    "verdict",
    "wilson_interval",
]

COVERAGE_LEVELS = (50, 80, 90, 95)
PIT_BINS = 10
_Z95 = 1.959963984540054  # two-sided 95% normal quantile


def crps(samples: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n,) fair ensemble CRPS of each origin's samples (n, S) at its realized value y (n,)."""
    import scoringrules as sr  # seconds to import: kept out of training, which imports this module (wilson_interval)

    samples, y = _check(samples, y)
    return np.asarray(sr.crps_ensemble(y, samples, estimator="pwm", backend="numpy"), dtype=np.float64)


def coverage_flags(
    samples: np.ndarray, y: np.ndarray, levels: Sequence[int] = COVERAGE_LEVELS
) -> dict[str, np.ndarray]:
    """level -> (n,) bool: y inside the central `level`% interval of the samples (ends included)."""
    samples, y = _check(samples, y)
    out = {}
    for level in levels:
        q = np.quantile(samples, [(1 - level / 100) / 2, (1 + level / 100) / 2], axis=1)
        out[str(level)] = (q[0] <= y) & (y <= q[1])
    return out


def pit_values(samples: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n,) probability integral transform: share of samples below y, ties counting half."""
    samples, y = _check(samples, y)
    below = (samples < y[:, None]).sum(1)
    ties = (samples == y[:, None]).sum(1)
    return (below + 0.5 * ties) / samples.shape[1]


def pit_histogram(pit: np.ndarray, bins: int = PIT_BINS) -> list[float]:
    """Share of PIT values in each of `bins` equal bins of [0, 1] (all 1/bins when calibrated)."""
    counts, _ = np.histogram(np.clip(pit, 0.0, 1.0), bins=bins, range=(0.0, 1.0))
    return (counts / max(len(pit), 1)).tolist()


def qlike(variance: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n,) QLIKE loss log(s2) + y^2 / s2 of a predicted variance s2 against the realized y."""
    variance = np.maximum(np.asarray(variance, dtype=np.float64), 1e-20)  # a constant forecaster has s2 = 0
    return np.log(variance) + np.asarray(y, dtype=np.float64) ** 2 / variance


def rank_ic(
    dates: np.ndarray, predicted: np.ndarray, realized: np.ndarray, min_assets: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """(dates, IC) of every date with at least `min_assets` origins and non-constant predictions:
    the Spearman correlation of predicted and realized returns across the assets of that date."""
    from scipy.stats import rankdata  # seconds to import: kept out of training, which imports this module

    dates, predicted, realized = np.asarray(dates), np.asarray(predicted, float), np.asarray(realized, float)
    order = np.argsort(dates, kind="stable")
    dates, predicted, realized = dates[order], predicted[order], realized[order]
    uniq, starts = np.unique(dates, return_index=True)
    bounds = np.append(starts, len(dates))
    kept, ics = [], []
    for d, lo, hi in zip(uniq, bounds[:-1], bounds[1:]):
        if hi - lo < min_assets:
            continue
        p, r = rankdata(predicted[lo:hi]), rankdata(realized[lo:hi])
        if p.std() == 0 or r.std() == 0:  # no ranking to judge (e.g. a zero-mean forecaster)
            continue
        kept.append(d)
        ics.append(float(np.corrcoef(p, r)[0, 1]))
    return np.asarray(kept), np.asarray(ics)


def newey_west_t(x: np.ndarray, lags: int) -> Optional[float]:
    """t-statistic of mean(x) with the Newey-West (Bartlett kernel) long-run variance; None when
    fewer than 2 values or no variance."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < 2:
        return None
    e = x - x.mean()
    long_run = e @ e / n
    for lag in range(1, min(lags, n - 1) + 1):
        long_run += 2 * (1 - lag / (lags + 1)) * (e[lag:] @ e[:-lag]) / n
    if long_run <= 0:
        return None
    return float(x.mean() / math.sqrt(long_run / n))


# --------------------------------------------------------------------------- skill and its interval


def block_length(n_dates: int, horizon: int, stride: int) -> int:
    """Consecutive origins whose horizons overlap (ceil(H / stride)) or n^(1/3), whichever is more."""
    return max(1, math.ceil(horizon / max(stride, 1)), round(n_dates ** (1 / 3)))


def block_bootstrap_indices(n: int, block: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n) indices of a circular block bootstrap: random starts, `block` consecutive each."""
    block = max(1, min(block, n))
    return _block_rows(rng.integers(0, n, size=(n_boot, -(-n // block))), block, n)


def _block_rows(starts: np.ndarray, block: int, n: int) -> np.ndarray:
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]) % n
    return idx.reshape(len(starts), -1)[:, :n]


_BOOT_ELEMENTS = 1 << 22  # indices per chunk of resamples: 32 MB, whatever n


def block_bootstrap_sums(
    arrays: Sequence[np.ndarray], block: int, n_boot: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each array's (n_boot,) sums over the resamples of block_bootstrap_indices (the same draws,
    the same sums), made a chunk of resamples at a time: the (n_boot, n) index matrix of 27,000
    test positions would be 216 MB, and each array's gather as much again."""
    n = len(arrays[0])
    block = max(1, min(block, n))
    starts = rng.integers(0, n, size=(n_boot, -(-n // block)))
    out = [np.empty(n_boot) for _ in arrays]
    step = max(1, _BOOT_ELEMENTS // max(n, 1))
    for lo in range(0, n_boot, step):
        idx = _block_rows(starts[lo : lo + step], block, n)
        for sums, a in zip(out, arrays):
            sums[lo : lo + len(idx)] = a[idx].sum(1)
    return out


def skill_interval(
    model: np.ndarray,
    baseline: np.ndarray,
    dates: np.ndarray,
    *,
    horizon: int,
    stride: int,
    kind: str = "ratio",
    n_boot: int = 1000,
    seed: int = 0,
    block: Optional[int] = None,
) -> dict:
    """Skill of `model` over `baseline` losses on the same origins, with a paired block-bootstrap
    95% interval over the origin dates (sorted; all origins of one date resampled together).

    kind "ratio": 1 - sum(model) / sum(baseline) (CRPS, MAE: positive losses).
    kind "diff": (sum(baseline) - sum(model)) / n, the mean loss difference (QLIKE).
    Positive is better for the model either way. block: dates per bootstrap block (default
    `block_length`).
    """
    model, baseline = np.asarray(model, float), np.asarray(baseline, float)
    uniq, inverse = np.unique(np.asarray(dates), return_inverse=True)
    m = np.bincount(inverse, weights=model, minlength=len(uniq))
    b = np.bincount(inverse, weights=baseline, minlength=len(uniq))
    c = np.bincount(inverse, minlength=len(uniq)).astype(np.float64)

    def stat(mm: np.ndarray, bb: np.ndarray, cc: np.ndarray) -> np.ndarray:
        if kind == "ratio":
            return 1.0 - mm / bb
        return (bb - mm) / cc

    value = float(stat(m.sum(), b.sum(), c.sum()))
    block = block or block_length(len(uniq), horizon, stride)
    boots = stat(*block_bootstrap_sums([m, b, c], block, n_boot, np.random.default_rng(seed)))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"value": value, "ci95": [float(lo), float(hi)], "verdict": verdict(float(lo), float(hi))}


def verdict(lo: float, hi: float) -> str:
    """'beats' when the whole 95% interval is above 0, 'worse' when below, else 'no edge'."""
    return "beats" if lo > 0 else "worse" if hi < 0 else "no edge"


def wilson_interval(successes: int, n: int, z: float = _Z95) -> tuple[Optional[float], Optional[float]]:
    """Wilson score interval of a binomial proportion; (None, None) when n == 0."""
    if n == 0:
        return None, None
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def _check(samples: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    samples, y = np.asarray(samples, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if samples.ndim != 2 or y.shape != (samples.shape[0],):
        raise ValueError(f"samples {samples.shape} must be (n, S) and y {y.shape} must be (n,)")
    if samples.shape[1] < 2:
        raise ValueError(f"need at least 2 samples per origin, got {samples.shape[1]}")
    return samples, y
