"""`marketgpt train` end to end on the shipped sample with a tiny model: the run folder, the
seed's jq queries, SIGTERM + kill -9 + --resume auto, and each fault as one line + non-zero exit."""

from __future__ import annotations

import json
import os
import queue
import random
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

from common.cli import main
from common.config import load_config
from common.paths import REPO_ROOT
from common.run.checkpoint import checkpoint_files, load_checkpoint

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")  # urllib3's IPv6 probe

TINY = {
    "experiment": "tiny",
    "model": {
        "vocab_size": 64,
        "context_length": 16,
        "d_model": 32,
        "num_layers": 2,
        "num_heads": 2,
        "d_ff": 64,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
    },
    "training": {
        "batch_size": 16,
        "epochs": 2,
        "max_steps_per_epoch": 6,
        "eval_max_batches": 4,
        "warmup_steps": 2,
        "log_every_steps": 3,
        "scorecard_origins": 2,
        "scorecard_samples": 4,
        "vol_reversion": False,  # a final output like the scorecard; tests/test_reversion.py
    },
    "data": {"source": "sample", "interval": "1d"},
}
RUN_FILES = {
    "best_model.pt",
    "config.json",
    "tokenizer.json",
    "asset_info.json",
    "data_info.json",
    "training_log.json",
    "test_results.json",
    "tokens",
    "report.png",
    "tensorboard",
    "scorecard.json",
    "scorecard.png",
}


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
            return subprocess.run(
                [jq, "-c", expr, str(run_dir / name)], capture_output=True, text=True, check=True
            ).stdout

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


@pytest.mark.parametrize("token", [32000, 5], ids=["out-of-range", "another-valid-id"])
def test_resume_of_a_run_whose_tokens_changed_on_disk_is_one_line_naming_the_file(
    finished_run, capsys, tmp_path, token
):
    """A run's tokens/ are hard links to the shard: one changed byte reaches every run sharing it.
    A resume (the requeue path) reads only verified bytes: the changed file is named, exit 2."""
    _, run_dir = finished_run
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    tokens = copy / "tokens" / "tokens.bin"
    data = bytearray(tokens.read_bytes())
    at = 2 * (len(data) // 4)  # an int16 token in the middle
    old = int.from_bytes(data[at : at + 2], "little", signed=True)
    data[at : at + 2] = (token if token != old else token + 1).to_bytes(2, "little", signed=True)
    tokens.write_bytes(bytes(data))
    code, _, err = _run(capsys, "--resume", copy, "--set", "training.epochs=3")
    _one_line_error(code, err, str(tokens), "does not match its sha256", "data prepare --rebuild")


def _copy_into_case(finished_run, tmp_path) -> tuple[Path, Path]:
    """The finished run as the only run of a fresh case folder: (config, run folder)."""
    config, run_dir = finished_run
    case = tmp_path / "case"
    shutil.copytree(config.parent, case / "configs")
    shutil.copytree(run_dir, case / "checkpoints" / run_dir.name)
    return case / "configs" / config.name, case / "checkpoints" / run_dir.name


@pytest.mark.parametrize("missing", [("report.png",), ("report.png", "test_results.json")])
def test_resume_auto_of_a_trained_run_missing_an_output_writes_only_the_outputs(
    finished_run, capsys, tmp_path, missing
):
    config, copy = _copy_into_case(finished_run, tmp_path)
    for name in missing:  # killed while writing its final outputs
        (copy / name).unlink()
    log = json.loads((copy / "training_log.json").read_text())
    log["status"] = "running"  # the kill came before the log said finished
    (copy / "training_log.json").write_text(json.dumps(log))
    before = {p.name: p.stat().st_mtime_ns for p in copy.glob("*.pt")}
    code, out, _ = _run(capsys, "--config", config, "--resume", "auto")
    assert code == 0 and f"Resuming {copy}" in out
    assert "Nothing left to train (2 of 2 epochs done): writing the final outputs" in out
    assert " step " not in out and "Epoch " not in out  # no training step, no epoch
    assert {p.name: p.stat().st_mtime_ns for p in copy.glob("*.pt")} == before
    assert (copy / "report.png").is_file() and _run_dirs(config) == [copy]
    assert json.loads((copy / "test_results.json").read_text()) == json.loads(
        (finished_run[1] / "test_results.json").read_text()
    )
    log = json.loads((copy / "training_log.json").read_text())
    assert log["status"] == "finished" and _epoch_losses(copy) == _epoch_losses(finished_run[1])


def test_resume_auto_starts_over_in_a_folder_killed_before_its_first_checkpoint(finished_run, capsys, tmp_path):
    config, _ = _copy_into_case(finished_run, tmp_path)
    shutil.rmtree(config.parent.parent / "checkpoints")
    early = config.parent.parent / "checkpoints" / "tiny_20250101_000000"
    early.mkdir(parents=True)
    (early / "config.json").write_text("{")  # killed while setting the run up
    (early / "training_log.json").write_text(json.dumps({"status": "running", "epochs": []}))
    code, out, _ = _run(capsys, "--config", config, "--resume", "auto")
    assert code == 0 and "killed before its first checkpoint" in out
    assert _run_dirs(config) == [early] and RUN_FILES <= {p.name for p in early.iterdir()}
    assert _epoch_losses(early) == _epoch_losses(finished_run[1])


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


def test_sigterm_then_resume_auto_continues_from_the_step_checkpoint(tmp_path, capsys):
    config = _case(tmp_path, "killed", training={"max_steps_per_epoch": 150, "log_every_steps": 10})
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "common.cli", "train", "--config", str(config), "--resume", "auto"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(_lines(proc), r"epoch 1/2 step \d+/150")
    proc.send_signal(signal.SIGTERM)  # checkpoint at the next step boundary, exit 75 (requeue me)
    assert proc.wait(timeout=60) == 75
    (run_dir,) = _run_dirs(config)
    first = [p.name for p in checkpoint_files(run_dir)]
    assert len(first) == 1 and re.fullmatch(r"checkpoint_epoch_1_step_\d+\.pt", first[0])
    code, out, _ = _run(capsys, "--config", config, "--resume", "auto", "--set", "training.epochs=1")
    assert code == 0 and f"Resuming {run_dir} from {first[0]}" in out and _run_dirs(config) == [run_dir]


# Kill moments: each waits for an event of the run, then a random delay (fixed seed), so every
# kill lands somewhere else in the run but the count never depends on the machine's speed. The
# mid-training kills aim at steps of their own stretch of the run's 48 (a resumed run already past
# its stretch is killed at its first line), so that each finds the run still alive. One kill per
# distinct moment: every kill after the first hits a resumed run, so a second mid-step kill would
# take the same path as the first.
_KILLS = (("setup", None), ("step", (4, 14)), ("checkpoint write", (16, 28)), ("final outputs", None))
_TEMP = re.compile(r"^\.(checkpoint_epoch_\d+(_step_\d+)?|best_model)\.pt\.\w+\.tmp$")


def _kill_moment(
    proc: subprocess.Popen,
    lines: "queue.Queue[str]",
    config: Path,
    anchor: str,
    steps: tuple[int, int] | None,
    rng: random.Random,
) -> bool:
    """Wait for `anchor` in the run, then a random delay; False if the process ended first."""
    if anchor == "setup":
        time.sleep(rng.uniform(0.5, 3.0))  # imports, data, tokenizer, run folder: any of them
    elif steps is not None:
        target = rng.randint(*steps)  # counted over both epochs (lines come every 4 steps)
        try:
            while True:
                line = _wait_for(lines, r"epoch \d/\d step \d+/|Nothing left to train|Test \(best model")
                m = re.search(r"epoch (\d)/\d step (\d+)/(\d+)", line)
                if m is None or (int(m[1]) - 1) * int(m[3]) + int(m[2]) >= target:
                    break
        except AssertionError:  # the output ended: the process is done
            return False
    if anchor in ("checkpoint write", "final outputs"):
        # poll the run folder for a checkpoint's temp file (it lives a few ms: if none shows up
        # within a random 0.05-0.3 s, that moment will do), or for the first final output
        wanted = (
            _TEMP.match
            if anchor == "checkpoint write"
            else (lambda n: n.startswith(".report.png.") or n in ("report.png", "test_results.json"))
        )
        deadline = time.monotonic() + (rng.uniform(0.05, 0.3) if anchor == "checkpoint write" else 120)
        while not any(wanted(p.name) for d in _run_dirs(config) for p in d.iterdir()):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.0005)
    return proc.poll() is None


def test_kill_9_at_random_moments_then_resume_auto_ends_bit_equal_to_a_straight_run(tmp_path, capsys):
    # a model big enough that a step takes milliseconds on any machine (a kill lands near its line),
    # and a timer checkpoint every 0.06 s: kills land in checkpoint writes as well as between them
    model = {"d_model": 128, "d_ff": 256, "context_length": 32}
    training = {
        "epochs": 2,
        "max_steps_per_epoch": 24,
        "log_every_steps": 4,
        "checkpoint_every_minutes": 0.001,
        "batch_size": 32,
    }
    straight = _case(tmp_path, "straight", model=model, training=training)
    assert main(["train", "--config", str(straight)]) == 0
    capsys.readouterr()
    (straight_dir,) = _run_dirs(straight)
    config = _case(tmp_path, "killed", model=model, training=training)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "common.cli", "train", "--config", str(config), "--resume", "auto"]
    rng = random.Random(1234)
    killed, finished = [], False
    for anchor, steps in _KILLS:
        logs = [d / "training_log.json" for d in _run_dirs(config) if (d / "training_log.json").is_file()]
        if logs and json.loads(logs[0].read_text())["status"] == "finished":
            break  # complete (a kill came after the end): another start would be a new run, as documented
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if _kill_moment(proc, _lines(proc), config, anchor, steps, rng):
            proc.kill()
            killed.append(anchor)
        proc.wait(timeout=120)
        finished = proc.returncode == 0
        if finished:
            break  # it completed before this kill
        assert proc.returncode == -signal.SIGKILL, f"exit {proc.returncode} after kills {killed}"
    assert len(killed) >= len(_KILLS) - 1, killed
    log = json.loads((_run_dirs(config)[0] / "training_log.json").read_text())
    if not finished and log["status"] != "finished":  # the last kill came before the end
        code, _, _ = _run(capsys, "--config", config, "--resume", "auto")  # the requeued job, say
        assert code == 0

    (run_dir,) = _run_dirs(config)  # one run folder, however early a kill came
    names = {p.name for p in run_dir.iterdir()}
    assert RUN_FILES <= names and not [n for n in names if n.endswith(".tmp")], names
    log = json.loads((run_dir / "training_log.json").read_text())
    assert log["status"] == "finished" and _epoch_losses(run_dir) == _epoch_losses(straight_dir)
    for name in ("best_model.pt", "checkpoint_epoch_2.pt"):
        mine, ref = load_checkpoint(run_dir / name)["model"], load_checkpoint(straight_dir / name)["model"]
        assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in ref), name
    results = json.loads((run_dir / "test_results.json").read_text())
    assert results == json.loads((straight_dir / "test_results.json").read_text())


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
    from common.model.gpt import MarketGPT

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
