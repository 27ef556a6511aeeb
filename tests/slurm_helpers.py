"""Shared by the Slurm-suite tests: a throwaway copy of the repo (jobs write their run folders
and logs into it, never into the working tree), the tiny-run overrides, the #SBATCH lines of
a case script, and fake `srun`/`scontrol`/`sbatch` commands for tests that need no cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from common.distributed.requeue import EXIT_REQUEUE

REPO = Path(__file__).resolve().parent.parent
CASES = {
    "a": ("case_a_full_market", "train_full_a100.sh", "full_market_config.json"),
    "b": ("case_b_reduced", "train_reduced_a100.sh", "reduced_config.json"),
    "c": ("case_c_crypto", "train_crypto_a100.sh", "crypto_prototype.json"),
}

# --set overrides that make any case tiny: the shipped sample (no network), a 2-layer model,
# no end-of-training scorecard (its fixed cost, ~10 s of imports, GARCH fits and a plot, is
# tested once in test_scorecard_cli.py, not in every job of these suites).
TINY = [
    "data.source=sample",
    "data.interval=1d",
    "model.vocab_size=64",
    "model.context_length=16",
    "model.d_model=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.asset_embed_dim=4",
    "model.category_embed_dim=4",
    "training.batch_size=16",
    "training.epochs=2",
    "training.max_steps_per_epoch=6",
    "training.eval_max_batches=4",
    "training.warmup_steps=2",
    "training.log_every_steps=3",
    "training.scorecard_origins=0",
    "training.vol_reversion=false",
    "training.device=cpu",  # the local Slurm cluster's GPUs are files: train on the CPU on purpose
]


def sets(overrides: Sequence[str]) -> list[str]:
    return [arg for kv in overrides for arg in ("--set", kv)]


def copy_repo(dst: Path) -> Path:
    """What a job needs from the repo (common/, the case folders, the launcher) under `dst`."""
    code = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "common", dst / "common", ignore=code)  # common/data included
    for case, _, _ in CASES.values():  # without the case's runs, logs and candle cache
        shutil.copytree(
            REPO / case,
            dst / case,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "checkpoints", "logs", "data"),
        )
    shutil.copy2(REPO / "launch_parallel_training.sh", dst / "launch_parallel_training.sh")
    return dst


def job_env(**extra: str) -> dict[str, str]:
    """The environment sbatch passes on to a job: this interpreter, one thread per rank, and
    the local cluster's SLURM_CONF (set by the slurm_cluster fixture) but no other SLURM_*."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SUBMITIT_", "MARKETGPT_"))
    }
    env.update({"MARKETGPT_PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra})
    return env


def sbatch_lines(script: Path) -> dict[str, Optional[str]]:
    """`#SBATCH --key=value` lines -> {key: value} (None for a flag), comments stripped."""
    out: dict[str, Optional[str]] = {}
    for line in script.read_text().splitlines():
        m = re.match(r"^#SBATCH\s+--([\w-]+)(?:=(\S+))?", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def shell_vars(script: Path) -> dict[str, str]:
    """Top-level `NAME=value` assignments of a case script (CASE, CONFIG, LOG_PREFIX)."""
    return dict(re.findall(r"^([A-Z_]+)=([^\s$(]+)$", script.read_text(), flags=re.M))


def run_dirs(repo: Path, case: str, experiment: str) -> list[Path]:
    return sorted((repo / case / "checkpoints").glob(f"{experiment}_*"))


def training_log(run_dir: Path) -> dict:
    return json.loads((run_dir / "training_log.json").read_text())


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")["model"]


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"{a} and {b} differ in {differ[:5]}"


def scontrol_field(job_id: str, field: str) -> Optional[str]:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60).stdout
    m = re.search(rf"\b{field}=(\S+)", out)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- fake Slurm commands

FAKE_SCONTROL = """#!/bin/bash
# fake scontrol: `show job ID` prints Command= and StdOut=; anything else is recorded
if [ "$1 $2" = "show job" ]; then
    [ -n "${FAKE_COMMAND:-}" ] && echo "   Command=$FAKE_COMMAND"
    [ -n "${FAKE_STDOUT:-}" ] && echo "   StdOut=$FAKE_STDOUT"
    exit 0
fi
echo "scontrol $*" >> "$FAKE_CALLS"
"""

FAKE_SRUN = """#!/bin/bash
# fake srun: records its arguments, then behaves as FAKE_SRUN says:
#   exit:N   exit with N          signal   wait for USR2 or TERM, then exit EXIT_REQUEUE (saved, stop)
echo "srun $*" >> "$FAKE_CALLS"
echo $$ > "$FAKE_CALLS.srun_pid"
case $FAKE_SRUN in
    exit:*) exit "${FAKE_SRUN#exit:}" ;;
    signal)
        trap 'echo "srun got USR2" >> "$FAKE_CALLS"; exit EXIT_REQUEUE' USR2
        trap 'echo "srun got TERM" >> "$FAKE_CALLS"; exit EXIT_REQUEUE' TERM
        for i in $(seq 1 300); do sleep 0.1; done
        exit 99 ;;
esac
""".replace("EXIT_REQUEUE", str(EXIT_REQUEUE))


FAKE_PYTHON = """#!/bin/bash
# fake python for job.sh's `marketgpt plan` (srun is fake too): records its arguments, then
# exits N for FAKE_PLAN=fail:N, else prints a plan line
echo "python $*" >> "$FAKE_CALLS"
case ${FAKE_PLAN:-ok} in
    fail:*) echo "marketgpt plan: error: fake failure" >&2; exit "${FAKE_PLAN#fail:}" ;;
esac
echo "Plan: (fake) $*"
"""


def fake_bin(folder: Path, **scripts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return folder
