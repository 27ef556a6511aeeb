"""Sampling token paths with a KV cache: many contexts x samples in one batch.

    tokens = sample_paths(model, contexts, asset_ids, category_ids, SamplingSettings(horizon=64, samples=256))
    # (N contexts, samples, horizon) token ids

Each context is prefilled once (batch N), and then every step feeds one token per row: a step
costs one token's forward per path instead of a whole context's. A context's samples share its
prefilled keys and values (`SharedPrefixKV` in kv_cache.py): they are not copied to each
sample, and a step's attention over them is one matrix product per context, which halves the
time of a forecast on the CPU.

The window. The cache holds at most context_length (T) tokens, at positions 0, 1, ... as in
training, so learned and rotary positions are both right. The prefill takes the last
max(T - horizon, T // 2) context tokens, so a horizon up to T // 2 fits in the window without
ever re-running anything; when the cache is full, it is rebuilt by prefilling the last T // 2
tokens (batch N x samples) and decoding goes on. Every step thus sees between T // 2 and T
tokens, the lengths every training window holds too. `on_step` sees each step's window and
logits: the parity test checks them against the uncached forward on that window.

Rows are processed in chunks of at most `max_batch` (the cache is the memory: at most 2 x
layers x T x d_model floats per row), whole contexts at a time while a context's samples fit;
with settings.seed set the draws depend on the arguments alone, so the same call gives the
same paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch
from torch.nn import functional as F

from common.model.gpt import MarketGPT
from common.model.kv_cache import KVCache
from common.model.sampling_settings import SamplingSettings
from common.model.windows import chunk_features, chunk_rows, context_chunks, prefill_length

__all__ = ["CACHE_BUDGET_BYTES", "SamplingSettings", "draw_tokens", "prefill_length", "sample_paths"]

CACHE_BUDGET_BYTES = 1 << 30  # KV cache of one chunk of rows (1 GiB): bounds max_batch by default

# on_step(step, contexts, seq, window, logits): step's tokens are about to be drawn from logits
# (B, V'), V' = the last id that may be drawn + 1, computed from the last `window` tokens of seq
# (B, L); contexts (B,): each row's context.
StepHook = Callable[[int, torch.Tensor, torch.Tensor, int, torch.Tensor], None]


def draw_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: Optional[int],
    top_p: Optional[float],
    banned: torch.Tensor,
    generator: Optional[torch.Generator],
    u: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One token per row of logits (B, V): softmax(logits / temperature), greedy at 0.

    banned (V,) bool: ids never drawn. top_k keeps the k likeliest ids, top_p the smallest set
    whose probability reaches p (both narrow every path; see docs/forecasting.md). u (B, 1): each
    row's uniform in [0, 1), given by the caller (None: drawn from generator).
    """
    logits = logits.float().masked_fill(banned, -float("inf"))
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        before = sorted_logits.softmax(dim=-1).cumsum(dim=-1) - sorted_logits.softmax(dim=-1)
        drop = torch.zeros_like(logits, dtype=torch.bool).scatter(1, order, before >= top_p)
        logits = logits.masked_fill(drop, -float("inf"))
    # inverse CDF: the first id whose cumulative probability exceeds u (zero-probability ids never
    # are); one uniform per row, about 50x cheaper than torch.multinomial on the CPU
    probs = F.softmax(logits, dim=-1)
    cdf = probs.cumsum(dim=-1)
    if u is None:
        u = torch.rand((logits.size(0), 1), generator=generator, device=logits.device)
    u = u.to(cdf.dtype) * cdf[:, -1:]
    ids = torch.searchsorted(cdf, u, right=True).squeeze(1)
    # u * total can round up to the total itself: then the last id with any probability
    last = probs.size(1) - 1 - (probs > 0).flip(1).to(torch.uint8).argmax(dim=1)
    return torch.minimum(ids, last)


@torch.no_grad()
def sample_paths(
    model: MarketGPT,
    contexts: torch.Tensor,
    asset_ids: torch.Tensor,
    category_ids: torch.Tensor,
    settings: SamplingSettings,
    *,
    banned: Optional[torch.Tensor] = None,
    on_step: Optional[StepHook] = None,
    features: Optional[torch.Tensor] = None,
    path_features: Optional[torch.Tensor] = None,
    uniforms: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """(N, samples, horizon) sampled token ids continuing each of the N contexts (N, L).

    asset_ids, category_ids: (N,). banned: (V,) bool of ids never drawn (default none).
    settings.seed seeds a generator on the contexts' device (None: torch's global one).
    features: (N, L + horizon, 3) candle ids (common/tokens/features.py) of the context's
    candles and then the future steps', for a model with time_features / volume_input; every
    forward gets the slice aligned with its tokens. path_features: (N, samples, horizon, k), each
    sample's own future in the last k columns of features (the market's, common.forecasting.core).
    uniforms: (N, samples, horizon) in [0, 1), each draw's uniform (common.forecasting.draws);
    None: drawn from settings.seed's generator. Runs in eval mode and restores the previous mode.
    """
    N, L = contexts.shape
    horizon, samples = settings.horizon, settings.samples
    T = model.config.context_length
    device = contexts.device
    banned, V = _drawable(banned, model.config.vocab_size, device)
    P = prefill_length(T, horizon, L)
    # under autocast (a bf16 forecast) the cache holds what the matmuls make and read: no casts per step
    cache_dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    max_batch = _default_max_batch(model) if settings.max_batch is None else settings.max_batch
    decoding = _Decoding(model, _draw_fn(settings, banned, device), V, cache_dtype, on_step)

    was_training = model.training
    model.eval()
    try:
        prefix = model.new_cache(N, dtype=cache_dtype)
        feats = None if features is None else features[:, L - P :]  # aligned with seq below: (N, P + H, 3)
        first_logits = _next_logits(
            model, contexts[:, L - P :], asset_ids, category_ids, prefix, None if feats is None else feats[:, :P], V
        )
        out = torch.empty((N * samples, horizon), dtype=torch.long, device=device)
        for c0, c1, group, lo in context_chunks(N, samples, max_batch):
            r = torch.arange(c0, c1, device=device).repeat_interleave(group)  # row -> its context
            # the samples share their context's prefilled keys and values (no copy per sample)
            cache = prefix.shared(c0, c1, group, T - P)
            seq = torch.cat((contexts[r, L - P :], out.new_empty((len(r), horizon))), dim=1)  # (B, P + H)
            rows = _Rows(
                r,
                asset_ids[r],
                category_ids[r],
                chunk_features(feats, r, lo, P, path_features),
                chunk_rows(uniforms, lo, len(r)),
            )
            _continue(seq, P, cache, first_logits[r], rows, decoding)
            out[lo : lo + len(r)] = seq[:, P:]
    finally:
        model.train(was_training)
    return out.view(N, samples, horizon)


def _draw_fn(settings: SamplingSettings, banned: torch.Tensor, device: torch.device) -> Callable[..., torch.Tensor]:
    """draw_tokens with the settings' temperature, truncation and seeded generator bound."""
    generator = None if settings.seed is None else torch.Generator(device=device).manual_seed(int(settings.seed))
    return partial(
        draw_tokens,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        banned=banned,
        generator=generator,
    )


@dataclass(frozen=True)
class _Decoding:
    """What every step of one sample_paths call decodes with: the model, the draw (sampling settings and
    generator bound), the logits' width (the drawable ids), the KV cache's dtype and the caller's step hook."""

    model: MarketGPT
    draw: Callable[..., torch.Tensor]  # draw(logits, u=None)
    vocab: int
    cache_dtype: Optional[torch.dtype]
    on_step: Optional[StepHook]


@dataclass(frozen=True)
class _Rows:
    """One chunk's rows (B): each row's context, asset and category ids, its candle ids
    (B, known + H, 3), aligned with seq, or None, and its draws' uniforms (B, H) or None."""

    contexts: torch.Tensor
    asset_ids: torch.Tensor
    category_ids: torch.Tensor
    features: Optional[torch.Tensor]
    uniforms: Optional[torch.Tensor] = None


def _continue(
    seq: torch.Tensor, known: int, cache: KVCache, logits: torch.Tensor, rows: _Rows, decoding: _Decoding
) -> None:
    """Draw seq[:, known:] in place (seq: (B, known + H)), one token per row and step.

    cache holds seq's first `known` tokens (or the last of them it has room for) and logits
    (B, vocab) are the next token's; when the cache is full it is rebuilt from the last
    context_length // 2 tokens, positions from 0. rows.contexts goes to on_step.
    """
    model, draw, vocab, on_step = decoding.model, decoding.draw, decoding.vocab, decoding.on_step
    features = rows.features
    T = model.config.context_length
    keep = max(1, T // 2)  # tokens a full cache is rebuilt from
    horizon = seq.size(1) - known
    for step in range(horizon):
        end = known + step  # tokens of seq known so far
        if on_step is not None:
            on_step(step, rows.contexts, seq[:, :end], cache.length, logits)
        seq[:, end] = draw(logits, u=None if rows.uniforms is None else rows.uniforms[:, step : step + 1])
        if step == horizon - 1:
            break
        if cache.length == T:  # full: rebuild from the last `keep` tokens
            cache = model.new_cache(len(seq), dtype=decoding.cache_dtype)
            window = slice(end + 1 - keep, end + 1)
        else:  # the token just drawn, at position cache.length
            window = slice(end, end + 1)
        logits = _next_logits(
            model,
            seq[:, window],
            rows.asset_ids,
            rows.category_ids,
            cache,
            None if features is None else features[:, window],
            vocab,
        )


def _next_logits(
    model: MarketGPT,
    tokens: torch.Tensor,
    asset_ids: torch.Tensor,
    category_ids: torch.Tensor,
    cache: KVCache,
    features: Optional[torch.Tensor],
    vocab: int,
) -> torch.Tensor:
    """(B, vocab) logits of the token after `tokens` (B, t), which continue what cache holds."""
    return model(tokens, asset_ids, category_ids, last_only=True, cache=cache, features=features, vocab=vocab)[0][:, -1]


def _drawable(banned: Optional[torch.Tensor], vocab_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """(banned[:V], V), V = the last id that may be drawn + 1: ids past it (the tokenizer's unused
    tail) get no logits at all. banned None: every id may be drawn."""
    if banned is None:
        banned = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    V = int(torch.nonzero(~banned).max()) + 1 if bool((~banned).any()) else banned.numel()
    return banned[:V], V


def _default_max_batch(model: MarketGPT) -> int:
    """Rows whose full KV cache fits CACHE_BUDGET_BYTES (counted in fp32 for bf16 too: larger
    chunks were no faster)."""
    c = model.config
    per_row = 2 * c.num_layers * c.context_length * c.d_model * model.lm_head.weight.element_size()
    return max(1, CACHE_BUDGET_BYTES // per_row)
