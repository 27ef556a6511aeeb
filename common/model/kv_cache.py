"""The key/value caches sampling decodes with: prefill a context once, then one token per step.

Each step's attention reads the keys and values of the earlier tokens from a cache instead of
recomputing them. `MarketGPT.new_cache` makes a KVCache (one LayerKV per block);
`KVCache.shared` turns a prefilled one into a cache whose samples share their context's prefix
(SharedPrefixKV). `CausalSelfAttention` calls `append` (prefill) and `attend` (decode step).

Shapes: B rows (sequences), nh heads, hs head size, L cached positions.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import torch

__all__ = ["AppendableCache", "KVCache", "LayerCache", "LayerKV", "SharedPrefixKV", "decode_attention"]


class LayerCache(Protocol):
    """One layer's cache as attention and KVCache use it: LayerKV, SharedPrefixKV, or an export's
    traced stand-ins (common.forecasting.export)."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int: ...

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class AppendableCache(LayerCache, Protocol):
    """A layer cache a prefill writes into (`append`): LayerKV, or an export's."""

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query token's attention (B, nh, 1, hs) over keys and values (B, nh, L, hs). No mask
    (it sees every cached key); two plain matmuls, as SDPA's CPU flash kernel is about 2x slower
    at query length 1."""
    return (q @ k.transpose(-2, -1) * (1.0 / math.sqrt(k.size(-1)))).softmax(dim=-1) @ v


class LayerKV:
    """One layer's cached keys and values, (B, nh, capacity, hs) each, filled up to `length`."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, length: int = 0) -> None:
        self.k, self.v, self.length = k, v, length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, nh, T, hs) new keys and values; return all of them so far."""
        end = self.length + k.size(2)
        if self.length and k.size(2) != 1:
            raise ValueError("a filled cache takes one token per step (prefill an empty cache instead)")
        if end > self.k.size(2):
            raise ValueError(f"KV cache holds {self.k.size(2)} positions; {end} requested")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """A decode step: store one token's k, v (B, nh, 1, hs); q's attention over every key so
        far, (B, nh, 1, hs)."""
        return decode_attention(q, *self.append(k, v))


class SharedPrefixKV:
    """A decode cache for `group` samples of each of n contexts that share one prefilled prefix.

    The prefix's keys and values are kept once per context, not copied to each of its samples,
    and a step's attention over them is one matrix product per context (the group's queries
    against the same keys) instead of `group` matrix-vector products; each sample's own tokens
    go to a small per-row LayerKV. The softmax runs over prefix and own keys together, so this is
    the same attention as a LayerKV holding prefix + own tokens, up to float rounding. Rows are
    context-major: row i * group + j is sample j of context i.
    """

    def __init__(self, prefix_k: torch.Tensor, prefix_v: torch.Tensor, group: int, capacity: int) -> None:
        n, nh, _, hs = prefix_k.shape  # (n, nh, P, hs)
        self.k, self.v, self.group = prefix_k, prefix_v, group
        self.own: AppendableCache = LayerKV(
            prefix_k.new_empty((n * group, nh, capacity, hs)), prefix_v.new_empty((n * group, nh, capacity, hs))
        )

    @property
    def length(self) -> int:
        return self.k.size(2) + self.own.length

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        own_k, own_v = self.own.append(k, v)  # (B, nh, L, hs)
        n, nh, P, hs = self.k.shape
        B, scale = q.size(0), 1.0 / math.sqrt(hs)
        # -1 for the group: an exported graph (common.forecasting.export) reads it from the shapes
        grouped = q.reshape(n, -1, nh, hs).transpose(1, 2)  # (n, nh, group, hs)
        shared = (grouped @ self.k.transpose(-2, -1) * scale).transpose(1, 2).reshape(B, nh, 1, P)
        w = torch.cat((shared, q @ own_k.transpose(-2, -1) * scale), dim=-1).softmax(dim=-1)  # (B, nh, 1, P + L)
        from_prefix = w[..., :P].reshape(n, -1, nh, P).transpose(1, 2) @ self.v  # (n, nh, group, hs)
        return from_prefix.transpose(1, 2).reshape(B, nh, 1, hs) + w[..., P:] @ own_v


class KVCache:
    """Every layer's LayerKV for a batch of B sequences; `MarketGPT.new_cache` makes one."""

    def __init__(self, layers: Sequence[LayerCache]) -> None:
        self.layers = layers

    @property
    def length(self) -> int:
        """Tokens cached so far: the position the next token takes."""
        return self.layers[0].length

    def shared(self, first: int, end: int, group: int, capacity: int) -> "KVCache":
        """A decode cache for `group` samples of each prefilled context first..end-1 (rows of this
        cache), sharing their prefix (SharedPrefixKV, no copy); `capacity` own tokens per sample."""
        return KVCache(
            [
                SharedPrefixKV(
                    layer.k[first:end, :, : layer.length], layer.v[first:end, :, : layer.length], group, capacity
                )
                for layer in self.layers
            ]
        )
