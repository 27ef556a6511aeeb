"""The Trainer on a tiny real MarketGPT and synthetic tokens: learning, logs, exact resume,
signals, timer checkpoints, NaN handling, early stopping."""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal

import numpy as np
import pytest
import torch

from common.config import Config, ModelConfig
from common.errors import UserError
from common.model.gpt import MarketGPT
from common.run.checkpoint import checkpoint_files, latest_good_checkpoint, load_checkpoint, save_checkpoint
from common.training.batches import build_windows
from common.training.lr_schedule import lr_at
from common.training.rng import seed_everything
from common.training.trainer import Trainer

from run_helpers import run_of

torch.set_num_threads(1)
# urllib3 (imported by tensorboard) probes for IPv6 by creating a socket at import: no traffic
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")
T = 16


def _config(**training) -> Config:
    cfg = Config()
    cfg.model = ModelConfig(
        vocab_size=64,
        context_length=T,
        d_model=32,
        num_layers=2,
        num_heads=2,
        d_ff=64,
        dropout=0.2,
        asset_embed_dim=4,
        category_embed_dim=4,
    )
    t = cfg.training
    t.batch_size, t.epochs, t.max_steps_per_epoch, t.warmup_steps = 4, 3, 6, 3
    t.learning_rate, t.grad_accum_steps, t.log_every_steps, t.seed = 3e-3, 2, 2, 5
    for k, v in training.items():
        setattr(t, k, v)
    return cfg


def _windows(features=None):
    """Two assets whose tokens follow a noisy cycle: learnable in a few dozen steps; features:
    symbol -> per-candle ids, for a model that reads them."""
    rng = np.random.default_rng(0)
    tokens, ranges = {}, {}
    for symbol, n, period in (("A", 400, 5), ("B", 300, 7)):
        cycle = 3 + (np.arange(n) % period) * 7
        noise = rng.random(n) < 0.1
        tokens[symbol] = np.where(noise, rng.integers(3, 64, n), cycle)
        ranges[symbol] = {"train": (0, int(n * 0.7)), "val": (int(n * 0.7), int(n * 0.85)), "test": (int(n * 0.85), n)}
    return build_windows(
        tokens,
        ranges,
        {"A": 0, "B": 1},
        {"A": 0, "B": 0},
        T,
        strides={"train": 1, "val": T, "test": T},
        features=features,
    )


WINDOWS = _windows()


def _trainer(run_dir, cfg=None, out=None, windows=None, **training) -> Trainer:
    cfg = cfg or _config(**training)
    seed_everything(cfg.training.seed)
    model = MarketGPT(cfg.model, num_assets=2, num_categories=1)
    run = run_of(run_dir, cfg)
    return Trainer(cfg.training, model, windows or WINDOWS, run, out=out or io.StringIO(), tensorboard=False)


def _weights(trainer: Trainer) -> dict:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _losses(trainer: Trainer) -> list:
    return [
        (e["epoch"], e["train_loss"], e["train_acc"], e["val_loss"], e["val_acc"], e["lr"]) for e in trainer.log.epochs
    ]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted reference run: 3 epochs x 6 steps x 2 micro-batches."""
    tr = _trainer(tmp_path_factory.mktemp("straight"))
    assert tr.train() == "finished"
    return _weights(tr), _losses(tr)


def _resume(run_dir, windows=None, **training) -> Trainer:
    """A new process's view: fresh model with other random weights, state from the newest checkpoint."""
    tr = _trainer(run_dir, windows=windows, **training)
    torch.manual_seed(12345)  # the checkpoint, not this, must decide dropout from here on
    tr.load_state_dict(load_checkpoint(latest_good_checkpoint(run_dir)))
    return tr


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    lrs = [lr_at(s, 1.0, 10, 110, 0.1) for s in range(110)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lr_at(110, 1.0, 10, 110, 0.1) == pytest.approx(0.1)
    assert lr_at(60, 1.0, 10, 110, 0.1) == pytest.approx(0.55)  # half-way down the cosine
    assert lr_at(0, 2.0, 0, 10, 0.0) == pytest.approx(2.0)


def _applied_lrs(trainer: Trainer) -> list[float]:
    """The learning rate of every optimizer step the trainer takes from now on."""
    seen: list[float] = []
    real_step = trainer.step.optimizer.step

    def step(*args, **kwargs):
        seen.append(trainer.step.optimizer.param_groups[0]["lr"])
        return real_step(*args, **kwargs)

    trainer.step.optimizer.step = step
    return seen


@pytest.mark.parametrize("stop_at", [None, 9], ids=["finished", "mid-run"])
def test_extending_a_run_keeps_the_learning_rate_continuous(tmp_path, stop_at):
    first = _trainer(tmp_path, epochs=2, min_lr_ratio=0.1)  # 12 steps, warmup 3
    before = _applied_lrs(first)
    assert first.train(stop_after_steps=stop_at) == ("stopped" if stop_at else "finished")
    extended = _resume(tmp_path, epochs=4, min_lr_ratio=0.1)  # 24 steps now: the cosine must not jump up
    after = _applied_lrs(extended)
    assert extended.train() == "finished"
    done = len(before)
    assert after[0] == pytest.approx(before[-1], rel=1e-12)  # right after == right before
    assert all(a >= b for a, b in zip(after, after[1:]))  # then only down...
    assert after[-1] == pytest.approx(extended.lr(23)) and extended.lr(24) == pytest.approx(3e-3 * 0.1)
    assert len(after) == 24 - done
    # ...and a later resume of the extended run keeps the same schedule
    again = _resume(tmp_path, epochs=4, min_lr_ratio=0.1)
    assert [again.lr(s) for s in range(done, 24)] == after


def test_final_outputs_are_written_before_the_log_says_finished(tmp_path):
    tr = _trainer(tmp_path, epochs=1)
    seen = []

    def final_outputs(status):
        seen.append(
            (
                status,
                json.loads((tmp_path / "training_log.json").read_text())["status"],
                (tmp_path / "best_model.pt").is_file(),
                [p.name for p in checkpoint_files(tmp_path)],
            )
        )

    assert tr.train(final_outputs=final_outputs) == "finished"
    assert seen == [("finished", "running", True, ["checkpoint_epoch_1.pt"])]
    assert json.loads((tmp_path / "training_log.json").read_text())["status"] == "finished"
    # resumed with nothing left to train, it only writes the final outputs again
    again = _resume(tmp_path, epochs=1)
    steps = _applied_lrs(again)
    assert again.train(final_outputs=final_outputs) == "finished" and steps == [] and len(seen) == 2


def test_nan_validation_loss_fails_the_run_and_is_never_saved_as_best(tmp_path):
    tr = _trainer(tmp_path, epochs=3)
    val = iter([3.0, float("nan")])
    tr.evaluate = lambda split, max_batches=None: (next(val), 0.5)
    assert tr.train(final_outputs=lambda status: pytest.fail("a failed run has no final outputs")) == "failed"
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["status"] == "failed" and "non-finite validation loss" in log["error"] and "epoch 2" in log["error"]
    assert [e["epoch"] for e in log["epochs"]] == [1] and (log["best_epoch"], log["best_val_loss"]) == (1, 3.0)
    assert load_checkpoint(tmp_path / "best_model.pt")["epoch"] == 1
    assert [p.name for p in checkpoint_files(tmp_path)] == ["checkpoint_epoch_1.pt"]


def test_training_learns_and_reports_in_the_seed_format(tmp_path):
    out = io.StringIO()
    tr = _trainer(tmp_path, out=out, epochs=4, max_steps_per_epoch=10, learning_rate=1e-2)
    tr.metrics.tensorboard = True
    before, _ = tr.evaluate("val")
    assert tr.train() == "finished"
    text = out.getvalue()
    assert "CUDA not available: training on CPU" in text
    assert "Effective batch size: 8 " in text  # 4 per process x 1 process x 2 accumulation
    assert "\r" not in text  # not a terminal: plain progress lines only
    assert re.search(r"epoch 1/4 step 2/10 \| loss \d+\.\d{3} \| lr ", text)
    blocks = re.findall(
        r"^Epoch (\d+)/4\nTrain Loss: \d+\.\d{3} \| Train Acc: \d+\.\d%\n"
        r"Val Loss: (\d+\.\d{3}) \| Val Acc: \d+\.\d%\nTime: \d+h \d+m \| ETA: \d+h \d+m$",
        text,
        re.M,
    )
    assert [b[0] for b in blocks] == ["1", "2", "3", "4"]

    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["status"] == "finished" and log["error"] is None
    assert [e["epoch"] for e in log["epochs"]] == [1, 2, 3, 4]
    for e in log["epochs"]:
        assert {
            "epoch",
            "train_loss",
            "train_acc",
            "val_loss",
            "val_acc",
            "lr",
            "tokens_per_sec",
            "elapsed_s",
            "eta_s",
        } <= set(e)
        assert 0 <= e["train_acc"] <= 1 and e["tokens_per_sec"] > 0
    assert log["epochs"][-1]["eta_s"] == 0
    best = min(log["epochs"], key=lambda e: e["val_loss"])
    assert (log["best_epoch"], log["best_val_loss"]) == (best["epoch"], best["val_loss"])
    assert log["epochs"][-1]["val_loss"] < before - 0.5  # it learned the cycles
    assert load_checkpoint(tmp_path / "best_model.pt")["epoch"] == best["epoch"]
    assert [p.name for p in checkpoint_files(tmp_path)] == [f"checkpoint_epoch_{e}.pt" for e in (2, 3, 4)]
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())


@pytest.mark.parametrize("stop_at", [4, 6, 9], ids=["mid-epoch", "epoch-end", "next-epoch"])
def test_resume_is_bit_identical(tmp_path, straight, stop_at):
    weights, losses = straight
    first = _trainer(tmp_path)
    assert first.train(stop_after_steps=stop_at) == "stopped"
    assert first.global_step == stop_at
    second = _resume(tmp_path)
    assert second.global_step == stop_at
    assert second.train() == "finished"
    for name, w in weights.items():
        assert torch.equal(second.model.state_dict()[name], w), name
    assert _losses(second) == losses


def test_resume_of_a_model_reading_candle_ids_is_bit_identical(tmp_path):
    """model.time_features + vol_level_input + market_context + market_peer: the windows carry (n,
    8) ids beside the tokens, and a resume draws the same ids with the same windows."""
    rng = np.random.default_rng(1)
    windows = _windows(
        {
            s: np.stack([rng.integers(0, m, n) for m in (24, 7, 9, 9, 9, 9, 9, 9)], axis=1)
            for s, n in (("A", 400), ("B", 300))
        }
    )

    def config() -> Config:
        cfg = _config()
        cfg.model.time_features = cfg.model.vol_level_input = cfg.model.market_context = cfg.model.market_peer = True
        return cfg

    whole = _trainer(tmp_path / "straight", cfg=config(), windows=windows)
    assert whole.train() == "finished"
    first = _trainer(tmp_path / "cut", cfg=config(), windows=windows)
    assert first.train(stop_after_steps=7) == "stopped"
    second = _trainer(tmp_path / "cut", cfg=config(), windows=windows)
    torch.manual_seed(12345)
    second.load_state_dict(load_checkpoint(latest_good_checkpoint(tmp_path / "cut")))
    assert second.train() == "finished"
    for name, w in whole.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], w), name
    assert _losses(second) == _losses(whole)
    assert {"vol_level_emb.weight", "market_emb.2.weight", "market_emb.3.weight"} <= set(whole.model.state_dict())


@pytest.mark.parametrize("stop_at", [4, 9], ids=["mid-epoch", "next-epoch"])
def test_resume_with_strided_epochs_is_bit_identical(tmp_path, straight, stop_at):
    """data.epoch_stride: each epoch takes every k-th window from an offset drawn per cycle of
    epochs; a resume (mid-epoch or in the next epoch) must see exactly the same windows."""
    strided = _windows()
    strided.epoch_stride = 3
    whole = _trainer(tmp_path / "straight", windows=strided)
    assert whole.train() == "finished"
    plain_weights, _ = straight  # stride 1
    assert any(not torch.equal(whole.model.state_dict()[k], w) for k, w in plain_weights.items())  # it took effect
    first = _trainer(tmp_path / "cut", windows=strided)
    assert first.train(stop_after_steps=stop_at) == "stopped"
    second = _resume(tmp_path / "cut", windows=strided)
    assert second.train() == "finished"
    for name, w in whole.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], w), name
    assert _losses(second) == _losses(whole)


def test_a_checkpoint_from_before_the_generated_epoch_order_resumes_with_randperm(tmp_path):
    """A run made before "epoch_order" existed drew its epochs with torch.randperm: resumed from
    its checkpoint (no "epoch_order" key) it goes on bit for bit as that code would have, and
    records "randperm" so later resumes keep it; a new run records and uses "feistel"."""
    assert _trainer(tmp_path / "new").state_dict()["epoch_order"] == "feistel"
    old_way = _trainer(tmp_path / "old")
    old_way.epoch_order = "randperm"  # the order of the code before, for the whole run
    assert old_way.train() == "finished"
    new, old = (WINDOWS.epoch_order("train", 5, 0, method=m).long() for m in ("feistel", "randperm"))
    assert not torch.equal(new, old)  # the two orders differ: the test tells them apart
    first = _trainer(tmp_path / "cut")
    first.epoch_order = "randperm"
    assert first.train(stop_after_steps=4) == "stopped"
    path = latest_good_checkpoint(tmp_path / "cut")
    state = load_checkpoint(path)
    del state["epoch_order"]  # as the code before wrote it
    save_checkpoint(state, path)
    second = _resume(tmp_path / "cut")
    assert second.epoch_order == "randperm"
    assert second.train(stop_after_steps=9) == "stopped"
    assert load_checkpoint(latest_good_checkpoint(tmp_path / "cut"))["epoch_order"] == "randperm"
    third = _resume(tmp_path / "cut")
    assert third.train() == "finished"
    for name, w in old_way.model.state_dict().items():
        assert torch.equal(third.model.state_dict()[name], w), name
    assert _losses(third) == _losses(old_way)
    state["epoch_order"] = "from-the-future"
    with pytest.raises(UserError, match="epoch order 'from-the-future' is unknown"):
        _trainer(tmp_path / "other").load_state_dict(state)


def _signal_at_step(trainer: Trainer, sig: int, step: int) -> None:
    """Send `sig` to this process during optimizer step `step` (1-based), from inside forward."""
    calls = {"n": 0}
    accum = trainer.t.grad_accum_steps

    def hook(module, args, output):
        if module.training:
            calls["n"] += 1
            if calls["n"] == (step - 1) * accum + 1:
                os.kill(os.getpid(), sig)

    trainer.model.register_forward_hook(hook)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2], ids=["SIGTERM", "SIGUSR2"])
def test_stop_signal_saves_at_the_step_boundary_and_stops_then_resumes_exactly(tmp_path, straight, sig):
    tr = _trainer(tmp_path)
    _signal_at_step(tr, sig, 8)
    previous = signal.getsignal(sig)
    assert tr.train() == "interrupted"
    assert signal.getsignal(sig) is previous  # handlers restored
    assert [p.name for p in checkpoint_files(tmp_path)][-1] == "checkpoint_epoch_2_step_2.pt"
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["status"] == "running" and signal.Signals(sig).name in log["interrupted"]
    second = _resume(tmp_path)
    assert second.train() == "finished"
    assert all(torch.equal(second.model.state_dict()[k], w) for k, w in straight[0].items())
    assert second.log.interrupted is None


def test_sigusr1_saves_and_carries_on(tmp_path, straight):
    tr = _trainer(tmp_path, keep_checkpoints=5)
    _signal_at_step(tr, signal.SIGUSR1, 3)
    seen = []
    real_save = tr._save
    tr._save = lambda name: (seen.append(name), real_save(name))
    assert tr.train() == "finished"
    assert seen[0] == "checkpoint_epoch_1_step_3.pt"
    assert all(torch.equal(tr.model.state_dict()[k], w) for k, w in straight[0].items())


def test_timer_checkpoints_inside_epochs(tmp_path):
    tr = _trainer(tmp_path, checkpoint_every_minutes=1e-9)  # due at every step boundary
    assert tr.train(stop_after_steps=10) == "stopped"
    names = [p.name for p in checkpoint_files(tmp_path)]
    # epoch 1's step checkpoints were pruned by its epoch checkpoint; two fresh ones are kept
    assert names == ["checkpoint_epoch_1.pt", "checkpoint_epoch_2_step_3.pt", "checkpoint_epoch_2_step_4.pt"]
    state = load_checkpoint(tmp_path / names[-1])
    assert state["progress"]["step_in_epoch"] == 4 and state["progress"]["global_step"] == 10
    assert json.loads((tmp_path / "training_log.json").read_text())["status"] == "running"


def _nan_loss_from(trainer: Trainer, first: int, until: float = math.inf) -> None:
    """Training forwards `first`..`until` (1-based; one per optimizer step at grad_accum_steps 1)
    return a NaN loss."""
    calls = {"n": 0}
    real_forward = trainer.model.forward

    def forward(*args, **kwargs):
        logits, loss = real_forward(*args, **kwargs)
        if trainer.model.training:
            calls["n"] += 1
            if first <= calls["n"] <= until:
                loss = loss * float("nan")
        return logits, loss

    trainer.model.forward = forward


def test_nan_loss_fails_with_the_step_and_is_never_saved_as_best(tmp_path):
    tr = _trainer(tmp_path, grad_accum_steps=1)
    _nan_loss_from(tr, 9)  # optimizer step 9 (epoch 2, step 3) and every later one
    out = io.StringIO()
    tr.out = out
    assert tr.train() == "failed"
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["status"] == "failed" and log["failed_step"] == 9
    assert "step 9 (epoch 2)" in log["error"] and "non-finite training loss" in log["error"]
    assert [e["epoch"] for e in log["epochs"]] == [1]
    assert load_checkpoint(tmp_path / "best_model.pt")["epoch"] == 1
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())  # the bad step was not applied
    assert [p.name for p in checkpoint_files(tmp_path)] == ["checkpoint_epoch_1.pt"]
    assert "Training failed: non-finite training loss" in out.getvalue()


def test_early_stopping_on_val_loss(tmp_path):
    tr = _trainer(tmp_path, epochs=10, early_stopping_patience=2, max_steps_per_epoch=1)
    val = iter([3.0, 2.0, 2.5, 2.0, 9.0, 1.0])  # best at epoch 2, then two epochs without a better one
    tr.evaluate = lambda split, max_batches=None: (next(val), 0.5)
    assert tr.train() == "early_stopped"
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["status"] == "early_stopped"
    assert (log["best_epoch"], log["best_val_loss"]) == (2, 2.0)
    assert [e["epoch"] for e in log["epochs"]] == [1, 2, 3, 4]
    assert load_checkpoint(tmp_path / "best_model.pt")["epoch"] == 2
    # a resume of an early-stopped run does not train further
    again = _resume(tmp_path, epochs=10, early_stopping_patience=2, max_steps_per_epoch=1)
    assert again.train() == "early_stopped" and again.epoch == 4


def test_state_dict_holds_everything_a_resume_needs(tmp_path):
    tr = _trainer(tmp_path)
    tr.train(stop_after_steps=2)
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["status"] == "running" and log["epochs"] == [] and log["best_val_loss"] is None
    state = load_checkpoint(latest_good_checkpoint(tmp_path))
    assert {
        "model",
        "optimizer",
        "lr_schedule",
        "progress",
        "epoch_order",
        "epoch_sums",
        "early_stopping",
        "rng",
        "log",
        "config",
    } <= set(state)
    assert state["lr_schedule"] == {"total_steps": 18, "restart": None}
    assert set(state["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])
    assert state["config"]["model"]["d_model"] == 32
    assert state["early_stopping"]["best_val_loss"] == math.inf


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_progress_bar_instead_of_lines(tmp_path):
    out = _Terminal()
    tr = _trainer(tmp_path, out=out, epochs=1)
    assert tr.train() == "finished"
    text = out.getvalue()
    assert "\r" in text and "Epoch 1/1:" in text  # tqdm's bar, redrawn in place
    assert not re.search(r"^  epoch 1/1 step", text, re.M)
    assert re.search(r"(^|\r)Epoch 1/1\nTrain Loss: ", text, re.M)  # after the bar is cleared


# ---------------------------------------------------------------- reading steps late (the GPU's way)


def _late(trainer: Trainer, fused: bool = False) -> Trainer:
    """The GPU's loop on the CPU: each step's sums read while the next step runs (read_lag 1),
    optionally with the GPU's fused AdamW, whose found_inf skips a non-finite step on the device."""
    trainer.read_lag = 1
    if fused:
        t = trainer.t
        trainer.step.optimizer = trainer.model.configure_optimizer(
            t.weight_decay,
            t.learning_rate,
            (t.beta1, t.beta2),
            "cuda",  # fused=True; it runs on CPU tensors too
        )
        assert trainer.step.optimizer.defaults["fused"]
    return trainer


def test_reading_steps_late_trains_the_same_run_and_resumes_exactly(tmp_path, straight):
    weights, losses = straight
    late = _late(_trainer(tmp_path / "whole"))
    assert late.train() == "finished"
    assert all(torch.equal(late.model.state_dict()[k], w) for k, w in weights.items())
    assert _losses(late) == losses
    first = _late(_trainer(tmp_path / "cut"))
    assert first.train(stop_after_steps=4) == "stopped"
    assert first.global_step == 4 and first._in_flight is None  # the checkpoint holds step 4
    second = _late(_resume(tmp_path / "cut"))
    assert second.train() == "finished"
    assert all(torch.equal(second.model.state_dict()[k], w) for k, w in weights.items())
    assert _losses(second) == losses


def test_reading_steps_late_serves_a_stop_signal_one_step_later(tmp_path, straight):
    tr = _late(_trainer(tmp_path))
    _signal_at_step(tr, signal.SIGTERM, 8)
    assert tr.train() == "interrupted"
    # the flag rode in step 8's agreement, read once step 9 was queued: the checkpoint holds step 9
    assert [p.name for p in checkpoint_files(tmp_path)][-1] == "checkpoint_epoch_2_step_3.pt"
    second = _late(_resume(tmp_path))
    assert second.global_step == 9 and second.train() == "finished"
    assert all(torch.equal(second.model.state_dict()[k], w) for k, w in straight[0].items())


@pytest.mark.parametrize("fused", [False, True], ids=["cpu-adamw", "fused-adamw"])
def test_reading_steps_late_never_applies_or_saves_a_nan_step(tmp_path, fused):
    tr = _late(_trainer(tmp_path, grad_accum_steps=1), fused=fused)
    _nan_loss_from(tr, 9, until=9)  # optimizer step 9 alone: epoch 2, step 3
    assert tr.train() == "failed"
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["failed_step"] == 9 and "step 9 (epoch 2)" in log["error"]
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())
    assert tr.global_step == 10  # step 10 was queued before step 9 was read ...
    assert [p.name for p in checkpoint_files(tmp_path)] == ["checkpoint_epoch_1.pt"]  # ... and nothing saved
    # 10 steps queued, step 9 skipped (on the device by the fused AdamW's found_inf, else on the host)
    assert {int(state["step"]) for state in tr.step.optimizer.state.values()} == {9}


@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # clipped, and left alone
def test_clip_values_is_torchs_clipping_and_packs_the_norm(max_norm):
    from common.training.step import clip_values

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in [(7, 5), (5,), (3, 2, 4)]]
    for p in params:
        p.grad = 3 * torch.randn_like(p)
    grads = [p.grad.clone() for p in params]
    want_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    sums = torch.tensor([12.5, 3.0, 8.0], dtype=torch.float64)
    values, bad = clip_values(grads, max_norm, sums, main=True)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, params))  # bit for bit, in place
    assert values.tolist() == [12.5, 3.0, 8.0, float(want_norm)] and float(bad) == 0.0
    values, _ = clip_values([g.clone() for g in grads], max_norm, sums, main=False)
    assert values[3] == 0  # only rank 0's norm enters the all-reduce
    grads[0][0, 0] = float("inf")
    assert float(clip_values(grads, max_norm, sums, main=True)[1]) == 1.0
    # the loss decides there
    assert float(clip_values([g.clone() for g in grads], max_norm, sums, main=False)[1]) == 0.0


def test_one_process_agreement_keeps_the_flags_on_the_host():
    from common.training.signals import CheckpointRequests

    requests = CheckpointRequests(every_minutes=0.0)  # the timer is due at once
    requests.restart_timer(0.0)
    requests.pending = signal.SIGUSR2
    sums = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    agreement = requests.send(sums)
    assert agreement.values is sums  # nothing appended, nothing copied
    assert agreement.get() == ([1.0, 2.0, 3.0, 4.0], signal.SIGUSR2, True)
    assert requests.pending is None
    requests.restart_timer(float("inf"))
    assert requests.send(sums).get() == ([1.0, 2.0, 3.0, 4.0], None, False)
