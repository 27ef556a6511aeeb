"""`marketgpt data prepare --array N`: the token shard as four dependent Slurm jobs (clean: an array
of N, fit, encode: an array of N, finish), planned and checked without Slurm, and once for real on
the local Slurm cluster (tools/local_slurm; only with CI=true or MARKETGPT_LOCAL_SLURM=1)."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pytest
import submitit

from common.cli import main
from common.config import load_config
from common.distributed.scheduler import wait_for_jobs
from common.errors import UserError
from common.slurm import prepare_jobs
from common.slurm.prepare_jobs import (
    PREP_MAX_MINUTES,
    PrepareJob,
    plan_preparation,
    prepare_parameters,
    submit_preparation,
)
from common.tokens.corpus import prepare_in_memory
from common.tokens.shard_paths import shard_folder, work_folder
from common.tokens.token_set import TokenSet

from test_shards import same_tokens

CONFIG = {
    "experiment": "prep",
    "model": {
        "vocab_size": 64,
        "context_length": 8,
        "d_model": 16,
        "num_layers": 1,
        "num_heads": 2,
        "d_ff": 32,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
    },
    "data": {
        "source": "synthetic",
        "interval": "1d",
        "start_date": "2019-01-01",
        "synthetic": {"assets": 5, "candles": 300, "seed": 3, "gap_prob": 0.02},
    },
    "slurm": {"partition": "long", "job_name": "prep", "time": "7-00:00:00"},
}


def make_case(root: Path) -> Path:
    """A case folder with a synthetic market (no cache to download); returns its config."""
    config = root / "case" / "configs" / "prep.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(CONFIG))
    return config


@pytest.fixture
def fake_slurm(monkeypatch):
    """Slurm answers and has the partition `long`."""

    def check_partition(name: str) -> None:
        if name != "long":
            raise UserError(f"partition '{name}' does not exist on this cluster (partitions: long)")

    monkeypatch.setattr(prepare_jobs, "slurm_available", lambda: True)
    monkeypatch.setattr(prepare_jobs, "check_partition", check_partition)


class FakeExecutor:
    """Records what each submission asked for; hands out job ids 100, 101, ... (arrays as 100_0, ...)."""

    submissions: list[tuple[dict, list]] = []

    def __init__(self, folder: Path, **kwargs) -> None:
        self.folder, self.parameters = Path(folder), {}
        FakeExecutor.submissions = []

    def update_parameters(self, **kwargs) -> None:
        self.parameters.update(kwargs)

    def _record(self, fns: list) -> str:
        FakeExecutor.submissions.append((dict(self.parameters), fns))
        return str(100 + len(FakeExecutor.submissions) - 1)

    def submit(self, fn):
        return type("Job", (), {"job_id": self._record([fn])})()

    def submit_array(self, fns):
        base = self._record(list(fns))
        return [type("Job", (), {"job_id": f"{base}_{i}"})() for i in range(len(fns))]


def test_the_plan_splits_clean_and_encode_over_the_tasks(tmp_path):
    config = make_case(tmp_path)
    plan = plan_preparation(config, ["tokenizer.ret_bins=6"], tasks=3)
    assert list(plan.stages) == ["clean", "fit", "encode", "finish"]
    assert [(j.task, j.tasks) for j in plan.stages["clean"]] == [(0, 3), (1, 3), (2, 3)]
    assert [(j.task, j.tasks) for j in plan.stages["encode"]] == [(0, 3), (1, 3), (2, 3)]
    assert [(j.task, j.tasks) for j in plan.stages["fit"] + plan.stages["finish"]] == [(0, 1), (0, 1)]
    cfg = load_config(config, ["tokenizer.ret_bins=6"])
    assert plan.shard == shard_folder(cfg, config.parent.parent)[0] and not plan.done
    assert plan.log_folder == config.parent.parent / "logs" / f"prepare_{plan.shard.name}"
    job = pickle.loads(pickle.dumps(plan.stages["encode"][2]))  # what submitit pickles: strings and ints
    assert (job.config, job.overrides, job.stage, job.task, job.key) == (
        str(config.resolve()),
        ["tokenizer.ret_bins=6"],
        "encode",
        2,
        plan.shard.name,
    )


def test_each_job_asks_for_cpus_only_on_the_configs_partition(tmp_path):
    cfg = load_config(make_case(tmp_path), ["slurm.partition=medium", "slurm.time=2:00:00"])
    params = prepare_parameters(cfg.slurm)
    text = submitit.slurm.slurm._make_sbatch_string(command="true", folder=tmp_path, **params, dependency="afterok:41")
    lines = {line.split("=")[0]: line.partition("=")[2] for line in text.splitlines() if line.startswith("#SBATCH")}
    assert lines["#SBATCH --partition"] == "medium" and lines["#SBATCH --dependency"] == "afterok:41"
    assert lines["#SBATCH --cpus-per-task"] == "2" and lines["#SBATCH --mem"] == "8GB"
    assert lines["#SBATCH --time"] == "120" and lines["#SBATCH --kill-on-invalid-dep"] == "yes"
    assert not any("gres" in k or "gpu" in k for k in lines), text
    assert "cluster_env.sh" in text and "--cpus-per-task=2" in text  # the cluster's set-up, srun's CPUs
    # the training's 7 days would wait long for a slot: a day at most
    assert prepare_parameters(load_config(make_case(tmp_path / "b")).slurm)["time"] == PREP_MAX_MINUTES


def test_the_four_jobs_are_chained_afterok(tmp_path, fake_slurm, monkeypatch):
    monkeypatch.setattr(submitit, "SlurmExecutor", FakeExecutor)
    config = make_case(tmp_path)
    out = io.StringIO()
    jobs = submit_preparation(config, [], tasks=2, out=out)
    subs = FakeExecutor.submissions
    assert [len(fns) for _, fns in subs] == [2, 1, 2, 1]
    assert [fns[0].stage for _, fns in subs] == ["clean", "fit", "encode", "finish"]
    assert [p.get("dependency") for p, _ in subs] == [None, "afterok:100", "afterok:101", "afterok:102"]
    assert [p["job_name"] for p, _ in subs] == ["prep-clean", "prep-fit", "prep-encode", "prep-finish"]
    assert all(p["partition"] == "long" and "gres" not in p for p, _ in subs)
    assert [j.job_id for j in jobs["clean"]] == ["100_0", "100_1"] and jobs["finish"][0].job_id == "103"
    text = out.getvalue()
    assert "Submitted job 101: fit, after job 100" in text and "squeue -j 100,101,102,103" in text
    assert "marketgpt train --config" in text and "reuses the shard" in text


def test_dry_run_shows_the_jobs_and_submits_nothing(tmp_path, capsys, nothing_queued, fake_slurm):
    config = make_case(tmp_path)
    assert main(["data", "prepare", "--config", str(config), "--array", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "token shard" in out and "4 jobs to partition long, CPU only (2 CPUs, 8GB" in out
    assert "1. clean   array of 4" in out and "4. finish  1 job        after 3 succeeds" in out
    assert "Dry run: nothing submitted." in out
    assert not (tmp_path / "case" / "data").exists() and not (tmp_path / "case" / "logs").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--array", "0"], "--array 0: the number of tasks must be 1 or more"),
        (["--array", "-2"], "--array -2: the number of tasks must be 1 or more"),
        (["--array", "2", "--set", "data.shards=false"], "data.shards is false"),
        (["--array", "2", "--set", "slurm.partition=gpu-xl"], "partition 'gpu-xl' does not exist"),
        (["--array", "6"], "--array 6: more tasks than the 5 series to prepare"),
    ],
)
def test_bad_input_is_one_line_before_anything_is_queued(tmp_path, argv, message, capsys, nothing_queued, fake_slurm):
    config = make_case(tmp_path)
    assert main(["data", "prepare", "--config", str(config), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("marketgpt data: error: ") and "\n" not in err and message in err, err


def test_an_existing_shard_is_reported_and_nothing_submitted(tmp_path, capsys, nothing_queued, monkeypatch):
    monkeypatch.setattr(prepare_jobs, "slurm_available", lambda: False)  # not even asked
    config = make_case(tmp_path)
    assert main(["data", "prepare", "--config", str(config), "--array", "1"]) == 0  # in this process
    assert "prepared" in capsys.readouterr().out
    assert main(["data", "prepare", "--config", str(config), "--array", "3"]) == 0
    assert "is already prepared; nothing to submit" in capsys.readouterr().out


def test_the_jobs_run_in_order_make_the_shard_and_a_stale_key_stops(tmp_path, capsys):
    config = make_case(tmp_path)
    case = config.parent.parent
    plan = plan_preparation(config, [], tasks=2)
    stale = PrepareJob(str(config), [], "clean", 0, 2, key="0123456789abcdef")
    with pytest.raises(UserError, match="inputs changed since it was submitted"):
        stale()
    assert "marketgpt data prepare: error: the shard's inputs changed" in capsys.readouterr().err
    for jobs in plan.stages.values():
        for job in reversed(jobs):  # array tasks in any order
            pickle.loads(pickle.dumps(job))()
    assert plan.done
    cfg = load_config(config)
    shard = TokenSet.load(plan.shard / "tokens")
    assert same_tokens(shard, prepare_in_memory(cfg, case).tokens)
    plan.stages["clean"][0]()  # a job queued behind a finished shard does nothing
    assert "already prepared" in capsys.readouterr().out and not work_folder(plan.shard).exists()


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")
def test_four_jobs_on_the_local_cluster_prepare_the_shard(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the jobs inherit the submitting environment
    config = make_case(tmp_path)
    out = io.StringIO()
    submitted = submit_preparation(config, ["slurm.time=00:10:00"], tasks=2, out=out)
    ids = [job.job_id for jobs in submitted.values() for job in jobs]
    assert len(ids) == 6, out.getvalue()
    states = wait_for_jobs(ids, timeout_s=600, poll_s=2.0)
    logs = "".join(p.read_text() for p in sorted((config.parent.parent / "logs").rglob("*_log.*")))
    assert set(states.values()) == {"COMPLETED"}, f"{states}\n{out.getvalue()}\n{logs[-4000:]}"
    cfg = load_config(config, ["slurm.time=00:10:00"])
    folder, _ = shard_folder(cfg, config.parent.parent)
    assert (folder / "manifest.json").is_file() and not work_folder(folder).exists()
    assert "the encode stage, task 1 of 2" in logs and "the finish stage" in logs
    assert same_tokens(TokenSet.load(folder / "tokens"), prepare_in_memory(cfg, config.parent.parent).tokens)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")
def test_a_failed_stage_cancels_the_jobs_after_it(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = make_case(tmp_path)
    submitted = submit_preparation(config, ["slurm.time=00:10:00"], tasks=2, out=io.StringIO())
    # the config edited before the jobs start (they take seconds): the clean tasks find another shard key
    config.write_text(json.dumps(dict(CONFIG, tokenizer={"ret_bins": 6})))
    states = wait_for_jobs([job.job_id for jobs in submitted.values() for job in jobs], timeout_s=600, poll_s=2.0)
    clean = [states[job.job_id] for job in submitted["clean"]]
    after = [states[job.job_id] for stage in ("fit", "encode", "finish") for job in submitted[stage]]
    assert clean == ["FAILED", "FAILED"] and set(after) == {"CANCELLED"}, states
    err = Path(submitted["clean"][0].paths.stderr).read_text()
    assert "marketgpt data prepare: error: the shard's inputs changed since it was submitted" in err
