"""Seeding and the RNG states a checkpoint carries (python, numpy, torch, cuda).

States are stored as tensors and plain lists so a checkpoint loads with weights_only=True.
"""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch

__all__ = ["restore_rank_rng", "seed_everything", "rng_state", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices); call before building the model."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    # legacy=True (the default): the tuple ("MT19937", keys, pos, has_gauss, cached_gaussian)
    _, keys, pos, has_gauss, cached = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    return {
        "python": [version, list(internal), gauss],
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        # this process's own GPU only: a resume may see another number of GPUs per process
        "cuda": torch.cuda.get_rng_state(torch.cuda.current_device()) if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    cuda = state["cuda"]
    if torch.cuda.is_available() and len(cuda):
        if isinstance(cuda, (list, tuple)):  # older checkpoints: every visible GPU's state
            cuda = cuda[min(torch.cuda.current_device(), len(cuda) - 1)]
        torch.cuda.set_rng_state(cuda, torch.cuda.current_device())


def restore_rank_rng(checkpoint: dict[str, Any], rank: int, new_rank_seed: int) -> None:
    """Continue this rank's own random streams (dropout) from a training checkpoint: its entry
    in `rng_per_rank` (a DDP run's), else the checkpoint's `rng`; a rank the checkpoint has no
    streams for (more GPUs now) is seeded with `new_rank_seed` instead of copying rank 0's."""
    per_rank = checkpoint.get("rng_per_rank") or []
    if rank < len(per_rank):
        set_rng_state(per_rank[rank])
        return
    set_rng_state(checkpoint["rng"])
    if rank > 0:
        seed_everything(new_rank_seed)
