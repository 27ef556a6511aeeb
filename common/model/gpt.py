"""MarketGPT: a decoder-only transformer over candle tokens, conditioned on the asset.

One file, read top to bottom: rotary helpers, norms, attention, MLP, block, the model. The
network and nothing else: the key/value caches sampling decodes with are in kv_cache.py,
sampling in sampling.py, `marketgpt model-info`'s sizes in sizing.py and memory.py, the CPU's
cheaper dropout in dropout.py.

Dropout (model.dropout) acts on the embeddings and on each residual branch's output, not on
the attention probabilities: that keeps attention on SDPA's fused kernels on every device (the
CPU flash kernel has no dropout; with dropout_p > 0 SDPA falls back to materializing the
B x nh x T x T probabilities: about 15% of a case C training step on the CPU). LLaMA-style
GPTs train without attention dropout too.

Shapes: B batch, T time (candles), C = d_model, nh heads, hs = C // nh head size, V vocab.
Each sequence belongs to one asset; the asset and its category are embedded, concatenated,
projected to C and added at every position, so one model learns many markets at once.
"""

from __future__ import annotations

import math
from typing import Optional, Union, cast

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.nn import functional as F

from common.config import Config, ModelConfig
from common.model.dropout import Dropout
from common.model.heads import FactorizedHead
from common.model.kv_cache import AppendableCache, KVCache, LayerCache, LayerKV
from common.special_tokens import PAD_TOKEN
from common.tokens.features import (
    CALENDAR_A,
    CALENDAR_B,
    MARKET_BINS,
    MARKET_COLUMNS,
    NUM_FEATURES,
    VOL_LEVEL_BINS,
    VOLUME_BINS,
    feature_columns,
)
from common.tokens.ids import RunInfo

__all__ = ["MARKET_MASK_SPAN", "MarketGPT", "RMSNorm", "apply_rotary", "norm_layer", "rotary_tables", "swiglu_width"]

# model.market_mask hides the market ids of a training window's last 1..MARKET_MASK_SPAN positions:
# the longest horizon the scorecard judges by default (1, 5, 20 candles)
MARKET_MASK_SPAN = 20


# --------------------------------------------------------------------------- rotary positions


def rotary_tables(context_length: int, head_size: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (context_length, head_size // 2), for rotary embeddings."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)  # (hs/2,)
    angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)  # (T, hs/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (x1, x2) pairs, the two halves of the head dim, by position-dependent angles."""
    # x: (B, nh, T, hs); cos, sin: (T, hs/2), cast so bf16 autocast stays bf16
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # (B, nh, T, hs/2) each
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


# --------------------------------------------------------------------------- layers


def norm_layer(config: ModelConfig, width: int) -> nn.Module:
    """model.norm: LayerNorm (GPT-2) or RMSNorm (scale only) over the last `width` features."""
    if config.norm == "rms":
        return RMSNorm(width)
    return nn.LayerNorm(width, bias=config.bias)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, written out (not nn.RMSNorm) so every ONNX opset exports it."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)  # fp32 under autocast
        return (x.float() * rms).to(x.dtype) * self.weight


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)  # fused q, k, v
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.resid_dropout = Dropout(config.dropout)
        head_size = config.d_model // config.num_heads
        # model.qk_norm: each head's queries and keys RMS-normalized (before rotary), a learned scale each
        self.q_norm = RMSNorm(head_size) if config.qk_norm else None
        self.k_norm = RMSNorm(head_size) if config.qk_norm else None

    def forward(
        self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]], kv: Optional[LayerCache] = None
    ) -> torch.Tensor:
        B, T, C = x.shape
        start = kv.length if kv is not None else 0  # position of x's first token
        q, k, v = self.qkv(x).split(C, dim=2)  # (B, T, C) each
        q = q.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2)
        v = v.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            cos, sin = rope[0][start : start + T], rope[1][start : start + T]
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if kv is not None and start > 0:  # (start > 0 only with a cache)
            y = kv.attend(q, k, v)  # one-token decode step over every cached key: (B, nh, 1, hs)
        else:
            if kv is not None:  # a LayerKV: a shared prefix is never prefilled
                k, v = cast(AppendableCache, kv).append(k, v)  # prefill: store the context's keys and values
            # fused kernels (flash on CUDA and CPU); the causal mask is never materialized
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.proj(y))


def swiglu_width(d_ff: int) -> int:
    """model.mlp = "swiglu"'s hidden width: 2/3 of d_ff, rounded up to a multiple of 8."""
    return (2 * d_ff // 3 + 7) // 8 * 8


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = swiglu_width(config.d_ff) if config.mlp == "swiglu" else config.d_ff
        self.fc = nn.Linear(config.d_model, hidden, bias=config.bias)
        # model.mlp = "swiglu": a second input matrix whose SiLU gates fc's output
        self.gate = nn.Linear(config.d_model, hidden, bias=config.bias) if config.mlp == "swiglu" else None
        self.proj = nn.Linear(hidden, config.d_model, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.dropout(self.proj(F.silu(self.gate(x)) * self.fc(x)))  # (B, T, C) -> (B, T, h) -> (B, T, C)
        return self.dropout(self.proj(F.gelu(self.fc(x))))  # (B, T, C) -> (B, T, d_ff) -> (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = norm_layer(config, config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = norm_layer(config, config.d_model)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]], kv: Optional[LayerCache] = None
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope, kv)
        x = x + self.mlp(self.ln_2(x))
        return x


# --------------------------------------------------------------------------- the model


class MarketGPT(nn.Module):
    """GPT over candle tokens with an asset + category embedding added at every position.

    `MarketGPT(config)` takes a ModelConfig (or a whole Config, whose `.model` is used).
    num_assets / num_categories size the embedding tables; asset and category ids passed to
    forward() must lie in [0, num_assets) and [0, num_categories).
    num_intervals > 1 (data.intervals): an interval embedding (num_intervals, d_model), zero at
    the start, added at every position like the asset's; one interval has none, so a one-interval
    model's parameters and checkpoints are as before. forward() reads interval_ids (B,), or
    without them `default_interval` (what forecasts and exports of one interval set).
    """

    def __init__(
        self, config: Union[ModelConfig, Config], num_assets: int = 1, num_categories: int = 1, num_intervals: int = 1
    ) -> None:
        super().__init__()
        if isinstance(config, Config):
            config = config.model
        if num_assets < 1 or num_categories < 1:
            raise ValueError(f"num_assets ({num_assets}) and num_categories ({num_categories}) must be at least 1")
        if config.d_model % config.num_heads:
            raise ValueError(f"d_model ({config.d_model}) must be divisible by num_heads ({config.num_heads})")
        self.config = config
        self.gradient_checkpointing = False  # training.gradient_checkpointing (set by the Trainer)
        self.num_assets = num_assets
        self.num_categories = num_categories
        self.num_intervals = num_intervals
        self.default_interval = 0  # the interval id forward() reads when given no interval_ids
        C = config.d_model

        self.wte = nn.Embedding(config.vocab_size, C)  # token embedding, tied to the head
        self.wpe = nn.Embedding(config.context_length, C) if config.positional == "learned" else None
        self.asset_emb = nn.Embedding(num_assets, config.asset_embed_dim)
        self.category_emb = nn.Embedding(num_categories, config.category_embed_dim)
        self.cond_proj = nn.Linear(config.asset_embed_dim + config.category_embed_dim, C, bias=config.bias)
        self.interval_emb = nn.Embedding(num_intervals, C) if num_intervals > 1 else None
        # model.time_features / volume_input / vol_level_input: per-candle ids (common/tokens/features.py)
        # whose embeddings add to the token's; None when off, so the documented counts hold
        self.time_emb = (
            nn.ModuleList([nn.Embedding(CALENDAR_A, C), nn.Embedding(CALENDAR_B, C)]) if config.time_features else None
        )
        self.volume_emb = nn.Embedding(VOLUME_BINS + 1, C) if config.volume_input else None
        self.vol_level_emb = nn.Embedding(VOL_LEVEL_BINS + 1, C) if config.vol_level_input else None
        self.market_emb = (
            nn.ModuleList(nn.Embedding(MARKET_BINS + 1, C) for _ in range(MARKET_COLUMNS + int(config.reads_peer)))
            if config.market_context
            else None
        )
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_f = norm_layer(config, C)
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying: one (V, C) matrix, counted once
        # model.head: "flat" reads logits through lm_head; "factorized" through p(move) p(shape | move)
        self.head: Optional[FactorizedHead] = None
        if config.head == "factorized":
            assert config.move_bins is not None and config.shape_bins is not None  # the config check fills them in
            self.head = FactorizedHead(C, config.vocab_size, config.move_bins, config.shape_bins)

        if config.positional == "rope":
            cos, sin = rotary_tables(config.context_length, C // config.num_heads)
            # derived from the config, so kept out of the state_dict
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        else:
            self.rope_cos = self.rope_sin = None

        # GPT-2 init: N(0, 0.02) everywhere; the projections that write into the residual
        # stream are scaled down so its variance doesn't grow with depth.
        self.apply(self._init_weights)
        for block in cast("list[Block]", self.blocks):
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.num_layers))
        if self.interval_emb is not None:
            # zero: the intervals start alike and training tells them apart (a fine-tuned
            # one-interval parent then forecasts every interval as it forecast its own)
            nn.init.zeros_(self.interval_emb.weight)

    @classmethod
    def for_run(cls, config: Union[ModelConfig, Config], info: RunInfo) -> "MarketGPT":
        """The model of a run with this asset_info.json: its assets, categories and intervals."""
        return cls(
            config, num_assets=info.num_assets, num_categories=info.num_categories, num_intervals=info.num_intervals
        )

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def reads_features(self) -> bool:
        """Whether forward() needs per-candle ids (common/tokens/features.py)."""
        return self.config.reads_features

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Exact parameter count, tied weights once. non_embedding leaves out the lookup
        tables (tokens, learned positions, assets, categories), as in scaling-law papers."""
        total = sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once
        if non_embedding:
            tables = [self.wte, self.asset_emb, self.category_emb] + ([self.wpe] if self.wpe is not None else [])
            tables += [*(self.time_emb or []), *(t for t in (self.volume_emb, self.vol_level_emb) if t is not None)]
            tables += [*(self.market_emb or [])]
            tables += [self.interval_emb] if self.interval_emb is not None else []
            total -= sum(t.weight.numel() for t in tables)
        return total

    def flops_per_token(self, seq_len: Optional[int] = None) -> int:
        """Training FLOPs per token (forward + backward) as MFU counts them (PaLM, appendix B):
        6 x the weights every token is multiplied by (all but the lookup tables; the tied head
        counts), plus 12 x layers x T x d_model for attention's two T-long matmuls."""
        T = seq_len or self.config.context_length
        n = self.num_parameters(non_embedding=True) + self.wte.weight.numel()  # body + tied head
        return 6 * n + 12 * self.config.num_layers * T * self.config.d_model

    def head_logits(self, x: torch.Tensor, vocab: Optional[int] = None) -> torch.Tensor:
        """Final hidden states (.., C) -> logits over the vocabulary (.., V), for the configured
        model.head (the factorized head's are log-probabilities; softmax reads both alike).
        vocab: the first `vocab` ids' logits only (sampling skips the ids it never draws)."""
        if self.head is not None:
            return self.head(x)[..., :vocab]
        if vocab is None:
            return self.lm_head(x)
        bias = None if self.lm_head.bias is None else self.lm_head.bias[:vocab]
        return F.linear(x, self.lm_head.weight[:vocab], bias)

    def _input_features(self, features: Optional[torch.Tensor], B: int, T: int) -> torch.Tensor | int:
        """(B, T, C): the embeddings of each candle's time, volume, vol-level and market ids
        (features: (B, T, feature_columns), common/tokens/features.py; a model ignores the columns
        of inputs it does not read, the time and volume ids always being the first three)."""
        vol_level, market = self.vol_level_emb is not None, self.market_emb is not None
        need = feature_columns(vol_level, market, self.config.reads_peer)
        if features is None or features.shape[:2] != (B, T) or features.shape[2] < need:
            got = "none" if features is None else tuple(features.shape)
            raise ValueError(
                "this model reads model.time_features / volume_input / vol_level_input / market_context / market_peer: "
                f"pass features of shape ({B}, {T}, {need}) (common/tokens/features.py), got {got}"
            )
        out: torch.Tensor | int = 0
        if self.time_emb is not None:
            out = self.time_emb[0](features[..., 0]) + self.time_emb[1](features[..., 1])
        if self.volume_emb is not None:
            out = out + self.volume_emb(features[..., 2])
        if self.vol_level_emb is not None:
            out = out + self.vol_level_emb(features[..., NUM_FEATURES])
        if self.market_emb is not None:
            first = NUM_FEATURES + int(vol_level)
            ids = features[..., first : first + len(self.market_emb)]
            if self.training and self.config.market_mask > 0:
                ids = ids * self._market_kept(B, T, ids.device)
            for k, table in enumerate(self.market_emb):
                out = out + table(ids[..., k])
        return out

    def _market_kept(self, B: int, T: int, device: torch.device) -> torch.Tensor:
        """(B, T, 1) int64: 0 where model.market_mask hides a position's market ids. A share
        market_mask of the windows lose a tail of 1..MARKET_MASK_SPAN positions, as a forecast's
        sampled future has no market to read. Drawn from torch's generator, so seeding and the
        checkpointed RNG states reproduce the masks as they do dropout's."""
        hidden = torch.rand(B, device=device) < self.config.market_mask
        span = torch.randint(1, MARKET_MASK_SPAN + 1, (B,), device=device)
        tail = torch.arange(T, device=device)[None, :] >= T - span[:, None]
        return (~(hidden[:, None] & tail)).long()[..., None]

    def new_cache(
        self, batch_size: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None
    ) -> KVCache:
        """An empty KV cache for batch_size sequences of up to context_length tokens."""
        c = self.config
        ref = self.lm_head.weight
        shape = (batch_size, c.num_heads, c.context_length, c.d_model // c.num_heads)
        return KVCache(
            [
                LayerKV(
                    ref.new_empty(shape, device=device, dtype=dtype), ref.new_empty(shape, device=device, dtype=dtype)
                )
                for _ in self.blocks
            ]
        )

    def forward(
        self,
        idx: torch.Tensor,
        asset_ids: torch.Tensor,
        category_ids: torch.Tensor,
        targets: Optional[torch.Tensor] = None,
        last_only: bool = False,
        cache: Optional[KVCache] = None,
        features: Optional[torch.Tensor] = None,
        vocab: Optional[int] = None,
        interval_ids: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """idx, targets: (B, T) token ids; asset_ids, category_ids: (B,).

        Returns logits (B, T, V), or (B, 1, V) with last_only (generation), and the mean
        cross-entropy over targets that are not PAD_TOKEN (None without targets).
        With a cache (inference only), idx continues the cached tokens: a whole context into an
        empty cache (prefill), then one token per call at position cache.length. vocab (with
        last_only): logits of the first `vocab` ids only.
        """
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        self._check_inputs(start + T, B, asset_ids, category_ids)

        x = self.wte(idx)  # (B, T, C)
        if self.head is not None:
            x = x + self.head.embed(idx)  # + the token's move-bin and shape-bin vectors
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))  # (T, C) broadcast over B
        cond = torch.cat((self.asset_emb(asset_ids), self.category_emb(category_ids)), dim=-1)  # (B, a + c)
        if self.reads_features:
            x = x + self._input_features(features, B, T)
        cond = self.cond_proj(cond)  # (B, C)
        if self.interval_emb is not None:
            if interval_ids is None:
                interval_ids = torch.full((B,), self.default_interval, dtype=torch.long, device=idx.device)
            cond = cond + self.interval_emb(interval_ids)
        x = self.drop(x + cond.unsqueeze(1))  # (B, 1, C) broadcast over T
        rope = (self.rope_cos, self.rope_sin) if self.rope_cos is not None else None
        layer_kvs = cache.layers if cache is not None else [None] * len(self.blocks)
        for block, kv in zip(self.blocks, layer_kvs):
            if self.gradient_checkpointing and self.training and kv is None and torch.is_grad_enabled():
                # keep only the block's input; backward reruns the block (same dropout masks:
                # checkpoint restores the RNG state) for the same loss and gradients
                x = torch.utils.checkpoint.checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope, kv)
        x = self.ln_f(x)

        if last_only:  # (B, 1, V): skips the (B, T, V) matmul; with vocab, (B, 1, vocab)
            return self.head_logits(x[:, -1:, :], vocab), None
        logits = self.head_logits(x)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=PAD_TOKEN)
        return logits, loss

    def _check_inputs(self, length: int, B: int, asset_ids: torch.Tensor, category_ids: torch.Tensor) -> None:
        """A ValueError for a sequence (cached tokens included) longer than context_length, or conditioning ids
        that are not one per sequence."""
        if length > self.config.context_length:
            raise ValueError(
                f"sequence length {length} exceeds model.context_length "
                f"{self.config.context_length}; crop the input to the last context_length tokens"
            )
        if asset_ids.shape != (B,) or category_ids.shape != (B,):
            raise ValueError(
                f"asset_ids {tuple(asset_ids.shape)} and category_ids {tuple(category_ids.shape)} "
                f"must both have shape ({B},), one id per sequence"
            )

    def configure_optimizer(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float], device_type: str
    ) -> torch.optim.AdamW:
        """AdamW that decays the 2-D weights (matmuls, embeddings) but not biases or norms."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")
