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

from common.distributed.ddp import all_reduce_sum, several_ranks

__all__ = ["Agreement", "CheckpointRequests", "SAVE_SIGNALS", "STOP_SIGNALS"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
SAVE_SIGNALS = (signal.SIGUSR1,)
_SIGNAL_ORDER = STOP_SIGNALS + SAVE_SIGNALS  # when ranks got different signals, the first wins


class CheckpointRequests:
    """The signal this process got since the last step and when the timer is next due."""

    def __init__(self, every_minutes: float) -> None:
        self.every_s = 60.0 * every_minutes
        self.pending: Optional[int] = None
        self.next_due = math.inf

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
        any rank's checkpoint timer is due; waits for the device."""
        return self.send(sums).get()

    def send(self, sums: torch.Tensor) -> "Agreement":
        """Start `agree` without waiting: the all-reduce and the copy to the host are queued
        behind the step's kernels, and `Agreement.get()` waits for them. The Trainer reads a
        step's agreement while the next step runs, so the device never idles on the host."""
        pending, self.pending = self.pending, None
        flags = [float(pending == s) for s in _SIGNAL_ORDER] + [float(time.monotonic() >= self.next_due)]
        if not several_ranks():  # nobody to agree with: the flags need no trip through the device
            return Agreement(sums, len(sums), flags)
        host = torch.tensor(flags, dtype=torch.float64)
        if sums.is_cuda:
            # pinned: copied without a sync; torch's pinned-memory cache reuses the buffer only
            # once the copy that read it has run
            host = host.pin_memory()
        return Agreement(all_reduce_sum(torch.cat([sums, host.to(sums.device, non_blocking=True)])), len(sums))


class Agreement:
    """One `CheckpointRequests.send` on its way to the host: `values` on the device, the summed
    values then the flags, or (one process) the values alone with the flags as given."""

    def __init__(self, values: torch.Tensor, n: int, flags: Optional[list[float]] = None) -> None:
        self.values = values
        self._n = n
        self._flags = flags
        self._ready: Optional[torch.cuda.Event] = None
        if values.is_cuda:
            self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = values

    def get(self) -> tuple[list[float], Optional[int], bool]:
        """The summed values, the agreed signal and whether the timer is due (waits for them)."""
        if self._ready is not None:
            self._ready.synchronize()  # this step's kernels only: later ones keep running
        values = self._host.tolist() + (self._flags or [])
        n = self._n
        sig = next((s for s, count in zip(_SIGNAL_ORDER, values[n:]) if count > 0), None)
        return values[:n], sig, values[-1] > 0
