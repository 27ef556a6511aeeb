"""`marketgpt plan --config CFG`: what a config will do, before the queue wait.

Candles (= tokens) per split, exact or estimated (common/commands/plan_data.py). Then parameters, unique
training tokens per parameter, windows, steps and tokens per epoch, how often each candle is
seen, time per epoch and per run on the job's GPUs and on a CPU, peak GPU memory, and warnings
(common/commands/plan_figures.py holds the arithmetic and the text).

Time comes from measured training rates: compiled bf16 tokens/s of one H200 per case shape,
scaled to other GPUs by their dense bf16 peak, and to other shapes by training FLOPs per token.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import sys
from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Sequence, TextIO

from common.commands.plan_data import data_figures
from common.commands.plan_figures import (
    MIN_TOKENS_PER_PARAMETER,
    DataFigures,
    OneGPU,
    Plan,
    Rate,
    format_plan,
    steps_per_epoch,
)
from common.config import Config, DataConfig, ModelConfig, TrainingConfig, load_config
from common.data.prepare import SPLITS
from common.distributed.precision import CUDA_GRAPH_MODES, choose_compile_mode
from common.distributed.requeue import MAX_REQUEUES
from common.distributed.scheduler import parse_slurm_time
from common.errors import UserError
from common.model.memory import estimate_training_memory
from common.model.scaling_fit import ScalingFit, corpus_of, load_size_fit, size_advice
from common.model.sizing import meta_model
from common.paths import case_dir_of_config, case_script, script_config
from common.training.mfu import known_peak

__all__ = [
    "CPU_MODEL_FLOPS",
    "GPU_RATES",
    "MeasuredRates",
    "build_plan",
    "gpu_rate",
    "one_gpu",
    "one_gpu_command",
    "plan_of_run",
    "run_plan",
    "scaling_suggestion",
]


class MeasuredRates(NamedTuple):
    """Compiled bf16 training tokens/s of one NVIDIA H200 for one model shape, measured 2026-11-26
    (bench/results/2026-11-26-h200/), and that model's training FLOPs per token."""

    plain: float  # plain torch.compile, batch 32: every rank of a DDP job (bench_gpu_default.json, the bare step)
    graphs: float  # CUDA graphs (compile_mode auto on one GPU), batch 32: the Trainer (bench_gpu_trainer.json)
    graphs_64: float  # the same at batch 64, a 2-GPU job's global batch on one GPU (bench_gpu_trainer_b64.json)
    flops_per_token: int  # MarketGPT.flops_per_token of the case's model


# (d_model, num_layers, context_length) -> rates. Case C's Trainer rate at batch 32: the median of
# three runs of the lighter step (bench/results/2026-11-26-h200-host/); at batch 64 the Trainer
# before it, a lower bound (0.76 of the bare step's 3.35M). Case A's at batch 64: the bare step
# (bench_gpu_a64_graphs.json; its Trainer runs at 0.98-0.99 of the bench at batch 32).
GPU_RATES: dict[tuple[int, int, int], MeasuredRates] = {
    (768, 12, 512): MeasuredRates(655_501.0, 644_408.0, 689_445.0, 585_662_976),  # A: compute-bound
    (512, 8, 256): MeasuredRates(608_876.0, 1_555_007.0, 1_743_386.0, 170_068_992),  # case B
    (256, 6, 128): MeasuredRates(646_228.0, 1_326_959.0, 2_529_857.0, 32_300_544),  # C: host-bound
}
GRAPHS_64 = 64  # the batch of MeasuredRates.graphs_64; every other figure is at batch 32
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
    # refused before the data is read
    size_fit = load_size_fit(fit, corpus_of(cfg.model, cfg.data)) if fit is not None else None
    plan = build_plan(cfg, data_figures(cfg, case_dir_of_config(config)), config=config, overrides=overrides)
    print(format_plan(plan), file=out or sys.stdout)  # looked up now: a redirected stdout counts
    print(scaling_suggestion(cfg.model, cfg.data, plan, size_fit, fit), file=out or sys.stdout)
    return 0


def scaling_suggestion(
    m: ModelConfig, d: DataConfig, plan: Plan, fit: Optional[ScalingFit], path: Optional[Path] = None
) -> str:
    """One line: the shape the user's scaling fit (common/model/scaling_fit.py) suggests for the
    plan's training candles beside the config's, that it gives no advice, or that there is no fit."""
    if fit is None:
        return (
            "Model size: no scaling fit for this corpus; measure one with `marketgpt sweep --config CFG` "
            "(docs/scaling.md), then `marketgpt plan --config CFG --fit SWEEP/sweep.json`"
        )
    figures = plan.data
    advice = size_advice(
        m,
        d,
        figures.candles["train"],
        fit,
        figures.assets or None,
        figures.categories or None,
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
    config: Optional[Path] = None,
    overrides: Sequence[str] = (),
) -> Plan:
    """The plan of `cfg` on `data`; parameters, FLOPs per token, steps per epoch and processes
    default to the config's model on its universe and the job's GPUs (slurm.nodes x gpus_per_node).
    `config` and `overrides`, where cfg was loaded from them, go into the one-GPU command."""
    t, s = cfg.training, cfg.slurm
    gpus = world_size or s.nodes * s.gpus_per_node
    if parameters is None or flops_per_token is None:
        model = meta_model(cfg.model, cfg.data, num_assets=data.assets or None, num_categories=data.categories or None)
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
        gpu_rate=gpu_rate(cfg.model, t, s.gpu_type, flops_per_token, gpus),
        cpu_rate=cpu_rate(flops_per_token),
        memory_gb=memory.total / 1e9,
        slurm_time_s=parse_slurm_time(s.time) * 60,
        max_requeues=MAX_REQUEUES,
        one_gpu=one_gpu(cfg.model, t, s.gpu_type, parameters, flops_per_token, gpus, config, overrides),
        market_context=cfg.model.market_context,
    )
    if plan.tokens_per_parameter < MIN_TOKENS_PER_PARAMETER:
        plan.suggestions = _supported_shapes(cfg.model, cfg.data, data)
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


def gpu_rate(m: ModelConfig, t: TrainingConfig, gpu_type: str, flops_per_token: int, gpus: int = 1) -> Optional[Rate]:
    """Training tokens/s of one of the job's `gpus` GPUs of `gpu_type`: the measurement of this shape (or of
    the nearest shape, scaled by FLOPs per token) in the compile mode the job will use (CUDA
    graphs on one GPU, plain compile under DDP) at the measured batch nearest below
    training.batch_size (64 or 32: 32 for plain compile), scaled by the GPU's dense bf16 peak."""
    mode, _ = choose_compile_mode(t.compile_mode, gpus, t.gradient_checkpointing)
    if not (t.compile and mode in CUDA_GRAPH_MODES):
        how, col = "plain torch.compile, batch 32", "plain"
    elif t.batch_size >= GRAPHS_64:
        how, col = f"CUDA graphs, batch {GRAPHS_64}", "graphs_64"
    else:
        how, col = "CUDA graphs, batch 32", "graphs"
    key = (m.d_model, m.num_layers, m.context_length)
    if key in GPU_RATES:
        rate = getattr(GPU_RATES[key], col)
        label = f"{RATES_DEVICE} tokens/s measured for this shape on {RATES_DATE} ({how})"
    else:  # the measured shape nearest in FLOPs per token, at the same model FLOP/s
        near = min(GPU_RATES.values(), key=lambda r: abs(math.log(r.flops_per_token / flops_per_token)))
        rate = getattr(near, col) * near.flops_per_token / flops_per_token
        label = f"estimate: the nearest measured {RATES_DEVICE} shape, scaled by FLOPs per token ({how})"
        # smaller than that shape: its tokens/s. The measured ones gain little from fewer FLOPs
        # (case C has 1/18 of case A's FLOPs per token and as many tokens/s): the host bounds them
        if flops_per_token < near.flops_per_token:
            rate = getattr(near, col)
            label = (
                f"estimate: the tokens/s of the nearest, larger measured {RATES_DEVICE} shape "
                f"(small models are launch-bound; {how})"
            )
    peak = known_peak(gpu_type)
    if peak is None:
        return None
    if peak[0] != RATES_PEAK:
        label += f"; one {gpu_type} estimated as {peak[0] / RATES_PEAK:.2f} {RATES_DEVICE} by dense bf16 peak"
    return Rate(rate * peak[0] / RATES_PEAK, label + "; training steps only, no validation")


def one_gpu(
    m: ModelConfig,
    t: TrainingConfig,
    gpu_type: str,
    parameters: int,
    flops_per_token: int,
    gpus: int,
    config: Optional[Path] = None,
    overrides: Sequence[str] = (),
) -> Optional[OneGPU]:
    """A `gpus`-GPU DDP job's model on one of its GPUs at its best: batch_size x gpus as one GPU's
    batch (the job's windows per step, grad_accum_steps unchanged), compiled with CUDA graphs where
    choose_compile_mode allows them on one GPU (not with gradient checkpointing); None for a one-GPU
    job or a GPU of unknown peak."""
    if gpus < 2:
        return None
    best = dataclasses.replace(t, batch_size=t.batch_size * gpus)
    sets = [f"training.batch_size={best.batch_size}"]
    graphs = choose_compile_mode("auto", 1, t.gradient_checkpointing)[0] in CUDA_GRAPH_MODES
    if graphs and not t.compile:
        best = dataclasses.replace(best, compile=True)
        sets.append("training.compile=true")
    if graphs and choose_compile_mode(t.compile_mode, 1, t.gradient_checkpointing)[0] not in CUDA_GRAPH_MODES:
        best = dataclasses.replace(best, compile_mode="auto")
        sets.append("training.compile_mode=auto")
    rate = gpu_rate(m, best, gpu_type, flops_per_token, 1)
    if rate is None:
        return None
    precision = "bf16" if t.precision == "auto" else t.precision
    memory = estimate_training_memory(m, parameters, best.batch_size, precision, t.gradient_checkpointing, 1)
    return OneGPU(
        rate,
        "CUDA graphs" if graphs else "plain torch.compile",
        best.batch_size,
        memory.total / 1e9,
        one_gpu_command(config, overrides, gpu_type, sets),
    )


def one_gpu_command(config: Optional[Path], overrides: Sequence[str], gpu_type: str, sets: Sequence[str]) -> str:
    """What a user types to train `config` with its `overrides` on one GPU, with `sets` added: the
    case's sbatch script with one task and one GPU where that script trains this config, else
    `marketgpt submit` with slurm.gpus_per_node=1. The job's own slurm.* and the keys of `sets`
    are left out of the overrides; paths relative to the current directory when below it."""
    keys = {kv.split("=", 1)[0] for kv in sets}
    kept = [kv for kv in overrides if not kv.startswith("slurm.") and kv.split("=", 1)[0] not in keys]
    args = " ".join(f"--set {shlex.quote(kv)}" for kv in [*kept, *sets])
    if config is None:  # the training banner: the run knows no config file
        return f"sbatch --ntasks-per-node=1 --gres=gpu:{gpu_type}:1 <the case's script> {args}"
    case = case_dir_of_config(config)
    try:
        script: Optional[Path] = case_script(case)
    except UserError:
        script = None
    if script is not None and (case / (script_config(script) or "-")).resolve() == Path(config).resolve():
        return f"sbatch --ntasks-per-node=1 --gres=gpu:{gpu_type}:1 {_shown(script)} {args}"
    return f"marketgpt submit --case {_shown(case)} --config {_shown(Path(config))} --set slurm.gpus_per_node=1 {args}"


def _shown(path: Path) -> str:
    """`path` relative to the current directory when below it (the repository root, where the
    case scripts are submitted from), else absolute; quoted for a shell."""
    path, here = Path(path).resolve(), Path.cwd().resolve()
    return shlex.quote(str(path.relative_to(here) if path.is_relative_to(here) else path))


def cpu_rate(flops_per_token: int) -> Rate:
    return Rate(
        CPU_MODEL_FLOPS / flops_per_token,
        "rough estimate: fp32 at 181 GFLOP/s of model FLOPs (2-core VM, docs/performance.md)",
    )


# --------------------------------------------------------------------------- data


def _supported_shapes(m: ModelConfig, d: DataConfig, data: DataFigures) -> list[str]:
    """The largest shape of _SHAPES with at least MIN_TOKENS_PER_PARAMETER tokens per parameter."""
    for d_model, layers in _SHAPES:
        if d_model >= m.d_model and layers >= m.num_layers:
            continue
        heads = max(2, d_model // 64)
        shape = dataclasses.replace(m, d_model=d_model, num_layers=layers, num_heads=heads, d_ff=4 * d_model)
        n = meta_model(
            shape, d, num_assets=data.assets or None, num_categories=data.categories or None
        ).num_parameters()
        if data.candles["train"] / n >= MIN_TOKENS_PER_PARAMETER:
            return [
                f"a smaller model the data supports: --set model.d_model={d_model} --set model.num_layers={layers} "
                f"--set model.num_heads={heads} --set model.d_ff={4 * d_model} ({n:,} parameters)"
            ]
    return []
