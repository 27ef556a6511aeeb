"""Quantile bins of one tokenizer feature (move/sigma or shape/sigma): fit, assign, save.

`QuantileBins.fit` puts its edges at the training values' quantiles, so every bin is used
about equally often, and gives each bin a representative value, the median of the training
values in it (what `decode` returns for the bin), and the training values' quantiles within
each bin (`inner`, at LEVELS: from the bin's smallest value to its largest, denser towards
both ends, where the end bins' tails stretch), from which `draw` takes a value at a given
level: a sampled path decoded that way has the training moves' spread, not only their
medians' (the medians of 32 move bins carry about 85% of the moves' second moment on the
shipped sample, the end bins' long tails least of all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = ["LEVELS", "QuantileBins"]

# Within-bin quantile levels: 16 equal steps, and 2^-5 .. 2^-14 from each end, so that the end
# bins' last segments hold next to no training values (a segment is drawn uniformly: one wide
# segment up to the largest value would put far too much weight on the extreme).
_TAIL = 2.0 ** -np.arange(5, 15)
LEVELS = np.unique(np.concatenate([np.linspace(0.0, 1.0, 17), _TAIL, 1.0 - _TAIL]))


@dataclass
class QuantileBins:
    """Quantile edges (interior, ascending) and per-bin representative values of one feature."""

    edges: np.ndarray  # n_bins - 1 values
    values: np.ndarray  # n_bins values: median of the training values in each bin
    low: float  # smallest / largest training value: beyond them a value counts as clipped
    high: float
    inner: Optional[np.ndarray] = None  # (n_bins, len(LEVELS)) within-bin quantiles; None in files before them

    @classmethod
    def fit(cls, x: np.ndarray, n_bins: int) -> "QuantileBins":
        """n_bins bins of the training values x (1-D, finite)."""
        x = np.sort(x)
        n = len(x)
        # Quantile levels 1/n_bins .. (n_bins-1)/n_bins, linear interpolation on the sorted data
        # (same as np.quantile's default, without re-partitioning 3M values for 4095 levels).
        pos = np.arange(1, n_bins) / n_bins * (n - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        edges = x[lo] + (pos - lo) * (x[hi] - x[lo])
        # A value v is in bin b when edges[b-1] <= v < edges[b] (searchsorted side="right").
        bounds = np.searchsorted(x, edges, side="left")
        start = np.concatenate([[0], bounds])
        end = np.concatenate([bounds, [n]])
        mid_lo = np.clip((start + end - 1) // 2, 0, n - 1)
        mid_hi = np.clip((start + end) // 2, 0, n - 1)
        values = 0.5 * (x[mid_lo] + x[mid_hi])
        # An empty bin (tied training values, e.g. many flat candles) gets the middle of its edges.
        empty = end <= start
        if empty.any() and n_bins > 1:
            lower = np.concatenate([[edges[0]], edges])
            upper = np.concatenate([edges, [edges[-1]]])
            values[empty] = 0.5 * (lower[empty] + upper[empty])
        # within-bin quantiles, linear interpolation on each bin's sorted values; an empty bin's all its value
        at = start[:, None] + LEVELS[None, :] * np.maximum(end - start - 1, 0)[:, None]
        i0 = np.clip(np.floor(at).astype(np.int64), 0, n - 1)
        i1 = np.clip(i0 + 1, 0, n - 1)
        inner = np.where(empty[:, None], values[:, None], x[i0] + (at - np.floor(at)) * (x[i1] - x[i0]))
        return cls(edges=edges, values=values, low=float(x[0]), high=float(x[-1]), inner=inner)

    def assign(self, x: np.ndarray) -> np.ndarray:
        """Each value's bin, 0..n_bins-1 (values beyond the end edges go to the end bins)."""
        return np.searchsorted(self.edges, x, side="right")

    def draw(self, bins: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The training values' within-bin quantile at level u (in [0, 1)) of each bin in `bins`
        (same shapes): a draw from the bin's training values when u is uniform."""
        if self.inner is None:
            raise ValueError("these bins have no within-bin quantiles (fitted before they were stored)")
        u = np.clip(u, 0.0, 1.0)
        k = np.clip(np.searchsorted(LEVELS, u, side="right") - 1, 0, len(LEVELS) - 2)
        frac = (u - LEVELS[k]) / (LEVELS[k + 1] - LEVELS[k])
        lo, hi = self.inner[bins, k], self.inner[bins, k + 1]
        return lo + frac * (hi - lo)

    def to_dict(self) -> dict:
        out = {"edges": self.edges.tolist(), "values": self.values.tolist(), "low": self.low, "high": self.high}
        if self.inner is not None:
            out["inner"] = self.inner.tolist()
        return out

    @classmethod
    def from_dict(cls, d: Any, n_bins: int, name: str) -> "QuantileBins":
        """The bins to_dict wrote; ValueError naming `name` if they are not n_bins valid bins."""
        if not isinstance(d, dict):
            raise ValueError(f"'{name}' is not an object")
        edges = np.asarray(d["edges"], dtype=np.float64)
        values = np.asarray(d["values"], dtype=np.float64)
        if edges.shape != (n_bins - 1,) or values.shape != (n_bins,):
            raise ValueError(
                f"'{name}' has {edges.size} edges and {values.size} values, expected {n_bins - 1} and {n_bins}"
            )
        if not (np.isfinite(edges).all() and np.isfinite(values).all()) or np.any(np.diff(edges) < 0):
            raise ValueError(f"'{name}' edges are not finite and ascending")
        inner = None
        if "inner" in d:  # absent from tokenizer files written before within-bin draws
            inner = np.asarray(d["inner"], dtype=np.float64)
            shape = (n_bins, len(LEVELS))
            if inner.shape != shape or not np.isfinite(inner).all() or np.any(np.diff(inner, axis=1) < 0):
                raise ValueError(f"'{name}' inner quantiles are not {shape[0]} ascending rows of {shape[1]} numbers")
        return cls(edges=edges, values=values, low=float(d["low"]), high=float(d["high"]), inner=inner)
