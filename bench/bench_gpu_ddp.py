"""CUDA graphs under DDP on one GPU: what compiled DDP and a whole-step graph cost or gain.

    python bench/bench_gpu_ddp.py [--cases C,B] [--batch 64] [--steps 30] [--warmup 5]
                                  [--variants a,b,c,d,e] [--json PATH] [--device cuda|cpu] [--smoke]

`choose_compile_mode` leaves CUDA graphs out under DDP because nobody measured them there. Per
case, tokens/s of the training step (bf16 autocast, loss, backward, clip, fused AdamW; the step
of bench_gpu.run_case) for:
  a  the bare model, torch.compile mode "default"
  b  the bare model, mode "reduce-overhead" (CUDA graphs: what one GPU trains with)
  c  the model in torch DDP at world size 1 over NCCL, compiled "default" (what DDP trains with)
  d  the same DDP model compiled "reduce-overhead" (torch's compiled DDP with CUDA graphs)
  e  one graph of the whole step: torch.compile(mode="reduce-overhead") of forward, backward,
     clip and AdamW(capturable=True).step()
World size 1 keeps DDP's bucketing and hooks but no traffic: the gap c-a is DDP's overhead, d-c
what CUDA graphs would buy DDP jobs. Each variant runs in its own try: one that fails records
a one-line reason and the rest still run. The JSON is rewritten after every variant, so a run
cut short by `timeout` keeps what it measured. --device cpu --smoke runs every variant's path
at toy size on the CPU (gloo, eager: compile is skipped there) to check the command itself.
"""

from __future__ import annotations

import gc
import json
import os
import shlex
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_args, blank_features, finish, machine_info, row  # noqa: E402

from common.config import Config, apply_overrides, load_config  # noqa: E402
from common.distributed.ddp import wrap_ddp  # noqa: E402
from common.distributed.precision import autocast, resolve_precision  # noqa: E402
from common.model.sizing import meta_model  # noqa: E402
from common.paths import case_config, case_dir  # noqa: E402
from common.training.mfu import device_peak_flops  # noqa: E402

from bench_gpu import SMOKE, build_model, open_device, run_case, time_steps  # noqa: E402

__all__ = ["VARIANTS", "main", "run_variant"]

# name -> (DDP-wrapped, compile mode, what it is)
VARIANTS: dict[str, tuple[bool, Optional[str], str]] = {
    "a": (False, "default", "bare model, compile default"),
    "b": (False, "reduce-overhead", "bare model, compile reduce-overhead (CUDA graphs)"),
    "c": (True, "default", "DDP world size 1, compile default"),
    "d": (True, "reduce-overhead", "DDP world size 1, compile reduce-overhead (compiled DDP + CUDA graphs)"),
    "e": (False, "reduce-overhead", "whole step (fwd+bwd+clip+AdamW capturable) in one reduce-overhead compile"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_group(device: torch.device) -> None:
    """A one-process group on a free loopback port (NCCL on CUDA, gloo on the CPU), once."""
    if dist.is_initialized():
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo binds the hostname's interface otherwise
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1, device_id=device if cuda else None)


def _ddp(device: torch.device) -> Callable[[nn.Module], nn.Module]:
    """DDP as MultiGPUWrapper builds it for several ranks, in a one-process group."""
    _ensure_group(device)
    return lambda model: wrap_ddp(model, device)


def _whole_step(cfg: Config, device: torch.device, batch: int, compile_on: bool) -> Callable[[], None]:
    """Variant e: forward, backward, clip and the optimizer step as one compiled function; the
    capturable AdamW keeps its step count on the device, so CUDA graphs can replay its update."""
    t, cuda = cfg.training, device.type == "cuda"
    model = build_model(cfg, device)
    model.gradient_checkpointing = t.gradient_checkpointing
    base = model.configure_optimizer(t.weight_decay, t.learning_rate, (t.beta1, t.beta2), device.type)
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in base.param_groups]
    # capturable is CUDA-only in AdamW; on the CPU this path only checks the code runs
    opt = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.beta1, t.beta2), fused=cuda, capturable=cuda)
    precision = resolve_precision("auto", device)
    params = list(model.parameters())
    x = torch.randint(4, cfg.model.vocab_size, (batch, cfg.model.context_length), device=device)
    ids = torch.zeros(batch, dtype=torch.long, device=device)
    blank = blank_features(cfg.model, batch, cfg.model.context_length)
    features = None if blank is None else torch.from_numpy(blank).to(device)

    def train_step() -> None:
        with autocast(precision, device):
            _, loss = model(x, ids, ids, x, features=features)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t.gradient_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    fn = torch.compile(train_step, mode="reduce-overhead") if compile_on else train_step

    def step() -> None:
        if compile_on:
            torch.compiler.cudagraph_mark_step_begin()
        fn()

    return step


def _dynamo_counts() -> dict[str, int]:
    """Graph breaks and graphs compiled since the last reset: is the step the one graph it should be?"""
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
    }


def _clean(device: torch.device) -> None:
    """Each variant starts from fresh compile caches and free memory."""
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def run_variant(
    name: str, cfg: Config, device: torch.device, batch: int, steps: int, warmup: int, peak: Optional[float]
) -> dict[str, Any]:
    """One variant's figures, or its failure as a one-line reason; never raises."""
    wrapped, mode, what = VARIANTS[name]
    cuda = device.type == "cuda"
    out: dict[str, Any] = {"variant": name, "what": what, "tokens_per_sec": None, "reason": None}
    out["note"] = None if cuda else "compile skipped on cpu (eager)"
    try:
        _clean(device)
        if name == "e":
            warmup_s, seconds = time_steps(_whole_step(cfg, device, batch, cuda), device, warmup, steps)
            out.update(warmup_seconds=warmup_s, seconds=seconds)
            out["tokens_per_sec"] = steps * batch * cfg.model.context_length / seconds
        else:
            wrap = _ddp(device) if wrapped else None
            r = run_case(cfg, device, batch, steps, warmup, cuda, peak, None, mode, None, wrap)
            keep = ("tokens_per_sec", "mfu", "warmup_seconds", "seconds", "peak_memory_bytes", "precision")
            out.update({k: r[k] for k in keep})
        out.update(_dynamo_counts())
    except Exception as e:  # noqa: BLE001 (any failure is a finding to record)
        first = (str(e).strip().splitlines() or [""])[0]
        out["reason"] = f"{type(e).__name__}: {first}"[:400]
        out["traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
        print(f"variant {name} failed: {out['reason']}", file=sys.stderr)
    finally:
        try:
            _clean(device)
        except Exception as e:  # noqa: BLE001 (a sticky CUDA error: later variants record theirs)
            out["cleanup_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def _versions(device: torch.device, name: str) -> dict[str, Any]:
    import torch._dynamo

    cuda = device.type == "cuda"
    return {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "capability": list(torch.cuda.get_device_capability(device)) if cuda else None,
        "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        # how dynamo splits a DDP model's graph at bucket boundaries ("ddp_optimizer" by default)
        "optimize_ddp": str(torch._dynamo.config.optimize_ddp),
    }


def _rows(cases: dict[str, Any], batch: int) -> list[dict[str, Any]]:
    rows = []
    for case, c in cases.items():
        base = {v["variant"]: v["tokens_per_sec"] for v in c["variants"]}
        for v in c["variants"]:
            ref = "a" if v["variant"] in "bcde" else None
            vs_a = v["tokens_per_sec"] / base["a"] if ref and v["tokens_per_sec"] and base.get("a") else None
            detail = v["reason"] or f"{v['what']}; batch {batch}" + (f"; {vs_a:.2f}x a" if vs_a else "")
            detail += f" [{v['note']}]" if v["note"] else ""
            rows.append(row(f"case {case}, {v['variant']}", "tokens/s", v["tokens_per_sec"], "tok/s", detail=detail))
    return rows


def _write(path: Optional[Path], result: dict[str, Any]) -> None:
    """The JSON so far: a run cut short by `timeout` keeps the variants it finished."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"name": "gpu_ddp", **result}, indent=2) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--cases", default="C,B")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="steps before timing (compile, CUDA-graph recording)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="which of a,b,c,d,e to run, in order")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--smoke", action="store_true", help="toy model sizes and 2 steps: checks the command only")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {','.join(VARIANTS)}")
    opened = open_device("bench_gpu_ddp", args.device, args.threads)
    if opened is None:
        return 2
    device, name = opened
    peak = device_peak_flops(device, None)
    steps, warmup = (2, 1) if args.smoke else (args.steps, args.warmup)
    cases: dict[str, Any] = {}
    result: dict[str, Any] = {"rows": [], "figures": {**_versions(device, name), "smoke": args.smoke, "cases": cases}}
    for case in [c.strip().upper() for c in args.cases.split(",") if c.strip()]:
        cfg = load_config(case_config(case_dir(case)))
        if args.smoke:
            apply_overrides(cfg, SMOKE, "--smoke")
        parameters = meta_model(cfg.model, cfg.data).num_parameters()
        cases[case] = {"num_parameters": parameters, "batch": args.batch, "variants": []}
        for v in variants:
            print(f"case {case}, variant {v}: {VARIANTS[v][2]}", flush=True)
            cases[case]["variants"].append(run_variant(v, cfg, device, args.batch, steps, warmup, peak))
            result["rows"] = _rows(cases, args.batch)
            _write(args.json, result)
    if dist.is_initialized():
        dist.destroy_process_group()
    result["figures"]["machine"] = machine_info()
    finish("gpu_ddp", result, None)
    _write(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
