"""The order a training epoch visits its windows in, keyed by (seed, epoch).

"feistel" (new runs): a pseudo-random permutation generated on demand, a Feistel network with
cycle walking (feistel_permute) mapping each position of the epoch to its window, so a chunk of
batches computes only its own positions (memory O(chunk), not O(windows), in every rank), the
same on any device. "randperm": a materialised torch.randperm from a generator seeded with
(seed, epoch), the order of every run made before "feistel", which their checkpoints resume
with (the Trainer's state records which). With an epoch stride k, cycle_offset draws the
offset each epoch takes, each once per cycle of k epochs. common.training.batches uses these.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from common.errors import UserError

__all__ = [
    "EPOCH_ORDER",
    "EPOCH_ORDERS",
    "checkpoint_epoch_order",
    "cycle_offset",
    "feistel_permute",
    "mix_seed",
    "randperm_order",
    "round_keys",
]

# How a training epoch orders its windows. "feistel": computed for the positions a chunk needs
# (memory O(chunk)); "randperm": a materialised permutation (4 bytes a window in every rank), the
# order of every run made before "feistel", which their checkpoints resume with (Trainer state).
EPOCH_ORDERS = ("randperm", "feistel")
EPOCH_ORDER = "feistel"  # what new runs use
_FEISTEL_ROUNDS = 6


def randperm_order(n: int, g: torch.Generator) -> torch.Tensor:
    """torch.randperm(n) in int32 where it fits: the same permutation as int64 from the same
    generator, at half the memory (an epoch of 10^8 windows: 400 MB instead of 800 MB, per rank)."""
    return torch.randperm(n, generator=g, dtype=torch.int32 if n < 2**31 else torch.int64)


def cycle_offset(seed: int, epoch: int, k: int) -> int:
    """The offset epoch `epoch` takes: the k epochs of a cycle take the k offsets in a random
    order, so a cycle reaches every window once."""
    cycle = torch.Generator().manual_seed(mix_seed(seed, epoch // k) ^ 0x5DEECE66D)
    return int(torch.randperm(k, generator=cycle)[epoch % k])


def round_keys(seed: int, epoch: int) -> list[int]:
    """The Feistel round keys of (seed, epoch): 32 bits each from a cryptographic hash, so they
    are the same on every platform and Python, and near epochs get unrelated keys."""
    digest = hashlib.blake2b(f"epoch-order:{seed}:{epoch}".encode(), digest_size=4 * _FEISTEL_ROUNDS).digest()
    return [int.from_bytes(digest[4 * r : 4 * r + 4], "little") for r in range(_FEISTEL_ROUNDS)]


def _round(right: torch.Tensor, key: int, bits: int) -> torch.Tensor:
    """A Feistel round function: the top `bits` of a 32-bit multiplicative hash of right ^ key
    (the top bits of a product depend on every bit of the input). In place where it can: a
    chunk's order is dozens of these over a few thousand positions. No product reaches 2**63
    (operand < 2**32, multiplier < 2**31): int64 never overflows, on any device."""
    return (right ^ key).mul_(0x2C1B3C6D).bitwise_and_(0xFFFFFFFF).bitwise_right_shift_(32 - bits)


def feistel_permute(positions: torch.Tensor, n: int, keys: Sequence[int], check: bool = True) -> torch.Tensor:
    """A pseudo-random bijection of [0, n), keyed by `keys`, at `positions` (int64, same shape).

    A Feistel network permutes [0, 2**b), the smallest power of 2 >= n: each round splits a
    value into a high and a low part, xors the high part with a hash of the low part and the
    round's key, and swaps the parts (so the widths alternate when b is odd); each round is
    invertible, so the network is a bijection. A value that lands at n or beyond is walked on
    through the same network until it falls inside (cycle walking): following the network's
    cycles from inside [0, n) back into it is a permutation of [0, n), and since 2**b < 2n a
    value needs fewer than 2 passes on average. Vectorised: O(len(positions)). check=False: the
    caller knows the positions lie in [0, n) (an epoch's own ranges), so no tensor value is read
    (the training step reads none)."""
    if n < 0 or n > 1 << 62:
        raise ValueError(f"cannot permute {n} positions")
    x = positions.long()
    if check and len(x) and (int(x.min()) < 0 or int(x.max()) >= n):  # a walk from outside might never end
        raise ValueError(f"positions outside [0, {n})")
    if n <= 1:
        return x.clone()
    bits = (n - 1).bit_length()

    def network(v: torch.Tensor) -> torch.Tensor:
        high = bits - bits // 2
        for key in keys:
            low = bits - high
            left = v >> low
            right = v & ((1 << low) - 1)
            left.bitwise_xor_(_round(right, key, high))
            v = right.bitwise_left_shift_(high).bitwise_or_(left)
            high = low
        return v

    x = network(x)
    outside = (x >= n).nonzero().squeeze(1)
    while len(outside):
        x[outside] = network(x[outside])
        outside = outside[x[outside] >= n]
    return x


def mix_seed(seed: int, epoch: int) -> int:
    # distinct (seed, epoch) pairs give distinct generator seeds; the multiplier is a large odd constant
    return (seed * 1_000_003 + epoch) % (2**63 - 1)


def checkpoint_epoch_order(state: dict) -> str:
    """The epoch order a checkpoint's run draws its epochs with: every run before the generated
    order drew them with torch.randperm and goes on with it; an unknown one is a UserError."""
    order = state.get("epoch_order", "randperm")
    if order not in EPOCH_ORDERS:
        raise UserError(
            f"the checkpoint's epoch order {order!r} is unknown to this version ({', '.join(EPOCH_ORDERS)}); "
            "resume it with the version that wrote it"
        )
    return str(order)
