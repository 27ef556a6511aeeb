"""Training speed on one GPU: cases A, B and C at batch 32 in the precision `auto` picks (bf16
on Ampere and newer), each without and with torch.compile.

    python bench/bench_gpu.py [--cases A,B,C] [--batch 32] [--steps 30] [--compile both|on|off]
                              [--no-max-batch] [--json PATH] [--device cuda|cpu] [--smoke]

Per case and compile setting:
- tokens/s of the training step as the Trainer does it (autocast, loss, backward, clipping,
  fused AdamW, zero_grad), timed over --steps steps after warm-up (the compile happens there)
  with torch.cuda.synchronize() around the timed block;
- MFU: model FLOPs per token (MarketGPT.flops_per_token) x tokens/s over the device's dense
  peak (common.training.mfu.KNOWN_PEAKS; none for an unknown card: set --peak-flops);
- peak memory (torch.cuda.max_memory_allocated) against the estimate of common.model.memory for one
  GPU (the target: within +-15%);
- without compile, the largest batch that fits: doubling from --batch until out of memory,
  then bisection (one step per try);
- with --profile DIR, a torch.profiler summary of 5 more steps per case and setting
  (DIR/profile_<case>_<eager|compile>.txt: the top kernels by device time), to find what holds
  MFU back (attention kernel, host syncs, optimizer, graph breaks).

It prints the table and writes JSON (--json, with the device name). Target (the issue's):
case A MFU >= 40% with compile on an A100 or H100. Without a GPU it stops with a note (run_all
skips it); --device cpu --smoke runs toy sizes on the CPU to check the command itself.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_args, blank_features, finish, machine_info, row  # noqa: E402

from common.config import Config, apply_overrides, load_config  # noqa: E402
from common.distributed.precision import CUDA_GRAPH_MODES, autocast, resolve_precision, use_tf32  # noqa: E402
from common.model.gpt import MarketGPT  # noqa: E402
from common.model.memory import estimate_training_memory  # noqa: E402
from common.model.sizing import meta_model  # noqa: E402
from common.paths import case_config, case_dir  # noqa: E402
from common.training.mfu import device_peak_flops  # noqa: E402

__all__ = ["build_model", "main", "open_device", "run_case", "time_steps"]

# --sdpa: one attention kernel forced, to compare with the one torch picks
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
SMOKE = [
    "model.d_model=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.vocab_size=64",
    "model.context_length=16",
    "model.asset_embed_dim=4",
    "model.category_embed_dim=4",
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(cfg: Config, device: torch.device) -> MarketGPT:
    """The case's MarketGPT on `device`, sized for its universe."""
    counts = cfg.data.universe_counts
    return MarketGPT(cfg.model, num_assets=sum(counts.values()) or 1, num_categories=len(counts) or 1).to(device)


def time_steps(step: Callable[[], None], device: torch.device, warmup: int, steps: int) -> tuple[float, float]:
    """Seconds of `warmup` steps (compiles, CUDA-graph recording) and of `steps` more, synchronized."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    _sync(device)
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return warmup_s, time.perf_counter() - t0


def _step_fn(
    cfg: Config,
    device: torch.device,
    batch: int,
    compile_model: bool,
    compile_mode: Optional[str] = None,
    sdpa: Optional[str] = None,
    wrap: Optional[Callable[[nn.Module], nn.Module]] = None,
):
    """One training step as the Trainer runs it, on random tokens; returns (step, model).
    `compile_mode` and `sdpa` (an attention backend: flash, cudnn, efficient, math) are for
    experiments; the Trainer uses torch.compile's default mode and lets torch pick the backend.
    `wrap` (e.g. DDP) wraps the model before the compile, as the Trainer does under DDP."""
    m, t = cfg.model, cfg.training
    model = build_model(cfg, device)
    precision = resolve_precision("auto", device)
    opt = model.configure_optimizer(t.weight_decay, t.learning_rate, (t.beta1, t.beta2), device.type)
    model.gradient_checkpointing = t.gradient_checkpointing
    wrapped = wrap(model) if wrap is not None else model
    forward = torch.compile(wrapped, mode=compile_mode) if compile_model else wrapped
    backend = (lambda: sdpa_kernel(SDPA_BACKENDS[sdpa])) if sdpa else contextlib.nullcontext
    x = torch.randint(4, m.vocab_size, (batch, m.context_length), device=device)
    ids = torch.zeros(batch, dtype=torch.long, device=device)
    blank = blank_features(m, batch, m.context_length)
    features = None if blank is None else torch.from_numpy(blank).to(device)

    graphs = compile_model and compile_mode in CUDA_GRAPH_MODES

    def step() -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()  # as the Trainer does
        with autocast(precision, device), backend():
            _, loss = forward(x, ids, ids, x, features=features)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.gradient_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model, precision


def _fits(cfg: Config, device: torch.device, batch: int) -> bool:
    try:
        step = _step_fn(cfg, device, batch, compile_model=False)[0]  # its closure holds the model
        step()
        _sync(device)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        step = None  # noqa: F841 (free the model before the next try)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def open_device(script: str, device: str, threads: Optional[int]) -> Optional[tuple[torch.device, str]]:
    """The device a GPU bench runs on ("cuda" or "cpu") and its name, with TF32 as training sets
    it; None, after a note, where torch sees no CUDA GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        print(f"{script}: no CUDA GPU visible to torch (run `marketgpt doctor`); nothing measured")
        return None
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    if threads:
        torch.set_num_threads(threads)
    use_tf32(dev)
    return dev, torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def largest_batch(cfg: Config, device: torch.device, start: int, limit: int) -> int:
    """The largest batch (up to `limit`) whose training step fits: doubling, then bisection."""
    lo, hi = 0, start
    while hi <= limit and _fits(cfg, device, hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(cfg, device, mid) else (lo, mid)
    return lo


def _profile(step, device: torch.device, path: Path, steps: int = 5) -> None:
    """The top operators by device time over `steps` steps, as a table in `path`."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=70) + "\n")


def run_case(
    cfg: Config,
    device: torch.device,
    batch: int,
    steps: int,
    warmup: int,
    compile_model: bool,
    peak_flops: Optional[float],
    profile_path: Optional[Path] = None,
    compile_mode: Optional[str] = None,
    sdpa: Optional[str] = None,
    wrap: Optional[Callable[[nn.Module], nn.Module]] = None,
) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step, model, precision = _step_fn(cfg, device, batch, compile_model, compile_mode, sdpa, wrap)
    warmup_s, seconds = time_steps(step, device, warmup, steps)
    tokens_per_sec = steps * batch * cfg.model.context_length / seconds
    fpt = model.flops_per_token()
    est = estimate_training_memory(
        cfg.model, model.num_parameters(), batch, precision, cfg.training.gradient_checkpointing, world_size=1
    )
    peak_mem = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    if profile_path is not None:
        _profile(step, device, profile_path)
    return {
        "batch": batch,
        "compile": compile_model,
        "precision": precision,
        "steps": steps,
        "warmup_seconds": warmup_s,
        "seconds": seconds,
        "tokens_per_sec": tokens_per_sec,
        "flops_per_token": fpt,
        "mfu": tokens_per_sec * fpt / peak_flops if peak_flops else None,
        "peak_memory_bytes": peak_mem,
        "estimate_bytes": est.total,
        "memory_over_estimate": peak_mem / est.total if peak_mem else None,
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--cases", default="A,B,C")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", choices=["both", "on", "off"], default="both")
    ap.add_argument("--no-max-batch", action="store_true", help="skip the largest-batch search")
    ap.add_argument("--max-batch-limit", type=int, default=4096)
    ap.add_argument("--peak-flops", type=float, default=None, help="the device's peak FLOP/s if not a known card")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--smoke", action="store_true", help="toy model sizes and 2 steps: checks the command only")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every case (e.g. model.dropout=0.0), for experiments",
    )
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    ap.add_argument(
        "--sdpa", choices=sorted(SDPA_BACKENDS), default=None, help="force one attention backend (default: torch picks)"
    )
    ap.add_argument("--profile", type=Path, default=None, help="folder for a torch.profiler summary per run")
    args = ap.parse_args(argv)
    opened = open_device("bench_gpu", args.device, args.threads)
    if opened is None:
        return 2
    device, name = opened
    peak = device_peak_flops(device, args.peak_flops)
    steps, warmup = (2, 1) if args.smoke else (args.steps, args.warmup)
    compiles = {"both": [False, True], "on": [True], "off": [False]}[args.compile]
    if device.type == "cpu":
        compiles = [False]  # the point of compile here is the GPU kernels

    rows, cases = [], {}
    for case in [c.strip().upper() for c in args.cases.split(",") if c.strip()]:
        cfg = load_config(case_config(case_dir(case)))
        if args.smoke:
            apply_overrides(cfg, SMOKE, "--smoke")
        apply_overrides(cfg, args.set, "--set")
        cases[case] = {"num_parameters": meta_model(cfg.model, cfg.data).num_parameters(), "runs": []}
        for compile_model in compiles:
            prof = (
                args.profile / f"profile_{case}_{'compile' if compile_model else 'eager'}.txt" if args.profile else None
            )
            r = run_case(
                cfg, device, args.batch, steps, warmup, compile_model, peak, prof, args.compile_mode, args.sdpa
            )
            cases[case]["runs"].append(r)
            label = f"case {case}, {r['precision']}, {'compile' if compile_model else 'eager'}"
            rows.append(
                row(
                    f"GPU training, {label}",
                    "tokens/s",
                    r["tokens_per_sec"],
                    "tok/s",
                    detail=f"batch {args.batch} x {cfg.model.context_length}, {name}",
                )
            )
            target = (
                ">= 0.40" if case == "A" and compile_model and peak and ("A100" in name or "H100" in name) else None
            )
            rows.append(
                row(
                    f"GPU training, {label}",
                    "MFU",
                    r["mfu"],
                    target=target,
                    detail=f"peak {peak / 1e12:g} TFLOP/s" if peak else "unknown peak: --peak-flops",
                )
            )
            if r["memory_over_estimate"] is not None:
                rows.append(
                    row(
                        f"GPU training, {label}",
                        "peak memory / estimate",
                        r["memory_over_estimate"],
                        detail=f"{r['peak_memory_bytes'] / 1e9:.2f} GB measured, "
                        f"{r['estimate_bytes'] / 1e9:.2f} GB estimated; target 0.85-1.15",
                    )
                )
        if not args.no_max_batch and device.type == "cuda":
            best = largest_batch(cfg, device, args.batch, args.max_batch_limit)
            cases[case]["largest_batch"] = best
            rows.append(
                row(
                    f"GPU training, case {case}",
                    "largest batch that fits",
                    best,
                    detail=f"eager, up to {args.max_batch_limit}",
                )
            )
    result = {
        "rows": rows,
        "figures": {
            "device": name,
            "peak_flops": peak,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "smoke": args.smoke,
            "cases": cases,
            "set": args.set,
            "compile_mode": args.compile_mode,
            "sdpa": args.sdpa,
            "machine": machine_info(),
        },
    }
    return finish("gpu", result, args.json)


if __name__ == "__main__":
    sys.exit(main())
