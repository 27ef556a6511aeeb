"""The rich market's candle range given its move, as the oracles read it (scaling_floors' candle
observer and observable_oracle's particle filter): the density of v = log(high / low) / sd - |r| / sd
given a = |r| / sd, both in units of the candle's scale sd.

The generator draws a candle's range as |z - 0.1 n1| + 0.5 (|n2| + |n3|) around its return z
(common/data/synthetic_rich.py), so v = |z - 0.1 n1| - |z| + 0.5 (|n2| + |n3|) depends on |z|
alone; `range_table` tabulates it by Monte Carlo on a grid of |z|, `range_loglik` reads it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["range_loglik", "range_table"]

RANGE_A = np.linspace(0.0, 0.6, 13)  # |z| rows; beyond 0.6 the fold |z - 0.1 n| is |z| - 0.1 n sign(z)
RANGE_V = np.linspace(-0.6, 7.0, 761)  # bin edges of v
LOG_FLOOR = math.log(1e-6)


def range_table(draws: int = 400_000, seed: int = 1) -> np.ndarray:
    """(len(RANGE_A), len(RANGE_V) - 1) log densities of v at each |z| of RANGE_A, by Monte Carlo
    histogram (floored at 1e-6)."""
    rng = np.random.default_rng(seed)
    n1 = rng.standard_normal(draws)
    extra = 0.5 * (np.abs(rng.standard_normal(draws)) + np.abs(rng.standard_normal(draws)))
    rows = [np.histogram(np.abs(a - 0.1 * n1) - a + extra, bins=RANGE_V, density=True)[0] for a in RANGE_A]
    return np.log(np.maximum(np.array(rows), 1e-6))


def range_loglik(a: np.ndarray, w: np.ndarray, table: np.ndarray) -> np.ndarray:
    """log density of the range w = log(high / low) / sd given the move a = |r| / sd, from
    `table` (range_table's); the Jacobian 1 / sd is the caller's."""
    row = np.minimum(np.rint(a / (RANGE_A[1] - RANGE_A[0])).astype(np.int64), len(RANGE_A) - 1)
    col = np.searchsorted(RANGE_V, w - a, side="right") - 1
    inside = (col >= 0) & (col < table.shape[1])
    return np.where(inside, table[row, np.clip(col, 0, table.shape[1] - 1)], LOG_FLOOR)
