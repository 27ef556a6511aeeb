"""training.optimizer = "muon": the transformer blocks' weight matrices step by Muon, everything
else (embeddings, the tied head, norms, biases, the conditioning projection) by AdamW, in one
torch Optimizer so the trainer, the grad scaler and checkpoints treat it like AdamW.

Muon (Jordan et al., 2024): SGD momentum (Nesterov), whose update of each matrix is replaced by the
nearest semi-orthogonal matrix, computed by a quintic Newton-Schulz iteration on the normalized
update; scaled by sqrt(max(1, rows / cols)) so a wide and a tall matrix move alike. Decoupled
weight decay as AdamW's. The learning rate the trainer sets each step (the warmup and cosine
schedule of training.learning_rate) is multiplied by training.muon_lr / learning_rate for the
Muon group, so one schedule drives both.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, cast

import torch

__all__ = ["MuonAdamW", "newton_schulz"]

_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # a quintic whose iteration pushes singular values toward 1
_NS_STEPS = 5


def newton_schulz(g: torch.Tensor, steps: int = _NS_STEPS, eps: float = 1e-7) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with g's singular vectors (singular values near 1)."""
    a, b, c = _NS_COEFFICIENTS
    x = g.float() / (g.norm() + eps)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return (x.T if tall else x).to(g.dtype)


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the param groups with use_muon, AdamW for the rest (see the module docstring).

    A group's lr is the schedule's; a Muon group steps with lr * lr_ratio."""

    def __init__(
        self,
        muon_params: Iterable[torch.nn.Parameter],
        adamw_groups: list[dict[str, Any]],
        lr: float,
        lr_ratio: float,
        weight_decay: float,
        betas: tuple[float, float],
        momentum: float = 0.95,
        eps: float = 1e-8,
    ) -> None:
        groups = [
            {"params": list(muon_params), "use_muon": True, "lr_ratio": lr_ratio, "weight_decay": weight_decay},
            *({**g, "use_muon": False, "lr_ratio": 1.0} for g in adamw_groups),
        ]
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, momentum=momentum, weight_decay=0.0))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr = group["lr"] * group["lr_ratio"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if group["use_muon"]:
                    self._muon(p, group, lr)
                else:
                    self._adamw(p, group, lr)
        return loss

    def _muon(self, p: torch.Tensor, group: dict, lr: float) -> None:
        grad = cast(torch.Tensor, p.grad)  # step() skips a parameter without one
        state = self.state[p]
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = torch.zeros_like(p)
        mu = group["momentum"]
        buf.mul_(mu).add_(grad)
        update = newton_schulz(grad.add(buf, alpha=mu))  # Nesterov
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(update, alpha=-lr * max(1.0, p.shape[0] / p.shape[1]) ** 0.5)

    def _adamw(self, p: torch.Tensor, group: dict, lr: float) -> None:
        grad = cast(torch.Tensor, p.grad)
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        t = float(state["step"])
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt_().add_(group["eps"])
        p.mul_(1 - lr * group["weight_decay"])
        p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1**t))
