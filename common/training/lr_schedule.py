"""Learning-rate schedule: linear warmup, then cosine decay to a floor. Step-based.

An extended run (`--resume RUN --set training.epochs=N`) has a new total step count. Recomputing
the cosine over it would jump the rate back up mid-run, so from the resume step on the rate
decays from where it was to the floor over the new remaining steps instead (`restart`).
"""
from __future__ import annotations

import math
from typing import Optional

__all__ = ["lr_at"]


def lr_at(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float,
          restart: Optional[tuple[int, float]] = None) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine decay to
    base_lr * min_lr_ratio at total_steps. With restart=(step0, lr0), the schedule of a run
    whose length changed at step0: from step0 on, cosine from lr0 down to the same floor at
    total_steps. A pure function of the step, so resuming needs nothing but the step (and the
    restart point, kept in the checkpoint)."""
    if restart is not None and step >= restart[0]:
        start, start_lr = restart
        min_lr = base_lr * min_lr_ratio
        progress = min(1.0, (step - start) / max(1, total_steps - start))
        return min_lr + (start_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
