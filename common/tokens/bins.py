"""Quantile bins of one tokenizer feature (move/sigma or shape/sigma): fit, assign, save.

`QuantileBins.fit` puts its edges at the training values' quantiles, so every bin is used
about equally often, and gives each bin a representative value, the median of the training
values in it (what `decode` returns for the bin).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["QuantileBins"]


@dataclass
class QuantileBins:
    """Quantile edges (interior, ascending) and per-bin representative values of one feature."""

    edges: np.ndarray  # n_bins - 1 values
    values: np.ndarray  # n_bins values: median of the training values in each bin
    low: float  # smallest / largest training value: beyond them a value counts as clipped
    high: float

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
        return cls(edges=edges, values=values, low=float(x[0]), high=float(x[-1]))

    def assign(self, x: np.ndarray) -> np.ndarray:
        """Each value's bin, 0..n_bins-1 (values beyond the end edges go to the end bins)."""
        return np.searchsorted(self.edges, x, side="right")

    def to_dict(self) -> dict:
        return {"edges": self.edges.tolist(), "values": self.values.tolist(), "low": self.low, "high": self.high}

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
        return cls(edges=edges, values=values, low=float(d["low"]), high=float(d["high"]))
