"""`marketgpt submit` without a cluster: parameters from the config (and equal to the sbatch
script's), arrays, every bad input rejected before anything is queued, the Checkpointable's
resume target, waiting with a timeout, and a real --local run (2 local DDP ranks).
tests/test_slurm_integration.py submits through submitit to the real local Slurm."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import submitit

from common.cli import main
from common.distributed import scheduler as slurm_utils
from common.distributed.scheduler import parse_slurm_time
from common.errors import UserError
from common.paths import REPO_ROOT
from common.run.checkpoint import save_checkpoint
from common.slurm import submit as submit_mod
from common.slurm.submit import TrainJob, executor_parameters, parse_array, plan_submission

from slurm_helpers import CASES, TINY, sbatch_lines, sets

pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")


@pytest.mark.parametrize(
    "text,minutes",
    [
        ("7-00:00:00", 7 * 24 * 60),
        ("2-00:00:00", 2880),
        ("90", 90),
        ("1:30", 2),
        ("2:00:00", 120),
        ("1-12", 36 * 60),
        ("0-0:1:0", 1),
        ("00:01:00", 1),
    ],
)
def test_slurm_time_formats(text, minutes):
    assert parse_slurm_time(text) == minutes


@pytest.mark.parametrize("text", ["", "7 days", "1:2:3:4", "0", "-5"])
def test_bad_slurm_times(text):
    with pytest.raises(UserError, match="slurm.time"):
        parse_slurm_time(text)


def test_array_specs():
    assert parse_array("seeds=1,2,3") == ("training.seed", ["1", "2", "3"])
    assert parse_array("training.learning_rate=1e-4, 3e-4") == ("training.learning_rate", ["1e-4", "3e-4"])
    for bad in ("seeds", "seeds=", "lr=1,2", "seeds=1,1"):
        with pytest.raises(UserError, match="--array"):
            parse_array(bad)


@pytest.mark.parametrize("key", sorted(CASES))
def test_submitit_asks_for_what_the_sbatch_script_asks_for(key, tmp_path):
    case, script, config = CASES[key]
    cfg = plan_submission(case)[0].cfg
    params = executor_parameters(cfg.slurm)
    text = submitit.slurm.slurm._make_sbatch_string(command="true", folder=tmp_path, **params)
    ours = sbatch_lines(REPO_ROOT / case / "slurm_scripts" / script)
    theirs = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH --"):
            k, _, v = line[len("#SBATCH --") :].partition("=")
            theirs[k] = v or None
    for k in ("job-name", "partition", "nodes", "ntasks-per-node", "cpus-per-task", "gres"):
        assert theirs[k] == ours[k], k
    assert theirs["mem"].removesuffix("GB") == ours["mem"].removesuffix("G")
    assert int(theirs["time"]) == parse_slurm_time(ours["time"])
    assert theirs["signal"].split("@")[1] == ours["signal"].split("@")[1]  # same warning time
    assert "requeue" in theirs
    assert f"--cpus-per-task={cfg.slurm.cpus_per_task}" in text  # srun gets it too (22.05+)


def test_an_array_trains_one_experiment_per_value():
    plan = plan_submission("c", overrides=["training.epochs=3"], array="seeds=1,2")
    assert [(p.label, p.cfg.training.seed, p.cfg.experiment, p.cfg.training.epochs) for p in plan] == [
        ("training.seed=1", 1, "crypto_prototype_seed1", 3),
        ("training.seed=2", 2, "crypto_prototype_seed2", 3),
    ]
    lr = plan_submission("c", array="training.learning_rate=1e-4,3e-4")
    assert [p.cfg.experiment for p in lr] == [
        "crypto_prototype_learning_rate1e-4",
        "crypto_prototype_learning_rate3e-4",
    ]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--case", "case_c_cripto"], "unknown case 'case_c_cripto'; did you mean 'case_c_crypto'?"),
        (["--case", "c", "--config", "missing.json"], "missing.json: config file not found"),
        (
            ["--case", "c", "--set", "training.epoch=5"],
            "unknown key 'training.epoch' (did you mean 'training.epochs'?)",
        ),
        (["--case", "c", "--array", "seeds=1,x"], "--array training.seed=x: 'training.seed' = 'x' is not an integer"),
        (["--case", "c", "--set", "slurm.time=7 days"], "slurm.time = '7 days' is not a Slurm time"),
    ],
    ids=["case typo", "missing config", "unknown key", "bad array value", "bad time"],
)
def test_bad_input_is_one_line_before_anything_is_queued(argv, message, capsys, nothing_queued):
    assert main(["submit", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("marketgpt submit: error: ") and "\n" not in err and message in err, err


def test_without_slurm_it_says_to_use_local(capsys, nothing_queued, monkeypatch):
    monkeypatch.setattr(submit_mod, "slurm_available", lambda: False)
    assert main(["submit", "--case", "c"]) == 2
    err = capsys.readouterr().err
    assert "Slurm does not answer here" in err and "--local" in err


def test_a_missing_partition_is_refused(capsys, nothing_queued, monkeypatch):
    monkeypatch.setattr(submit_mod, "slurm_available", lambda: True)
    monkeypatch.setattr(slurm_utils, "partitions", lambda: ["long", "medium"])
    assert main(["submit", "--case", "c", "--set", "slurm.partition=gpu-xl"]) == 2
    err = capsys.readouterr().err
    assert "partition 'gpu-xl' does not exist on this cluster (partitions: long, medium)" in err


def test_dry_run_shows_the_job_and_submits_nothing(capsys, nothing_queued, monkeypatch):
    monkeypatch.setattr(submit_mod, "slurm_available", lambda: True)
    monkeypatch.setattr(slurm_utils, "partitions", lambda: ["long"])
    assert main(["submit", "--case", "c", "--dry-run", "--array", "seeds=1,2"]) == 0
    out = capsys.readouterr().out
    assert "2 job(s) to partition long: 1 node(s) x 2 task(s) (gpu:a100:2), 32 CPUs/task, 128G" in out
    assert "--num-gpus 2 --resume auto --set training.seed=2 --set experiment=crypto_prototype_seed2" in out
    assert "Dry run: nothing submitted." in out


def _case(root: Path) -> Path:
    """A case folder holding case C's config (so --set TINY applies) under `root`."""
    folder = root / "case_t"
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / "t.json").write_text((REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json").read_text())
    return folder


def test_checkpoint_resumes_this_jobs_own_run(tmp_path, monkeypatch):
    case = _case(tmp_path)
    run = case / "checkpoints" / "crypto_prototype_20250101_000000"
    run.mkdir(parents=True)
    (run / "training_log.json").write_text(json.dumps({"status": "running", "slurm_job_id": "77"}))
    job = TrainJob(str(case / "configs" / "t.json"), ["training.epochs=3"], 2)
    assert pickle.loads(pickle.dumps(job)).argv() == job.argv()
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert job.checkpoint().function.resume == "auto"  # no checkpoint yet
    save_checkpoint({"x": 1}, run / "checkpoint_epoch_1_step_5.pt")
    follow_up = job.checkpoint().function
    assert isinstance(follow_up, TrainJob) and follow_up.resume == str(run)
    assert follow_up.argv()[-2:] == ["--set", "training.epochs=3"]


def test_a_stopped_job_requeues_after_usr2_but_not_after_scancel(monkeypatch):
    states = {"31": "RUNNING", "32": "COMPLETING"}  # what scontrol shows after USR2 / after scancel
    monkeypatch.setattr(submit_mod, "job_info", lambda job: {"JobState": states[job]})
    assert submit_mod.still_running("slurm", "31") and not submit_mod.still_running("slurm", "32")
    assert submit_mod.still_running("local", None)  # submitit's local controller restarts the tasks


def test_waiting_gives_up_after_its_timeout(monkeypatch):
    monkeypatch.setattr(slurm_utils, "job_states", lambda ids: {i: "RUNNING" for i in ids})
    with pytest.raises(TimeoutError, match="12 RUNNING"):
        slurm_utils.wait_for_jobs(["12"], timeout_s=0.3, poll_s=0.05)
    # a job killed outside Python (scancel, OOM) is over as soon as Slurm says so
    monkeypatch.setattr(slurm_utils, "job_states", lambda ids: {})
    monkeypatch.setattr(slurm_utils, "job_info", lambda job: {"JobState": "CANCELLED"} if job == "12" else None)
    assert slurm_utils.wait_for_jobs(["12", "13"], timeout_s=5, poll_s=0.05) == {"12": "CANCELLED", "13": "GONE"}


@pytest.mark.slow
def test_local_runs_the_same_job_without_a_cluster(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    case = _case(tmp_path)
    code = main(["submit", "--case", str(case), "--local", *sets(TINY), "--set", "experiment=local"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 job(s) locally (submitit LocalExecutor): 1 node(s) x 2 task(s)" in out
    assert "follow:  tail -f" in out and "Local job" in out and "finished" in out
    (run,) = (case / "checkpoints").glob("local_*")
    log = json.loads((run / "training_log.json").read_text())
    assert log["status"] == "finished" and log["world_size"] == 2 and log["launcher"] == "submitit"
    assert (run / "test_results.json").is_file()
    logged = Path(log["log_file"]).read_text()
    assert "DDP: 2 processes (gloo)" in logged and "Epoch 2/2" in logged
