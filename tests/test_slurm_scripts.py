"""The sbatch scripts without a cluster: their #SBATCH lines against the config's `slurm`
section and the seed's request, and common/slurm/job.sh (logs, pass-through, requeue,
scancel) driven by fake `srun` and `scontrol` commands. tests/test_slurm_integration.py
runs the same scripts on the real local Slurm."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from common.config import load_config
from common.distributed.requeue import DEFAULT_MAX_REQUEUES, EXIT_REQUEUE

from slurm_helpers import (
    CASES,
    FAKE_PYTHON,
    FAKE_SCONTROL,
    FAKE_SRUN,
    REPO,
    copy_repo,
    fake_bin,
    job_env,
    sbatch_lines,
    shell_vars,
)

SCRIPTS = {key: REPO / case / "slurm_scripts" / script for key, (case, script, _) in CASES.items()}


@pytest.mark.parametrize("key", sorted(CASES))
def test_sbatch_lines_agree_with_the_config_slurm_section(key):
    case, script, config = CASES[key]
    lines = sbatch_lines(SCRIPTS[key])
    cfg = load_config(REPO / case / "configs" / config)
    s = cfg.slurm
    assert lines["job-name"] == s.job_name
    assert lines["partition"] == s.partition
    assert int(lines["nodes"]) == s.nodes
    assert int(lines["ntasks-per-node"]) == s.gpus_per_node  # one task per GPU
    assert lines["gres"] == f"gpu:{s.gpu_type}:{s.gpus_per_node}"
    assert int(lines["cpus-per-task"]) == s.cpus_per_task
    assert lines["mem"] == f"{s.mem_gb}G"
    assert lines["time"] == s.time
    assert lines["signal"] == f"B:USR2@{60 * s.signal_minutes_before_limit}"
    assert "requeue" in lines and lines["open-mode"] == "append"
    assert "ntasks" not in lines  # tasks come from ntasks-per-node x nodes
    variables = shell_vars(SCRIPTS[key])
    assert variables["CASE"] == case and variables["LOG_PREFIX"] == s.log_prefix
    assert variables["CONFIG"] == f"configs/{config}"


@pytest.mark.parametrize("key", sorted(CASES))
def test_every_script_asks_for_the_seed_request(key):
    lines = sbatch_lines(SCRIPTS[key])
    assert (lines["nodes"], lines["gres"], lines["mem"], lines["time"], lines["partition"]) == (
        "1",
        "gpu:a100:2",
        "128G",
        "7-00:00:00",
        "long",
    )
    assert int(lines["ntasks-per-node"]) * int(lines["cpus-per-task"]) == 64  # 2 tasks x 32 CPUs


def test_the_three_scripts_differ_only_in_their_case():
    texts = []
    for key, (case, script, config) in CASES.items():
        text = SCRIPTS[key].read_text()
        s = load_config(REPO / case / "configs" / config).slurm
        for word in (
            case,
            script.removesuffix(".sh"),
            config,
            f"job-name={s.job_name}",
            f"{s.log_prefix}_<JOBID>",
            f"LOG_PREFIX={s.log_prefix}",
        ):
            text = text.replace(word, "<case>")
        texts.append([" ".join(line.split()) for line in text.splitlines() if not line.startswith("# Case ")])
    assert texts[0] == texts[1] == texts[2]


@pytest.mark.parametrize(
    "path",
    [
        *SCRIPTS.values(),
        REPO / "common/slurm/job.sh",
        REPO / "common/slurm/cluster_env.sh",
        REPO / "launch_parallel_training.sh",
    ],
    ids=lambda p: p.name,
)
def test_shell_syntax(path):
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True).returncode == 0
    if path.parent.name != "slurm" or path.parent.parent.name != "common":  # common/slurm/*.sh are sourced
        assert os.access(path, os.X_OK), f"{path} is not executable"


def test_job_sh_agrees_with_common_requeue():
    """The exit code that means "requeue me" and the default requeue cap, as job.sh sees them."""
    env = {k: v for k, v in job_env().items() if k != "MARKETGPT_MAX_REQUEUES"}
    proc = subprocess.run(
        ["bash", "-c", 'source common/slurm/job.sh && echo "$MARKETGPT_EXIT_REQUEUE $MARKETGPT_REQUEUE_CAP"'],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(EXIT_REQUEUE), str(DEFAULT_MAX_REQUEUES)]


# --------------------------------------------------------------------------- job.sh with fake Slurm


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return copy_repo(tmp_path_factory.mktemp("repo"))


class FakeJob:
    """The case C script as Slurm would start it, with fake srun/scontrol on PATH and a fake python
    for its plan (real_python: this interpreter, so the real `marketgpt plan` runs)."""

    def __init__(
        self,
        repo: Path,
        tmp: Path,
        srun: str,
        job_id: str = "4242",
        restarts: int = 0,
        command: str | None = None,
        submit_dir: Path | None = None,
        stdout: Path | None = None,
        real_python: bool = False,
    ) -> None:
        self.repo, self.job_id, self.calls = repo, job_id, tmp / "calls.txt"
        script = repo / "case_c_crypto" / "slurm_scripts" / "train_crypto_a100.sh"
        bin_dir = fake_bin(tmp / "bin", srun=FAKE_SRUN, scontrol=FAKE_SCONTROL, fake_python=FAKE_PYTHON)
        python = {} if real_python else {"MARKETGPT_PYTHON": "fake_python"}  # found on PATH
        self.env = job_env(
            **python,
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            FAKE_CALLS=str(self.calls),
            FAKE_SRUN=srun,
            FAKE_COMMAND=f"{script} --set training.epochs=5" if command is None else command,
            FAKE_STDOUT=str(stdout or ""),
            SLURM_JOB_ID=job_id,
            SLURM_JOB_NAME="crypto",
            SLURM_GPUS_ON_NODE="2",
            SLURM_CPUS_PER_TASK="32",
            SLURM_NTASKS="2",
            SLURM_RESTART_COUNT=str(restarts),
            SLURM_SUBMIT_DIR=str(submit_dir or tmp),
        )
        # sbatch runs a spooled copy of the script, from the directory it was submitted in
        self.spooled = tmp / "slurm_script"
        self.spooled.write_text(script.read_text())
        self.cwd = submit_dir or tmp

    def start(self, *args: str) -> subprocess.Popen:
        self.calls.unlink(missing_ok=True)
        return subprocess.Popen(
            ["bash", str(self.spooled), *args],
            cwd=self.cwd,
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def run(self, *args: str) -> int:
        return self.start(*args).wait(timeout=60)

    def log(self, suffix: str = "out") -> str:
        return (self.repo / "case_c_crypto" / "logs" / f"crypto_{self.job_id}.{suffix}").read_text()

    def recorded(self) -> str:
        return self.calls.read_text() if self.calls.exists() else ""

    def srun_pid(self) -> int:
        path = Path(f"{self.calls}.srun_pid")
        deadline = time.monotonic() + 30
        while not (path.exists() and path.read_text().strip()):
            assert time.monotonic() < deadline, "srun never started"
            time.sleep(0.05)
        return int(path.read_text())


def test_a_finished_job_logs_to_the_case_folder_and_passes_extra_arguments(repo, tmp_path):
    job = FakeJob(repo, tmp_path, "exit:0", job_id="101")
    assert job.run("--set", "training.epochs=5") == 0
    (srun,) = [line for line in job.recorded().splitlines() if line.startswith("srun ")]
    assert srun.startswith("srun --cpus-per-task=32 ") and srun.endswith(
        " -m common.cli train --config case_c_crypto/configs/crypto_prototype.json --num-gpus 2 --resume auto "
        "--set training.epochs=5"
    )
    assert "requeue" not in job.recorded()
    log = job.log()
    assert "job 101 (crypto)" in log and "restart 0" in log and "training exited with code 0" in log


def test_the_log_starts_with_the_plan_of_the_jobs_config_overrides_and_gpus(repo, tmp_path):
    job = FakeJob(repo, tmp_path, "exit:0", job_id="111")
    job.env.update(SLURM_GPUS_ON_NODE="4", SLURM_JOB_NUM_NODES="2")
    assert job.run("--set", "training.epochs=5", "--init-from", "runs/x", "--set=model.dropout=0") == 0
    plan, srun = job.recorded().splitlines()  # the plan first, on the batch host, then srun
    assert plan.endswith(
        " -m common.cli plan --config case_c_crypto/configs/crypto_prototype.json --set "
        "training.epochs=5 --set=model.dropout=0 --set slurm.nodes=2 --set slurm.gpus_per_node=4"
    )
    assert srun.startswith("srun ") and srun.endswith("--init-from runs/x --set=model.dropout=0")
    log = job.log().splitlines()
    assert "job 111 (crypto)" in log[0] and log[2].startswith("Plan: (fake) -m common.cli plan")
    assert "training exited with code 0" in log[-1]


def test_the_real_plan_runs_with_the_jobs_gpus(repo, tmp_path):
    job = FakeJob(repo, tmp_path, "exit:0", job_id="112", real_python=True)
    job.env.update(SLURM_GPUS_ON_NODE="1")  # the config says 2 GPUs per node: the job's count wins
    assert job.run("--set", "training.epochs=5") == 0
    log = job.log()
    assert "Plan: " in log and "time on 1x a100" in log and "for 5 epochs" in log
    assert log.index("Plan: ") < log.index("training exited with code 0")


def test_a_failed_plan_is_one_warning_and_the_job_trains(repo, tmp_path):
    job = FakeJob(repo, tmp_path, "exit:0", job_id="113")
    job.env["FAKE_PLAN"] = "fail:2"
    assert job.run() == 0
    assert [line.split()[0] for line in job.recorded().splitlines()] == ["python", "srun"]
    assert (
        "marketgpt: warning: `marketgpt plan` failed (exit 2; 124: over 5 minutes; its message is in the "
        ".err log); training goes on"
    ) in job.log()
    assert "marketgpt plan: error: fake failure" in job.log("err")


def test_a_requeued_job_does_not_plan_again(repo, tmp_path):
    job = FakeJob(repo, tmp_path, "exit:0", job_id="114", restarts=1)
    assert job.run() == 0
    assert [line.split()[0] for line in job.recorded().splitlines()] == ["srun"]
    assert "Plan: " not in job.log()


def test_exit_75_requeues_and_the_log_is_appended(repo, tmp_path):
    job = FakeJob(repo, tmp_path, f"exit:{EXIT_REQUEUE}", job_id="102")
    assert job.run() == 0
    assert "scontrol requeue 102" in job.recorded()
    again = FakeJob(repo, tmp_path / "second", "exit:0", job_id="102", restarts=1)
    assert again.run() == 0
    log = job.log()
    assert "restart 0" in log and "requeueing job 102" in log and "restart 1" in log  # one file, both runs
    assert log.index("restart 0") < log.index("restart 1")


def test_a_killed_rank_requeues_and_an_error_does_not(repo, tmp_path):
    # srun's 137: a task got SIGKILL (the OOM killer, its node, an operator), not an error in the run
    job = FakeJob(repo, tmp_path, "exit:137", job_id="109")
    assert job.run() == 0
    assert "scontrol requeue 109" in job.recorded()
    assert "a rank was killed (SIGKILL" in job.log() and "requeueing job 109" in job.log()
    failed = FakeJob(repo, tmp_path / "failed", "exit:1", job_id="110")
    assert failed.run() == 1 and "requeue" not in failed.recorded()


def test_usr2_to_the_batch_shell_reaches_the_tasks_and_the_job_requeues(repo, tmp_path):
    job = FakeJob(repo, tmp_path, "signal", job_id="103")
    proc = job.start()
    job.srun_pid()
    time.sleep(0.3)  # let the shell note srun's pid before the signal comes
    proc.send_signal(signal.SIGUSR2)  # #SBATCH --signal=B:USR2@600: only the batch shell gets it
    assert proc.wait(timeout=30) == 0
    assert "srun got USR2" in job.recorded() and "scontrol requeue 103" in job.recorded()
    assert "USR2 (time limit near or preemption)" in job.log()


def test_scancel_leaves_the_checkpoint_and_never_requeues(repo, tmp_path):
    job = FakeJob(repo, tmp_path, "signal", job_id="104")
    proc = job.start()
    srun = job.srun_pid()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)  # scancel: SIGTERM to the batch shell and to the steps
    os.kill(srun, signal.SIGTERM)
    assert proc.wait(timeout=30) == EXIT_REQUEUE
    assert "srun got TERM" in job.recorded() and "requeue" not in job.recorded()
    assert "submit the same script again to resume" in job.log()


def test_requeues_stop_at_the_cap(repo, tmp_path):
    job = FakeJob(repo, tmp_path, f"exit:{EXIT_REQUEUE}", job_id="105", restarts=DEFAULT_MAX_REQUEUES)
    assert job.run() == EXIT_REQUEUE
    assert "requeue" not in job.recorded()
    assert f"not requeued: already restarted {DEFAULT_MAX_REQUEUES} times" in job.log()
    below = FakeJob(repo, tmp_path / "below", f"exit:{EXIT_REQUEUE}", job_id="108", restarts=DEFAULT_MAX_REQUEUES - 1)
    assert below.run() == 0 and "scontrol requeue 108" in below.recorded()


def test_the_repo_is_found_from_the_submit_dir_when_scontrol_has_no_command(repo, tmp_path):
    scripts = repo / "case_c_crypto" / "slurm_scripts"
    job = FakeJob(repo, tmp_path, "exit:0", job_id="106", command="", submit_dir=scripts)
    assert job.run() == 0
    assert "job 106" in job.log()


def test_slurms_own_output_file_is_moved_into_the_err_log(repo, tmp_path):
    early = tmp_path / "slurm_crypto_107.out"
    early.write_text("slurmstepd: error: *** JOB 107 ON node1 CANCELLED ***\n")
    job = FakeJob(repo, tmp_path, "exit:0", job_id="107", stdout=early)
    assert job.run() == 0
    assert not early.exists()
    assert "JOB 107 ON node1 CANCELLED" in job.log("err")


def test_outside_slurm_the_script_says_to_use_sbatch(repo, tmp_path):
    script = repo / "case_c_crypto" / "slurm_scripts" / "train_crypto_a100.sh"
    proc = subprocess.run(["bash", str(script)], env=job_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "submit this script with sbatch" in proc.stderr
