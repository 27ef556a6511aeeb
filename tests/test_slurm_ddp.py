"""DDP under Slurm through the real case script, on the local test cluster (tools/local_slurm,
two slurmd on this machine): `sbatch case_c_crypto/slurm_scripts/train_crypto_a100.sh --set ...`
with `--nodes=2` as 2 nodes x 2 tasks (4 ranks), forced to requeue once mid-training (`scancel
--signal=USR2 --batch`: what the batch shell gets before the time limit). It must end with the
weights and logged losses of one process training the same global batch. One node x 2 tasks is
no other path: test_slurm_integration.py runs every case script so under Slurm, and
test_ddp.py checks 2 ranks against the same reference (on one node a rank's local id is its
global one, so 2 nodes is the layout that can tell them apart). Waits go through `scontrol
show job` (no sacct here), under a timeout."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.distributed.slurm import wait_for_jobs
from ddp_helpers import GLOBAL_BATCH, TINY, assert_same_run, final_weights, logged_epochs
from slurm_helpers import copy_repo, job_env, run_dirs, scontrol_field, sets, training_log

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")]

CASE = "case_c_crypto"
SCRIPT = f"{CASE}/slurm_scripts/train_crypto_a100.sh"
CONFIG = f"{CASE}/configs/crypto_prototype.json"
# ddp_helpers.TINY (no dropout, so ranks match one process) as --set overrides of case C's config
OVERRIDES = [f"{section}.{key}={value if isinstance(value, str) else json.dumps(value)}"
             for section in ("model", "training", "data") for key, value in TINY[section].items()
             ] + ["training.device=cpu"]  # the local cluster's GPUs are files
LAYOUTS = {"2 nodes x 2 tasks, requeued once": (2, 2)}
TASKS_PER_NODE = 2  # the case script's --ntasks-per-node
TIMEOUT_S = 600
EPOCHS, STEPS = TINY["training"]["epochs"], TINY["training"]["max_steps_per_epoch"]


def _env() -> dict[str, str]:
    return job_env(MARKETGPT_DIST_TIMEOUT="60")


def _experiment(layout: str) -> str:
    return "ddp_" + re.sub(r"\W+", "_", layout).strip("_")


def _sbatch(repo: Path, layout: str) -> str:
    nodes, tasks = LAYOUTS[layout]
    ranks = nodes * tasks
    overrides = [*OVERRIDES, f"training.batch_size={GLOBAL_BATCH // ranks}", f"experiment={_experiment(layout)}"]
    proc = subprocess.run(["sbatch", "--parsable", f"--nodes={nodes}", SCRIPT, *sets(overrides)], cwd=repo,
                          env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    return proc.stdout.strip().split(";")[0]


def _log(repo: Path, job_id: str) -> str:
    path = repo / CASE / "logs" / f"crypto_{job_id}.out"
    err = path.with_suffix(".err")
    return (path.read_text() if path.exists() else "") + (err.read_text()[-3000:] if err.exists() else "")


def _force_requeue(repo: Path, job_id: str, deadline: float) -> str:
    """USR2 to the batch shell once the job trains (a few steps into epoch 1); returns the log
    line that was there when it was sent."""
    step = re.compile(rf"epoch 1/{EPOCHS} step (\d+)/{STEPS}")
    while time.monotonic() < deadline:
        seen = [int(m) for m in step.findall(_log(repo, job_id))]
        if seen and max(seen) >= 3:
            proc = subprocess.run(["scancel", "--signal=USR2", "--batch", job_id], env=_env(), capture_output=True,
                                  text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
            return f"step {max(seen)}"
        time.sleep(0.1)
    pytest.fail(f"job {job_id} never reached step 3 of epoch 1:\n{_log(repo, job_id)[-3000:]}")


@pytest.fixture(scope="module")
def finished(slurm_cluster, tmp_path_factory) -> dict:
    """The 2-node job submitted from a repo copy and signalled once it trains, the reference
    trained meanwhile; then waited for."""
    if slurm_cluster["nodes"] < 2:
        pytest.fail(f"the 2-node job needs 2 Slurm nodes, sinfo lists {slurm_cluster['nodes']}: "
                    "tools/local_slurm/local_slurm.sh start --nodes 2")
    repo = copy_repo(tmp_path_factory.mktemp("ddp_repo"))
    deadline = time.monotonic() + TIMEOUT_S
    jobs = {layout: _sbatch(repo, layout) for layout in LAYOUTS}
    signalled_at = {layout: _force_requeue(repo, job_id, deadline) for layout, job_id in jobs.items()}

    # the reference: one process, the whole global batch, the same config, no Slurm
    proc = subprocess.run([sys.executable, "-m", "common.cli", "train", "--config", CONFIG,
                           *sets([*OVERRIDES, f"training.batch_size={GLOBAL_BATCH}", "experiment=reference"])],
                          cwd=repo, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (ref_dir,) = run_dirs(repo, CASE, "reference")

    states = wait_for_jobs(list(jobs.values()), timeout_s=max(1.0, deadline - time.monotonic()), poll_s=2.0)
    return {"repo": repo, "jobs": jobs, "states": states, "signalled_at": signalled_at,
            "reference": (final_weights(ref_dir), logged_epochs(ref_dir))}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_case_script_under_ddp_learns_what_one_process_with_the_global_batch_learns(finished, layout):
    repo, job_id = finished["repo"], finished["jobs"][layout]
    nodes, tasks = LAYOUTS[layout]
    ranks = nodes * tasks
    log = _log(repo, job_id)
    assert (finished["states"][job_id], scontrol_field(job_id, "ExitCode")) == ("COMPLETED", "0:0"), log[-4000:]
    assert f"DDP: {ranks} processes (gloo)" in log
    assert f"({GLOBAL_BATCH // ranks} per process x {ranks} processes x 2 accumulation)" in log
    (run_dir,) = run_dirs(repo, CASE, _experiment(layout))  # every rank trained the one folder rank 0 made
    train_log = training_log(run_dir)
    assert train_log["status"] == "finished" and train_log["world_size"] == ranks
    assert train_log["launcher"] == "slurm" and train_log["slurm_job_id"] == job_id
    assert (run_dir / "test_results.json").is_file()
    assert scontrol_field(job_id, "Restarts") == "1", log[-4000:]
    assert "USR2 (time limit near or preemption)" in log, finished["signalled_at"][layout]
    saved = re.search(r"Received SIGUSR2: saved (checkpoint_epoch_\d+_step_\d+\.pt)", log)
    assert saved and f"requeueing job {job_id}" in log and "restart 1 =====" in log, log[-4000:]
    assert f"Resuming {run_dir} from {saved.group(1)}" in log
    assert len(train_log["resumes"]) == 1
    assert log.count(f"Epoch {EPOCHS}/{EPOCHS}") == 1  # rank 0 alone prints, once
    assert_same_run(run_dir, finished["reference"])
