"""Shared by test_ddp.py and the tests that train under DDP: the tiny DDP run, its one-process reference,
starting ranks the way torchrun does, and comparing runs.

Run as a script (`python tests/ddp_helpers.py fault RANK STEP [--stuck] -- <marketgpt train args>`),
it is `marketgpt train` with an error injected on one rank at one step, for the failure tests.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional, Sequence

import torch

REPO = Path(__file__).resolve().parent.parent

# dropout 0: ranks draw different dropout masks than one process would, so only a run without
# dropout can match the one-process reference. 2 x 40 optimizer steps of 2 micro-batches each.
TINY = {
    "experiment": "ddp",
    "model": {
        "vocab_size": 64,
        "context_length": 16,
        "d_model": 32,
        "num_layers": 2,
        "num_heads": 2,
        "d_ff": 64,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
        "dropout": 0.0,
    },
    "training": {
        "batch_size": 16,
        "grad_accum_steps": 2,
        "epochs": 2,
        "max_steps_per_epoch": 40,
        "eval_max_batches": 3,
        "warmup_steps": 4,
        "learning_rate": 1e-3,
        "log_every_steps": 1,
        "device": "cpu",
        "scorecard_origins": 0,  # the scorecard: test_scorecard_cli.py
        "vol_reversion": False,
    },
    "data": {"source": "sample", "interval": "1d"},
}
GLOBAL_BATCH = TINY["training"]["batch_size"]  # one process's batch; N ranks take GLOBAL_BATCH / N each
STEPS = TINY["training"]["epochs"] * TINY["training"]["max_steps_per_epoch"]


def make_case(root: Path, name: str = "case", **training) -> Path:
    """A case folder with configs/ddp.json (TINY, `training` merged in); returns the config path."""
    raw = json.loads(json.dumps(TINY))
    raw["training"].update(training)
    path = root / name / "configs" / "ddp.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(raw))
    return path


def run_dirs(config: Path) -> list[Path]:
    return sorted((config.parent.parent / "checkpoints").glob("ddp_*"))


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    name = f"checkpoint_epoch_{TINY['training']['epochs']}.pt"
    return torch.load(run_dir / name, weights_only=True)["model"]


def logged_epochs(run_dir: Path) -> list[dict]:
    log = json.loads((run_dir / "training_log.json").read_text())
    return [{k: e[k] for k in ("epoch", "train_loss", "train_acc", "val_loss", "val_acc")} for e in log["epochs"]]


def max_weight_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def assert_same_run(run_dir: Path, reference: tuple[dict, list], atol: float = 2e-5) -> None:
    """Weights within float tolerance of the reference, and the same logged global numbers."""
    weights, epochs = reference
    diff = max_weight_difference(final_weights(run_dir), weights)
    assert diff < atol, f"weights differ from the one-process reference by up to {diff:.3g}"
    got = logged_epochs(run_dir)
    assert [e["epoch"] for e in got] == [e["epoch"] for e in epochs]
    for mine, ref in zip(got, epochs):
        for key in ("train_loss", "val_loss"):
            assert abs(mine[key] - ref[key]) < 1e-5 * abs(ref[key]), (key, mine, ref)
        for key in ("train_acc", "val_acc"):  # exact counts, unless an argmax tie flips
            assert abs(mine[key] - ref[key]) < 1e-3, (key, mine, ref)


@functools.lru_cache(maxsize=None)
def reference(batch_size: int = GLOBAL_BATCH) -> tuple[dict, list]:
    """One process with the combined batch (GLOBAL_BATCH): final weights and logged epochs."""
    root = tempfile.mkdtemp(prefix="ddp_reference_")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    config = make_case(Path(root), batch_size=batch_size)
    run([sys.executable, "-m", "common.cli", "train", "--config", str(config)], expect=0)
    (run_dir,) = run_dirs(config)
    return final_weights(run_dir), logged_epochs(run_dir)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a launched rank: no launcher variables inherited from this one."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in launcher and not k.startswith(("SLURM_", "TORCHELASTIC_", "SUBMITIT_"))
    }
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MARKETGPT_DIST_TIMEOUT": "60", **extra})
    return env


def run(cmd: Sequence[str], expect: Optional[int] = None, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    if expect is not None:
        assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(n: int, command: Sequence[str], **extra_env: str) -> list[subprocess.Popen]:
    """Start `n` ranks of `command` with torchrun's environment protocol (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT) on a free loopback port; stdout/stderr are pipes."""
    port = str(free_port())
    return [
        subprocess.Popen(
            list(command),
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_env(
                RANK=str(r),
                WORLD_SIZE=str(n),
                LOCAL_RANK=str(r),
                LOCAL_WORLD_SIZE=str(n),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                **extra_env,
            ),
        )
        for r in range(n)
    ]


def train_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "common.cli", "train", *map(str, args)]


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    """Read `proc`'s stdout until a line containing `needle` (killing it after `timeout` s);
    returns the lines read."""
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if needle in line:
                return lines
    finally:
        timer.cancel()
    raise AssertionError(f"no line with {needle!r}:\n{''.join(lines)[-3000:]}\n{proc.stderr.read()[-3000:]}")


def _fault_main(argv: list[str]) -> int:
    """`marketgpt train` where rank RANK raises a RuntimeError after optimizer step STEP. With
    --stuck, the other ranks then block at that step outside any collective, as a rank waiting
    on an NCCL kernel does (no error ever reaches it)."""
    stuck = "--stuck" in argv
    argv = [a for a in argv if a != "--stuck"]
    rank, step, args = int(argv[0]), int(argv[1]), argv[2:]
    from common.cli import main
    from common.training import trainer

    mine = int(os.environ.get("RANK", 0)) == rank
    if mine or stuck:
        real = trainer.Trainer._step_boundary

        def step_boundary(self, *a, **kw):
            if self.global_step == step:
                if mine:
                    raise RuntimeError(f"injected fault on rank {rank} at step {step}")
                threading.Event().wait()  # forever
            return real(self, *a, **kw)

        trainer.Trainer._step_boundary = step_boundary
    return main(["train", *args])


if __name__ == "__main__":
    assert sys.argv[1] == "fault", "usage: ddp_helpers.py fault RANK STEP [--stuck] -- ARGS"
    rest = sys.argv[2:]
    sys.exit(_fault_main([a for a in rest if a != "--"]))
