"""Learning-rate schedule: linear warmup, then cosine decay to a floor. Step-based.

An extended run (`--resume RUN --set training.epochs=N`) has a new total step count. Recomputing
the cosine over it would jump the rate back up mid-run, so from the resume step on the rate
decays from where it was to the floor over the new remaining steps instead (`restart`).
`LRSchedule` is one run's schedule with that restart point, which its checkpoint carries.
"""

from __future__ import annotations

import math
from typing import Optional

__all__ = ["LRSchedule", "lr_at"]


def lr_at(
    step: int,
    base_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float,
    restart: Optional[tuple[int, float]] = None,
) -> float:
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


class LRSchedule:
    """`lr_at` of one run: `schedule(step)` is the rate of optimizer step `step` (0-based)."""

    def __init__(self, base_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> None:
        self.base_lr, self.warmup_steps, self.total_steps, self.min_lr_ratio = (
            base_lr,
            warmup_steps,
            total_steps,
            min_lr_ratio,
        )
        self.restart: Optional[tuple[int, float]] = None  # (step, lr) where a changed length took over

    def __call__(self, step: int) -> float:
        return lr_at(step, self.base_lr, self.warmup_steps, self.total_steps, self.min_lr_ratio, self.restart)

    def state_dict(self) -> dict:
        return {"total_steps": self.total_steps, "restart": list(self.restart) if self.restart else None}

    def load_state_dict(self, saved: dict, global_step: int) -> None:
        """Continue a checkpoint's schedule at `global_step`. When the run's length changed
        (training.epochs set anew on resume), keep the rate continuous: from here on it decays
        from the rate of the last step to the floor over the new remaining steps, instead of
        jumping onto the cosine of the new length."""
        restart = saved.get("restart")
        self.restart = (int(restart[0]), float(restart[1])) if restart else None
        saved_total = saved.get("total_steps", self.total_steps)
        if saved_total != self.total_steps and global_step > 0 and global_step >= self.warmup_steps:
            last = lr_at(global_step - 1, self.base_lr, self.warmup_steps, saved_total, self.min_lr_ratio, self.restart)
            self.restart = (global_step, last)
