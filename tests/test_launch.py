"""launch_parallel_training.sh with fake sbatch/sinfo/squeue: checks, confirmation, --cases,
--dry-run, bad input before anything is submitted, and the monitoring script it writes.
tests/test_slurm_integration.py runs it against the real local Slurm."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_helpers import copy_repo, fake_bin, job_env

FAKE_SBATCH = """#!/bin/bash
echo "sbatch $*" >> "$FAKE_CALLS"
echo "$(( $(grep -c '^sbatch' "$FAKE_CALLS") + 500 ))"
"""
FAKE_SINFO = """#!/bin/bash
[ -n "${FAKE_SLURM_DOWN:-}" ] && { echo "sinfo: error: Unable to contact slurm controller" >&2; exit 1; }
part="" fmt=""
while [ $# -gt 0 ]; do case $1 in -p) part=$2; shift 2 ;; -o) fmt=$2; shift 2 ;; *) shift ;; esac; done
known=${FAKE_PARTITIONS:-long medium}
case $fmt in
    %R) printf '%s\\n' $known ;;
    %P) for p in ${part//,/ }; do [[ " $known " == *" $p "* ]] && echo "$p"; done ;;
    *) echo "PARTITION NODES NODELIST GRES"; echo "long* 2 node[1-2] gpu:a100:2" ;;
esac
"""
FAKE_SQUEUE = """#!/bin/bash
echo "squeue $*" >> "$FAKE_CALLS"
[[ " $* " == *" -h "* ]] || echo "JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)"
"""


@pytest.fixture
def launch(tmp_path):
    """Runs the copy's launch_parallel_training.sh with no terminal; returns (run, repo, calls)."""
    repo = copy_repo(tmp_path / "repo")
    calls = tmp_path / "calls.txt"
    calls.touch()
    bin_dir = fake_bin(tmp_path / "bin", sbatch=FAKE_SBATCH, sinfo=FAKE_SINFO, squeue=FAKE_SQUEUE)

    def run(*args: str, **env: str) -> subprocess.CompletedProcess:
        full_env = job_env(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_CALLS=str(calls), **env)
        return subprocess.run(
            ["bash", str(repo / "launch_parallel_training.sh"), *args],
            cwd=tmp_path,
            env=full_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run, repo, calls


def _submitted(calls: Path) -> list[str]:
    return [line for line in calls.read_text().splitlines() if line.startswith("sbatch")]


def test_without_a_terminal_and_without_y_nothing_is_submitted(launch):
    run, repo, calls = launch
    proc = run()
    assert proc.returncode == 1
    assert "No terminal to ask for confirmation and no -y: nothing submitted" in proc.stderr
    assert _submitted(calls) == [] and not (repo / "monitor_training.sh").exists()
    # it did check and show the cluster first
    assert "case_a_full_market/slurm_scripts/train_full_a100.sh" in proc.stdout
    assert "case_b_reduced/slurm_scripts/train_reduced_a100.sh" in proc.stdout
    assert "==> Cluster: sinfo -p long" in proc.stdout and "squeue -p long" in calls.read_text()


def test_dry_run_shows_the_default_cases_a_and_b(launch):
    run, _, calls = launch
    proc = run("--dry-run", "--set", "training.epochs=3")
    assert proc.returncode == 0, proc.stderr
    assert "Dry run: would submit 2 job(s):" in proc.stdout
    assert "sbatch case_a_full_market/slurm_scripts/train_full_a100.sh --set training.epochs=3" in proc.stdout
    assert "sbatch case_b_reduced/slurm_scripts/train_reduced_a100.sh --set training.epochs=3" in proc.stdout
    assert _submitted(calls) == []


def test_y_submits_the_chosen_cases_and_writes_a_monitoring_script(launch):
    run, repo, calls = launch
    proc = run("-y", "--cases", "b,c", "--set", "training.epochs=3")
    assert proc.returncode == 0, proc.stderr
    assert _submitted(calls) == [
        "sbatch --parsable case_b_reduced/slurm_scripts/train_reduced_a100.sh --set training.epochs=3",
        "sbatch --parsable case_c_crypto/slurm_scripts/train_crypto_a100.sh --set training.epochs=3",
    ]
    out = proc.stdout
    assert "Submitted case b: job 501" in out and "Submitted case c: job 502" in out
    assert "Jobs: 501,502" in out and "./monitor_training.sh" in out and "scancel 501 502" in out
    assert "tail -f case_b_reduced/logs/reduced_501.out" in out and "tail -f case_c_crypto/logs/crypto_502.out" in out
    monitor = subprocess.run(
        [str(repo / "monitor_training.sh")],
        cwd="/",
        env=job_env(PATH=f"{calls.parent / 'bin'}:{os.environ['PATH']}", FAKE_CALLS=str(calls)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert monitor.returncode == 0, monitor.stderr
    assert "jobs 501,502" in monitor.stdout and "squeue -t all -j 501,502" in calls.read_text()
    assert "No runs under case_*/checkpoints yet" in monitor.stdout  # `marketgpt status` of that repo
    assert "-- case_c_crypto/logs/crypto_502.out" in monitor.stdout and "(no log yet" in monitor.stdout
    if shutil.which("shellcheck"):  # tests/test_shellcheck.py fails under CI when it is missing
        checked = subprocess.run(
            ["shellcheck", "--external-sources", "monitor_training.sh"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert checked.returncode == 0, checked.stdout


@pytest.mark.parametrize(
    "args,env,message",
    [
        (["--cases", "a,x"], {}, "unknown case 'x' in --cases a,x (use a, b, c"),
        (
            ["--cases", "c", "--set", "training.epoch=3"],
            {},
            "unknown key 'training.epoch' (did you mean 'training.epochs'?)",
        ),
        (["--cases", "c"], {"FAKE_SLURM_DOWN": "1"}, "Slurm does not answer"),
        (
            ["--cases", "c"],
            {"FAKE_PARTITIONS": "short"},
            "partition 'long' does not exist on this cluster (partitions: short)",
        ),
        (["--frobnicate"], {}, "unknown option '--frobnicate'"),
    ],
    ids=["case typo", "unknown key", "no slurm", "no partition", "bad option"],
)
def test_bad_input_submits_nothing(launch, args, env, message):
    run, _, calls = launch
    proc = run("-y", *args, **env)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr
    assert _submitted(calls) == []


def test_a_missing_script_is_reported(launch):
    run, repo, calls = launch
    (repo / "case_b_reduced/slurm_scripts/train_reduced_a100.sh").unlink()
    proc = run("-y")
    assert proc.returncode == 2 and "missing case_b_reduced/slurm_scripts/train_reduced_a100.sh" in proc.stderr
    assert _submitted(calls) == []


def test_help_lists_the_options(launch):
    run, _, _ = launch
    proc = run("--help")
    assert proc.returncode == 0 and re.search(r"--cases a,b,c", proc.stdout) and "--dry-run" in proc.stdout
    assert "common/slurm/cluster_env.sh" in proc.stdout
    assert not re.search(r"^\s*set ", proc.stdout, flags=re.M), proc.stdout  # the script's `set -uo pipefail`
