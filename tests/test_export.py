"""`marketgpt export`: ONNX and TorchScript exports of a tiny trained run, their parity with the
torch model, the model card, the torch-free sampler of common.forecasting.infer, and bad input."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from common.cli import main
from common.forecasting.export import PARITY_ATOL, NextTokenLogits, random_inputs
from common.forecasting.forecaster import Forecaster
from common.forecasting.infer import OnnxBackend, draw_tokens_np, sample_paths_np
from common.model.sampling import sample_paths
from slurm_helpers import REPO
from test_forecast import TINY, run_dir  # noqa: F401 (run_dir: the tiny trained run fixture)

pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")  # training's tensorboard


@pytest.fixture(scope="module")
def onnx_dir(run_dir):
    assert main(["export", str(run_dir), "--format", "onnx"]) == 0  # default --out: <case>/exports/<run>
    return run_dir.parent.parent / "exports" / run_dir.name


@pytest.fixture(scope="module")
def forecaster(run_dir):
    return Forecaster.from_run(run_dir)


def test_onnx_export_files_and_model_card(run_dir, onnx_dir, forecaster):
    for name in ("model.onnx", "model_step.onnx", "config.json", "tokenizer.json", "asset_info.json",
                 "model_card.json"):
        assert (onnx_dir / name).is_file(), name
    assert not list(onnx_dir.glob(".export_*")), "no staging folder left behind"
    for name in ("config.json", "tokenizer.json", "asset_info.json"):
        assert (onnx_dir / name).read_bytes() == (run_dir / name).read_bytes()
    card = json.loads((onnx_dir / "model_card.json").read_text())
    data_info = json.loads((run_dir / "data_info.json").read_text())
    assert card["training_data_cutoff"] == data_info["split_cuts"]["val_start"]
    assert card["universe"] == list(json.loads((run_dir / "asset_info.json").read_text())["symbols"])
    assert card["parameter_count"] == sum(p.numel() for p in forecaster.model.parameters())
    assert card["parent_run"] == str(run_dir.resolve())
    assert card["kv_cache"] is True and card["context_length"] == TINY["model"]["context_length"]
    scorecard = run_dir / "scorecard.json"
    expected = json.loads(scorecard.read_text())["headline"] if scorecard.is_file() else None
    assert card["scorecard_headline"] == expected
    assert 0 <= card["parity_max_abs_diff"] <= PARITY_ATOL


@pytest.mark.parametrize("batch,length", [(1, 1), (7, 5), (4, 16), (33, 16)])
def test_onnxruntime_and_torch_logits_agree_on_random_inputs(onnx_dir, forecaster, batch, length):
    info = json.loads((onnx_dir / "asset_info.json").read_text())
    t, a, c = random_inputs(batch, length, TINY["model"]["vocab_size"], info["num_assets"], info["num_categories"],
                            seed=batch * 100 + length)
    with torch.no_grad():
        ref = NextTokenLogits(forecaster.model)(t, a, c).numpy()
    backend = OnnxBackend(onnx_dir / "model.onnx", context_length=16)
    got = backend(t.numpy(), a.numpy(), c.numpy())
    assert got.shape == (batch, TINY["model"]["vocab_size"]) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)
    if length > 1:  # the KV-cache path: all but the last token prefilled, then one step
        _, k, v = backend.prefill(t[:, :-1].numpy(), a.numpy(), c.numpy())
        stepped = backend.step(t[:, -1:].numpy(), a.numpy(), c.numpy(), k, v)[0]
        np.testing.assert_allclose(stepped, ref, rtol=0, atol=1e-4)


def test_torchscript_export_matches_torch(run_dir, forecaster, tmp_path):
    assert main(["export", str(run_dir), "--format", "torchscript", "--out", str(tmp_path / "ts")]) == 0
    module = torch.jit.load(str(tmp_path / "ts" / "model.pt"))
    t, a, c = random_inputs(3, 9, TINY["model"]["vocab_size"], 5, 2, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(module(t, a, c), NextTokenLogits(forecaster.model)(t, a, c), atol=1e-4, rtol=0)
    assert json.loads((tmp_path / "ts" / "model_card.json").read_text())["file"] == "model.pt"


@pytest.mark.parametrize("cached", [True, False])
def test_greedy_paths_equal_the_torch_sampler(onnx_dir, forecaster, cached):
    """common.forecasting.infer's window is the torch sampler's: with greedy decoding both give the same
    tokens, across the window's rebuild (horizon > T / 2), with the ONNX KV cache and without
    (a plain logits function re-running the window)."""
    info = json.loads((onnx_dir / "asset_info.json").read_text())
    t, a, c = random_inputs(3, 16, 60, info["num_assets"], info["num_categories"], seed=5)
    banned = forecaster.banned_ids()
    ref = sample_paths(forecaster.model, t, a, c, horizon=20, samples=2, temperature=0.0,
                       banned=torch.as_tensor(banned)).numpy()
    backend = OnnxBackend(onnx_dir / "model.onnx", 16)
    logits = backend if cached else (lambda *x: backend(*x))  # a plain function has no step()
    got = sample_paths_np(logits, t.numpy(), a.numpy(), c.numpy(), horizon=20, samples=2, context_length=16,
                          temperature=0.0, banned=banned, max_batch=4)
    np.testing.assert_array_equal(got, ref)


def test_numpy_draws_follow_the_distribution_and_never_a_banned_id():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4, 1e-9]] * 20000, dtype=np.float32))
    banned = np.array([False, False, False, False, True])
    ids = draw_tokens_np(logits, 1.0, None, None, banned, rng)
    freq = np.bincount(ids, minlength=5) / len(ids)
    np.testing.assert_allclose(freq[:4], [0.1, 0.2, 0.3, 0.4], atol=0.015)
    assert freq[4] == 0
    assert set(draw_tokens_np(logits, 1.0, 2, None, banned, rng)) == {2, 3}  # top-k 2
    assert set(draw_tokens_np(logits, 1.0, None, 0.35, banned, rng)) == {3}  # top-p: 0.4 reaches it alone
    assert set(draw_tokens_np(logits, 0.0, None, None, banned, rng)) == {3}  # greedy
    a = draw_tokens_np(logits[:50], 1.0, None, None, banned, np.random.default_rng(3))
    np.testing.assert_array_equal(a, draw_tokens_np(logits[:50], 1.0, None, None, banned, np.random.default_rng(3)))


# --------------------------------------------------------------------------- bad input


def test_a_run_without_a_best_model_unknown_format_and_unwritable_out_are_clear_errors(run_dir, tmp_path, capsys):
    bare = tmp_path / "case" / "checkpoints" / "bare_20240101_000000"
    shutil.copytree(run_dir, bare, ignore=shutil.ignore_patterns("best_model.pt", "checkpoint_*", "tensorboard"))
    assert main(["export", str(bare), "--out", str(tmp_path / "x")]) == 2
    assert "no best_model.pt yet" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

    assert main(["export", str(run_dir), "--format", "tflite", "--out", str(tmp_path / "y")]) == 2
    assert "--format 'tflite': expected one of onnx, torchscript" in capsys.readouterr().err

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["export", str(run_dir), "--out", str(blocker / "out")]) == 2
    assert f"--out {blocker / 'out'} is not writable" in capsys.readouterr().err


# --------------------------------------------------------------------------- forecasting from the export


def test_forecast_with_onnxruntime_is_the_torch_forecast(onnx_dir, forecaster):
    """Greedy decoding takes the sampler's draws out: the same table from both backends."""
    from common.forecasting.infer import ExportedForecaster

    fc = ExportedForecaster.from_export(onnx_dir)
    histories = forecaster.load_history(["AAPL", "^GSPC"], as_of="2012-06-01")
    ref = forecaster.forecast(histories, horizon=12, samples=3, temperature=0.0).table
    got = fc.forecast(histories, horizon=12, samples=3, temperature=0.0).table
    pd.testing.assert_frame_equal(got, ref)
    sampled = fc.forecast(histories, horizon=12, samples=40, seed=4)
    pd.testing.assert_frame_equal(sampled.table, fc.forecast(histories, horizon=12, samples=40, seed=4).table)
    assert (sampled.table["p95"] > sampled.table["p5"]).all()


BLOCK_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, NoTorch())
from common.cli import main
code = main(sys.argv[1:])
assert not [m for m in sys.modules if m.split(".")[0] == "torch"]
sys.exit(code)
"""


def test_marketgpt_forecast_backend_onnx_runs_without_torch(onnx_dir, tmp_path):
    out = tmp_path / "fc"
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH, "forecast", str(onnx_dir), "--backend", "onnx",
                           "--symbols", "AAPL,IBM", "--horizon", "5", "--samples", "30", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AAPL" in proc.stdout and "IBM" in proc.stdout
    meta = json.loads((out / "forecast.json").read_text())
    card = json.loads((onnx_dir / "model_card.json").read_text())
    assert meta["backend"] == "onnx" and meta["checkpoint_sha256"] == card["checkpoint_sha256"]
    assert meta["precision"] == "fp32"
    assert len(pd.read_parquet(out / "forecast.parquet")) == 2 * 5


def test_forecast_backend_onnx_on_a_run_folder_or_a_torchscript_export_says_what_is_missing(run_dir, tmp_path,
                                                                                              capsys):
    assert main(["forecast", str(run_dir), "--backend", "onnx", "--out", str(tmp_path / "a")]) == 2
    assert "missing model.onnx" in capsys.readouterr().err
    assert main(["forecast", str(run_dir), "--backend", "onnx", "--precision", "bf16"]) == 2
    assert "in fp32 (no --device, no --precision)" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--format", "torchscript", "--out", str(tmp_path / "ts")]) == 0
    capsys.readouterr()
    assert main(["forecast", str(tmp_path / "ts"), "--backend", "onnx", "--out", str(tmp_path / "b")]) == 2
    assert "a torchscript export" in capsys.readouterr().err
