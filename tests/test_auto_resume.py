"""Which run `--resume auto` continues (run_folder.auto_resume_run): a requeued job's own run,
else the newest run unless it is done or another live job trains it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.distributed import scheduler as slurm_utils
from common.errors import UserError
from common.run.resume import auto_resume_run, find_runs, resolve_resume, reuse_unstarted_run


def _run(root: Path, stamp: str, test_results: bool = False, **log) -> Path:
    """A run folder; test_results=True: with its final outputs (report.png, test_results.json)."""
    path = root / f"exp_{stamp}"
    path.mkdir(parents=True)
    if log:
        (path / "training_log.json").write_text(json.dumps(log))
    if test_results:
        (path / "report.png").write_bytes(b"\x89PNG")
        (path / "test_results.json").write_text("{}")
    return path


@pytest.fixture
def alive(monkeypatch) -> set[str]:
    """Job ids Slurm reports as queued or running (none: no Slurm)."""
    jobs: set[str] = set()
    monkeypatch.setattr(slurm_utils, "job_is_alive", lambda job, completing_wait_s=120.0: job in jobs)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return jobs


def test_no_runs_start_a_new_one(alive):
    assert auto_resume_run([]) is None


def test_the_newest_unfinished_run_is_continued(tmp_path, alive):
    _run(tmp_path, "20250101_000000", status="finished", test_results=True)
    newest = _run(tmp_path, "20250102_000000", status="running", slurm_job_id="7")
    assert auto_resume_run(find_runs(tmp_path, "exp")) == newest


@pytest.mark.parametrize(
    "log,test_results",
    [
        ({"status": "finished"}, True),
        ({"status": "early_stopped"}, True),
        ({"status": "failed", "error": "non-finite loss"}, False),
    ],
    ids=["finished", "early_stopped", "failed"],
)
def test_a_done_newest_run_starts_a_new_one(tmp_path, alive, log, test_results):
    _run(tmp_path, "20250101_000000", status="running")  # an older, abandoned run stays abandoned
    _run(tmp_path, "20250102_000000", test_results=test_results, **log)
    assert auto_resume_run(find_runs(tmp_path, "exp")) is None
    assert resolve_resume("auto", tmp_path, "exp") == (None, None)


def test_a_run_killed_before_its_test_evaluation_is_continued(tmp_path, alive):
    run = _run(tmp_path, "20250102_000000", status="finished")  # no test_results.json yet
    assert auto_resume_run([run]) == run


def test_a_run_missing_any_final_output_is_continued(tmp_path, alive):
    run = _run(tmp_path, "20250102_000000", status="early_stopped", test_results=True)
    (run / "report.png").unlink()  # killed while drawing it (by an older version that wrote it last)
    assert auto_resume_run([run]) == run
    (run / "test_results.json").write_text(json.dumps({"report_error": "ImportError: no matplotlib"}))
    assert auto_resume_run([run]) is None  # a report that cannot be drawn is not retried forever


def test_a_folder_killed_before_its_first_checkpoint_is_reused(tmp_path, alive):
    run = _run(tmp_path, "20250102_000000", status="running")
    for name in (
        "config.json",
        "tokenizer.json",
        "asset_info.json",
        "data_info.json",
        "tokens",
        ".tokens.a1b2.tmp",
        "best_model.pt",
    ):  # killed between best_model.pt and its epoch checkpoint
        (run / name).write_text("x")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out").write_text("x")
    assert resolve_resume("auto", tmp_path, "exp") == (run, None)
    assert reuse_unstarted_run(run) and list(run.iterdir()) == []


@pytest.mark.parametrize("name", ["checkpoint_epoch_1_step_3.pt", "checkpoint_epoch_1.pt", "report.png", "notes.txt"])
def test_a_folder_holding_more_than_its_set_up_is_not_reused(tmp_path, alive, name):
    run = _run(tmp_path, "20250102_000000", status="running")
    (run / "config.json").write_text("x")
    (run / name).write_text("damaged, or someone else's")
    assert not reuse_unstarted_run(run)
    assert sorted(p.name for p in run.iterdir()) == sorted({"config.json", "training_log.json", name})


def test_a_run_another_live_job_trains_is_left_alone(tmp_path, alive, monkeypatch):
    run = _run(tmp_path, "20250102_000000", status="running", slurm_job_id="7")
    alive.add("7")
    assert auto_resume_run([run]) is None
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    assert auto_resume_run([run]) is None
    alive.discard("7")  # scancel'ed: a resubmitted job picks it up
    assert auto_resume_run([run]) == run


def test_a_requeued_job_continues_its_own_run_even_when_a_newer_one_exists(tmp_path, alive, monkeypatch):
    mine = _run(tmp_path, "20250101_000000", status="running", slurm_job_id="7")
    _run(tmp_path, "20250102_000000", status="running", slurm_job_id="9")
    alive.update({"7", "9"})
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert auto_resume_run(find_runs(tmp_path, "exp")) == mine


def test_a_run_without_a_log_yet_is_the_newest_unfinished(tmp_path, alive):
    run = _run(tmp_path, "20250102_000000")  # died before its first step: no training_log.json
    assert auto_resume_run([run]) == run
    assert resolve_resume("auto", tmp_path, "exp") == (run, None)  # no checkpoint: a new run starts


def test_resume_path_refuses_a_run_another_live_job_trains(tmp_path, alive, monkeypatch):
    run = _run(tmp_path, "20250102_000000", status="running", slurm_job_id="7")
    (run / "checkpoint_epoch_1.pt").write_bytes(b"")  # never read: the refusal comes first
    alive.add("7")
    for resume in (run, run / "checkpoint_epoch_1.pt"):
        with pytest.raises(UserError, match="Slurm job 7 is still training this run.*scancel 7"):
            resolve_resume(str(resume), None, None)
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # job 7 itself, requeued with an explicit --resume
    assert resolve_resume(str(run / "checkpoint_epoch_1.pt"), None, None) == (run, run / "checkpoint_epoch_1.pt")


def test_a_setting_added_after_a_checkpoint_counts_as_its_default():
    """A checkpoint's stored config lacks keys added to the code later: they mean the default."""
    from common.config import Config, config_to_dict
    from common.run.folder import config_differences

    old = config_to_dict(Config())
    del old["data"]["synthetic"]  # as written before data.synthetic existed
    assert config_differences(Config(), old) == []
    changed = Config()
    changed.data.synthetic = {"assets": 3}
    assert [d.split(":")[0] for d in config_differences(changed, old)] == ["data.synthetic"]
