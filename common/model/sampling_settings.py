"""SamplingSettings: how many token paths a sampler draws and how. Shared by the torch sampler
(common.model.sampling) and the torch-free one (common.forecasting.infer): plain Python, no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from common.errors import UserError

__all__ = ["SamplingSettings"]


@dataclass(frozen=True)
class SamplingSettings:
    """The knobs of one sampling call, passed whole rather than one argument each.

    samples paths of horizon tokens per context. temperature 0 is greedy; top_k / top_p narrow every
    draw (None: off). seed None: no seeded generator (torch's global one, fresh numpy entropy), so
    the same seed gives the same paths only when it is set. max_batch: rows per chunk (None: what
    the KV cache budget allows). Impossible knobs are refused as the forecast command's flags.
    """

    horizon: int
    samples: int
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    max_batch: Optional[int] = None

    def __post_init__(self) -> None:
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise UserError(f"--temperature {self.temperature}: must be >= 0 (0 is greedy, 1 the model's own)")
        if self.top_k is not None and self.top_k < 1:
            raise UserError(f"--top-k {self.top_k}: must be at least 1")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise UserError(f"--top-p {self.top_p}: must be in (0, 1]")
