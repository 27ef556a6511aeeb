"""RNG states in checkpoints: every generator round-trips, and a GPU state goes to this
process's own device whatever number of GPUs the saving process saw."""

from __future__ import annotations

import random

import numpy as np
import torch

from common.training import rng
from common.training.rng import rng_state, seed_everything, set_rng_state


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_every_generator_continues_where_the_state_was_taken():
    seed_everything(3)
    _draws()
    state = rng_state()
    expected = _draws()
    seed_everything(99)
    set_rng_state(state)
    assert _draws() == expected
    assert state["cuda"] == [] or torch.cuda.is_available()


class _FakeCuda:
    """torch.cuda as a process bound to GPU `device` sees it (no GPU on the test machines)."""

    def __init__(self, device: int) -> None:
        self.device, self.restored = device, []

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return self.device

    def get_rng_state(self, device: int) -> torch.Tensor:
        return torch.full((4,), device, dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor, device: int) -> None:
        self.restored.append((int(state[0]), device))


def test_a_gpu_state_is_this_devices_own_and_survives_a_change_of_visible_gpus(monkeypatch):
    saver = _FakeCuda(device=1)
    monkeypatch.setattr(rng.torch, "cuda", saver)
    state = rng_state()
    assert torch.equal(state["cuda"], torch.full((4,), 1, dtype=torch.uint8))  # one state, not a list

    resumer = _FakeCuda(device=0)  # the same rank, now bound to the only GPU it sees
    monkeypatch.setattr(rng.torch, "cuda", resumer)
    set_rng_state(state)
    assert resumer.restored == [(1, 0)]

    # a checkpoint of the older format (every visible GPU's state) picks this device's entry
    for device, states, picked in ((1, [10, 11], 11), (3, [10, 11], 11), (0, [10], 10)):
        resumer = _FakeCuda(device)
        monkeypatch.setattr(rng.torch, "cuda", resumer)
        set_rng_state({**state, "cuda": [torch.full((4,), s, dtype=torch.uint8) for s in states]})
        assert resumer.restored == [(picked, device)]
