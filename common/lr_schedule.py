"""Learning-rate schedule: linear warmup, then cosine decay to a floor. Step-based."""
from __future__ import annotations

import math

__all__ = ["lr_at"]


def lr_at(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine decay to
    base_lr * min_lr_ratio at total_steps. A pure function of the step, so resuming needs
    nothing but the step."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
