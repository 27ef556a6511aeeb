"""A run folder's checkpoints as a job's ranks write them together (the files: checkpoint.py).

Every rank calls `save` at the same step. Rank 0 serializes the state and training goes on;
a background thread (CheckpointWriter) fsyncs, publishes and prunes. All ranks then meet at a
barrier, so no rank runs ahead of a checkpoint.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from common.distributed.ddp import all_gather_objects, barrier
from common.distributed.job_store import before_abort
from common.errors import UserError
from common.run.checkpoint import CheckpointWriter, prune_checkpoints, remove_stale_temp_files
from common.run.files import BEST_MODEL_PT
from common.training.rng import rng_state

__all__ = ["RunCheckpoints", "check_resumable"]


class RunCheckpoints:
    """`keep`: training.keep_checkpoints. `is_main`: this rank writes (rank 0)."""

    def __init__(self, run_dir: Path, keep: int, *, is_main: bool, world_size: int, out: TextIO) -> None:
        self.run_dir, self.keep, self.is_main, self.world_size = Path(run_dir), keep, is_main, world_size
        self.writer = CheckpointWriter()
        if is_main and world_size > 1:
            before_abort(self.writer.wait)  # the watchdog finishes a checkpoint before it ends the process
        if is_main:
            for path in remove_stale_temp_files(self.run_dir):
                print(f"Removed {path.name}, left by a writer that was killed", file=out, flush=True)

    def save(self, name: str, state: Callable[[], dict[str, Any]]) -> None:
        """A training checkpoint: `state()` (rank 0's) plus, under DDP, every rank's RNG state."""
        rngs = all_gather_objects(rng_state()) if self.world_size > 1 else None
        if self.is_main:
            obj = {"format": "marketgpt-checkpoint", "version": 1, **state()}
            if rngs is not None:
                obj["rng_per_rank"] = rngs
            # training goes on once the state is serialized; the writer prunes after publishing
            self.writer.save(
                obj, self.run_dir / name, then=functools.partial(prune_checkpoints, self.run_dir, keep=self.keep)
            )
        barrier()

    def save_best(self, model: Callable[[], dict[str, Any]]) -> None:
        """best_model.pt: `model()`, the weights and what scoring them needs (no optimizer state)."""
        if self.is_main:
            self.writer.save({"format": "marketgpt-best-model", "version": 1, **model()}, self.run_dir / BEST_MODEL_PT)
        barrier()

    def check(self) -> None:
        """Raise now if a checkpoint failed to publish (rank 0; a no-op elsewhere)."""
        if self.is_main:
            self.writer.check()

    def finish(self, raise_errors: bool) -> None:
        """Wait until every checkpoint is on disk; a failure raises, or is a warning when
        another error is already on its way out."""
        if not self.is_main:
            return
        try:
            self.writer.wait()  # on disk before anyone reads them, or this process exits
        except Exception as e:
            if raise_errors:
                raise
            print(f"warning: a checkpoint could not be written ({type(e).__name__}: {e})", file=sys.stderr, flush=True)


def check_resumable(progress: dict[str, Any], steps_per_epoch: int, world_size: int) -> Optional[str]:
    """Whether a checkpoint's progress can go on in this run: a UserError where its steps per
    epoch differ (the data, batch size or world size changed); a warning where it can, but was
    trained by another number of processes; else None."""
    if progress["steps_per_epoch"] != steps_per_epoch:
        raise UserError(
            f"the checkpoint has {progress['steps_per_epoch']} steps per epoch but this run has "
            f"{steps_per_epoch}: the data, batch size or world size changed; resume with the same ones"
        )
    saved_world = progress.get("world_size", 1)
    if saved_world != world_size:
        return (
            f"warning: the checkpoint was trained by {saved_world} process(es), this run has "
            f"{world_size}: the effective batch size changes"
        )
    return None
