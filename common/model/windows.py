"""The sampling window and the row chunks, shared by the torch sampler (common.model.sampling)
and the torch-free one (common.forecasting.infer): plain Python, no torch."""

from __future__ import annotations

from typing import Any, Iterator

__all__ = ["chunk_features", "chunk_rows", "context_chunks", "prefill_length"]


def prefill_length(context_length: int, horizon: int, available: int) -> int:
    """Context tokens prefilled: all of the forecast fits in the window when it can."""
    return max(1, min(available, context_length, max(context_length - horizon, context_length // 2)))


def context_chunks(n: int, samples: int, max_batch: int) -> Iterator[tuple[int, int, int, int]]:
    """(first context, end context, samples each, first output row) per chunk of at most
    max_batch rows: whole contexts while a context's samples fit, else one context's in parts."""
    if samples <= max_batch:
        per = max_batch // samples
        for c0 in range(0, n, per):
            yield c0, min(n, c0 + per), samples, c0 * samples
    else:
        for c in range(n):
            for s0 in range(0, samples, max_batch):
                yield c, c + 1, min(max_batch, samples - s0), c * samples + s0


def chunk_features(features: Any, rows: Any, first_row: int, known: int, path_features: Any) -> Any:
    """A chunk's candle ids (B, known + H, F): its rows' contexts' `features` (N, known + H, F),
    numpy or torch alike, with, where `path_features` (N, samples, H, k) is given, each row's own
    sample's future in the last k columns (the chunk's rows are output rows first_row, ...: context
    row // samples, sample row % samples). None without features."""
    if features is None:
        return None
    out = features[rows]  # advanced indexing: a copy in numpy and torch
    if path_features is not None:
        out[:, known:, -path_features.shape[-1] :] = chunk_rows(path_features, first_row, len(rows))
    return out


def chunk_rows(per_sample: Any, first_row: int, n: int) -> Any:
    """A chunk's n rows, output rows first_row, ..., of `per_sample` (N, samples, ...), numpy or
    torch alike; None stays None."""
    if per_sample is None:
        return None
    return per_sample.reshape(-1, *per_sample.shape[2:])[first_row : first_row + n]
