"""common/slurm/cluster_env.sh, the one place to adapt to a cluster, reaches every way a job
starts: a variable exported there is seen by the tasks of an sbatch job (a case script) and of a
submitit job (the executor parameters `marketgpt submit` uses), on the local test cluster, in a
copy of the repo whose cluster_env.sh has one line added."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.distributed.scheduler import wait_for_jobs

from slurm_helpers import copy_repo, job_env

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:A test tried to use socket.socket"),
]

PROBE = "MARKETGPT_CLUSTER_ENV_PROBE"
TIMEOUT_S = 300

# In place of python for the sbatch job's tasks: records what each training task sees, trains
# nothing (the plan job.sh prints first, on the batch host, runs through it too: not recorded).
PROBE_PYTHON = f"""#!/bin/bash
case " $* " in
    *" train "*) echo "task ${{SLURM_PROCID:-?}}: ${{{PROBE}:-unset}}" >> "$(dirname "$0")/sbatch_probe.txt";;
esac
"""

SUBMITIT_JOB = f"""
import os, sys
import submitit
from common.config import load_config
from common.slurm.submit import executor_parameters

params = executor_parameters(load_config("case_c_crypto/configs/crypto_prototype.json").slurm)
params["time"] = 30  # minutes: the USR2 warning (10 min before the limit) must not come during the job
executor = submitit.SlurmExecutor(folder=sys.argv[1])
executor.update_parameters(**params)
job = executor.submit(os.system, 'echo "task $SLURM_PROCID: ${{{PROBE}:-unset}}" >> ' + sys.argv[2])
print(job.job_id)
"""


@pytest.fixture(scope="module")
def probes(slurm_cluster, tmp_path_factory) -> dict:
    """Both jobs submitted from a repo copy whose cluster_env.sh exports PROBE, and waited for:
    {"token", "sbatch": (job id, state, probe file), "submitit": (...)}."""
    root = tmp_path_factory.mktemp("cluster_env")
    repo = copy_repo(root / "repo")
    token = f"set-in-cluster-env-{os.getpid()}"
    env_file = repo / "common" / "slurm" / "cluster_env.sh"
    text = env_file.read_text()
    assert "# (your cluster's lines here)\n" in text
    env_file.write_text(text.replace("# (your cluster's lines here)\n", f"export {PROBE}={token}\n"))
    assert PROBE not in os.environ

    probe_python = root / "probe_python"
    probe_python.write_text(PROBE_PYTHON)
    probe_python.chmod(0o755)
    script = repo / "case_c_crypto" / "slurm_scripts" / "train_crypto_a100.sh"
    proc = subprocess.run(
        ["sbatch", "--parsable", "--time=5", str(script)],
        cwd=repo,
        env=job_env(MARKETGPT_PYTHON=str(probe_python)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    sbatch_id = proc.stdout.strip().split(";")[0]

    submitit_probe = root / "submitit_probe.txt"
    proc = subprocess.run(
        [sys.executable, "-c", SUBMITIT_JOB, str(root / "submitit"), str(submitit_probe)],
        cwd=repo,
        env=job_env(PYTHONPATH=str(repo)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    submitit_id = proc.stdout.split()[-1]

    states = wait_for_jobs([sbatch_id, submitit_id], timeout_s=TIMEOUT_S, poll_s=2.0)
    time.sleep(0.5)  # the last task's line lands on the shared file system
    return {
        "token": token,
        "repo": repo,
        "sbatch": (sbatch_id, states.get(sbatch_id), root / "sbatch_probe.txt"),
        "submitit": (submitit_id, states.get(submitit_id), submitit_probe),
    }


def _lines(path: Path) -> list[str]:
    return sorted(path.read_text().splitlines()) if path.exists() else []


def test_a_variable_exported_in_cluster_env_reaches_every_task_of_an_sbatch_job(probes):
    job_id, state, probe = probes["sbatch"]
    log = probes["repo"] / "case_c_crypto" / "logs" / f"crypto_{job_id}"
    logs = "".join(p.read_text() for p in log.parent.glob(f"{log.name}.*")) if log.parent.exists() else ""
    assert state == "COMPLETED", logs[-3000:]
    assert _lines(probe) == [f"task 0: {probes['token']}", f"task 1: {probes['token']}"], logs[-3000:]


def test_a_variable_exported_in_cluster_env_reaches_every_task_of_a_submitit_job(probes):
    job_id, state, probe = probes["submitit"]
    assert state == "COMPLETED"
    assert _lines(probe) == [f"task 0: {probes['token']}", f"task 1: {probes['token']}"]
