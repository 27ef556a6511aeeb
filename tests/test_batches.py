"""In-memory token windows: boundaries, ids, epoch order, DDP sharding, resume offsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from common.errors import UserError
from common.special_tokens import PAD_TOKEN
from common.training import epoch_order
from common.training.batches import build_windows
from common.training.window_index import SPLITS, window_starts

T = 8  # context length in these tests


def _token_set(lengths: dict[str, int], seed: int = 0):
    """Distinct token values per asset (asset i uses 10*i + small), split 60/20/20 with no purge."""
    rng = np.random.default_rng(seed)
    tokens, ranges = {}, {}
    for i, (symbol, n) in enumerate(lengths.items()):
        tokens[symbol] = (rng.integers(3, 60, size=n) + 100 * (i + 1)).astype(np.int16)
        a, b = int(n * 0.6), int(n * 0.8)
        ranges[symbol] = {"train": (0, a), "val": (a, b), "test": (b, n)}
    ids = {s: i for i, s in enumerate(lengths)}
    cats = {s: i % 2 for i, s in enumerate(lengths)}
    return tokens, ranges, ids, cats


def _build(lengths=None, stride=1, **kw):
    tokens, ranges, ids, cats = _token_set(lengths or {"A": 200, "B": 120, "C": 90})
    w = build_windows(tokens, ranges, ids, cats, T, strides={"train": stride, "val": T, "test": T}, **kw)
    return w, tokens, ranges, ids, cats


def test_window_starts_stay_inside_the_range():
    assert window_starts(10, 20, 5, 1).tolist() == [10, 11, 12, 13, 14, 15]
    assert window_starts(10, 20, 5, 3).tolist() == [10, 13]
    assert window_starts(10, 14, 5, 1).tolist() == []  # shorter than one window
    assert window_starts(10, 15, 5, 1).tolist() == [10]


def test_every_window_lies_in_one_assets_split_and_carries_its_ids():
    w, tokens, ranges, ids, cats = _build()
    owner_of = {}  # global offset -> (symbol, local index)
    offset = 0
    for symbol, toks in tokens.items():
        for i in range(len(toks)):
            owner_of[offset + i] = (symbol, i)
        offset += len(toks)
    for split in SPLITS:
        sw = w.splits[split]
        assert len(sw) > 0
        batch = w.gather(split, torch.arange(len(sw)))
        assert batch.x.shape == batch.y.shape == (len(sw), T)
        assert torch.equal(batch.x[:, 1:], batch.y[:, :-1])  # y is x shifted by one
        for k, start in enumerate(sw.starts.tolist()):
            symbol, first = owner_of[start]
            begin, end = ranges[symbol][split]
            assert begin <= first and first + T + 1 <= end
            assert batch.asset_ids[k].item() == ids[symbol]
            assert batch.category_ids[k].item() == cats[symbol]
            expected = tokens[symbol][first : first + T + 1].astype(np.int64)
            assert torch.equal(torch.cat([batch.x[k], batch.y[k, -1:]]), torch.from_numpy(expected))
    assert not (w.tokens == PAD_TOKEN).any()


@given(n=st.integers(0, 80), stride=st.integers(1, 5), begin=st.integers(0, 20))
def test_window_count_matches_the_formula(n, stride, begin):
    toks = {"A": np.arange(begin + n + T + 1) % 50 + 3}
    ranges = {"A": {"train": (begin, begin + n), "val": (0, T + 1), "test": (0, T + 1)}}
    if n < T + 1:
        with pytest.raises(UserError, match="no train windows"):
            build_windows(toks, ranges, {"A": 0}, {"A": 0}, T, strides={"train": stride, "val": 1, "test": 1})
        return
    w = build_windows(toks, ranges, {"A": 0}, {"A": 0}, T, strides={"train": stride, "val": 1, "test": 1})
    assert w.num_windows("train") == (n - (T + 1)) // stride + 1


def test_split_without_windows_is_a_user_error():
    tokens, ranges, ids, cats = _token_set({"A": 100})
    ranges["A"]["val"] = (60, 95)
    ranges["A"]["test"] = (95, 100)  # 5 tokens < T + 1, and no gap before them to read context from
    with pytest.raises(UserError, match="no test windows"):
        build_windows(tokens, ranges, ids, cats, T, strides={"train": 1, "val": 1, "test": 1})
    ranges["A"]["test"] = (100, 100)
    with pytest.raises(UserError, match="no test windows"):
        build_windows(tokens, ranges, ids, cats, T, strides={"train": 1, "val": 1, "test": 1})


@pytest.mark.parametrize("val_end", [121, 125, 128, 141])
def test_val_and_test_windows_read_their_context_from_the_purge_gap(val_end):
    """A val split shorter than a window still has every candle a target exactly once: its
    windows reach back into the purge gap (untrained candles) for context, and the gap's own
    targets are PAD. No window reads a training token."""
    toks = {"A": (np.arange(200) % 50 + 3).astype(np.int16)}
    toks["A"][:100] = 60  # the training tokens, recognisable
    ranges = {"A": {"train": (0, 100), "val": (120, val_end), "test": (160, 163)}}  # purge gaps 20 >= T
    w = build_windows(toks, ranges, {"A": 0}, {"A": 0}, T, strides={"train": 1, "val": T, "test": T})
    for split, (begin, end) in (("val", (120, val_end)), ("test", (160, 163))):
        sw = w.splits[split]
        assert len(sw) == -(-(end - begin) // T)  # ceil: every candle once
        b = w.gather(split, torch.arange(len(sw)))
        assert (b.x != 60).all()  # nothing from the train split
        targets = b.y[b.y != PAD_TOKEN]
        assert torch.equal(targets, torch.from_numpy(toks["A"][begin:end].astype(np.int64)))
        assert int(sw.starts.min()) >= begin - T


def test_epoch_order_depends_only_on_seed_and_epoch():
    w, *_ = _build()
    a = w.epoch_order("train", seed=7, epoch=3)
    assert torch.equal(a, w.epoch_order("train", seed=7, epoch=3))
    assert not torch.equal(a, w.epoch_order("train", seed=7, epoch=4))
    assert not torch.equal(a, w.epoch_order("train", seed=8, epoch=3))
    assert sorted(a.tolist()) == list(range(w.num_windows("train")))


def test_the_randperm_order_is_int32_and_the_permutation_runs_before_it_resume_with():
    """Half the memory of an int64 order (10^8 windows: 400 MB a rank), and the very order an
    int64 randperm gives, so a run checkpointed mid-epoch before resumes on the same windows."""

    w, *_ = _build()
    for epoch in range(3):
        order = w.epoch_order("train", seed=7, epoch=epoch, method="randperm")
        g = torch.Generator().manual_seed(epoch_order.mix_seed(7, epoch))
        assert order.dtype == torch.int32
        assert torch.equal(order.long(), torch.randperm(w.num_windows("train"), generator=g))
    big = torch.Generator().manual_seed(1)
    assert torch.equal(
        epoch_order.randperm_order(3_000_000, big).long(),
        torch.randperm(3_000_000, generator=torch.Generator().manual_seed(1)),
    )


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_batches_together_are_one_process_with_the_combined_batch(world):
    # DDP equivalence: at every step, the union of the ranks' batches is exactly the batch one
    # process with batch_size x world_size trains on, and no window is seen twice.
    w, *_ = _build()
    B = 5
    kw = dict(shuffle=True, seed=1, epoch=0, drop_last=True)
    single = list(w.batches("train", B * world, **kw))
    per_rank = [list(w.batches("train", B, rank=r, world_size=world, **kw)) for r in range(world)]
    n = w.num_batches("train", B, world, drop_last=True)
    assert n == w.num_windows("train") // (B * world) == len(single)
    assert all(len(batches) == n for batches in per_rank)
    order = w.epoch_order("train", seed=1, epoch=0)
    for i in range(n):
        assert all(per_rank[r][i].x.shape[0] == B for r in range(world))
        union = torch.cat([per_rank[r][i].x for r in range(world)])
        assert torch.equal(union, single[i].x)
        assert torch.equal(union, w.gather("train", order[i * B * world : (i + 1) * B * world]).x)
    starts = torch.cat([w.splits["train"].starts[order[i * B * world : (i + 1) * B * world]] for i in range(n)])
    assert len(set(starts.tolist())) == n * B * world  # disjoint


def test_sharded_evaluation_covers_every_window_once_with_uneven_last_slices():
    w, *_ = _build()
    B, world = 4, 3
    n = w.num_batches("val", B, world)
    assert n == -(-w.num_windows("val") // (B * world))
    per_rank = [list(w.batches("val", B, shuffle=False, rank=r, world_size=world)) for r in range(world)]
    seen = torch.cat([per_rank[r][i].x[:, 0] for i in range(n) for r in range(world) if i < len(per_rank[r])])
    first = w.gather("val", torch.arange(w.num_windows("val"))).x[:, 0]
    assert torch.equal(seen, first)  # every window once, in order
    assert all(b.x.shape[0] > 0 for batches in per_rank for b in batches)  # empty slices are skipped


def test_training_drops_only_the_last_incomplete_global_batch():
    w, *_ = _build()
    N = w.num_windows("train")
    B = 7
    assert N % (2 * B)  # this token set leaves a remainder
    assert w.num_batches("train", B, 2, drop_last=True) == N // (2 * B)
    assert w.num_batches("train", B, 2) == N // (2 * B) + 1
    assert len(list(w.batches("train", B, shuffle=True, drop_last=True))) == N // B


def test_starting_mid_pass_continues_the_same_sequence():
    w, *_ = _build()
    kw = dict(shuffle=True, seed=3, epoch=2, limit=9)
    whole = list(w.batches("train", 4, **kw))
    tail = list(w.batches("train", 4, start=5, **kw))
    assert len(whole) == 9 and len(tail) == 4
    for a, b in zip(whole[5:], tail):
        assert torch.equal(a.x, b.x) and torch.equal(a.asset_ids, b.asset_ids)


def test_unshuffled_pass_covers_every_window_once_with_a_partial_last_batch():
    w, *_ = _build()
    seen = torch.cat([b.x[:, 0] for b in w.batches("val", 3, shuffle=False)])
    assert len(seen) == w.num_windows("val")
    first = w.gather("val", torch.arange(w.num_windows("val"))).x[:, 0]
    assert torch.equal(seen, first)


@pytest.mark.parametrize("chunk_batches", [1, 2, 3])
def test_batches_gathered_a_chunk_at_a_time_equal_one_gather_each(monkeypatch, chunk_batches):
    # the loader gathers CHUNK_TOKENS at a time and hands out views: the same batches, ids and all
    import common.training.batches as batches_module

    w, *_ = _build()
    B, world, rank = 4, 2, 1
    monkeypatch.setattr(batches_module, "CHUNK_TOKENS", chunk_batches * B * (T + 1))
    order = w.epoch_order("train", seed=5, epoch=1)
    got = list(
        w.batches("train", B, shuffle=True, seed=5, epoch=1, rank=rank, world_size=world, drop_last=True, start=3)
    )
    n = w.num_batches("train", B, world, drop_last=True)
    assert len(got) == n - 3
    for i, b in zip(range(3, n), got):
        want = w.gather("train", order[(i * world + rank) * B :][:B])
        for field in ("x", "y", "asset_ids", "category_ids"):
            assert torch.equal(getattr(b, field), getattr(want, field))
    # evaluation: uneven last slices, empty ones skipped, every window once
    per_rank = [list(w.batches("val", 3, shuffle=False, rank=r, world_size=world)) for r in range(world)]
    seen = sorted(int(s) for batches in per_rank for b in batches for s in b.x[:, 0])
    assert seen == sorted(w.gather("val", torch.arange(w.num_windows("val"))).x[:, 0].tolist())
    assert all(len(b.x) for batches in per_rank for b in batches)


def _counted(counts: list[int], k: int):
    """Windows whose training runs hold exactly `counts` windows (one asset each), epoch stride k."""
    tokens, ranges = {}, {}
    for i, c in enumerate(counts):
        n = c + T + 2 * (T + 1)  # c training windows, then one val and one test window
        tokens[f"S{i}"] = np.arange(n) % 50 + 3
        ranges[f"S{i}"] = {"train": (0, c + T), "val": (c + T, c + 2 * T + 1), "test": (c + 2 * T + 1, n)}
    ids = {s: i for i, s in enumerate(tokens)}
    return build_windows(tokens, ranges, ids, ids, T, strides={"train": 1, "val": 1, "test": 1}, epoch_stride=k)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 97, 256, 257, 1000])
def test_feistel_permute_is_a_bijection_for_awkward_sizes(n):
    from common.training.epoch_order import feistel_permute, round_keys

    for epoch in range(3):
        assert sorted(feistel_permute(torch.arange(n), n, round_keys(11, epoch)).tolist()) == list(range(n))


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("counts", [[1], [2], [3], [97], [64], [65], [5, 1, 64, 97], [5, 4, 64, 97]], ids=str)
def test_a_generated_epoch_takes_each_window_once_and_the_same_set_as_randperm(counts, k):
    w = _counted(counts, k)
    if sum(counts) < k:  # fewer windows than the stride: some offset has none, so every epoch is empty
        assert w.epoch_windows("train") == 0 and len(w.epoch_order("train", seed=4, epoch=0)) == 0
        return
    assert w.num_windows("train") == sum(counts)
    pos = w.splits["train"].positions
    for epoch in range(2 * k):  # a whole cycle of offsets, and the next
        new = w.epoch_order("train", seed=4, epoch=epoch)
        assert len(new) == len(set(new.tolist())) == w.epoch_windows("train")
        if k == 1:
            assert sorted(new.tolist()) == list(range(w.num_windows("train")))
            continue
        # a permutation of the chosen offset's windows (the list the randperm order takes from),
        # cut to epoch_windows; an asset with fewer than k windows has none at some offsets
        offset = int(pos[new[0]]) % k
        chosen = (pos % k == offset).nonzero().squeeze(1)
        full = w.epoch_lookup("train", 4, epoch)(torch.arange(len(chosen)))
        assert sorted(full.tolist()) == chosen.tolist() and torch.equal(full[: len(new)], new)
        if min(counts) >= k:  # (the randperm order cannot list the offsets of a shorter asset)
            old = w.epoch_order("train", seed=4, epoch=epoch, method="randperm")
            assert set(old.tolist()) <= set(chosen.tolist()) and len(old) == len(new)


def test_the_randperm_order_with_a_stride_is_the_one_runs_before_it_drew():
    """The old code's order, written out: a run checkpointed before resumes on the same windows."""

    w = _counted([40, 17, 33], 3)
    for epoch in range(4):
        cycle = torch.Generator().manual_seed(epoch_order.mix_seed(4, epoch // 3) ^ 0x5DEECE66D)
        offset = int(torch.randperm(3, generator=cycle)[epoch % 3])
        chosen = w.splits["train"].with_offset(3, offset)
        g = torch.Generator().manual_seed(epoch_order.mix_seed(4, epoch))
        want = chosen[torch.randperm(len(chosen), generator=g)][: w.epoch_windows("train")]
        assert torch.equal(w.epoch_order("train", seed=4, epoch=epoch, method="randperm").long(), want)
        # the generated order takes the same offset's windows, in another order
        new = w.epoch_order("train", seed=4, epoch=epoch)
        assert set(new.tolist()) <= set(chosen.tolist()) and len(new) == len(want)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("method", ["feistel", "randperm"])
def test_chunked_batch_indices_are_the_ranks_slices_of_the_whole_order(monkeypatch, k, method):
    import common.training.batches as batches_module

    w = _counted([130, 61, 97], k)
    B, world = 5, 3
    monkeypatch.setattr(batches_module, "CHUNK_TOKENS", 2 * B * (T + 1))  # 2 batches a chunk
    order = w.epoch_order("train", seed=9, epoch=5, method=method)
    n = w.num_batches("train", B, world, drop_last=True, shuffle=True)
    for rank in range(world):
        chunks = list(
            w.batch_indices(
                "train", B, shuffle=True, seed=9, epoch=5, rank=rank, world_size=world, drop_last=True, order=method
            )
        )
        assert len(chunks) == -(-n // 2) and all(sizes == [B] * len(sizes) for _, sizes in chunks)
        got = torch.cat([index.long() for index, _ in chunks])
        want = torch.cat([order[(i * world + rank) * B :][:B] for i in range(n)]).long()
        assert torch.equal(got, want)
        # from a mid-epoch start (a resume): the same tail
        tail = torch.cat(
            [
                i.long()
                for i, _ in w.batch_indices(
                    "train",
                    B,
                    shuffle=True,
                    seed=9,
                    epoch=5,
                    rank=rank,
                    world_size=world,
                    drop_last=True,
                    order=method,
                    start=3,
                )
            ]
        )
        assert torch.equal(tail, want[3 * B :])


def test_the_generated_order_looks_uniform():
    """Fixed seeds, tolerant bounds: the window at position 0 over 600 epochs falls in each tenth
    of [0, n) about equally often, and within one epoch position and window are uncorrelated."""
    w = _counted([1000, 237], 1)
    n = w.num_windows("train")
    lookup_first = [int(w.epoch_lookup("train", 1, e)(torch.zeros(1, dtype=torch.int64))) for e in range(600)]
    tenths = np.bincount(np.array(lookup_first) * 10 // n, minlength=10)
    assert tenths.min() >= 30 and tenths.max() <= 90, tenths  # 60 expected, sd ~7.3
    for epoch in range(3):
        order = w.epoch_order("train", seed=1, epoch=epoch).double()
        corr = np.corrcoef(np.arange(n), order.numpy())[0, 1]
        assert abs(corr) < 0.1, corr  # sd ~0.03 for a random permutation
        assert (order.diff().abs() == 1).float().mean() < 0.05  # not runs of neighbours


def test_an_asset_with_fewer_windows_than_the_offset_takes_none():
    from common.training.batches import SplitWindows

    w = SplitWindows(torch.tensor([0, 100]), torch.tensor([1, 10]), 1, torch.tensor([0, 1]), torch.tensor([0, 0]))
    assert w.with_offset(3, 2).tolist() == [3, 6, 9]  # run 0 (1 window) has no position 2; run 1's are 1 + 2, 5, 8
