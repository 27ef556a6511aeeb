"""Everything issue 12 asks of a GPU machine, in one command that writes its results to a folder.

    python tools/gpu_check.py --out gpu_out            # on a GPU node (a few minutes; bench_gpu most)
    python tools/gpu_check.py --out x --device cpu --tiny --skip-bench   # checks this script on a CPU

1. `marketgpt doctor` -> doctor.txt.
2. `bench/bench_gpu.py` (cases A, B, C; eager and compiled) -> bench_gpu.json, bench_gpu.txt.
3. Case C's config on the shipped daily sample with --num-gpus 1: stopped part-way through its
   second epoch, then `--resume auto` to the end -> train.log and the run folder. Checked:
   the run finished after one resume, its epoch losses equal an uninterrupted run's to bf16
   tolerance, training_log.json has mfu and gpus per epoch (on a GPU), and best_model.pt
   loads and forecasts on the CPU.
4. The first training steps on the device and on the CPU from the same seed, dropout off: the
   step losses must agree to bf16 tolerance (relative 2e-2) -> first_steps.json.
5. The run's full default scorecard on the device, timed (issue 14's speed, on a GPU).

summary.json holds every check (ok or the reason) and figure; the exit code is 0 when every
check passed. Each step runs even when an earlier one failed, so one call gathers everything.
--out gets at most 7 files: doctor.txt, bench_gpu.json, bench_gpu.txt, train.log,
training_log.json, scorecard.json and summary.json. Where one command may run 10 minutes at
most, run step 2 on its own (`python bench/bench_gpu.py --json OUT/bench_gpu.json`) and this
script with --skip-bench.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CASE_C = REPO / "case_c_crypto" / "configs" / "crypto_prototype.json"
SAMPLE = ['data.source="sample"', 'data.interval="1d"', "data.universe_counts={}"]
TINY = [
    "model.d_model=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.context_length=16",
    "model.vocab_size=64",
    "training.batch_size=8",
]
LOSS_TOLERANCE = 2e-2  # relative: bf16 autocast against fp32, first steps
_STEP_LOSS = re.compile(r"step (\d+)/\d+ \| loss ([0-9.]+)")


def _case(root: Path, name: str) -> Path:
    """A throwaway case folder with case C's config and universe; returns the config path."""
    case = root / name
    (case / "configs").mkdir(parents=True)
    shutil.copy(CASE_C.parent.parent / "universe.csv", case / "universe.csv")
    return Path(shutil.copy(CASE_C, case / "configs" / CASE_C.name))


def _run_of(config: Path) -> Path:
    """The one run folder a `_case` config trained."""
    (run,) = (config.parent.parent / "checkpoints").glob(f"{config.stem}_*")
    return run


def _train(config: Path, sets: list[str], log: io.StringIO, **kw: Any) -> int:
    from common.commands.train import run_training

    return run_training(config, sets, out=log, **kw)


def step_losses(text: str) -> list[float]:
    """The step losses a training log printed (`epoch 1/2 step 3/40 | loss 6.931 | ...`), in order."""
    return [float(m.group(2)) for m in _STEP_LOSS.finditer(text)]


def check_training(out: Path, device: str, sets: list[str], steps: int) -> dict[str, Any]:
    """Step 3: a run stopped in its second epoch, resumed, finished; its log and checkpoint."""
    from common.forecasting.forecaster import Forecaster

    config = _case(Path(tempfile.mkdtemp(prefix="gpu_check_")), "train")
    num_gpus = 1 if device == "cuda" else None
    log = io.StringIO()
    sets = sets + [
        f"training.device={device}",
        "training.epochs=2",
        f"training.max_steps_per_epoch={steps}",
        "training.log_every_steps=1",
        "training.scorecard_origins=5",
        "training.scorecard_samples=20",
    ]
    t0 = time.perf_counter()
    first = _train(config, sets, log, num_gpus=num_gpus, stop_after_steps=steps + steps // 2)
    second = _train(config, sets, log, num_gpus=num_gpus, resume="auto")
    seconds = time.perf_counter() - t0
    straight_config = _case(config.parent.parent.parent, "straight")
    straight_code = _train(straight_config, sets, io.StringIO(), num_gpus=num_gpus)
    (out / "train.log").write_text(log.getvalue())
    run = _run_of(config)
    shutil.copy(run / "training_log.json", out / "training_log.json")
    tlog = json.loads((run / "training_log.json").read_text())
    epochs = tlog["epochs"]
    problems = []
    if (first, second) != (0, 0) or tlog["status"] != "finished" or len(tlog.get("resumes", [])) != 1:
        problems.append(
            f"exit codes {first}, {second}; status {tlog['status']}; resumes {len(tlog.get('resumes', []))}"
        )
    if device == "cuda" and not all(e.get("mfu") and e.get("gpus") for e in epochs):
        problems.append("an epoch without mfu or gpus in training_log.json")
    # stopped and resumed against uninterrupted: equal to bf16 tolerance (GPU kernels need not be bit-exact)
    straight = json.loads((_run_of(straight_config) / "training_log.json").read_text())["epochs"]
    worst = max(
        (abs(a[k] - b[k]) / abs(b[k]) for a, b in zip(epochs, straight) for k in ("train_loss", "val_loss")),
        default=None,
    )
    if straight_code != 0 or len(straight) != len(epochs) or worst is None or worst > LOSS_TOLERANCE:
        problems.append(
            f"resumed run against uninterrupted: exit {straight_code}, epochs {len(epochs)} vs "
            f"{len(straight)}, worst relative loss difference {worst}"
        )
    fc = Forecaster.from_run(run, device="cpu")  # the GPU's checkpoint on the CPU
    (h,) = fc.load_history([fc.symbols[0]])
    fc.forecast([h], horizon=3, samples=4)
    return {
        "ok": not problems,
        "problems": problems,
        "seconds": seconds,
        "run": str(run),
        "resumed_vs_straight_max_relative_difference": worst,
        "straight_epochs": [{k: e.get(k) for k in ("epoch", "train_loss", "val_loss")} for e in straight],
        "precision": tlog.get("precision"),
        "epochs": [
            {k: e.get(k) for k in ("epoch", "train_loss", "val_loss", "tokens_per_sec", "mfu", "gpus")} for e in epochs
        ],
    }


def check_first_steps(device: str, sets: list[str], steps: int = 5) -> dict[str, Any]:
    """Step 4: the same seed's first step losses on the device and on the CPU (fp32), no dropout."""
    root = Path(tempfile.mkdtemp(prefix="gpu_check_first_"))
    common = sets + [
        "model.dropout=0",
        "training.epochs=1",
        f"training.max_steps_per_epoch={steps}",
        "training.log_every_steps=1",
        "training.scorecard_origins=0",
        "training.vol_reversion=false",
    ]
    losses = {}
    for name, extra in (
        ("device", [f"training.device={device}"]),
        ("cpu", ["training.device=cpu", "training.precision=fp32"]),
    ):
        log = io.StringIO()
        code = _train(
            _case(root, name), common + extra, log, num_gpus=1 if name == "device" and device == "cuda" else None
        )
        losses[name] = step_losses(log.getvalue()) if code == 0 else []
    pairs = list(zip(losses["device"], losses["cpu"]))
    worst = max((abs(a - b) / abs(b) for a, b in pairs), default=None)
    ok = len(pairs) == steps and worst is not None and worst <= LOSS_TOLERANCE
    return {"ok": ok, "losses": losses, "max_relative_difference": worst, "tolerance": LOSS_TOLERANCE}


def check_scorecard(out: Path, run: str, device: str) -> dict[str, Any]:
    """Step 5: the run's full default scorecard on the device, timed."""
    from common.cli import main

    t0 = time.perf_counter()
    code = main(["scorecard", run, "--device", device])
    card = json.loads((Path(run) / "scorecard.json").read_text()) if code == 0 else {}
    if code == 0:
        shutil.copy(Path(run) / "scorecard.json", out / "scorecard.json")
    return {
        "ok": code == 0,
        "seconds": time.perf_counter() - t0,
        "precision": card.get("precision"),
        "origins": card.get("horizons", {}).get("1", {}).get("n"),
    }


def _step(summary: dict, name: str, fn: Callable[[], dict[str, Any]]) -> None:
    t0 = time.perf_counter()
    try:
        summary[name] = fn()
    except Exception as e:  # noqa: BLE001 (one failure must not cost the other measurements)
        summary[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    summary[name]["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"== {name}: {'ok' if summary[name].get('ok') else 'FAILED'} ({summary[name]['wall_s']} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for every result (created)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--steps", type=int, default=40, help="training steps per epoch in step 3 (default 40)")
    ap.add_argument("--skip-bench", action="store_true", help="leave out bench_gpu.py (step 2)")
    ap.add_argument("--skip-scorecard", action="store_true", help="leave out the full scorecard (step 5)")
    ap.add_argument("--tiny", action="store_true", help="a toy model instead of case C's (to test this script)")
    args = ap.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    sets = SAMPLE + (TINY if args.tiny else [])
    summary: dict[str, Any] = {}

    def doctor() -> dict[str, Any]:
        from common.commands.doctor import run_doctor

        text = io.StringIO()
        code = run_doctor(text)
        (out / "doctor.txt").write_text(text.getvalue())
        return {"ok": code == 0 or args.device == "cpu", "exit_code": code, "report": text.getvalue().splitlines()}

    def bench() -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--json", str(out / "bench_gpu.json")],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        (out / "bench_gpu.txt").write_text(proc.stdout + proc.stderr)
        return {"ok": proc.returncode == 0, "exit_code": proc.returncode, "tail": proc.stdout[-2000:]}

    _step(summary, "doctor", doctor)
    if not args.skip_bench:
        _step(summary, "bench_gpu", bench)
    _step(summary, "training", lambda: check_training(out, args.device, sets, args.steps))
    _step(summary, "first_steps", lambda: check_first_steps(args.device, sets))
    if not args.skip_scorecard and summary["training"].get("run"):
        _step(summary, "scorecard", lambda: check_scorecard(out, summary["training"]["run"], args.device))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"Wrote {out / 'summary.json'}")
    return 0 if all(step.get("ok") for step in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
