"""Where each split's training windows lie in one asset's token series, as plain index arithmetic
(no tensors): the start of each run of windows and how many it holds (common.training.batches
turns the runs of every asset into SplitWindows).
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np

__all__ = ["SPLITS", "asset_runs", "split_runs", "window_starts"]

SPLITS = ("train", "val", "test")


def window_starts(begin: int, end: int, length: int, stride: int) -> np.ndarray:
    """Start indices of the `length`-token windows inside [begin, end), `stride` apart."""
    last = end - length  # the last start whose window still ends inside the range
    if last < begin:
        return np.zeros(0, dtype=np.int64)
    return np.arange(begin, last + 1, stride, dtype=np.int64)


def split_runs(
    split: str, begin: int, end: int, previous_end: int, context_length: int, stride: int
) -> tuple[int, int]:
    """(first window start, window count) of one asset's split [begin, end).

    Training windows lie inside the range, from its start. Validation and test windows are laid
    from the range's end back, `stride` apart, and may start up to a context before `begin`,
    never before `previous_end`: with a purge gap of at least a context, every val or test
    candle is a target even when the split is shorter than a window (case A's daily val split
    is 830 candles, its purge gap and context 512), read with the gap's untrained candles as
    context; the targets in the gap are masked (SplitWindows.target_begin)."""
    length = context_length + 1
    if split == "train":
        return begin, max(0, (end - length - begin) // stride + 1)  # = len(window_starts(...))
    if end <= begin:
        return begin, 0
    # the earliest start whose window has a target, reading nothing of the split before
    lowest = max(min(previous_end, begin), begin - context_length)
    last = end - length  # the last window ends at the range's end
    if last < lowest:
        return begin, 0
    count = (last - lowest) // stride + 1
    return last - (count - 1) * stride, count


def asset_runs(
    symbol: str, n: int, mine: Mapping[str, Sequence[int]], context_length: int, strides: Mapping[str, int]
) -> Iterator[tuple[str, tuple[int, int, int]]]:
    """(split, (first window start, windows, first target)) of one asset of n tokens, for each of
    its splits that holds a window; `mine` its ranges."""
    previous_end = 0  # where the split before this one ends: no window reads a token before it
    for split in SPLITS:
        if split not in mine:
            continue
        begin, end = (int(v) for v in mine[split])
        if not 0 <= begin <= end <= n:
            raise ValueError(f"{symbol}: {split} range [{begin}, {end}) is outside its {n} tokens")
        start, count = split_runs(split, begin, end, previous_end, context_length, strides[split])
        previous_end = end
        if count:
            yield split, (start, count, begin)
