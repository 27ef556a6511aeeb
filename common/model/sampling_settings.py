"""SamplingSettings: how many token paths a sampler draws and how. Shared by the torch sampler
(common.model.sampling) and the torch-free one (common.forecasting.infer): plain Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["SamplingSettings"]


@dataclass(frozen=True)
class SamplingSettings:
    """The knobs of one sampling call, passed whole rather than one argument each.

    samples paths of horizon tokens per context. temperature 0 is greedy; top_k / top_p narrow every
    draw (None: off). seed None: no seeded generator (torch's global one, fresh numpy entropy), so
    the same seed gives the same paths only when it is set. max_batch: rows per chunk (None: what
    the KV cache budget allows).
    """

    horizon: int
    samples: int
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    max_batch: Optional[int] = None
