"""PIT uniformity: a test per forecaster and horizon, and the PIT of the calibrated forecaster.

The test. A calibrated forecaster's PIT values are uniform, so the shares p_j of its PIT in
TEST_BINS equal bins each expect 1 / TEST_BINS. Two dependences break a multinomial test:
origins fewer than H dates apart share part of their H-step return (overlapping horizons), and
the assets of one date share its market move. So the test keeps every ceil(H / stride)-th origin
date (no two kept horizons overlap) and treats each date as one cluster: with g dates, d = (p_j -
1/k) for all bins but the last and S the dates' covariance of their pull on the shares,

    T^2 = d' S^-1 d,  F = T^2 (g - df) / (df (g - 1)) ~ F(df, g - df)      (Hotelling, df = k - 1)

Five bins, not the histogram's ten: with 60 dates of 4 assets a date, a calibrated forecaster is
rejected at 5% in 6% of cards with 5 bins and in 9% with 10 (the shares of sparse bins are far
from normal); an over-confident one is rejected either way.

The calibrated forecaster (calibration.json, split-conformal CQR) moves the ends of the central
50/80/90% intervals; it has no full distribution, so its PIT is read on the grid those ends make:
the 8 bins cut at 0.05, 0.10, 0.25, 0.5, 0.75, 0.90, 0.95 (GRID_EDGES). The raw forecaster is read
on the same grid beside it; their tests merge the two 5% bins of each tail (6 bins).
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np
from scipy.stats import f as fdist

__all__ = [
    "GRID_EDGES",
    "GRID_TEST",
    "TEST_BINS",
    "calibrated_grid_bins",
    "grid_bins",
    "pit_bins",
    "pit_uniformity",
]

# the ends of the central 90/80/50% intervals and the median, as PIT values
GRID_EDGES = (0.0, 0.05, 0.10, 0.25, 0.5, 0.75, 0.90, 0.95, 1.0)
GRID_TEST = np.array([0, 0, 1, 2, 3, 4, 5, 5])  # grid bin -> its test bin: each tail's two 5% bins merged
TEST_BINS = 5
_GRID_LEVELS = (90, 80, 50)  # outermost first: bin k below the median lies outside the levels[:k]


def grid_bins(pit: np.ndarray) -> np.ndarray:
    """(n,) bin of each PIT value on GRID_EDGES (0..7)."""
    return np.clip(np.searchsorted(GRID_EDGES, np.asarray(pit, dtype=np.float64), side="right") - 1, 0, 7)


def pit_bins(pit: np.ndarray, bins: int) -> np.ndarray:
    """(n,) bin of each PIT value among `bins` equal bins of [0, 1] (as metrics.pit_histogram)."""
    return np.clip((np.asarray(pit, dtype=np.float64) * bins).astype(int), 0, bins - 1)


def calibrated_grid_bins(
    scores: Mapping[int, np.ndarray], adjustments: Mapping[int, float], above_median: np.ndarray
) -> np.ndarray:
    """(n,) grid bin of each outcome under the calibrated intervals: how many of the calibrated
    90/80/50% intervals leave it out (score > q), on its side of the median (raw: the CQR moves
    the ends only)."""
    outside = sum((np.asarray(scores[lv]) > adjustments[lv]).astype(int) for lv in _GRID_LEVELS)
    depth = len(_GRID_LEVELS) - np.asarray(outside)  # 0: outside all three .. 3: inside the 50%
    return np.where(above_median, 4 + (3 - depth), depth)


def pit_uniformity(
    bins: np.ndarray,
    expected: np.ndarray,
    dates: np.ndarray,
    *,
    horizon: int,
    stride: int,
) -> Optional[dict]:
    """The test of bin shares against `expected` on non-overlapping origin dates, clustered by
    date (module docstring); None with too few dates for the test's degrees of freedom."""
    expected = np.asarray(expected, dtype=np.float64)
    k = len(expected)
    uniq, inverse = np.unique(np.asarray(dates), return_inverse=True)
    every = math.ceil(horizon / max(stride, 1))  # consecutive origin dates whose horizons overlap
    counts = np.bincount(inverse * k + np.asarray(bins), minlength=len(uniq) * k).reshape(len(uniq), k)[::every]
    g, df = len(counts), k - 1
    if g < df + 2:
        return None
    per_date = counts.sum(1, keepdims=True).astype(np.float64)
    shares = counts.sum(0) / per_date.sum()
    u = (counts - per_date * shares)[:, :-1] / per_date.sum()  # each date's pull on the shares
    d = (shares - expected)[:-1]
    stat = float(d @ np.linalg.pinv(u.T @ u * g / (g - 1)) @ d)  # Hotelling T^2: the dates' covariance
    f = stat * (g - df) / (df * (g - 1))
    p = float(fdist.sf(f, df, g - df))
    return {
        "test": "Hotelling T2 (F) over non-overlapping origin dates, clustered by date",
        "statistic": stat,
        "df": df,
        "p_value": p,
        "uniform": bool(p >= 0.05),
        "n_dates": int(g),
        "every": int(every),
    }
