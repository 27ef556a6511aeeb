"""The real Trainer against bench_gpu's bare step, per case, on one GPU: is the loop free of host waits?

    python bench/bench_gpu_trainer.py [--cases C,B,A] [--steps 60] [--compile-mode auto] [--json PATH]
                                      [--device cuda|cpu] [--smoke]

Per case, in one process, on random tokens cut into windows on the device (the loader's GPU
path: the token tensor lives on the GPU and each batch is a gather):
1. bench: `bench_gpu.run_case` at the same batch and compile mode (the bare training step);
2. Trainer: `Trainer.train(stop_after_steps=...)` for --steps steps, its tokens/s from the
   epoch's own sums (warm-up and CUDA-graph recording steps excluded, as in training_log.json),
   with the step's sums read a step late (read_lag 1, the GPU default), then the same again
   reading each step at once (read_lag 0: the host waits for the device every step);
3. a torch.profiler window of 6 steady Trainer steps: the GPU's busy share, kernel time over
   the wall time of those steps (a host wait shows as idle GPU);
4. with --host-profile DIR, cProfile over 50 more steady steps (DIR/host_<case>.txt, by own
   time): where the host's time per step goes, when the GPU waits for it.
Target (issue 28): the Trainer within 3% of the bench (Trainer / bench >= 0.97).
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_args, bench_run, blank_features, finish, machine_info, row  # noqa: E402

from common.config import Config, apply_overrides, load_config  # noqa: E402
from common.distributed.precision import choose_compile_mode  # noqa: E402
from common.model.gpt import MarketGPT  # noqa: E402
from common.paths import case_config, case_dir  # noqa: E402
from common.training.batches import TokenWindows, build_windows  # noqa: E402
from common.training.mfu import device_peak_flops  # noqa: E402
from common.training.rng import seed_everything  # noqa: E402
from common.training.trainer import Trainer  # noqa: E402

from bench_gpu import SMOKE, open_device, run_case  # noqa: E402

__all__ = ["main", "trainer_rates"]

TARGET = 0.97


def _windows(cfg: Config, device: torch.device, steps: int) -> TokenWindows:
    """Random tokens of 8 assets, enough stride-1 windows for `steps` batches and more."""
    rng = np.random.default_rng(0)
    per_asset = (steps + 20) * cfg.training.batch_size // 8 + 2 * cfg.model.context_length + 64
    n = max(int(per_asset / 0.7), int(3 * (cfg.model.context_length + 1) / 0.15)) + 1  # val and test hold windows
    tokens = {f"S{i}": rng.integers(4, cfg.model.vocab_size, n) for i in range(8)}
    ranges = {
        s: {"train": (0, int(n * 0.7)), "val": (int(n * 0.7), int(n * 0.85)), "test": (int(n * 0.85), n)}
        for s in tokens
    }
    ids = {s: i for i, s in enumerate(tokens)}
    features = blank_features(cfg.model, n)
    return build_windows(
        tokens,
        ranges,
        ids,
        dict.fromkeys(ids, 0),
        cfg.model.context_length,
        strides={"train": 1, "val": cfg.model.context_length, "test": cfg.model.context_length},
        device=device,
        features=None if features is None else dict.fromkeys(ids, features),
    )


def _rate(tr: Trainer, t0_seen: float, t0_seconds: float) -> float:
    """tokens/s of the steps since the sums read (t0_seen, t0_seconds), as the epoch line computes it."""
    return (tr.sums.seen - t0_seen) * tr.world_size / max(tr.sums.seconds - t0_seconds, 1e-9)


@contextlib.contextmanager
def _no_checkpoint(tr: Trainer) -> Iterator[None]:
    """The checkpoint `stop_after_steps` writes is no training step: leave it out while measuring."""
    save, tr._save = tr._save, lambda name: None
    try:
        yield
    finally:
        tr._save = save


def _busy_share(tr: Trainer, steps: int, device: torch.device) -> Optional[float]:
    """Kernel time over wall time across `steps` more Trainer steps under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    with _no_checkpoint(tr), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        tr.train(stop_after_steps=tr.global_step + steps)
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    kernels = (
        sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
        / 1e6
    )
    return kernels / wall


def _syncs(tr: Trainer, steps: int, device: torch.device) -> Optional[dict[str, Any]]:
    """Synchronizing CUDA calls in `steps` more Trainer steps (torch.cuda.set_sync_debug_mode),
    each with the Python lines that made it: a steady step should make none."""
    import traceback
    import warnings

    if device.type != "cuda":
        return None
    found: list[str] = []

    def record(message: Warning | str, *args: Any, **kwargs: Any) -> None:  # the message and our frames
        frames = [
            f"{Path(f.filename).name}:{f.lineno}"
            for f in reversed(traceback.extract_stack(limit=14)[:-1])
            if "/common/" in f.filename
        ]
        found.append(f"{message}".splitlines()[0][:120] + " | " + " <- ".join(frames))

    with _no_checkpoint(tr), warnings.catch_warnings():  # restores showwarning after
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            tr.train(stop_after_steps=tr.global_step + steps)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return {"steps": steps, "count": len(found), "first": found[:8]}


def _host_profile(tr: Trainer, steps: int, path: Path) -> None:
    """cProfile of `steps` more Trainer steps, the top functions by own time, in `path`."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    with _no_checkpoint(tr):
        prof.runcall(tr.train, stop_after_steps=tr.global_step + steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    text.write(f"{steps} Trainer steps\n")
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)  # where the host's time goes
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(20)  # and through which calls
    path.write_text(text.getvalue())


def trainer_rates(
    cfg: Config, device: torch.device, steps: int, run_dir: Path, host_profile: Optional[Path] = None
) -> dict[str, Any]:
    """The Trainer's tokens/s reading a step late and at once, and the GPU's busy share."""
    counts = cfg.data.universe_counts
    seed_everything(cfg.training.seed)
    model = MarketGPT(cfg.model, num_assets=sum(counts.values()) or 1, num_categories=len(counts) or 1)
    windows = _windows(cfg, device, 3 * steps + 80)
    out = io.StringIO()
    run = bench_run(run_dir, cfg, sum(counts.values()) or 1)
    tr = Trainer(cfg.training, model, windows, run, device=device, out=out, tensorboard=False)
    t0 = time.perf_counter()
    assert tr.train(stop_after_steps=steps) == "stopped", out.getvalue()[-2000:]
    first_s = time.perf_counter() - t0
    late = _rate(tr, 0, 0)
    seen, seconds = tr.sums.seen, tr.sums.seconds
    tr.read_lag = 0
    tr.train(stop_after_steps=2 * steps)
    at_once = _rate(tr, seen, seconds)
    tr.read_lag = 1
    busy = syncs = None
    try:  # the rates above matter most: a failure here costs only these two figures
        busy = _busy_share(tr, 6, device)
        syncs = _syncs(tr, 4, device)
        if host_profile is not None:
            _host_profile(tr, 50, host_profile)
    except Exception as e:  # noqa: BLE001
        print(f"profile or sync count failed: {traceback.format_exc()[-2000:]}", flush=True)
        syncs = {"count": None, "first": [f"{type(e).__name__}: {e}"]}
    return {
        "tokens_per_sec": late,
        "tokens_per_sec_read_at_once": at_once,
        "gpu_busy_share": busy,
        "syncs": syncs,
        "first_segment_seconds": first_s,
        "compile_mode": tr.step.compile_mode if tr.step.compiled else None,
        "cuda_graphs": tr.step.cuda_graphs,
        "banner": [line for line in out.getvalue().splitlines()[:8]],
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--cases", default="C,B,A")
    ap.add_argument("--steps", type=int, default=60, help="Trainer steps per measurement (default 60)")
    ap.add_argument("--bench-steps", type=int, default=30)
    ap.add_argument("--compile-mode", default="auto", help="training.compile_mode for both (default auto)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--smoke", action="store_true", help="toy model sizes and 3 steps: checks the command only")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every case")
    ap.add_argument(
        "--host-profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="cProfile 50 more steps per case into DIR/host_<case>.txt",
    )
    args = ap.parse_args(argv)
    opened = open_device("bench_gpu_trainer", args.device, args.threads)
    if opened is None:
        return 2
    device, name = opened
    peak = device_peak_flops(device, None)
    steps = 3 if args.smoke else args.steps
    mode, _ = choose_compile_mode(args.compile_mode, 1, False)
    compiled = device.type == "cuda"
    rows, cases = [], {}
    for case in [c.strip().upper() for c in args.cases.split(",") if c.strip()]:
        cfg = load_config(case_config(case_dir(case)))
        apply_overrides(
            cfg,
            (SMOKE if args.smoke else [])
            + args.set
            + [
                "training.compile=true",
                f'training.compile_mode="{args.compile_mode}"',
                "training.log_every_steps=1000000",
                "training.checkpoint_every_minutes=1000000",
                "training.keep_checkpoints=1",
            ],
            "--set",
        )
        try:
            bench = run_case(
                cfg,
                device,
                cfg.training.batch_size,
                2 if args.smoke else args.bench_steps,
                1 if args.smoke else 5,
                compiled,
                peak,
                compile_mode=mode,
            )
            with tempfile.TemporaryDirectory(prefix="bench_gpu_trainer_") as tmp:
                tr = trainer_rates(
                    cfg, device, steps, Path(tmp), args.host_profile / f"host_{case}.txt" if args.host_profile else None
                )
        except Exception as e:  # noqa: BLE001 (one case's failure must not cost the others' figures)
            cases[case] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            print(f"case {case} failed: {cases[case]['traceback']}", flush=True)
            continue
        ratio = tr["tokens_per_sec"] / bench["tokens_per_sec"]
        cases[case] = {"bench": bench, "trainer": tr, "trainer_over_bench": ratio}
        label = f"case {case}, batch {cfg.training.batch_size}, mode {mode if compiled else 'eager'}"
        detail = f"{name}; bench {bench['tokens_per_sec']:,.0f} tok/s"
        rows.append(
            row(
                f"Trainer vs bench, {label}",
                "Trainer / bench",
                ratio,
                target=f">= {TARGET}",
                detail=detail + f"; Trainer {tr['tokens_per_sec']:,.0f} tok/s",
            )
        )
        rows.append(
            row(
                f"Trainer vs bench, {label}",
                "read at once / bench",
                tr["tokens_per_sec_read_at_once"] / bench["tokens_per_sec"],
                detail="the host waiting for each step's sums (read_lag 0)",
            )
        )
        if tr["gpu_busy_share"] is not None:
            rows.append(
                row(
                    f"Trainer vs bench, {label}",
                    "GPU busy share",
                    tr["gpu_busy_share"],
                    detail="kernel time / wall time over 6 steady steps (torch.profiler)",
                )
            )
        if tr["syncs"] is not None and tr["syncs"]["count"] is not None:
            rows.append(
                row(
                    f"Trainer vs bench, {label}",
                    "synchronizing calls in 4 steps",
                    tr["syncs"]["count"],
                    detail="torch.cuda.set_sync_debug_mode; the first: "
                    + ("; ".join(tr["syncs"]["first"][:2]) or "none"),
                )
            )
    result = {
        "rows": rows,
        "figures": {
            "device": name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "compile_mode": args.compile_mode,
            "steps": steps,
            "cases": cases,
            "smoke": args.smoke,
            "set": args.set,
            "machine": machine_info(),
        },
    }
    return finish("gpu_trainer", result, args.json)


if __name__ == "__main__":
    sys.exit(main())
