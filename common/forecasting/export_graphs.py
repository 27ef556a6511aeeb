"""The graphs `marketgpt export` traces (common.forecasting.export): the next-token forward
(NextTokenLogits, pt2 and the plain ONNX), the prefill that also returns every layer's keys and
values (Prefill, model.onnx) and the one-token step on a shared prefix plus each sample's own
keys and values (Step, model_step.onnx: the KV cache common.forecasting.infer samples with), and
random inputs of the right shapes to trace and check them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, cast

import torch

from common.model.kv_cache import KVCache, SharedPrefixKV, decode_attention
from common.tokens.features import CALENDAR_B

if TYPE_CHECKING:
    from common.model.gpt import MarketGPT

__all__ = ["NextTokenLogits", "Prefill", "Step", "random_inputs", "step_input_names"]


class NextTokenLogits(torch.nn.Module):
    """The exported forward: (tokens (B, L), asset_ids (B,), category_ids (B,)[, features (B, L, F)])
    -> logits (B, V); features only for a model that reads candle ids (common/tokens/features.py)."""

    def __init__(self, model: "MarketGPT") -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        tokens: torch.Tensor,
        asset_ids: torch.Tensor,
        category_ids: torch.Tensor,
        features: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        return self.model(tokens, asset_ids, category_ids, last_only=True, features=features)[0][:, -1]


class _GrowingKV:
    """A layer's keys and values as plain tensors grown by concatenation: what a traced graph
    can take in and give back (common.model.kv_cache's LayerKV writes into a preallocated buffer)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    @property
    def length(self) -> int:
        return self.k.size(2)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k, self.v = torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2)
        return self.k, self.v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return decode_attention(q, *self.append(k, v))


class _GrowingCache(KVCache):
    """common.model.kv_cache.KVCache over _GrowingKV layers, for MarketGPT.forward."""

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([x.k for x in self.layers]), torch.stack([x.v for x in self.layers])


class Prefill(torch.nn.Module):
    """model.onnx: (tokens (B, L), asset_ids, category_ids[, features (B, L, F)]) -> the next
    token's logits (B, V) and every layer's keys and values (layers, B, heads, L, head size), to
    continue from."""

    def __init__(self, model: "MarketGPT") -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        tokens: torch.Tensor,
        asset_ids: torch.Tensor,
        category_ids: torch.Tensor,
        features: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.model.config
        empty = torch.zeros(tokens.size(0), c.num_heads, 0, c.d_model // c.num_heads)
        cache = _GrowingCache([_GrowingKV(empty, empty) for _ in self.model.blocks])
        logits = self.model(tokens, asset_ids, category_ids, last_only=True, cache=cache, features=features)[0][:, -1]
        return (logits, *cache.stacked())


class _OwnKV(_GrowingKV):
    """A sample's own keys and values in a step graph: what came in (B, nh, L, hs), plus the
    step's token, which is kept (`new`) to be given back alone."""

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.new = k, v
        return super().append(k, v)


class _SharedStepKV(SharedPrefixKV):
    """common.model.kv_cache.SharedPrefixKV over graph inputs: the contexts' prefix (n, nh, P, hs),
    shared by their samples, and each sample's own tokens so far, time-major (L, B, nh, hs) so
    that the sampler passes a contiguous slice of its buffer (no copy per step)."""

    def __init__(
        self, prefix_k: torch.Tensor, prefix_v: torch.Tensor, own_k: torch.Tensor, own_v: torch.Tensor
    ) -> None:
        # not super().__init__: it allocates a buffer for the own tokens, which here are an input
        self.k, self.v = prefix_k, prefix_v
        self.own = _OwnKV(own_k.permute(1, 2, 0, 3), own_v.permute(1, 2, 0, 3))


class Step(torch.nn.Module):
    """model_step.onnx: one more token per sample, its context's keys and values shared by all of
    the context's samples (as the torch sampler): (token (B, 1), asset_ids (B,), category_ids (B,),
    [features (B, 1, F): a model that reads candle ids,] prefix_k, prefix_v (layers, n, heads, P,
    head size), own_k_<i>, own_v_<i> (L, B, heads, head size) per layer i) -> logits (B, V),
    new_k, new_v (layers, B, heads, head size): the step token's. Rows are context-major (B = n x
    samples each); L >= 0 own tokens before this one."""

    def __init__(self, model: "MarketGPT") -> None:
        super().__init__()
        self.model = model

    def forward(
        self, token: torch.Tensor, asset_ids: torch.Tensor, category_ids: torch.Tensor, *rest: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = len(self.model.blocks)
        features = rest[0] if self.model.reads_features else None
        prefix_k, prefix_v, *own = rest[1:] if features is not None else rest
        layers = [_SharedStepKV(prefix_k[i], prefix_v[i], own[i], own[n + i]) for i in range(n)]
        cache = KVCache(layers)
        logits = self.model(token, asset_ids, category_ids, last_only=True, cache=cache, features=features)[0][:, -1]
        owns = [cast(_OwnKV, x.own) for x in layers]
        return (logits, torch.stack([o.new[0][:, :, 0] for o in owns]), torch.stack([o.new[1][:, :, 0] for o in owns]))


def step_input_names(num_layers: int, features: bool = False) -> list[str]:
    """model_step.onnx's inputs, in order."""
    return (
        ["token", "asset_ids", "category_ids", *(["features"] if features else []), "prefix_k", "prefix_v"]
        + [f"own_k_{i}" for i in range(num_layers)]
        + [f"own_v_{i}" for i in range(num_layers)]
    )


def random_inputs(
    batch: int,
    length: int,
    vocab_size: int,
    num_assets: int,
    num_categories: int,
    seed: int = 0,
    feature_columns: int = 0,
) -> tuple[torch.Tensor, ...]:
    """(tokens, asset_ids, category_ids[, features (batch, length, feature_columns)]): features,
    ids below the smallest table's rows (7, the days of the week), only when feature_columns."""
    g = torch.Generator().manual_seed(seed)
    out: tuple[torch.Tensor, ...] = (
        torch.randint(0, vocab_size, (batch, length), generator=g),
        torch.randint(0, num_assets, (batch,), generator=g),
        torch.randint(0, num_categories, (batch,), generator=g),
    )
    if feature_columns:
        out = (*out, torch.randint(0, CALENDAR_B, (batch, length, feature_columns), generator=g))
    return out
