"""training.optimizer = "muon" (common/training/muon.py): orthogonalized matrix updates, AdamW's
for the rest, a resume that equals an uninterrupted run."""

from __future__ import annotations

import torch

from common.run.checkpoint import load_checkpoint
from common.training.muon import MuonAdamW, newton_schulz

from test_trainer import _config, _losses, _resume, _trainer


def test_newton_schulz_gives_a_semi_orthogonal_matrix_with_the_same_singular_vectors():
    torch.manual_seed(0)
    for shape in ((32, 64), (64, 32), (48, 48)):
        g = torch.randn(shape) @ torch.diag(torch.logspace(-1, 0.5, shape[1]))  # badly conditioned
        u, s, vh = torch.linalg.svd(newton_schulz(g), full_matrices=False)
        # the bulk near 1 (the quintic does not lift the tiniest, as Muon intends), none above 1.3
        assert (s > 0.6).float().mean() > 0.9 and s.max() < 1.3, (shape, s)
        # each singular direction of g keeps its sign: u^T o(g) v is diagonal and positive
        gu, _, gvh = torch.linalg.svd(g, full_matrices=False)
        inner = gu.T @ newton_schulz(g) @ gvh.T
        assert (torch.diagonal(inner) > 0).all()
        assert (inner - torch.diag(torch.diagonal(inner))).abs().max() < 0.05


def test_the_adamw_groups_step_as_torch_adamw():
    torch.manual_seed(1)
    a = [torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    ours = MuonAdamW(
        [],
        [{"params": [a[0]], "weight_decay": 0.1}, {"params": [a[1]], "weight_decay": 0.0}],
        1e-2,
        20.0,
        0.1,
        (0.9, 0.95),
    )
    ref = torch.optim.AdamW(
        [{"params": [b[0]], "weight_decay": 0.1}, {"params": [b[1]], "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.95)
    )
    for _ in range(5):
        grads = [torch.randn_like(p) for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        for p, q in zip(a, b):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_muon_run_learns_and_resumes_bit_identical(tmp_path):
    cfg = lambda: _config(optimizer="muon", muon_lr=0.02)  # noqa: E731
    whole = _trainer(tmp_path / "straight", cfg=cfg())
    assert isinstance(whole.step.optimizer, MuonAdamW) and whole.train() == "finished"
    losses = _losses(whole)
    assert losses[-1][1] < losses[0][1]  # train loss falls
    muon = whole.step.optimizer.param_groups[0]
    assert muon["use_muon"] and all(p.dim() == 2 for p in muon["params"]) and len(muon["params"]) == 2 * 4
    first = _trainer(tmp_path / "cut", cfg=cfg())
    assert first.train(stop_after_steps=7) == "stopped"
    second = _resume(tmp_path / "cut", optimizer="muon", muon_lr=0.02)
    assert second.train() == "finished"
    for name, w in whole.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], w), name
    assert _losses(second) == losses
    assert load_checkpoint(next((tmp_path / "cut").glob("checkpoint_epoch_*.pt")))["optimizer"]["state"]
