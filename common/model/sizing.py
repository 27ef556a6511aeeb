"""`marketgpt model-info`: a case's model sizes, without building its weights.

`meta_model` builds the case's MarketGPT on the meta device (shapes only), for model-info,
`marketgpt doctor` and bench_gpu; `describe_model` is model-info's text: parameter counts and
the per-GPU training memory estimate of common/model/memory.py.
"""

from __future__ import annotations

from typing import Optional

import torch

from common.config import Config, DataConfig, ModelConfig
from common.errors import UserError
from common.model.gpt import MarketGPT
from common.model.memory import estimate_training_memory
from common.tokens.features import CALENDAR_A, CALENDAR_B, MARKET_BINS, MARKET_COLUMNS, VOL_LEVEL_BINS, VOLUME_BINS

__all__ = ["describe_model", "meta_model"]


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.2f} GB"


def meta_model(
    m: ModelConfig, d: DataConfig, num_assets: Optional[int] = None, num_categories: Optional[int] = None
) -> MarketGPT:
    """The case's model on the meta device (shapes only: no memory, no init cost).

    Without num_assets / num_categories, the case's data.universe_counts gives them (the sum
    of its counts and its number of categories), or 1 if it is empty.
    """
    counts = d.universe_counts
    if num_assets is None:
        num_assets = sum(counts.values()) or 1
    if num_categories is None:
        num_categories = len(counts) or 1
    if num_assets < 1 or num_categories < 1:
        raise UserError(f"--num-assets ({num_assets}) and --num-categories ({num_categories}) must be at least 1")
    with torch.device("meta"):
        return MarketGPT(m, num_assets=num_assets, num_categories=num_categories, num_intervals=len(d.intervals) or 1)


def _inputs_line(m: ModelConfig) -> str:
    """What each input besides the tokens adds (lookup tables of d_model rows)."""
    C = m.d_model
    adds = {
        "time_features": (CALENDAR_A + CALENDAR_B) * C,
        "volume_input": (VOLUME_BINS + 1) * C,
        "vol_level_input": (VOL_LEVEL_BINS + 1) * C,
        "market_context": MARKET_COLUMNS * (MARKET_BINS + 1) * C,
        "market_peer": (MARKET_BINS + 1) * C,
    }
    on = {key: getattr(m, key) for key in adds} | {"market_peer": m.reads_peer}
    parts = [
        f"{key} {'on' if on[key] else 'off'} ({'' if on[key] else 'would add '}+{n:,} parameters)"
        for key, n in adds.items()
    ]
    if m.market_peer and not m.market_context:
        parts[-1] += ", not read without market_context"
    return "inputs besides tokens: " + "; ".join(parts)


def describe_model(cfg: Config, num_assets: Optional[int] = None, num_categories: Optional[int] = None) -> str:
    """Parameter counts and a per-GPU training memory estimate (see meta_model for the sizes)."""
    model = meta_model(cfg.model, cfg.data, num_assets, num_categories)
    num_assets, num_categories = model.num_assets, model.num_categories
    m, B = cfg.model, cfg.training.batch_size
    n_total, n_body = model.num_parameters(), model.num_parameters(non_embedding=True)

    t = cfg.training
    precision = "bf16" if t.precision == "auto" else t.precision  # auto: bf16 on the GPUs the cases use
    world = cfg.slurm.nodes * cfg.slurm.gpus_per_node
    est = estimate_training_memory(m, n_total, B, precision, t.gradient_checkpointing, world)
    per_param = 16 + est.autocast_copies // max(n_total, 1) + est.ddp_buckets // max(n_total, 1)
    return "\n".join(
        [
            f"MarketGPT: {m.num_layers} layers, d_model {m.d_model}, {m.num_heads} heads, d_ff {m.d_ff}, "
            f"context {m.context_length}, vocab {m.vocab_size}, positions {m.positional}; "
            f"assets {num_assets}, categories {num_categories}",
            f"parameters: {n_total:,} total, {n_body:,} non-embedding",
            _inputs_line(m),
            f"training memory per GPU (batch {B} x {m.context_length} tokens, {precision}"
            f"{' autocast' if precision != 'fp32' else ''}, {world} GPU(s)"
            f"{', gradient checkpointing' if t.gradient_checkpointing else ''}):",
            f"  weights + grads + AdamW moments (fp32, 16 B/param), autocast copies, DDP buckets "
            f"({per_param} B/param): {_gb(est.static)}",
            f"  activations (fp32 residual stream, see common/model/memory.py): {_gb(est.activations)}",
            f"  logits and loss: {_gb(est.logits)}",
            f"  total: about {_gb(est.total)} (plus CUDA context and allocator slack, roughly 1-2 GB)",
        ]
    )
