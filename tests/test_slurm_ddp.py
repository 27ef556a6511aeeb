"""DDP under Slurm on the local test cluster (tools/local_slurm, two slurmd on this machine):
a 1-node x 2-task job and a 2-node x 2-task job (4 ranks) reach the weights and logged losses
of one process with the combined batch. Submitted with sbatch, waited on with `scontrol show
job` (no sacct here) under a timeout."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_helpers import GLOBAL_BATCH, REPO, assert_same_run, clean_env, make_case, reference, run_dirs

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")]

JOB_SCRIPT = Path(__file__).with_name("slurm_ddp_job.sh")
LAYOUTS = {"1 node x 2 tasks": (1, 2), "2 nodes x 2 tasks": (2, 2)}
_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}
TIMEOUT_S = 600


def _sbatch(root: Path, nodes: int, tasks: int) -> tuple[str, Path, Path]:
    """Submit one layout; returns (job id, config, log file)."""
    config = make_case(root)
    log = root / "slurm-%j.out"
    ranks = nodes * tasks
    cmd = ["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={tasks}", f"--output={log}",
           str(JOB_SCRIPT), "--set", f"training.batch_size={GLOBAL_BATCH // ranks}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env=clean_env(PYTHON=sys.executable, REPO=str(REPO), CONFIG=str(config)))
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    job_id = proc.stdout.strip().split(";")[0]
    return job_id, config, Path(str(log).replace("%j", job_id))


def _job_state(job_id: str) -> tuple[str, str]:
    """(JobState, ExitCode) from `scontrol show job` (it remembers a finished job for MinJobAge)."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60).stdout
    state, code = re.search(r"JobState=(\S+)", out), re.search(r"ExitCode=(\S+)", out)
    return (state.group(1) if state else "UNKNOWN"), (code.group(1) if code else "?")


@pytest.fixture(scope="module")
def finished_jobs(slurm_cluster, tmp_path_factory) -> dict:
    """Both layouts submitted at once and waited for: layout -> (state, exit code, config, log text)."""
    if slurm_cluster["nodes"] < 2:
        pytest.fail(f"the 2-node job needs 2 Slurm nodes, sinfo lists {slurm_cluster['nodes']}: "
                    "tools/local_slurm/local_slurm.sh start --nodes 2")
    jobs = {name: _sbatch(tmp_path_factory.mktemp(name.replace(" ", "")), *layout)
            for name, layout in LAYOUTS.items()}
    reference()  # computed while the jobs queue and run
    deadline = time.monotonic() + TIMEOUT_S
    states: dict[str, tuple[str, str]] = {}
    while len(states) < len(jobs):
        for name, (job_id, _, _) in jobs.items():
            if name not in states:
                state, code = _job_state(job_id)
                if state not in _ACTIVE:
                    states[name] = (state, code)
        if len(states) < len(jobs):
            if time.monotonic() > deadline:
                for name, (job_id, _, _) in jobs.items():
                    subprocess.run(["scancel", job_id], timeout=60)
                pytest.fail(f"jobs not finished within {TIMEOUT_S} s: "
                            f"{ {n: _job_state(j)[0] for n, (j, _, _) in jobs.items()} }")
            time.sleep(1)
    return {name: (*states[name], config, log.read_text() if log.exists() else "")
            for name, (_, config, log) in jobs.items()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_slurm_ddp_job_learns_what_one_process_with_the_combined_batch_learns(finished_jobs, layout):
    state, code, config, log = finished_jobs[layout]
    nodes, tasks = LAYOUTS[layout]
    assert (state, code) == ("COMPLETED", "0:0"), log[-4000:]
    assert f"DDP: {nodes * tasks} processes (gloo)" in log
    assert f"({GLOBAL_BATCH // (nodes * tasks)} per process x {nodes * tasks} processes x 2 accumulation)" in log
    assert log.count("Epoch 2/2") == 1  # rank 0 alone prints
    (run_dir,) = run_dirs(config)  # every rank trained the one folder rank 0 made
    train_log = json.loads((run_dir / "training_log.json").read_text())
    assert train_log["world_size"] == nodes * tasks and train_log["launcher"] == "slurm"
    assert (run_dir / "test_results.json").is_file()
    assert_same_run(run_dir, reference())
