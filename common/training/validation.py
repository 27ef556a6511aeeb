"""The Trainer's validation: token-weighted mean loss and accuracy of a model on one split, and
early stopping on the validation loss (training.early_stopping_patience: stop after that many
epochs without a better one; 0: never). Its state travels in the checkpoint ("early_stopping")."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F

from common.distributed.ddp import all_reduce_sum
from common.distributed.precision import autocast
from common.special_tokens import PAD_TOKEN
from common.training.batches import TokenWindows

__all__ = ["EarlyStopping", "split_loss"]


@torch.no_grad()
def split_loss(
    model: torch.nn.Module,
    windows: TokenWindows,
    split: str,
    batch_size: int,
    precision: str,
    device: torch.device,
    *,
    rank: int = 0,
    world_size: int = 1,
    max_batches: Optional[int] = None,
) -> tuple[float, float]:
    """Token-weighted mean loss and accuracy over `split` (non-PAD targets), in eval mode, in
    `precision`'s autocast. Under DDP each rank scores its slices of the batches and the sums
    are all-reduced, so every rank returns the whole split's numbers."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    tokens = torch.zeros((), device=device, dtype=torch.int64)
    try:
        for b in windows.batches(split, batch_size, shuffle=False, rank=rank, world_size=world_size, limit=max_batches):
            with autocast(precision, device):
                logits, _ = model(b.x, b.asset_ids, b.category_ids, **b.extra_inputs())
            logits = logits.float()
            loss_sum += F.cross_entropy(
                logits.view(-1, logits.size(-1)), b.y.reshape(-1), ignore_index=PAD_TOKEN, reduction="sum"
            ).double()
            mask = b.y != PAD_TOKEN
            correct += ((logits.argmax(dim=-1) == b.y) & mask).sum()
            tokens += mask.sum()
    finally:
        model.train(was_training)
    loss_sum, correct, tokens = all_reduce_sum(torch.stack([loss_sum, correct.double(), tokens.double()])).tolist()
    n = max(tokens, 1.0)
    return loss_sum / n, correct / n


class EarlyStopping:
    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best_val_loss = math.inf
        self.best_epoch: Optional[int] = None
        self.bad_epochs = 0

    def update(self, val_loss: float, epoch: int) -> bool:
        """Count finished epoch `epoch` (1-based); True when its `val_loss` is the best so far."""
        if val_loss < self.best_val_loss:
            self.best_val_loss, self.best_epoch, self.bad_epochs = val_loss, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    def exhausted(self) -> bool:
        return self.patience > 0 and self.bad_epochs >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best_val_loss": self.best_val_loss, "best_epoch": self.best_epoch, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_val_loss, self.best_epoch, self.bad_epochs = (
            state["best_val_loss"],
            state["best_epoch"],
            state["bad_epochs"],
        )
