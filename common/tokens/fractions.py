"""A share of the training split on the same token shard (data.train_fraction, data.fraction_by),
so the points of `marketgpt sweep` vary their training data without preparing it again.

"assets": the first ceil(f * n) assets in symbol order keep their training range, the others
train on nothing. "time": each asset keeps the latest f of its training range (the candles next
to validation). Validation and test ranges are untouched, so every point is scored on the same
candles. The shard's own index keeps the full ranges: the trim is applied each time a run opens
its tokens, new or resumed.
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = ["trim_train"]

Ranges = dict[str, dict[str, tuple[int, int]]]


def trim_train(ranges: Ranges, fraction: float, by: Literal["assets", "time"]) -> Ranges:
    """`ranges` with each asset's "train" range cut to `fraction` (see the module docstring)."""
    if fraction >= 1.0:
        return ranges
    out: Ranges = {}
    keep = set(sorted(ranges)[: max(1, math.ceil(fraction * len(ranges)))])
    for symbol, r in ranges.items():
        b, e = (int(v) for v in r["train"])
        if by == "assets":
            train = (b, e) if symbol in keep else (b, b)
        else:
            train = (e - max(1, round(fraction * (e - b))), e)
        out[symbol] = {**r, "train": train}
    return out
