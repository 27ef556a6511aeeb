"""Per-GPU training memory estimate (`marketgpt model-info`, `marketgpt doctor`, bench_gpu).

What one training step holds at its peak (the start of backward), per GPU:

- static, per parameter: fp32 weights, grads and AdamW's two moments (16 B); under bf16/fp16
  autocast the cached 16-bit weight copies, kept until backward (2 B); under DDP the gradient
  buckets, a second fp32 copy of the grads (4 B);
- activations, per token and layer (C = d_model, F = d_ff, a = 2 bytes under autocast, 4 in
  fp32): the two LayerNorm inputs from the residual stream, which stays fp32 (8C); the
  matmul-side tensors at a bytes: LayerNorm outputs cast for the matmuls, q, k, v, attention
  output and its re-laid-out copy, the MLP's fc and GELU outputs (a x (7C + 2F)); the two
  dropout masks (1 B each, 2C, when model.dropout > 0). Flash attention keeps no T x T term.
  With gradient checkpointing a layer keeps only its fp32 input (4C); in backward one layer's
  full set is rebuilt at a time, beside the logits and the fp32 gradients flowing through it,
  after the loss's own memory is freed (the peak is the larger of the two moments);
- per token once: the embedding output and ln_f input (fp32, 8C), the head's input (aC);
  the logits (a x V, kept through backward), under autocast their fp32 copy (4V), the loss's
  log-softmax (4V) and its gradient (4V).

The constants follow what autocast and DDP keep (see docs/performance.md). On the CPU, torch's
memory profiler agrees within 15% under bf16 autocast and fp32, with and without dropout and
gradient checkpointing (tests/test_gpu_readiness.py); on a GPU bench/bench_gpu.py compares them
with torch.cuda.max_memory_allocated (not run yet: no GPU here).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import ModelConfig

__all__ = ["MemoryEstimate", "estimate_training_memory"]


@dataclass(frozen=True)
class MemoryEstimate:
    weights_optimizer: int  # fp32 weights + grads + AdamW moments
    autocast_copies: int  # 16-bit weight copies autocast caches for backward
    ddp_buckets: int  # DDP's fp32 gradient buckets
    activations: int  # kept for backward, layers and the rest
    logits: int  # logits, the loss's fp32 copy and log-softmax, their gradient
    recompute: int = 0  # gradient checkpointing: one layer's activations rebuilt in backward

    @property
    def static(self) -> int:
        return self.weights_optimizer + self.autocast_copies + self.ddp_buckets

    @property
    def total(self) -> int:
        return self.static + self.activations + max(self.logits, self.recompute)


def estimate_training_memory(
    m: ModelConfig,
    num_parameters: int,
    batch_size: int,
    precision: str = "bf16",
    gradient_checkpointing: bool = False,
    world_size: int = 1,
) -> MemoryEstimate:
    """Peak bytes of one training step on one GPU (precision: a resolved "bf16"/"fp16"/"fp32")."""
    a = 4 if precision == "fp32" else 2
    C, F, V = m.d_model, m.d_ff, m.vocab_size
    tokens = batch_size * m.context_length
    masks = 2 * C if m.dropout > 0 else 0
    per_layer = 8 * C + a * (7 * C + 2 * F) + masks
    layers = m.num_layers * (4 * C if gradient_checkpointing else per_layer)
    once = 8 * C + a * C + (C if m.dropout > 0 else 0)
    return MemoryEstimate(
        weights_optimizer=16 * num_parameters,
        autocast_copies=0 if a == 4 else 2 * num_parameters,
        ddp_buckets=4 * num_parameters if world_size > 1 else 0,
        activations=tokens * (layers + once),
        # the logits (kept through backward for the accuracy), their fp32 copy under autocast,
        # log-softmax's output and, in backward, its gradient
        logits=tokens * V * (a + (4 if a == 2 else 0) + 4 + 4),
        # one layer rebuilt, beside the logits still held and the fp32 gradients in and out of it
        recompute=tokens * (per_layer + a * V + 8 * C) if gradient_checkpointing else 0,
    )
