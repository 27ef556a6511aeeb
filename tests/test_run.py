"""The Run (common/run/folder.py): a run folder opened and made in one place, on the run folders
an earlier version made (tests/fixtures/runs) and on ones it makes itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from common.config import ConfigError
from common.errors import UserError
from common.paths import REPO_ROOT
from common.run.folder import Run
from common.run.log import RunLog

RUNS = REPO_ROOT / "tests" / "fixtures" / "runs"


@pytest.fixture
def old_run(tmp_path) -> Path:
    copy = tmp_path / "tiny_20260101_000000"
    shutil.copytree(RUNS / "two_intervals", copy)
    return copy


def test_an_old_run_opens_with_its_files_read_back(old_run):
    run = Run.open(old_run, tokens=True)
    raw = json.loads((old_run / "asset_info.json").read_text())
    assert run.info.to_json() == raw  # RunInfo reads and writes asset_info.json key for key
    assert run.info.intervals == ("1d", "1h") and run.cfg.data.intervals == ["1d", "1h"]
    assert run.tokens is not None and set(run.tokens.symbols) == set(raw["series"])
    assert run.best_model == old_run / "best_model.pt" and run.best_model.is_file()
    assert run.log().status in ("finished", "early_stopped")
    assert "split" in json.dumps(run.data_info())  # data_info.json as training wrote it
    assert Run.open(old_run).tokens is None  # the token set only when asked for


def test_a_created_run_opens_to_the_same_run(old_run, tmp_path):
    source = Run.open(old_run, tokens=True)
    assert source.tokens is not None
    new = tmp_path / "tiny_20260102_000000"
    new.mkdir()
    made = Run.create(new, source.cfg, source.tokenizer, source.info, source.tokens, source.data_info())
    back = Run.open(new, tokens=True, model=False)
    assert back.cfg == source.cfg and back.info == source.info == made.info
    assert (new / "tokenizer.json").read_text() == (old_run / "tokenizer.json").read_text()
    assert (new / "asset_info.json").read_bytes() == (old_run / "asset_info.json").read_bytes()
    assert back.tokens is not None
    for s in source.tokens.symbols:
        np.testing.assert_array_equal(back.tokens.tokens[s], source.tokens.tokens[s])
    assert back.tokens.ranges == source.tokens.ranges
    assert back.log().status == "running" and back.log().epochs == []  # the folder is owned from the start
    with pytest.raises(UserError, match="no best_model.pt yet"):
        Run.open(new)


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("asset_info.json", "missing asset_info.json"),
        ("tokens", "missing tokens"),
        ("best_model.pt", "no best_model.pt yet"),
    ],
)
def test_a_folder_missing_a_file_says_which(old_run, remove, message):
    path = old_run / remove
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    with pytest.raises(UserError, match=message):
        Run.open(old_run, tokens=True)


def test_a_damaged_file_is_named(old_run, tmp_path):
    with pytest.raises(UserError, match="no such run folder"):
        Run.open(tmp_path / "nowhere")
    (old_run / "data_info.json").write_text("{ not json")
    with pytest.raises(UserError, match=r"data_info.json is not valid JSON.*damaged"):
        Run.open(old_run).data_info()
    (old_run / "asset_info.json").write_text('{"assets": 3}')
    with pytest.raises(UserError, match="not a valid asset_info.json"):
        Run.open(old_run)


def test_a_resume_may_change_only_harmless_keys(old_run):
    run = Run.open(old_run, overrides=["training.epochs=9", "slurm.time=01:00:00"])
    assert run.cfg.training.epochs == 9
    with pytest.raises(ConfigError, match="--set cannot change training.learning_rate when resuming"):
        Run.open(old_run, overrides=["training.learning_rate=0.5"])


def test_a_log_that_is_missing_or_damaged_reads_as_empty(old_run):
    (old_run / "training_log.json").write_text("[1, 2")
    assert RunLog.read(old_run).status is None and RunLog.read(old_run).to_dict() == {}
    (old_run / "training_log.json").unlink()
    assert Run.open(old_run).log().to_dict() == {}


@pytest.mark.parametrize("name", ["one_interval", "two_intervals"])
def test_an_old_log_reads_as_attributes_and_writes_back_byte_for_byte(name, tmp_path):
    # users' jq over training_log.json is the seed guide's interface: RunLog keeps every field and its order
    log = RunLog.read(RUNS / name)
    raw = json.loads((RUNS / name / "training_log.json").read_text())
    assert log.status == raw["status"] and log.best_epoch == raw["best_epoch"] and log.epochs == raw["epochs"]
    assert log.last_epoch == raw["epochs"][-1] and log.best_val_loss == raw["best_val_loss"]
    log.write(tmp_path / "training_log.json")
    assert (tmp_path / "training_log.json").read_bytes() == (RUNS / name / "training_log.json").read_bytes()


def test_the_log_is_written_through_its_methods_only_with_known_values():
    log = RunLog()
    with pytest.raises(ValueError, match="unknown status"):
        log.set_status("done")
    with pytest.raises(ValueError, match="lacks"):
        log.add_epoch(epoch=1)
    log.set_interrupted("SIGUSR2 at epoch 1 step 3")
    assert log.interrupted == "SIGUSR2 at epoch 1 step 3"
    log.set_interrupted(None)
    assert log.interrupted is None and "interrupted" not in log.to_dict()
    log.epochs.append({"epoch": 9})  # a read is a copy: nothing changes the log from outside
    assert log.epochs == [] and list(log.to_dict()) == ["status", "error", "best_val_loss", "best_epoch", "epochs"]
