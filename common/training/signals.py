"""Checkpoint requests between optimizer steps: signals and the checkpoint timer.

- SIGUSR1: save a step checkpoint and carry on.
- SIGTERM, SIGUSR2 (preemption, Slurm's warning before the time limit): save and stop.
- the timer (training.checkpoint_every_minutes): save and carry on.

The handler only sets a flag; the Trainer serves it at the next step boundary. Under DDP the
flags of every rank ride in the step's one all-reduce (`agree`), so all ranks checkpoint and
stop at the same step.
"""
from __future__ import annotations

import contextlib
import math
import signal
import time
from typing import Any, Iterator, Optional

import torch

from common.distributed.ddp import all_reduce_sum

__all__ = ["CheckpointRequests", "SAVE_SIGNALS", "STOP_SIGNALS"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
SAVE_SIGNALS = (signal.SIGUSR1,)
_SIGNAL_ORDER = STOP_SIGNALS + SAVE_SIGNALS  # when ranks got different signals, the first wins


class CheckpointRequests:
    """The signal this process got since the last step and when the timer is next due."""

    def __init__(self, every_minutes: float, pin_memory: bool = False) -> None:
        self.every_s = 60.0 * every_minutes
        self.pending: Optional[int] = None
        self.next_due = math.inf
        # the per-step signal/timer flags, filled on the host and copied without a sync
        self._flags = torch.zeros(len(_SIGNAL_ORDER) + 1, dtype=torch.float64, pin_memory=pin_memory)

    def restart_timer(self, now: float) -> None:
        """The next timer checkpoint is due `every_minutes` after `now` (a checkpoint, a start)."""
        self.next_due = now + self.every_s

    @contextlib.contextmanager
    def handlers(self) -> Iterator[None]:
        """Install flag-setting handlers for the checkpoint signals; restore the old ones after."""
        def handler(signum: int, frame: Any) -> None:
            # a stop request wins over a save request that hasn't been served yet
            if self.pending not in STOP_SIGNALS:
                self.pending = signum

        previous = {}
        try:
            for sig in STOP_SIGNALS + SAVE_SIGNALS:
                previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: signals can't be caught here
            pass
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def agree(self, sums: torch.Tensor) -> tuple[list[float], Optional[int], bool]:
        """All ranks' `sums` added up, the signal any rank got (stop beats save) and whether
        any rank's checkpoint timer is due: one all-reduce, one host sync per step."""
        pending, self.pending = self.pending, None
        for i, s in enumerate(_SIGNAL_ORDER):
            self._flags[i] = float(pending == s)
        self._flags[-1] = float(time.monotonic() >= self.next_due)
        # pinned host buffer -> device without waiting; reused only after tolist() waited for it
        flags = self._flags.to(sums.device, non_blocking=True)
        values = all_reduce_sum(torch.cat([sums, flags])).tolist()  # the step's one wait for the device
        n = len(sums)
        sig = next((s for s, count in zip(_SIGNAL_ORDER, values[n:]) if count > 0), None)
        return values[:n], sig, values[-1] > 0
