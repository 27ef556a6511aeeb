"""`marketgpt train` end to end on the shipped sample with a tiny model: the run folder, the
seed's jq queries, SIGTERM + kill -9 + --resume auto, and each fault as one line + non-zero exit."""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from common.checkpoint import checkpoint_files
from common.cli import main
from common.config import load_config
from common.paths import REPO_ROOT

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")  # urllib3's IPv6 probe

TINY = {
    "experiment": "tiny",
    "model": {"vocab_size": 64, "context_length": 16, "d_model": 32, "num_layers": 2, "num_heads": 2,
              "d_ff": 64, "asset_embed_dim": 4, "category_embed_dim": 4},
    "training": {"batch_size": 16, "epochs": 2, "max_steps_per_epoch": 6, "eval_max_batches": 4,
                 "warmup_steps": 2, "log_every_steps": 3},
    "data": {"source": "sample", "interval": "1d"},
}
RUN_FILES = {"best_model.pt", "config.json", "tokenizer.json", "asset_info.json", "data_info.json",
             "training_log.json", "test_results.json", "tokens.npz", "report.png", "tensorboard"}


def _case(root: Path, name: str = "case", **sections) -> Path:
    """A case folder with configs/tiny.json (TINY with `sections` merged in); returns the config."""
    raw = json.loads(json.dumps(TINY))
    for section, values in sections.items():
        if isinstance(values, dict):
            raw.setdefault(section, {}).update(values)
        else:
            raw[section] = values
    path = root / name / "configs" / "tiny.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(raw))
    return path


def _run(capsys, *args) -> tuple[int, str, str]:
    code = main(["train", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marketgpt train: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


def _run_dirs(config: Path) -> list[Path]:
    return sorted((config.parent.parent / "checkpoints").glob("tiny_*"))


def _epoch_losses(run_dir: Path) -> list:
    log = json.loads((run_dir / "training_log.json").read_text())
    return [(e["epoch"], e["train_loss"], e["train_acc"], e["val_loss"], e["val_acc"]) for e in log["epochs"]]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    config = _case(tmp_path_factory.mktemp("done"))
    code = main(["train", "--config", str(config)])
    assert code == 0
    (run_dir,) = _run_dirs(config)
    return config, run_dir


def test_a_run_folder_has_every_file_and_the_seed_queries_work(finished_run):
    config, run_dir = finished_run
    assert re.fullmatch(r"tiny_\d{8}_\d{6}", run_dir.name)
    names = {p.name for p in run_dir.iterdir()}
    assert RUN_FILES <= names
    assert {"checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"} <= names
    assert load_config(run_dir / "config.json") == load_config(config)  # fully resolved, same run
    assert any((run_dir / "tensorboard").iterdir())

    log = json.loads((run_dir / "training_log.json").read_text())
    results = json.loads((run_dir / "test_results.json").read_text())
    assert log["status"] == "finished" and [e["epoch"] for e in log["epochs"]] == [1, 2]
    assert log["best_epoch"] in (1, 2) and log["best_val_loss"] == log["epochs"][log["best_epoch"] - 1]["val_loss"]
    assert 0 <= results["test_accuracy"] <= 1 and results["test_loss"] > 0
    assert set(results["baselines"]) == {"unigram", "repeat_last", "markov1"}
    assert results["best_epoch"] == log["best_epoch"]
    info = json.loads((run_dir / "asset_info.json").read_text())
    assert set(results["per_asset"]) <= set(info["symbols"])

    jq = shutil.which("jq")
    assert jq or not os.environ.get("CI"), "jq is missing: CI installs it (.ci/run) to run the seed's queries"
    if jq:  # the seed guide's own queries, on the real file
        def q(expr: str, name: str = "training_log.json") -> str:
            return subprocess.run([jq, "-c", expr, str(run_dir / name)], capture_output=True, text=True,
                                  check=True).stdout
        assert json.loads(q(".epochs[-5:]")) == log["epochs"]
        rows = [json.loads(line) for line in q(".epochs[] | {epoch, train_loss, val_loss}").splitlines()]
        assert rows == [{k: e[k] for k in ("epoch", "train_loss", "val_loss")} for e in log["epochs"]]
        assert float(q(".best_val_loss")) == log["best_val_loss"] and int(q(".best_epoch")) == log["best_epoch"]
        assert float(q(".test_accuracy", "test_results.json")) == results["test_accuracy"]


def test_resume_with_a_harmless_override_extends_the_run(finished_run, capsys, tmp_path):
    config, run_dir = finished_run
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    code, out, _ = _run(capsys, "--resume", copy, "--set", "training.epochs=3")
    assert code == 0 and "Resuming" in out and "Epoch 3/3" in out and "Epoch 2/3" not in out
    log = json.loads((copy / "training_log.json").read_text())
    assert [e["epoch"] for e in log["epochs"]] == [1, 2, 3] and len(log["resumes"]) == 1
    assert _epoch_losses(copy)[:2] == _epoch_losses(run_dir)


def test_resume_auto_skips_a_corrupted_newest_checkpoint(finished_run, capsys, tmp_path):
    config, run_dir = finished_run
    case = tmp_path / "case"
    shutil.copytree(config.parent, case / "configs")
    copy = case / "checkpoints" / run_dir.name
    shutil.copytree(run_dir, copy)
    newest = copy / "checkpoint_epoch_2.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated, as by a full disk or a bad copy
    (copy / "test_results.json").unlink()  # killed before its test evaluation: auto continues it
    code, out, err = _run(capsys, "--config", case / "configs" / config.name, "--resume", "auto")
    assert code == 0
    assert "checkpoint_epoch_2.pt is truncated or corrupted" in err and "falling back" in err
    assert f"Resuming {copy} from checkpoint_epoch_1.pt" in out
    assert _epoch_losses(copy) == _epoch_losses(run_dir)  # epoch 2 redone, identically


def test_sigterm_then_kill_9_then_resume_auto_matches_a_straight_run(tmp_path, capsys):
    long = {"epochs": 3, "max_steps_per_epoch": 150, "log_every_steps": 10}
    straight = _case(tmp_path, "straight", training=long)
    assert main(["train", "--config", str(straight)]) == 0
    capsys.readouterr()
    config = _case(tmp_path, "killed", training=long)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "common.cli", "train", "--config", str(config), "--resume", "auto"]

    # 1. SIGTERM mid-epoch: checkpoint at the next step boundary, exit 75 (requeue me)
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = _lines(proc)
    _wait_for(lines, r"epoch 1/3 step \d+/150")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    (run_dir,) = _run_dirs(config)
    first = [p.name for p in checkpoint_files(run_dir)]
    assert len(first) == 1 and re.fullmatch(r"checkpoint_epoch_1_step_\d+\.pt", first[0])

    # 2. kill -9 after the resumed process wrote its next checkpoint
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = _lines(proc)
    _wait_for(lines, r"Resuming .* from checkpoint_epoch_1_step_")
    deadline = time.monotonic() + 60
    while (run_dir / "checkpoint_epoch_1.pt").exists() is False and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert "test_results.json" not in {p.name for p in run_dir.iterdir()}
    half_written = run_dir / ".checkpoint_epoch_2_step_40.pt.x1y2z3.tmp"  # a kill -9 inside torch.save
    half_written.write_bytes(b"PK\x03\x04")

    # 3. --resume auto continues from the last good checkpoint and finishes
    code, out, _ = _run(capsys, "--config", config, "--resume", "auto")
    assert code == 0 and f"Resuming {run_dir}" in out
    assert f"Removed {half_written.name}, left by a writer that was killed" in out
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert _run_dirs(config) == [run_dir]
    log = json.loads((run_dir / "training_log.json").read_text())
    assert log["status"] == "finished" and len(log["resumes"]) == 2
    assert _epoch_losses(run_dir) == _epoch_losses(_run_dirs(straight)[0])  # exact, across processes


def _lines(proc: subprocess.Popen) -> "queue.Queue[str]":
    q: "queue.Queue[str]" = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            q.put(line)
        q.put("")  # end of output

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(lines: "queue.Queue[str]", pattern: str, timeout: float = 120.0) -> str:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = lines.get(timeout=deadline - time.monotonic())
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen)}")


# --------------------------------------------------------------------------- faults


def test_config_pointing_at_missing_data(tmp_path, capsys):
    config = _case(tmp_path, data={"source": "download", "universe": "universe.csv"})
    (config.parent.parent / "universe.csv").write_text("symbol,source,category,name\nAAPL,yfinance,us_stock,Apple\n")
    code, _, err = _run(capsys, "--config", config)
    _one_line_error(code, err, "marketgpt data download")
    assert not _run_dirs(config)


def test_context_longer_than_any_history(tmp_path, capsys):
    config = _case(tmp_path)
    code, _, err = _run(capsys, "--config", config, "--set", "model.context_length=9000")
    _one_line_error(code, err, "context length 9000")
    assert not _run_dirs(config)


def test_resume_path_that_does_not_exist(tmp_path, capsys):
    config = _case(tmp_path)
    code, _, err = _run(capsys, "--config", config, "--resume", tmp_path / "nope")
    _one_line_error(code, err, "no such run folder")


def test_resume_of_a_different_config(finished_run, tmp_path, capsys):
    _, run_dir = finished_run
    code, _, err = _run(capsys, "--resume", run_dir, "--set", "model.d_model=64")
    _one_line_error(code, err, "cannot change model.d_model")
    other = _case(tmp_path, model={"num_layers": 3})
    code, _, err = _run(capsys, "--config", other, "--resume", run_dir)
    _one_line_error(code, err, "belongs to a different config", "model.num_layers")


def test_resume_auto_of_a_changed_case_config(finished_run, capsys, tmp_path):
    config, run_dir = finished_run
    case = tmp_path / "case"  # a copy killed before its test evaluation, so auto continues it
    shutil.copytree(config.parent, case / "configs")
    shutil.copytree(run_dir, case / "checkpoints" / run_dir.name)
    (case / "checkpoints" / run_dir.name / "test_results.json").unlink()
    config, run_dir = case / "configs" / config.name, case / "checkpoints" / run_dir.name
    raw = json.loads(config.read_text())
    raw["training"]["learning_rate"] = 0.1  # the case file was edited after the run started
    changed = config.with_name("changed.json")
    changed.write_text(json.dumps(raw))
    code, _, err = _run(capsys, "--config", changed, "--resume", "auto")
    _one_line_error(code, err, "belongs to a different config", "training.learning_rate")
    code, _, err = _run(capsys, "--config", config, "--resume", "auto", "--set", "training.learning_rate=0.1")
    _one_line_error(code, err, "cannot change training.learning_rate when resuming")
    assert _run_dirs(config) == [run_dir]


def test_run_folder_not_writable(tmp_path, capsys):
    config = _case(tmp_path)
    (config.parent.parent / "checkpoints").write_text("a file where the run folders should go")
    code, _, err = _run(capsys, "--config", config)
    _one_line_error(code, err, "not writable")


def test_nan_loss_fails_the_run_with_its_step(tmp_path, capsys, monkeypatch):
    from common.model import MarketGPT

    real_forward = MarketGPT.forward

    def forward(self, *args, **kwargs):
        logits, loss = real_forward(self, *args, **kwargs)
        return logits, (None if loss is None else loss * float("nan"))

    monkeypatch.setattr(MarketGPT, "forward", forward)
    config = _case(tmp_path)
    code, _, err = _run(capsys, "--config", config)
    _one_line_error(code, err, "non-finite training loss", "step 1 ")
    (run_dir,) = _run_dirs(config)
    log = json.loads((run_dir / "training_log.json").read_text())
    assert log["status"] == "failed" and log["failed_step"] == 1 and log["epochs"] == []
    assert not (run_dir / "best_model.pt").exists() and not (run_dir / "test_results.json").exists()
