"""`marketgpt export`: ONNX, torch.export (pt2) and hf model-folder exports of a tiny trained run,
their parity with the torch model, the model card, the torch-free sampler of
common.forecasting.infer, Forecaster.from_pretrained's round trip, and bad input."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from common.cli import main
from common.errors import UserError
from common.forecasting.export import PARITY_ATOL
from common.forecasting.export_graphs import NextTokenLogits, random_inputs
from common.forecasting.forecaster import Forecaster
from common.forecasting.infer import OnnxBackend, draw_tokens_np, sample_paths_np
from common.forecasting.model_card import parent_run_of
from common.model.sampling import SamplingSettings, sample_paths
from common.paths import REPO_ROOT

from slurm_helpers import REPO
from test_forecast import TINY, train_tiny

pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")  # training's tensorboard


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """test_forecast.py's tiny trained run."""
    return train_tiny(tmp_path_factory.mktemp("fc"), TINY)[1]


UMASK = 0o027  # group may read, others not: an export follows the umask, not a fixed mode


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def export(*args: str) -> int:
    with umask(UMASK):
        return main(["export", *args])


def assert_modes_follow_the_umask(folder) -> None:
    """Every file of the export as a new file of the user's reads (safetensors' own is 0600)."""
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in folder.iterdir()}
    assert modes == dict.fromkeys(modes, oct(0o666 & ~UMASK)), modes


@pytest.fixture(scope="module")
def onnx_dir(run_dir):
    assert export(str(run_dir), "--format", "onnx") == 0  # default --out: <case>/exports/<run>
    return run_dir.parent.parent / "exports" / run_dir.name


@pytest.fixture(scope="module")
def forecaster(run_dir):
    return Forecaster.from_run(run_dir)


def test_onnx_export_files_and_model_card(run_dir, onnx_dir, forecaster):
    for name in (
        "model.onnx",
        "model_step.onnx",
        "config.json",
        "tokenizer.json",
        "asset_info.json",
        "model_card.json",
    ):
        assert (onnx_dir / name).is_file(), name
    assert not list(onnx_dir.glob(".export_*")), "no staging folder left behind"
    for name in ("config.json", "tokenizer.json", "asset_info.json"):
        assert (onnx_dir / name).read_bytes() == (run_dir / name).read_bytes()
    card = json.loads((onnx_dir / "model_card.json").read_text())
    data_info = json.loads((run_dir / "data_info.json").read_text())
    assert card["training_data_cutoff"] == data_info["split_cuts"]["val_start"]
    assert card["universe"] == list(json.loads((run_dir / "asset_info.json").read_text())["symbols"])
    assert card["parameter_count"] == sum(p.numel() for p in forecaster.model.parameters())
    assert card["parent_run"] == run_dir.name  # outside the repository: its name, no absolute path
    assert_modes_follow_the_umask(onnx_dir)
    assert card["kv_cache"] is True and card["context_length"] == TINY["model"]["context_length"]
    scorecard = run_dir / "scorecard.json"
    expected = json.loads(scorecard.read_text())["headline"] if scorecard.is_file() else None
    assert card["scorecard_headline"] == expected
    assert 0 <= card["parity_max_abs_diff"] <= PARITY_ATOL


@pytest.mark.parametrize("batch,length", [(1, 1), (7, 5), (4, 16), (33, 16)])
def test_onnxruntime_and_torch_logits_agree_on_random_inputs(onnx_dir, forecaster, batch, length):
    info = json.loads((onnx_dir / "asset_info.json").read_text())
    t, a, c = random_inputs(
        batch,
        length,
        TINY["model"]["vocab_size"],
        info["num_assets"],
        info["num_categories"],
        seed=batch * 100 + length,
    )
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


def test_a_model_with_the_recipe_options_exports_to_onnx_with_equal_logits(tmp_path):
    """Rotary, RMSNorm, QK-norm and SwiGLU through the ONNX export: full and KV-cache graphs."""
    spec = json.loads(json.dumps(TINY))
    spec["model"].update(positional="rope", norm="rms", qk_norm=True, mlp="swiglu")
    run = train_tiny(tmp_path, spec)[1]
    out = tmp_path / "onnx"
    assert export(str(run), "--format", "onnx", "--out", str(out)) == 0
    fc = Forecaster.from_run(run)
    t, a, c = random_inputs(5, 12, TINY["model"]["vocab_size"], fc.info.num_assets, fc.info.num_categories, seed=3)
    with torch.no_grad():
        ref = NextTokenLogits(fc.model)(t, a, c).numpy()
    backend = OnnxBackend(out / "model.onnx", context_length=16)
    np.testing.assert_allclose(backend(t.numpy(), a.numpy(), c.numpy()), ref, rtol=0, atol=1e-4)
    _, k, v = backend.prefill(t[:, :-1].numpy(), a.numpy(), c.numpy())
    np.testing.assert_allclose(backend.step(t[:, -1:].numpy(), a.numpy(), c.numpy(), k, v)[0], ref, rtol=0, atol=1e-4)


@pytest.mark.filterwarnings("error::DeprecationWarning")
def test_pt2_export_matches_torch(run_dir, forecaster, tmp_path):
    """torch.export replaced TorchScript: the program loads without torch.jit, batch and length dynamic."""
    assert export(str(run_dir), "--format", "pt2", "--out", str(tmp_path / "pt2")) == 0
    module = torch.export.load(str(tmp_path / "pt2" / "model.pt2")).module()
    for batch, length in ((3, 9), (1, 1), (6, 16)):
        t, a, c = random_inputs(batch, length, TINY["model"]["vocab_size"], 5, 2, seed=batch + length)
        with torch.no_grad():
            torch.testing.assert_close(module(t, a, c), NextTokenLogits(forecaster.model)(t, a, c), atol=1e-4, rtol=0)
    card = json.loads((tmp_path / "pt2" / "model_card.json").read_text())
    assert card["file"] == "model.pt2" and card["format"] == "pt2" and card["parity_max_abs_diff"] <= PARITY_ATOL
    assert sorted(p.name for p in (tmp_path / "pt2").iterdir()) == [
        "asset_info.json",
        "config.json",
        "model.pt2",
        "model_card.json",
        "tokenizer.json",
    ]
    assert_modes_follow_the_umask(tmp_path / "pt2")
    assert card["parent_run"] == run_dir.name


def test_parent_run_is_relative_to_the_repository_or_the_runs_name(tmp_path):
    """model_card.json's parent_run stays true when the export moves: never an absolute path."""
    inside = REPO_ROOT / "case_c_crypto" / "checkpoints" / "crypto_prototype_20261128_120000"
    assert parent_run_of(inside) == "case_c_crypto/checkpoints/crypto_prototype_20261128_120000"
    assert parent_run_of(tmp_path / "runs" / "tiny_20240101_000000") == "tiny_20240101_000000"


def test_torchscript_is_refused_with_the_formats_that_replace_it(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir), "--format", "torchscript", "--out", str(tmp_path / "ts")]) == 2
    err = capsys.readouterr().err
    assert "TorchScript is deprecated" in err and "--format pt2" in err and "--format onnx" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "ts").exists()


@pytest.mark.parametrize("cached,max_batch", [(True, 4), (True, 1), (False, 4)])
def test_greedy_paths_equal_the_torch_sampler(onnx_dir, forecaster, cached, max_batch):
    """common.forecasting.infer's window is the torch sampler's: with greedy decoding both give the same
    tokens, across the window's rebuild (horizon > T / 2), with the ONNX KV cache and without
    (a plain logits function re-running the window). max_batch 4: chunks of two contexts whose two
    samples share their prefix in the step graph; 1: one sample per chunk."""
    info = json.loads((onnx_dir / "asset_info.json").read_text())
    t, a, c = random_inputs(3, 16, 60, info["num_assets"], info["num_categories"], seed=5)
    banned = forecaster.banned_ids()
    ref = sample_paths(
        forecaster.model, t, a, c, SamplingSettings(20, 2, temperature=0.0), banned=torch.as_tensor(banned)
    ).numpy()
    backend = OnnxBackend(onnx_dir / "model.onnx", 16)
    logits = backend if cached else (lambda *x: backend(*x))  # a plain function has no step()
    got = sample_paths_np(
        logits,
        t.numpy(),
        a.numpy(),
        c.numpy(),
        16,
        SamplingSettings(20, 2, temperature=0.0, seed=0, max_batch=max_batch),
        banned=banned,
    )
    np.testing.assert_array_equal(got, ref)


def test_an_older_step_graph_says_to_export_again(onnx_dir, tmp_path):
    """Exports before the shared prefix had a step graph with a per-row cache (past_k, past_v):
    one line saying to export again, not a wrong input name from onnxruntime mid-forecast."""
    old = tmp_path / "old"
    shutil.copytree(onnx_dir, old)
    shutil.copy2(old / "model.onnx", old / "model_step.onnx")  # any graph without prefix_k stands in for it
    with pytest.raises(UserError, match="older export's step graph.*export the run again") as e:
        OnnxBackend(old / "model.onnx", 16)
    assert "\n" not in str(e.value)


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
    assert "--format 'tflite': expected one of onnx, pt2, hf" in capsys.readouterr().err

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
    # shared draws: both backends invert the same uniforms, so they draw the same paths (but where a
    # uniform falls within float rounding of a boundary of the CDF: float32 in torch, float64 here)
    try:
        fc.shared_draws = forecaster.shared_draws = True
        ref = forecaster.forecast(histories, horizon=12, samples=40, seed=4, return_paths=True).tokens
        got = fc.forecast(histories, horizon=12, samples=40, seed=4, return_paths=True).tokens
    finally:
        forecaster.shared_draws = False
    assert (got == ref).all(axis=2).mean() > 0.9


# a laptop without torch (docs/remote.md): no torch, no tqdm, no training module on this path
BLOCK_TORCH = """
import sys
BLOCKED = ("torch", "tqdm", "common.training")
def blocked(name):
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)
class NoTorch:
    def find_spec(self, name, path, target=None):
        if blocked(name):
            raise ImportError(name + " is blocked in this test")
sys.meta_path.insert(0, NoTorch())
from common.cli import main
code = main(sys.argv[1:])
assert not [m for m in sys.modules if blocked(m)]
sys.exit(code)
"""


def test_marketgpt_forecast_backend_onnx_runs_without_torch(onnx_dir, tmp_path):
    out = tmp_path / "fc"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCK_TORCH,
            "forecast",
            str(onnx_dir),
            "--backend",
            "onnx",
            "--symbols",
            "AAPL,IBM",
            "--horizon",
            "5",
            "--samples",
            "30",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AAPL" in proc.stdout and "IBM" in proc.stdout
    meta = json.loads((out / "forecast.json").read_text())
    card = json.loads((onnx_dir / "model_card.json").read_text())
    assert meta["backend"] == "onnx" and meta["checkpoint_sha256"] == card["checkpoint_sha256"]
    assert meta["precision"] == "fp32"
    assert len(pd.read_parquet(out / "forecast.parquet")) == 2 * 5


def test_forecast_backend_onnx_on_a_run_folder_or_a_pt2_export_says_what_is_missing(run_dir, tmp_path, capsys):
    assert main(["forecast", str(run_dir), "--backend", "onnx", "--out", str(tmp_path / "a")]) == 2
    assert "missing model.onnx" in capsys.readouterr().err
    assert main(["forecast", str(run_dir), "--backend", "onnx", "--precision", "bf16"]) == 2
    assert "in fp32 (no --device, no --precision)" in capsys.readouterr().err
    assert export(str(run_dir), "--format", "pt2", "--out", str(tmp_path / "pt2")) == 0
    capsys.readouterr()
    assert main(["forecast", str(tmp_path / "pt2"), "--backend", "onnx", "--out", str(tmp_path / "b")]) == 2
    assert "it holds model.pt2: a torch.export program" in capsys.readouterr().err


# --------------------------------------------------------------------------- the hf model folder


@pytest.fixture(scope="module")
def hf_dir(run_dir, tmp_path_factory):
    """`--format hf`, then the folder moved away from the case: nothing of the run is reachable."""
    out = tmp_path_factory.mktemp("hf_export") / "x"
    assert export(str(run_dir), "--format", "hf", "--out", str(out)) == 0
    moved = tmp_path_factory.mktemp("elsewhere") / "tiny-marketgpt"
    shutil.move(str(out), moved)
    return moved


def test_hf_folder_files_weights_and_model_card(run_dir, hf_dir, forecaster):
    from safetensors import safe_open

    assert sorted(p.name for p in hf_dir.iterdir()) == [
        "README.md",
        "asset_info.json",
        "config.json",
        "model.safetensors",
        "model_card.json",
        "tokenizer.json",
    ]
    for name in ("config.json", "tokenizer.json", "asset_info.json"):
        assert (hf_dir / name).read_bytes() == (run_dir / name).read_bytes()
    with safe_open(str(hf_dir / "model.safetensors"), framework="pt") as f:
        meta, names = f.metadata(), set(f.keys())
        weights = {k: f.get_tensor(k) for k in names}
    assert meta["checkpoint_sha256"] == forecaster.checkpoint_sha256
    state = forecaster.model.state_dict()
    assert names <= set(state) and len(names) == len(state) - 1  # the tied head stored once
    for k in names:
        assert torch.equal(weights[k], state[k]), k
    card = json.loads((hf_dir / "model_card.json").read_text())
    assert card["format"] == "hf" and card["file"] == "model.safetensors" and card["parity_max_abs_diff"] == 0.0
    assert card["parent_run"] == run_dir.name
    assert_modes_follow_the_umask(hf_dir)

    readme = (hf_dir / "README.md").read_text()
    assert readme.startswith("---\nlibrary_name: marketgpt\n")
    cutoff = json.loads((run_dir / "data_info.json").read_text())["split_cuts"]["val_start"]
    assert f"data cut-off: the model learned from candles before **{cutoff}**" in readme
    assert ", ".join(json.loads((run_dir / "asset_info.json").read_text())["symbols"]) in readme
    for section in ("## Intended use", "## Limits", "## Evaluation", "Forecaster.from_pretrained"):
        assert section in readme, section
    scorecard = run_dir / "scorecard.json"
    assert ("Scorecard headline" in readme) == scorecard.is_file()
    assert ("Not scored" in readme) == (not scorecard.is_file())


def test_model_card_markdown_shows_the_scorecard_headline(run_dir, tmp_path):
    from common.forecasting.model_card import model_card_markdown

    scored = tmp_path / "run"
    shutil.copytree(run_dir, scored, ignore=shutil.ignore_patterns("checkpoint_*", "tensorboard", "tokens*"))
    verdict = "H=1: CRPS skill vs GARCH +2.1% [0.8, 3.4] (beats)"
    (scored / "scorecard.json").write_text(json.dumps({"verdicts": [verdict]}))
    card = {
        "universe": ["AAPL", "IBM"],
        "interval": "1d",
        "parameter_count": 1234,
        "context_length": 16,
        "data_source": "sample",
        "training_data_cutoff": "2011-01-01",
        "validation_end": "2012-01-01",
        "test_loss": 3.2,
        "best_epoch": 1,
        "exported_at": "now",
        "checkpoint_sha256": "ab",
        "torch_version": "x",
        "scorecard_headline": {
            "horizon": 1,
            "baseline": "garch",
            "value": 0.021,
            "ci95": [0.008, 0.034],
            "verdict": "beats",
        },
    }
    readme = model_card_markdown(card, scored)
    assert "**H=1: CRPS skill vs garch +2.1% [0.8, 3.4] (beats)**" in readme and f"- {verdict}" in readme
    assert "Not scored" not in readme
    assert "... (60 in all)" in model_card_markdown({**card, "universe": [f"S{i}" for i in range(60)]}, scored)


def test_from_pretrained_forecasts_equal_the_runs_without_pickle(hf_dir, forecaster, monkeypatch):
    import pickle

    def no_pickle(*args, **kwargs):
        raise AssertionError("from_pretrained must not unpickle")

    monkeypatch.setattr(torch, "load", no_pickle)
    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "Unpickler", no_pickle)
    fc = Forecaster.from_pretrained(hf_dir)
    monkeypatch.undo()
    assert fc.run_dir == hf_dir and fc.checkpoint_sha256 == forecaster.checkpoint_sha256
    histories = forecaster.load_history(["AAPL", "^GSPC"], as_of="2012-06-01")
    assert [
        h.candles.equals(g.candles) for h, g in zip(fc.load_history(["AAPL", "^GSPC"], as_of="2012-06-01"), histories)
    ] == [True, True]
    ref = forecaster.forecast(histories, horizon=9, samples=64, seed=7, return_paths=True)
    got = fc.forecast(histories, horizon=9, samples=64, seed=7, return_paths=True)
    pd.testing.assert_frame_equal(got.table, ref.table)
    np.testing.assert_array_equal(got.tokens, ref.tokens)


def test_marketgpt_forecast_takes_the_hf_folder(hf_dir, forecaster, tmp_path, capsys):
    assert (
        main(
            [
                "forecast",
                str(hf_dir),
                "--symbols",
                "AAPL",
                "--horizon",
                "3",
                "--samples",
                "8",
                "--out",
                str(tmp_path / "fc"),
            ]
        )
        == 0
    )
    assert "AAPL" in capsys.readouterr().out
    meta = json.loads((tmp_path / "fc" / "forecast.json").read_text())
    assert meta["run"] == str(hf_dir) and meta["checkpoint_sha256"] == forecaster.checkpoint_sha256


def _one_line(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err


def test_a_bad_model_folder_is_one_line_and_exit_2(run_dir, hf_dir, tmp_path, capsys):
    def forecast(folder):
        return main(
            [
                "forecast",
                str(folder),
                "--symbols",
                "AAPL",
                "--horizon",
                "2",
                "--samples",
                "2",
                "--out",
                str(tmp_path / "out"),
            ]
        )

    with pytest.raises(UserError, match="no such folder"):
        Forecaster.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(UserError, match="missing model.safetensors; is it a `marketgpt export --format hf`"):
        Forecaster.from_pretrained(run_dir)  # a run folder is not a model folder

    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    (broken / "tokenizer.json").unlink()
    assert forecast(broken) == 2
    _one_line(capsys, "missing tokenizer.json")

    shutil.copy2(hf_dir / "tokenizer.json", broken / "tokenizer.json")
    (broken / "model.safetensors").write_bytes(b"not a safetensors file at all")
    assert forecast(broken) == 2
    _one_line(capsys, "model.safetensors: cannot be read as safetensors", "export the run again")

    shutil.copy2(hf_dir / "model.safetensors", broken / "model.safetensors")
    config = json.loads((hf_dir / "config.json").read_text())
    config["model"]["d_model"] = 48  # another shape than the weights'
    (broken / "config.json").write_text(json.dumps(config))
    assert forecast(broken) == 2
    _one_line(capsys, "model.safetensors does not fit", "config.json")
    config["model"]["d_model"], config["model"]["num_layers"] = 32, 3  # a layer the weights lack
    (broken / "config.json").write_text(json.dumps(config))
    assert forecast(broken) == 2
    _one_line(capsys, "model.safetensors does not fit", "Missing key")

    assert not (tmp_path / "out").exists()
    assert main(["export", str(hf_dir), "--format", "onnx", "--out", str(tmp_path / "again")]) == 2
    _one_line(capsys, "is an exported model folder, not a run folder")
