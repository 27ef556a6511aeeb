"""MFU: the peak lookup, the arithmetic, and the Trainer's epoch log and line on the CPU with a
stated peak (no GPU here: the A100 lookup is checked by its device name)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from common.config import Config, ConfigError, ModelConfig, load_config
from common.model.gpt import MarketGPT
from common.paths import REPO_ROOT
from common.training.batches import build_windows
from common.training.mfu import device_peak_flops, known_peak, mfu
from common.training.rng import seed_everything
from common.training.trainer import Trainer

from run_helpers import run_of

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")  # tensorboard's urllib3
T = 16


def _trainer(run_dir, out: io.StringIO, peak_flops=None) -> Trainer:
    cfg = Config()
    cfg.model = ModelConfig(
        vocab_size=64,
        context_length=T,
        d_model=32,
        num_layers=2,
        num_heads=2,
        d_ff=64,
        dropout=0.1,
        asset_embed_dim=4,
        category_embed_dim=4,
    )
    t = cfg.training
    t.batch_size, t.epochs, t.max_steps_per_epoch, t.warmup_steps, t.peak_flops = 4, 2, 3, 1, peak_flops
    rng = np.random.default_rng(0)
    tokens = {"A": rng.integers(3, 64, 300)}
    windows = build_windows(
        tokens,
        {"A": {"train": (0, 200), "val": (200, 250), "test": (250, 300)}},
        {"A": 0},
        {"A": 0},
        T,
        strides={"train": 1, "val": T, "test": T},
    )
    seed_everything(0)
    return Trainer(cfg.training, MarketGPT(cfg.model), windows, run_of(run_dir, cfg, 1), out=out, tensorboard=False)


def test_peak_is_the_stated_one_else_a_known_card_else_none(monkeypatch):
    assert device_peak_flops(torch.device("cpu")) is None
    assert device_peak_flops(torch.device("cpu"), 2e11) == 2e11
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert device_peak_flops(torch.device("cuda", 0)) == 312e12
    assert device_peak_flops(torch.device("cuda", 0), 1e14) == 1e14  # the config wins
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GH200 480GB")
    assert device_peak_flops(torch.device("cuda", 0)) is None  # not in the table: no MFU


@pytest.mark.parametrize(
    "name, peak, dtype",
    [
        ("NVIDIA A100-SXM4-40GB", 312e12, "bf16"),
        ("NVIDIA A100 80GB PCIe", 312e12, "bf16"),
        ("NVIDIA H100 80GB HBM3", 989.5e12, "bf16"),
        ("NVIDIA H100 PCIe", 756.5e12, "bf16"),
        ("NVIDIA H100 NVL", 835.5e12, "bf16"),
        ("NVIDIA H200", 989.5e12, "bf16"),
        ("NVIDIA H200 NVL", 835.5e12, "bf16"),
        ("NVIDIA L40S", 362.05e12, "bf16"),
        ("NVIDIA L40", 181.05e12, "bf16"),
        ("NVIDIA L4", 121e12, "bf16"),
        ("NVIDIA A10", 125e12, "bf16"),
        ("NVIDIA GeForce RTX 4090", 165.2e12, "bf16"),
        ("NVIDIA GeForce RTX 3090", 71e12, "bf16"),
        ("Tesla V100-SXM2-32GB", 125e12, "fp16"),
        ("Tesla V100-PCIE-16GB", 112e12, "fp16"),
        ("Tesla V100S-PCIE-32GB", 130e12, "fp16"),
        ("Tesla T4", 65e12, "fp16"),
        ("NVIDIA A10G", None, None),  # an AWS part without a datasheet figure, not the A10's
    ],
)
def test_known_cards_most_specific_name_first(name, peak, dtype):
    assert known_peak(name) == ((peak, dtype) if peak else None)


def test_mfu_is_model_flops_over_the_peak_of_all_devices():
    assert mfu(1000.0, 6_000_000, 1e10) == pytest.approx(0.6)
    assert mfu(1000.0, 6_000_000, 1e10, devices=2) == pytest.approx(0.3)  # tokens/s of the whole job
    assert mfu(1000.0, 6_000_000, None) is None


def test_flops_per_token_counts_the_weights_and_attention():
    cfg = ModelConfig(
        vocab_size=64,
        context_length=T,
        d_model=32,
        num_layers=2,
        num_heads=2,
        d_ff=64,
        asset_embed_dim=4,
        category_embed_dim=4,
    )
    model = MarketGPT(cfg)
    weights = model.num_parameters(non_embedding=True) + 64 * 32  # the body and the tied head
    assert model.flops_per_token(T) == 6 * weights + 12 * 2 * T * 32
    assert model.flops_per_token(4 * T) - model.flops_per_token(T) == 12 * 2 * (3 * T) * 32


def test_trainer_logs_mfu_per_epoch_against_a_stated_peak(tmp_path):
    out = io.StringIO()
    tr = _trainer(tmp_path, out, peak_flops=5e9)
    assert tr.metrics.flops_per_token == MarketGPT(tr.run.cfg.model).flops_per_token(T) and tr.metrics.peak_flops == 5e9
    tr.metrics.flops_per_token = 123_456  # injected: the log must follow the formula with these numbers
    assert tr.train() == "finished"
    log = json.loads((tmp_path / "training_log.json").read_text())
    for e in log["epochs"]:
        assert e["tokens_per_sec"] > 0 and e["mfu"] == pytest.approx(e["tokens_per_sec"] * 123_456 / 5e9, rel=1e-9)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("Throughput:")]
    assert len(lines) == 2 and all(line.endswith("of 0.005 TFLOP/s per device") for line in lines)
    assert f"MFU: {100 * log['epochs'][-1]['mfu']:.1f}%" in lines[-1]


def test_without_a_peak_mfu_is_null_and_not_printed(tmp_path):
    out = io.StringIO()
    tr = _trainer(tmp_path, out)
    assert tr.train() == "finished"
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert [e["mfu"] for e in log["epochs"]] == [None, None]
    assert "MFU" not in out.getvalue()


def test_peak_flops_config_key():
    config = REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json"
    assert load_config(config).training.peak_flops is None
    assert load_config(config, ["training.peak_flops=2.1e11"]).training.peak_flops == 2.1e11
    with pytest.raises(ConfigError, match="'training.peak_flops' must be positive"):
        load_config(config, ["training.peak_flops=0"])
