"""The model's dropout (model.dropout): nn.Dropout's behaviour, a quarter of its random draws on the CPU."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

__all__ = ["Dropout"]


class Dropout(nn.Module):
    """nn.Dropout (zero with probability p, scale the rest by 1 / (1 - p)), cheaper on the CPU.

    torch draws a CPU dropout mask with one mt19937 call per element on one thread (its
    vectorized MKL path is Intel-only): 4.7 ms per million elements on the AMD EPYC these
    benchmarks ran on, 30 times a GELU per element and about 6% of a case C training step. Here every 64-bit
    draw yields four uniform 16-bit lanes, a quarter of the draws for the same Bernoulli mask;
    p is rounded to a multiple of 1/65536 (0.1 acts as 0.100006). The draws come from torch's
    CPU generator, so seeding and checkpointed RNG states reproduce them exactly. On other
    devices F.dropout (fused, counter-based) is already cheap and is used as is.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        n = x.numel()
        words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64)  # uniform 64-bit draws
        lanes = words.view(torch.int16)[:n].view(x.shape)  # four uniform 16-bit lanes per draw
        keep = lanes >= round(self.p * 65536) - 32768  # P(drop) = round(p * 2^16) / 2^16
        return x * (keep.to(x.dtype) * (1.0 / (1.0 - self.p)))
