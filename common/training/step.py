"""What one training step computes on the device, apart from the model: the micro-batch's
loss with its sums, the step's values (sums and gradient norm) and their finiteness, and the
clipping. Small functions, so that where training.compile is on each becomes a fused kernel
(common.training.trainer compiles them) instead of a dozen launches per step.
"""

from __future__ import annotations

import torch

from common.special_tokens import PAD_TOKEN

__all__ = ["TrainingForward", "batch_sums", "clip_values", "nonfinite", "step_values"]


class TrainingForward(torch.nn.Module):
    """A training micro-batch: the model's loss, and its `batch_sums` from the same graph (no
    second launch when compiled). `model` is the one training runs through (DDP under DDP)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        x: torch.Tensor,
        asset_ids: torch.Tensor,
        category_ids: torch.Tensor,
        y: torch.Tensor,
        **extra: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits, loss = self.model(x, asset_ids, category_ids, y, **extra)
        with torch.no_grad():
            return loss, batch_sums(logits.detach(), loss.detach(), y)


def batch_sums(logits: torch.Tensor, loss: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(loss x tokens, correct predictions, tokens) of one micro-batch, float64, on its device."""
    mask = y != PAD_TOKEN
    n = mask.sum()
    correct = ((logits.argmax(dim=-1) == y) & mask).sum()
    return torch.stack([loss.double() * n, correct.double(), n.double()])


def step_values(sums: torch.Tensor, norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's four values (the sums, then the gradient norm) and whether they are `nonfinite`."""
    values = torch.cat([sums, norm.reshape(1).double()])
    return values, nonfinite(values)


def clip_values(
    grads: list[torch.Tensor], max_norm: float, sums: torch.Tensor, main: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip `grads` in place to a total 2-norm of `max_norm` (torch.nn.utils.clip_grad_norm_'s
    arithmetic without its per-call grouping and checks) and return `step_values` with the norm
    before clipping (zero unless `main`: rank 0's norm alone enters the all-reduce)."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return step_values(sums, norm if main else torch.zeros_like(norm))


def nonfinite(values: torch.Tensor) -> torch.Tensor:
    """1.0 (on the device) when the loss sum or the gradient norm (`values[0]`, `[3]`) is not finite.
    A slice, not a list index: that would copy the index from the host."""
    return (~torch.isfinite(values[0:4:3])).any().float()
