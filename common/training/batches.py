"""Training windows kept in memory and gathered by index: no DataLoader, no per-sample Python.

All tokens of all assets sit in one contiguous 1-D int16 tensor: on the GPU when there is one
(2 bytes a candle: 100M candles take 200 MB), else the memory map of the run's token folder
itself, so a CPU process reads only the pages its windows touch.
A window is `context_length + 1` consecutive tokens of one asset. A training window lies fully
inside the asset's train range; a val or test window ends inside its range and may read its
context from the purge gap before it, whose targets are masked (so a split shorter than a
window still has every candle scored, see window_index.split_runs). A split is a few numbers per asset:
where its windows start in the big tensor, how many, and the asset's ids. A batch of windows is one
advanced-indexing gather, `tokens[starts[:, None] + arange(T + 1)]`.

Epoch order is a pseudo-random permutation keyed by (seed, epoch), generated for the positions
a chunk of batches needs (common.training.epoch_order), so a resumed run sees exactly the order
the interrupted one saw. With an epoch stride k > 1
(data.epoch_stride) a training epoch takes every k-th window of each asset, from an offset in
[0, k) drawn per cycle of k epochs (each offset once a cycle, so a cycle reaches every window):
each candle is then a target about context_length / k times per epoch instead of
context_length times (stride-1 windows overlap). The epoch permutes that offset's windows (the
i-th of them found from per-asset counts, not a list) and keeps the first epoch_windows.
Under DDP the order is cut into global batches of batch_size x world_size windows and rank r
takes the r-th slice of each: at every step the ranks' batches together are exactly the batch
one process with batch_size x world_size would train on, so N processes learn what that one
process learns. Training drops the last incomplete global batch (every rank must see a full
batch for DDP's gradient mean to equal that process's); evaluation keeps it, unevenly sliced (a rank may get nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch

from common.errors import UserError
from common.special_tokens import PAD_TOKEN
from common.training.epoch_order import (
    EPOCH_ORDER,
    EPOCH_ORDERS,
    cycle_offset,
    feistel_permute,
    mix_seed,
    randperm_order,
    round_keys,
)
from common.training.window_index import SPLITS, asset_runs

__all__ = [
    "Batch",
    "SplitWindows",
    "TokenWindows",
    "build_windows",
]

# Batches are gathered this many tokens at a time (int64 on the device: 16 MB, three times more
# with features): one index copy, lookup and gather per chunk of steps instead of a dozen small
# kernel launches per step, which held a small model's GPU step back on the host.
CHUNK_TOKENS = 1 << 21


@dataclass
class Batch:
    """x, y: (B, T) inputs and next-token targets; asset_ids, category_ids: (B,)."""

    x: torch.Tensor
    y: torch.Tensor
    asset_ids: torch.Tensor
    category_ids: torch.Tensor
    features: Optional[torch.Tensor] = None  # (B, T, 3) time and volume ids of x (see build_windows)
    interval_ids: Optional[torch.Tensor] = None  # (B,): a run of several intervals (data.intervals)

    def extra_inputs(self) -> dict:
        """Keyword inputs of the model beyond the ids, only when the run has them."""
        extra = {} if self.features is None else {"features": self.features}
        if self.interval_ids is not None:
            extra["interval_ids"] = self.interval_ids
        return extra

    def split(self, sizes: Sequence[int]) -> list["Batch"]:
        """Consecutive batches of `sizes` windows each, as views of this one."""
        parts = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        parts = {k: None if v is None else v.split(list(sizes)) for k, v in parts.items()}
        pieces: list[dict[str, Any]] = [
            {k: None if v is None else v[i] for k, v in parts.items()} for i in range(len(sizes))
        ]
        return [Batch(**piece) for piece in pieces]


@dataclass
class SplitWindows:
    """One split's windows as runs, one run per asset: run r holds count[r] windows whose starts
    (offsets into the token tensor) are first[r], first[r] + stride, ... Window i of the split
    is run r = the one whose [cum[r], cum[r + 1]) holds i, at position i - cum[r] in it. A few
    numbers per asset, not per window: a 1B-candle corpus costs nothing here."""

    first: torch.Tensor  # (R,) int64, on the token tensor's device
    count: torch.Tensor  # (R,) int64, on the CPU: only the epoch order reads it
    stride: int
    asset_ids: torch.Tensor  # (R,) on the device
    category_ids: torch.Tensor  # (R,) on the device
    interval_ids: Optional[torch.Tensor] = None  # (R,) on the device; a run of several intervals only
    # (R,) on the device, val and test only: the run's first target; a window's earlier targets
    # (its context reaches back into the purge gap before the split) are PAD, scored by nobody
    target_begin: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        self.cum = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(self.count, 0)])  # (R + 1,) CPU
        self._ends = self.cum[1:].to(self.first.device)  # run r ends before window cum[r + 1]
        self._cum = self.cum.to(self.first.device)
        # as Python ints, read once here: the training step never reads a tensor value for them
        self.counts: list[int] = self.count.tolist()
        self._windows = sum(self.counts)

    def __len__(self) -> int:
        return self._windows

    def runs_of(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(run, start offset into the token tensor) of each window in `index` (on the device)."""
        run = torch.searchsorted(self._ends, index, right=True)
        return run, self.first[run] + (index - self._cum[run]) * self.stride

    @property
    def starts(self) -> torch.Tensor:
        """(W,) every window's start: O(W), for inspection and tests."""
        return self.runs_of(torch.arange(len(self), device=self.first.device))[1]

    @property
    def positions(self) -> torch.Tensor:
        """(W,) each window's index among its asset's windows, on the CPU: O(W), for inspection."""
        index = torch.arange(len(self))
        return index - self.cum[torch.searchsorted(self.cum[1:], index, right=True)]

    def with_offset(self, k: int, offset: int) -> torch.Tensor:
        """The windows whose position p in their run has p % k == offset, ascending (CPU)."""
        starts = [0, *itertools.accumulate(self.counts)]
        # a run with fewer windows than the offset takes none (arange would refuse start > end)
        parts = [torch.arange(starts[r] + min(offset, c), starts[r] + c, k) for r, c in enumerate(self.counts)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


class TokenWindows:
    """The in-memory token set of one run and its per-split windows."""

    def __init__(
        self,
        tokens: torch.Tensor,
        splits: Mapping[str, SplitWindows],
        context_length: int,
        epoch_stride: int = 1,
        features: Optional[torch.Tensor] = None,
    ) -> None:
        self.tokens = tokens
        self.features = features  # (N, 3) ids aligned with tokens, when the model reads them
        self.splits = dict(splits)
        self.context_length = context_length
        self.epoch_stride = epoch_stride  # training epochs take every k-th window of an asset
        # (T + 1,) offsets of a window's tokens from its start, built once
        self._offsets = torch.arange(context_length + 1, device=tokens.device)

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def num_windows(self, split: str) -> int:
        return len(self.splits[split])

    def epoch_windows(self, split: str) -> int:
        """Windows in one shuffled epoch of `split`: all of them, or with an epoch stride k the
        fewest any offset selects (every epoch the same length, so steps per epoch are fixed)."""
        w, k = self.splits[split], self.epoch_stride
        if k == 1:
            return len(w)
        # a run of c windows has ceil((c - o) / k) at positions o, o + k, ... (none when o >= c)
        return min(sum(max(0, -(-(c - o) // k)) for c in w.counts) for o in range(k))

    def num_batches(
        self, split: str, batch_size: int, world_size: int = 1, drop_last: bool = False, shuffle: bool = False
    ) -> int:
        """Global batches (batch_size x world_size windows) in one pass over `split`: the
        batches each rank takes a slice of. The last incomplete one counts unless drop_last.
        shuffle: a training epoch's pass (see epoch_windows)."""
        n = self.epoch_windows(split) if shuffle else self.num_windows(split)
        size = batch_size * world_size
        return n // size if drop_last else -(-n // size)

    def epoch_order(self, split: str, seed: int, epoch: int, method: str = EPOCH_ORDER) -> torch.Tensor:
        """The whole order of one training epoch (see epoch_lookup), materialised: O(windows),
        for inspection and tests; `batches` computes only the slices it needs."""
        return self.epoch_lookup(split, seed, epoch, method)(torch.arange(self.epoch_windows(split)))

    def epoch_lookup(
        self, split: str, seed: int, epoch: int, method: str = EPOCH_ORDER
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """positions -> window ids of one training epoch, whose order depends only on (seed, epoch)
        and `method` (EPOCH_ORDERS): a permutation of all windows, or with an epoch stride k the
        first epoch_windows of a permutation of one offset's every k-th window. Computed on the
        CPU (the same on any device); "feistel" costs O(positions asked), "randperm" O(windows)."""
        w, k = self.splits[split], self.epoch_stride
        if method == "randperm":
            order = self._randperm_order(split, seed, epoch)
            return lambda positions: order[positions]
        if method != "feistel":
            raise ValueError(f"unknown epoch order {method!r}; one of {EPOCH_ORDERS}")
        keys = round_keys(seed, epoch)
        if k == 1:
            n = self.num_windows(split)
            return lambda positions: feistel_permute(positions, n, keys, check=False)  # epoch positions
        # the i-th chosen window (ascending, as with_offset lists them) from a few numbers per run
        offset = cycle_offset(seed, epoch, k)
        chosen = torch.clamp((w.count - offset + k - 1) // k, min=0)  # (R,) windows taken per run
        ends = torch.cumsum(chosen, 0)
        firsts = w.cum[:-1] + offset  # the run's first chosen window id
        total = sum(max(0, -(-(c - offset) // k)) for c in w.counts)  # Python ints: no tensor read

        def lookup(positions: torch.Tensor) -> torch.Tensor:
            i = feistel_permute(positions, total, keys, check=False)  # epoch positions
            run = torch.searchsorted(ends, i, right=True)
            return firsts[run] + (i - (ends[run] - chosen[run])) * k

        return lookup

    def _randperm_order(self, split: str, seed: int, epoch: int) -> torch.Tensor:
        """The materialised order of the runs made before EPOCH_ORDER "feistel", kept exactly."""
        g = torch.Generator().manual_seed(mix_seed(seed, epoch))
        w, k = self.splits[split], self.epoch_stride
        if k == 1:
            return randperm_order(self.num_windows(split), g)  # on the CPU: same on any device
        chosen = w.with_offset(k, cycle_offset(seed, epoch, k))
        return chosen[randperm_order(len(chosen), g)][: self.epoch_windows(split)]

    def gather(self, split: str, index: torch.Tensor) -> Batch:
        """The windows at `index` (positions in the split's arrays) as one batch."""
        w = self.splits[split]
        index = index.long()  # an epoch order is int32 (_randperm)
        if self.device.type == "cuda" and not index.is_cuda:
            # pinned, or the copy from pageable memory waits for the device (a sync every step)
            index = index.pin_memory()
        index = index.to(self.device, non_blocking=True)
        run, starts = w.runs_of(index)  # (B,), (B,)
        chunk = self.tokens[starts[:, None] + self._offsets].long()  # (B, T + 1): the one gather
        features = None if self.features is None else self.features[starts[:, None] + self._offsets[:-1]].long()
        y = chunk[:, 1:]
        if w.target_begin is not None:  # targets in the purge gap before the split: context only
            before = (starts[:, None] + self._offsets[1:]) < w.target_begin[run][:, None]
            y = y.masked_fill(before, PAD_TOKEN)
        return Batch(
            x=chunk[:, :-1],
            y=y,
            asset_ids=w.asset_ids[run],
            category_ids=w.category_ids[run],
            features=features,
            interval_ids=None if w.interval_ids is None else w.interval_ids[run],
        )

    def batches(
        self,
        split: str,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        start: int = 0,
        limit: int | None = None,
        drop_last: bool = False,
        order: str = EPOCH_ORDER,
    ) -> Iterator[Batch]:
        """This rank's slices of the global batches of one pass over `split`, from the
        `start`-th global batch on.

        shuffle=False walks the windows in order (evaluation). `limit` caps the global batches
        (counted from 0, so a resumed pass with the same limit ends where the first would have).
        Without drop_last, a rank whose slice of the last batch is empty skips it. The batches
        are gathered CHUNK_TOKENS at a time and handed out as views of that chunk. order: the
        epoch order's method (EPOCH_ORDERS), the one the run was started with.
        """
        for index, sizes in self.batch_indices(
            split,
            batch_size,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            start=start,
            limit=limit,
            drop_last=drop_last,
            order=order,
        ):
            yield from self.gather(split, index).split(sizes)

    def batch_indices(
        self,
        split: str,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        start: int = 0,
        limit: int | None = None,
        drop_last: bool = False,
        order: str = EPOCH_ORDER,
    ) -> Iterator[tuple[torch.Tensor, list[int]]]:
        """What `batches` gathers, a chunk at a time: (window ids on the CPU, the sizes of the
        rank's non-empty batches in them). Only the chunk's positions of the order are computed."""
        n = self.num_batches(split, batch_size, world_size, drop_last, shuffle=shuffle)
        if limit is not None:
            n = min(n, limit)
        length = self.epoch_windows(split) if shuffle else self.num_windows(split)
        lookup = self.epoch_lookup(split, seed, epoch, order) if shuffle else None
        per_chunk = max(1, CHUNK_TOKENS // (batch_size * (self.context_length + 1)))
        for c in range(start, n, per_chunk):
            firsts = [(i * world_size + rank) * batch_size for i in range(c, min(c + per_chunk, n))]
            # rank r: slice r of global batch i, i.e. positions [f, f + batch_size) of the order
            spans = [(f, min(f + batch_size, length)) for f in firsts]
            sizes = [b - a for a, b in spans if b > a]
            if not sizes:
                continue
            positions = (torch.tensor(firsts)[:, None] + torch.arange(batch_size)).flatten()
            positions = positions[positions < length]  # the spans, end to end
            yield (positions if lookup is None else lookup(positions)), sizes


def _split_windows(
    split: str, runs: Sequence[tuple[int, ...]], stride: int, device: torch.device | str, with_intervals: bool
) -> SplitWindows:
    """One split's SplitWindows from its runs (first, count, asset, category, interval, first target)."""
    first, counts, a, c, k, b = (torch.tensor([r[i] for r in runs], dtype=torch.int64) for i in range(6))
    return SplitWindows(
        first.to(device),
        counts,
        stride,
        a.to(device),
        c.to(device),
        k.to(device) if with_intervals else None,
        None if split == "train" else b.to(device),  # val and test mask their targets before the split
    )


def build_windows(
    tokens: Mapping[str, np.ndarray],
    ranges: Mapping[str, Mapping[str, Sequence[int]]],
    asset_ids: Mapping[str, int],
    category_ids: Mapping[str, int],
    context_length: int,
    *,
    strides: Mapping[str, int],
    device: torch.device | str = "cpu",
    epoch_stride: int = 1,
    features: Optional[Mapping[str, np.ndarray]] = None,
    flat: Optional[tuple[np.ndarray, Optional[np.ndarray]]] = None,
    interval_ids: Optional[Mapping[str, int]] = None,
) -> TokenWindows:
    """Concatenate every asset's tokens and cut each split's windows.

    tokens: symbol -> 1-D token array of the asset's whole cleaned series;
    ranges: symbol -> {"train": (begin, end), "val": ..., "test": ...} candle index ranges
    (end exclusive) into that series; asset_ids / category_ids: symbol -> id;
    strides: split -> start-to-start distance of that split's windows; epoch_stride: a training
    epoch's distance between the windows it takes (see the module docstring); features: symbol ->
    (len(tokens), 3) per-candle ids (model.time_features / volume_input), concatenated alike so
    a window's features line up with its tokens; flat: (tokens, features) already end to end
    in the order of `tokens` (TokenSet.flat: the memory maps of a token folder), used as they are;
    interval_ids: symbol -> interval id, for a run of several intervals (every window is one
    series, so one interval); None: the batches carry none.
    """
    parts, feature_parts, offset = [], [], 0
    # (first, count, asset, category, interval, first target)
    runs: dict[str, list[tuple[int, ...]]] = {s: [] for s in SPLITS}
    for symbol, toks in tokens.items():
        toks = np.asarray(toks)
        if toks.ndim != 1:
            raise ValueError(f"{symbol}: token array must be 1-D, got shape {toks.shape}")
        ids = (asset_ids[symbol], category_ids[symbol], interval_ids[symbol] if interval_ids is not None else 0)
        for split, (start, count, begin) in asset_runs(
            symbol, len(toks), ranges.get(symbol, {}), context_length, strides
        ):
            runs[split].append((offset + start, count, *ids, offset + begin))
        if features is not None and len(features[symbol]) != len(toks):
            raise ValueError(f"{symbol}: {len(features[symbol])} feature rows for {len(toks)} tokens")
        if flat is None:
            parts.append(toks.astype(np.int16, copy=False))
            if features is not None:
                feature_parts.append(np.asarray(features[symbol], dtype=np.int16))
        offset += len(toks)
    if not tokens:
        raise UserError("no assets to train on: every asset was dropped while preparing the data")
    splits = {
        split: _split_windows(split, runs[split], strides[split], device, interval_ids is not None) for split in SPLITS
    }
    _require_windows(splits, context_length)  # fail now rather than after days of training
    if flat is None:
        flat = np.concatenate(parts), (np.concatenate(feature_parts) if features is not None else None)
    all_tokens, all_features = flat
    if len(all_tokens) != offset:
        raise ValueError(f"flat tokens hold {len(all_tokens)} candles, the assets {offset}")
    stacked = torch.from_numpy(all_features).to(device) if features is not None else None
    return TokenWindows(torch.from_numpy(all_tokens).to(device), splits, context_length, epoch_stride, stacked)


def _require_windows(splits: Mapping[str, SplitWindows], context_length: int) -> None:
    """Raise a UserError naming the first split that got no window at all."""
    for split in SPLITS:
        if len(splits[split]) == 0:
            need = f"{context_length + 1} tokens" if split == "train" else "a token after its purge gap"
            raise UserError(
                f"no {split} windows: no asset's {split} range holds {need}; "
                f"lower model.context_length or use longer histories"
            )
