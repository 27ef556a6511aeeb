"""`marketgpt plan --config CFG`: what a config will do, before the queue wait.

Candles (= tokens) per split, exact or estimated (common/commands/plan_data.py). Then parameters, unique
training tokens per parameter, windows, steps and tokens per epoch, how often each candle is
seen, time per epoch and per run on the job's GPUs and on a CPU, peak GPU memory, and warnings
(common/commands/plan_figures.py holds the arithmetic and the text).

Time comes from measured training rates: compiled bf16 tokens/s of one H200 per case shape,
scaled to other GPUs by their dense bf16 peak, and to other shapes by training FLOPs per token.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence, TextIO

from common.commands.plan_data import data_figures
from common.commands.plan_figures import (
    MIN_TOKENS_PER_PARAMETER,
    DataFigures,
    Plan,
    Rate,
    format_plan,
    steps_per_epoch,
)
from common.config import Config, load_config
from common.data.prepare import SPLITS
from common.distributed.precision import CUDA_GRAPH_MODES, choose_compile_mode
from common.errors import UserError
from common.model.memory import estimate_training_memory
from common.model.scaling_fit import ScalingFit, load_size_fit, size_advice
from common.model.sizing import meta_model
from common.paths import case_dir_of_config
from common.slurm.requeue import MAX_REQUEUES
from common.slurm.scheduler import parse_slurm_time
from common.training.mfu import known_peak

__all__ = [
    "CPU_MODEL_FLOPS",
    "GPU_RATES",
    "build_plan",
    "gpu_rate",
    "plan_of_run",
    "run_plan",
    "scaling_suggestion",
]

# Compiled bf16 training tokens/s of one NVIDIA H200 at batch 32, measured 2026-11-26
# (bench/results/2026-11-26-h200/). (d_model, num_layers, context_length) -> (tokens/s with plain
# torch.compile, as every rank of a DDP job compiles: bench_gpu_default.json, the bare step;
# tokens/s with CUDA graphs, training.compile_mode=auto on one GPU: the Trainer itself,
# bench_gpu_trainer.json; training FLOPs per token of that case's model, MarketGPT.flops_per_token).
# Case C's Trainer rate: the median of three runs of the lighter step (bench/results/2026-11-26-h200-host/).
GPU_RATES: dict[tuple[int, int, int], tuple[float, float, int]] = {
    (768, 12, 512): (655_501.0, 644_408.0, 585_662_976),  # case A: compute-bound, graphs add nothing
    (512, 8, 256): (608_876.0, 1_555_007.0, 170_068_992),  # case B
    (256, 6, 128): (646_228.0, 1_326_959.0, 32_300_544),  # case C: host-bound either way
}
RATES_DEVICE, RATES_DATE = "H200", "2026-11-26"
RATES_PEAK = 989.5e12  # the H200's dense bf16 FLOP/s, the H100 SXM's too (common/training/mfu.py)
# Model FLOP/s of fp32 training on the CPU: case C's shape on the 2-core development VM
# (docs/performance.md, "Hardware utilization, case C": 181 GFLOP/s). Rough: scales with cores.
CPU_MODEL_FLOPS = 181e9

# model shapes tried for "a shape the data supports": (d_model, num_layers)
_SHAPES = ((512, 8), (384, 6), (256, 6), (256, 4), (128, 4), (128, 2), (64, 2), (32, 1))


def run_plan(
    config: Path, overrides: Sequence[str] = (), out: Optional[TextIO] = None, fit: Optional[Path] = None
) -> int:
    """The `marketgpt plan` command: the plan's lines on `out`, then the size line of the user's
    scaling fit `fit` (a sweep.json); 0 (UserError for a bad config or a fit of another corpus)."""
    cfg = load_config(config, overrides)
    if fit is None and cfg.model.size_fit:
        fit = Path(cfg.model.size_fit)
    size_fit = load_size_fit(fit, cfg) if fit is not None else None  # refused before the data is read
    plan = build_plan(cfg, data_figures(cfg, case_dir_of_config(config)))
    print(format_plan(plan), file=out or sys.stdout)  # looked up now: a redirected stdout counts
    print(scaling_suggestion(cfg, plan, size_fit, fit), file=out or sys.stdout)
    return 0


def scaling_suggestion(cfg: Config, plan: Plan, fit: Optional[ScalingFit], path: Optional[Path] = None) -> str:
    """One line: the shape the user's scaling fit (common/model/scaling_fit.py) suggests for the
    plan's training candles beside the config's, that it gives no advice, or that there is no fit."""
    if fit is None:
        return (
            "Model size: no scaling fit for this corpus; measure one with `marketgpt sweep --config CFG` "
            "(docs/scaling.md), then `marketgpt plan --config CFG --fit SWEEP/sweep.json`"
        )
    d = plan.data
    advice = size_advice(
        cfg,
        d.candles["train"],
        fit,
        d.assets or None,
        d.categories or None,
        min_tokens_per_parameter=MIN_TOKENS_PER_PARAMETER,
    )
    if advice["shape"] is None:
        return f"Model size ({path}): {advice['text']}"
    return (
        f"Model size ({path}): {advice['text']}; this config: {plan.parameters:,} parameters; "
        f"--set model.size=auto --set model.size_fit={path} trains that shape"
    )


def build_plan(
    cfg: Config,
    data: DataFigures,
    *,
    parameters: Optional[int] = None,
    flops_per_token: Optional[int] = None,
    steps: Optional[int] = None,
    world_size: Optional[int] = None,
) -> Plan:
    """The plan of `cfg` on `data`; parameters, FLOPs per token, steps per epoch and processes
    default to the config's model on its universe and the job's GPUs (slurm.nodes x gpus_per_node)."""
    t, s = cfg.training, cfg.slurm
    gpus = world_size or s.nodes * s.gpus_per_node
    if parameters is None or flops_per_token is None:
        model = meta_model(cfg, num_assets=data.assets or None, num_categories=data.categories or None)
        parameters, flops_per_token = model.num_parameters(), model.flops_per_token()
    if steps is None:
        steps = steps_per_epoch(data.epoch_windows, t.batch_size, gpus, t.grad_accum_steps, t.max_steps_per_epoch)
    precision = "bf16" if t.precision == "auto" else t.precision
    memory = estimate_training_memory(cfg.model, parameters, t.batch_size, precision, t.gradient_checkpointing, gpus)
    plan = Plan(
        data=data,
        parameters=parameters,
        context_length=cfg.model.context_length,
        epochs=t.epochs,
        steps_per_epoch=steps,
        global_batch=t.batch_size * gpus * t.grad_accum_steps,
        epoch_stride=cfg.data.epoch_stride,
        gpus=gpus,
        gpu_type=s.gpu_type,
        gpu_rate=gpu_rate(cfg, flops_per_token, gpus),
        cpu_rate=cpu_rate(flops_per_token),
        memory_gb=memory.total / 1e9,
        slurm_time_s=parse_slurm_time(s.time) * 60,
        max_requeues=MAX_REQUEUES,
        one_gpu_rate=gpu_rate(cfg, flops_per_token, 1) if gpus > 1 else None,
    )
    if plan.tokens_per_parameter < MIN_TOKENS_PER_PARAMETER:
        plan.suggestions = _supported_shapes(cfg, data)
    return plan


def plan_of_run(
    cfg: Config,
    ranges: Mapping[str, Mapping[str, Sequence[int]]],
    *,
    train_windows: int,
    epoch_windows: int,
    parameters: int,
    flops_per_token: int,
    steps: int,
    world_size: int,
) -> str:
    """The short plan a starting training run prints, from its own data, windows and model."""
    candles = {split: sum(int(r[split][1]) - int(r[split][0]) for r in ranges.values()) for split in SPLITS}
    data = DataFigures(candles, train_windows, epoch_windows, basis="exact (this run)", assets=len(ranges))
    try:
        plan = build_plan(
            cfg, data, parameters=parameters, flops_per_token=flops_per_token, steps=steps, world_size=world_size
        )
    except UserError as e:  # e.g. a slurm.time that is no Slurm time: the run trains all the same
        return f"Plan: not available ({e})"
    return format_plan(plan, short=True)


# --------------------------------------------------------------------------- rates


def gpu_rate(cfg: Config, flops_per_token: int, gpus: int = 1) -> Optional[Rate]:
    """Training tokens/s of one of the job's `gpus` GPUs: the measurement of this shape (or of
    the nearest shape, scaled by FLOPs per token) in the compile mode the job will use (CUDA
    graphs on one GPU, plain compile under DDP), scaled by the GPU's dense bf16 peak."""
    m, t = cfg.model, cfg.training
    mode, _ = choose_compile_mode(t.compile_mode, gpus, t.gradient_checkpointing)
    graphs = t.compile and mode in CUDA_GRAPH_MODES
    how, col = ("CUDA graphs", 1) if graphs else ("plain torch.compile", 0)  # col: GPU_RATES' rate
    key = (m.d_model, m.num_layers, m.context_length)
    if key in GPU_RATES:
        rate = GPU_RATES[key][col]
        label = f"{RATES_DEVICE} tokens/s measured for this shape on {RATES_DATE} ({how})"
    else:  # the measured shape nearest in FLOPs per token, at the same model FLOP/s
        near = min(GPU_RATES.values(), key=lambda r: abs(math.log(r[2] / flops_per_token)))
        rate = near[col] * near[2] / flops_per_token
        label = f"estimate: the nearest measured {RATES_DEVICE} shape, scaled by FLOPs per token ({how})"
        # smaller than that shape: its tokens/s. The measured ones gain little from fewer FLOPs
        # (case C has 1/18 of case A's FLOPs per token and as many tokens/s): the host bounds them
        if flops_per_token < near[2]:
            rate = near[col]
            label = (
                f"estimate: the tokens/s of the nearest, larger measured {RATES_DEVICE} shape "
                f"(small models are launch-bound; {how})"
            )
    peak = known_peak(cfg.slurm.gpu_type)
    if peak is None:
        return None
    if peak[0] != RATES_PEAK:
        label += f"; one {cfg.slurm.gpu_type} estimated as {peak[0] / RATES_PEAK:.2f} {RATES_DEVICE} by dense bf16 peak"
    return Rate(rate * peak[0] / RATES_PEAK, label + "; training steps only, no validation")


def cpu_rate(flops_per_token: int) -> Rate:
    return Rate(
        CPU_MODEL_FLOPS / flops_per_token,
        "rough estimate: fp32 at 181 GFLOP/s of model FLOPs (2-core VM, docs/performance.md)",
    )


# --------------------------------------------------------------------------- data


def _supported_shapes(cfg: Config, data: DataFigures) -> list[str]:
    """The largest shape of _SHAPES with at least MIN_TOKENS_PER_PARAMETER tokens per parameter."""
    for d_model, layers in _SHAPES:
        if d_model >= cfg.model.d_model and layers >= cfg.model.num_layers:
            continue
        shape = copy.deepcopy(cfg)
        heads = max(2, d_model // 64)
        shape.model.d_model, shape.model.num_layers, shape.model.num_heads, shape.model.d_ff = (
            d_model,
            layers,
            heads,
            4 * d_model,
        )
        n = meta_model(shape, num_assets=data.assets or None, num_categories=data.categories or None).num_parameters()
        if data.candles["train"] / n >= MIN_TOKENS_PER_PARAMETER:
            return [
                f"a smaller model the data supports: --set model.d_model={d_model} --set model.num_layers={layers} "
                f"--set model.num_heads={heads} --set model.d_ff={4 * d_model} ({n:,} parameters)"
            ]
    return []
