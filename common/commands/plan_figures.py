"""The arithmetic of `marketgpt plan`: data, model and time figures of a run, and their text.

Pure: plain numbers in, a `Plan` and its lines out, so the tests check it on hand-made figures
and `marketgpt train` prints the same lines from the figures of the run it is starting. One
candle is one token, so tokens per split are candles per split. Windows and steps follow
`common/training/batches.py` (TokenWindows) and `common/training/optimizer_step.py`'s `steps_per_epoch`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from common.data.check import format_breakdown
from common.tokens.market_context import MIN_SERIES

__all__ = [
    "MIN_TOKENS_PER_PARAMETER",
    "ONE_GPU_ADVANTAGE",
    "SHORT_RUN_SHARE",
    "DataFigures",
    "OneGPU",
    "Plan",
    "Rate",
    "asset_windows",
    "epoch_windows",
    "format_plan",
    "plan_warnings",
    "steps_per_epoch",
]

# Warn below 1 unique training token per parameter. Language models are trained compute-optimally
# at about 20 tokens per parameter (Hoffmann et al. 2022, "Chinchilla"), and a market token
# carries less to learn than a word (a next-candle distribution close to the unigram). Below 1
# a model is more than 20x short of that, and the shipped sample shows what follows: at 0.008
# (case C's 5.0M parameters on 38k daily candles) and 0.04 (the small-data 0.93M) the validation
# loss is best after an epoch or two and the model then memorizes (docs/generalization.md).
MIN_TOKENS_PER_PARAMETER = 1.0
# a run that uses less than this share of the Slurm time it asks for queues longer than it needs
SHORT_RUN_SHARE = 0.10
# advise one GPU with CUDA graphs over a DDP job when it is at least this much faster: below it the
# measured rates' run-to-run spread (up to 15% for case C) outweighs it
ONE_GPU_ADVANTAGE = 1.10


@dataclass
class DataFigures:
    """Candles (= tokens) per split and the training windows they give."""

    candles: dict[str, int]  # "train", "val", "test"
    train_windows: int  # context_length + 1 long, data.window_stride apart
    epoch_windows: int  # those one training epoch takes with data.epoch_stride
    basis: str  # "exact (...)" or "estimated (...)": where the counts come from
    assets: int = 0  # the assets and categories the model's embeddings hold (0: the config's counts)
    categories: int = 0
    notes: list[str] = field(default_factory=list)  # what limits the data (e.g. Yahoo's intraday windows)
    by: dict = field(default_factory=dict)  # per interval and category (common.data.check.breakdown)
    # what preparation leaves out, and a warning for a category or interval lost whole (common.data.check.left_out)
    left_out: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class Rate:
    """Training tokens/s of one device and where the figure comes from."""

    tokens_per_s: float
    label: str


@dataclass
class OneGPU:
    """A DDP job's model on one of its GPUs at its best (common/commands/plan.py's one_gpu)."""

    rate: Rate  # tokens/s, in the compile mode one GPU gets
    mode: str  # that mode in words: "CUDA graphs" where they apply, else "plain torch.compile"
    batch_size: int  # the job's batch_size x GPUs: as many windows per step as the job
    memory_gb: float  # the estimate at that batch on one GPU
    command: str  # the submission that trains it


@dataclass
class Plan:
    data: DataFigures
    parameters: int
    context_length: int
    epochs: int
    steps_per_epoch: int
    global_batch: int  # windows per optimizer step: batch_size x GPUs x grad_accum_steps
    epoch_stride: int
    gpus: int
    gpu_type: str
    gpu_rate: Optional[Rate]  # per GPU; None: a GPU we know no peak of
    cpu_rate: Rate
    memory_gb: float  # per GPU, the estimate of common/model/memory.py
    slurm_time_s: int
    max_requeues: int
    suggestions: list[str] = field(default_factory=list)  # model shapes the data supports, filled in by the caller
    # the same model on one of the GPUs at its best: set for a multi-GPU job, whose ranks compile
    # without CUDA graphs
    one_gpu: Optional[OneGPU] = None
    market_context: bool = False  # model.market_context: each interval needs MIN_SERIES series

    @property
    def tokens_per_parameter(self) -> float:
        return self.data.candles["train"] / max(self.parameters, 1)

    @property
    def tokens_per_epoch(self) -> int:
        return self.steps_per_epoch * self.global_batch * self.context_length

    @property
    def times_seen(self) -> float:
        """How often each training candle is a target over all epochs (stride-1 windows overlap)."""
        return self.epochs * self.tokens_per_epoch / max(self.data.candles["train"], 1)

    def epoch_seconds(self, rate: Rate, devices: int = 1) -> float:
        return self.tokens_per_epoch / (rate.tokens_per_s * devices)

    @property
    def run_seconds(self) -> Optional[float]:
        """All epochs on the job's GPUs (DDP scales about linearly); None without a GPU rate."""
        return None if self.gpu_rate is None else self.epochs * self.epoch_seconds(self.gpu_rate, self.gpus)


def asset_windows(candles: int, length: int, stride: int) -> int:
    """Windows of `length` tokens, `stride` apart, inside one asset's `candles` (window_starts)."""
    return max(0, (candles - length) // stride + 1)


def epoch_windows(per_asset: Sequence[int], epoch_stride: int) -> int:
    """One training epoch's windows: every k-th of each asset from the offset that gives the
    fewest (TokenWindows.epoch_windows), i.e. the offset k - 1: floor(w / k) per asset."""
    return sum(per_asset) if epoch_stride == 1 else sum(w // epoch_stride for w in per_asset)


def steps_per_epoch(
    windows: int, batch_size: int, world_size: int, grad_accum_steps: int, max_steps: Optional[int]
) -> int:
    """Optimizer steps of one epoch: full global batches only, as the Trainer counts them."""
    steps = windows // (batch_size * world_size) // grad_accum_steps
    return min(steps, max_steps or steps)


def duration(seconds: float) -> str:
    """3 d 9 h, 5 h 12 min, 31 min, 45 s."""
    if seconds >= 86400:
        return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _count(n: float) -> str:
    """1,234 / 1.2M / 3.4B: short enough for one line."""
    for size, unit in ((1e9, "B"), (1e6, "M")):
        if n >= size:
            return f"{n / size:.2f}{unit}" if n < 10 * size else f"{n / size:.1f}{unit}"
    return f"{n:,.0f}"


def slurm_time(seconds: float) -> str:
    """Seconds -> a Slurm --time (D-HH:MM:SS), rounded up to the hour."""
    hours = max(1, math.ceil(seconds / 3600))
    return f"{hours // 24}-{hours % 24:02d}:00:00" if hours >= 24 else f"{hours}:00:00"


def plan_warnings(plan: Plan) -> list[str]:
    """Each warning one line, with its numbers and a concrete suggestion."""
    out = []
    if plan.tokens_per_parameter < MIN_TOKENS_PER_PARAMETER:
        needed = plan.parameters * MIN_TOKENS_PER_PARAMETER / max(plan.data.candles["train"], 1)
        fixes = list(plan.suggestions) + [
            f"about {needed:,.0f}x more training candles (longer histories, more assets, a shorter data.interval)"
        ]
        if plan.epoch_stride == 1 and plan.context_length >= 16:
            fixes.append(
                f"--set data.epoch_stride={plan.context_length // 8} (each candle a target about 8 times "
                f"per epoch instead of {plan.context_length})"
            )
        out.append(
            f"WARNING: {plan.tokens_per_parameter:.3g} unique training tokens per parameter "
            f"({_count(plan.data.candles['train'])} tokens, {_count(plan.parameters)} parameters), below "
            f"{MIN_TOKENS_PER_PARAMETER:g}: the model can memorize the data. Try " + "; or ".join(fixes)
        )
    out += _one_gpu_advice(plan)
    thin = {i: r["series"] for i, r in plan.data.by.get("interval", {}).items() if r["series"] < MIN_SERIES}
    if plan.market_context and thin:
        out.append(
            "WARNING: model.market_context reads the cross-section of each interval's series, and "
            + ", ".join(f"{i} has {n}" for i, n in thin.items())
            + f": training will refuse it when it prepares the data; give each interval at least {MIN_SERIES} "
            "series, or --set model.market_context=false"
        )
    run, limit = plan.run_seconds, plan.slurm_time_s
    if run is not None and limit > 0:
        where = f"{plan.gpus}x {plan.gpu_type}"
        if run > limit:
            requeues = math.ceil(run / limit) - 1
            over = f", more than the {plan.max_requeues} requeues a job allows" if requeues > plan.max_requeues else ""
            out.append(
                f"WARNING: the run needs about {duration(run)} on {where}, more than slurm.time "
                f"{duration(limit)}: it will requeue about {requeues} time(s){over}. Ask for "
                f"--set slurm.time={slurm_time(run * 1.2)} where the partition allows it, or fewer "
                "training.epochs, or a larger data.epoch_stride"
            )
        elif run < SHORT_RUN_SHARE * limit:
            out.append(
                f"WARNING: the run needs about {duration(run)} on {where}, {run / limit:.1%} of slurm.time "
                f"{duration(limit)}: a shorter --time queues sooner, e.g. --set slurm.time="
                f"{slurm_time(run * 1.5 + 1800)}"
            )
    return out


def _one_gpu_advice(plan: Plan) -> list[str]:
    """A warning where one GPU at its best (CUDA graphs, the job's windows per step as its batch)
    outruns the whole DDP job, whose ranks compile without graphs (small models: their step is
    launch-bound, which graphs remove). DDP is taken to scale linearly, so the comparison favours
    the job the user asked for."""
    if plan.gpus < 2 or plan.gpu_rate is None or plan.one_gpu is None:
        return []
    one, per_gpu = plan.one_gpu, plan.gpu_rate.tokens_per_s
    ddp = per_gpu * plan.gpus
    if one.rate.tokens_per_s < ONE_GPU_ADVANTAGE * ddp:
        return []
    run_one, run_ddp = (
        plan.epochs * plan.epoch_seconds(one.rate),
        plan.epochs * plan.epoch_seconds(plan.gpu_rate, plan.gpus),
    )
    return [
        f"WARNING: one {plan.gpu_type} with {one.mode} at batch {one.batch_size} (as many windows per step as "
        f"this job) trains this model at about {_count(one.rate.tokens_per_s)} tokens/s, "
        f"{one.rate.tokens_per_s / ddp:.2f}x the {_count(ddp)} of {plan.gpus}x {plan.gpu_type} under DDP, where "
        f"CUDA graphs are off ({plan.gpus} x {_count(per_gpu)}): about {duration(run_one)} for {plan.epochs} epochs "
        f"instead of {duration(run_ddp)}, about {one.memory_gb:.1f} GB of GPU memory (estimate). Submit it on one "
        f"GPU: {one.command}; or train {plan.gpus} ensemble members at once, one per GPU, each with its own "
        "--set training.seed=N"
    ]


def format_plan(plan: Plan, short: bool = False) -> str:
    """The plan's lines; short: the main figures and the warnings (the training banner)."""
    c, d = plan.data.candles, plan.data
    assets = f" of {d.assets} assets" if d.assets else ""
    lines = [
        f"Plan: {_count(c['train'])} train, {_count(c['val'])} val, {_count(c['test'])} test candles (= tokens)"
        f"{assets}, {d.basis}",
        *(f"  note: {n}" for n in d.notes),
        f"  parameters {_count(plan.parameters)}: {plan.tokens_per_parameter:.3g} unique training tokens per "
        f"parameter (warn below {MIN_TOKENS_PER_PARAMETER:g})",
        f"  epoch: {_count(d.epoch_windows)} of {_count(d.train_windows)} training windows (data.epoch_stride "
        f"{plan.epoch_stride}), {plan.steps_per_epoch:,} steps of {plan.global_batch} windows = "
        f"{_count(plan.tokens_per_epoch)} tokens; {plan.epochs} epochs show each training candle about "
        f"{plan.times_seen:,.0f} times",
    ]
    run_seconds = plan.run_seconds  # None exactly when gpu_rate is
    if plan.gpu_rate is not None and run_seconds is not None:
        lines.append(
            f"  time on {plan.gpus}x {plan.gpu_type}: {duration(plan.epoch_seconds(plan.gpu_rate, plan.gpus))}"
            f" per epoch, {duration(run_seconds)} for {plan.epochs} epochs (slurm.time "
            f"{duration(plan.slurm_time_s)})"
        )
        lines.append(f"    ({plan.gpu_rate.label})")
    else:
        lines.append(f"  time on {plan.gpus}x {plan.gpu_type}: unknown (no peak FLOP/s for this GPU model)")
    if not short:
        lines.append(f"  time on a CPU: {duration(plan.epoch_seconds(plan.cpu_rate))} per epoch; {plan.cpu_rate.label}")
        lines.append(
            f"  peak GPU memory: about {plan.memory_gb:.1f} GB per GPU (estimate, common/model/memory.py; "
            "plus 1-2 GB CUDA context)"
        )
        lines += format_breakdown(d.by, plan.parameters)
        lines += [f"  {line}" for line in d.left_out]
    return "\n".join(lines + d.warnings + plan_warnings(plan))
