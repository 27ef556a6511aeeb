"""`marketgpt plan --config CFG`: what a config will do, before the queue wait.

Candles (= tokens) per split: exact from the config's prepared token shard when there is one
(its index.json and data_info.json: no candle read), or from the shipped sample; from the
timestamps alone where the candles are here (your files, or the parquet cache: training's own
cleaning and split, asset by asset, on every candle's timestamp with placeholder prices, so
only the rows cleaning drops for bad prices are counted too: an estimate, `marketgpt data check`
counts exactly); otherwise estimated from the universe, the dates and the interval, or from
data.synthetic (the synthetic market is not generated for a plan). Memory holds one asset's
timestamps, whatever the corpus' size. Then parameters, unique
training tokens per parameter, windows, steps and tokens per epoch, how often each candle is
seen, time per epoch and per run on the job's GPUs and on a CPU, peak GPU memory, and warnings
(common/commands/plan_figures.py holds the arithmetic and the text).

Time comes from measured training rates: compiled bf16 tokens/s of one H200 per case shape,
scaled to other GPUs by their dense bf16 peak, and to other shapes by training FLOPs per token.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence, TextIO

import pandas as pd

from common.commands.plan_figures import (
    MIN_TOKENS_PER_PARAMETER,
    DataFigures,
    Plan,
    Rate,
    asset_windows,
    epoch_windows,
    format_plan,
    steps_per_epoch,
)
from common.config import Config, at_interval, load_config
from common.data.cache import CandleCache
from common.data.check import Row, breakdown, left_out, prepare_streamed, prepared_rows, shard_summary
from common.data.loading import load_market_data, start_bound
from common.data.prepare import EVAL_MIN_CANDLES, SPLITS, lost_text, prepare_data, short_intervals_error
from common.data.synthetic import synthetic_assets, synthetic_spec
from common.data.universe import EXCHANGE_UNIVERSE, Asset, load_universe, universe_as_of, universe_path
from common.data.yahoo import LOOKBACK_LIMITS, window_text
from common.distributed.precision import CUDA_GRAPH_MODES, choose_compile_mode
from common.distributed.requeue import MAX_REQUEUES
from common.distributed.slurm import parse_slurm_time
from common.errors import UserError
from common.markets import INTERVAL_SECONDS, series_name
from common.model.memory import estimate_training_memory
from common.model.scaling_fit import ScalingFit, load_size_fit, size_advice
from common.model.sizing import meta_model
from common.paths import case_dir_of_config
from common.training.mfu import known_peak

__all__ = [
    "CPU_MODEL_FLOPS",
    "GPU_RATES",
    "MAX_ESTIMATE_START",
    "build_plan",
    "data_figures",
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

# Estimated candles per year: category -> (trading days per year, trading hours per day).
# Stock exchanges and indices trade ~252 days of ~6.5 h; FX 24 h on weekdays; crypto 24/7.
_SESSIONS: dict[str, tuple[int, float]] = {"crypto": (365, 24.0), "fx": (260, 24.0), "commodity": (252, 23.0)}
_STOCK_SESSION = (252, 6.5)
# the first candle a source can give: Binance (the cases' ccxt exchange) opened on 2017-07-14
_FIRST_CANDLE = {"ccxt": pd.Timestamp("2017-07-14", tz="UTC")}
# data.start_date = "max" in an estimate: where a Yahoo asset's first trade is taken to be (it is
# known only once downloaded; most of a stock universe trades since before then)
MAX_ESTIMATE_START = pd.Timestamp("2000-01-01", tz="UTC")
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


def data_figures(cfg: Config, case_dir: Path) -> DataFigures:
    """Exact counts from a prepared shard or the sample; counted from the timestamps where the
    candles are here (files, cache); else an estimate."""
    d = cfg.data
    if d.source == "sample":
        return _exact(cfg, case_dir, "exact (the shipped sample)")
    shard = shard_summary(cfg, case_dir) if d.source in ("files", "download") else None
    if shard is not None:
        return _figures(
            cfg, shard.rows, f"exact (the prepared token shard {shard.folder.name}; no candle read)", shard.info
        )
    if d.source == "files":
        return _from_times(cfg, case_dir, f"your files in {d.files_dir}")
    if d.source == "synthetic":
        return _synthetic_estimate(cfg)
    assets = _universe(cfg, case_dir)
    cache = CandleCache(case_dir / d.cache_dir)
    per_interval = [sum(cache.path_for(a.source, iv, a.symbol).exists() for a in assets) for iv in d.run_intervals()]
    cached = sum(per_interval)
    figures = (
        _estimate(cfg, assets)
        if min(per_interval) == 0
        else _from_times(
            cfg,
            case_dir,
            f"the cache: {cached} of {len(assets) * len(per_interval)} {'series' if d.intervals else 'assets'}",
        )
    )
    if d.universe == EXCHANGE_UNIVERSE:  # which of the dated files
        universe = universe_path(case_dir, d.universe, d.exchange)
        figures.basis += f"; universe {universe.name} (as of {universe_as_of(universe)})"
    figures.notes += [n for iv in d.run_intervals() for n in _yahoo_window_notes(at_interval(cfg, iv), assets)]
    if d.intervals and d.interval_split == "pooled" and not figures.basis.startswith("exact"):
        figures.notes.append(
            "the estimate splits each series on its own dates; the pooled cuts shared by every "
            "interval are checked once the candles are cached: an interval they leave without "
            "windows is refused then"
        )
    return figures


def _yahoo_window_notes(cfg: Config, assets: Sequence[Asset]) -> list[str]:
    """A line when Yahoo's intraday window cuts data.start_date for the config's Yahoo assets."""
    d = cfg.data
    yahoo = sum(a.source == "yfinance" for a in assets)
    if not yahoo or d.interval not in LOOKBACK_LIMITS:
        return []
    end = _end(cfg)
    earliest = end - LOOKBACK_LIMITS[d.interval]
    start = start_bound(d.start_date)
    if start is not None and start >= earliest:
        return []
    wanted = 'the whole history (data.start_date = "max")' if start is None else d.start_date
    return [
        f"{window_text(d.interval)}: the {yahoo} Yahoo assets start about {earliest:%Y-%m-%d} instead of "
        f"{wanted}; each download adds the newest bars to the cache, so the history grows run by run"
    ]


def _end(cfg: Config) -> pd.Timestamp:
    d = cfg.data
    return pd.Timestamp(d.end_date, tz="UTC") if d.end_date else pd.Timestamp.now(tz="UTC").floor("D")


def _universe(cfg: Config, case_dir: Path) -> list[Asset]:
    d = cfg.data
    assets = load_universe(universe_path(case_dir, d.universe, d.exchange), d.universe_counts or None)
    return [a for a in assets if not d.categories or a.category in d.categories]


def _exact(cfg: Config, case_dir: Path, basis: str) -> DataFigures:
    """The candles training would use: load_market_data + prepare_data (offline; the sample is small)."""
    prepared = prepare_data(cfg, load_market_data(cfg, case_dir))
    return _figures(cfg, prepared_rows(prepared, cfg.data.interval, bool(cfg.data.intervals)), basis, prepared.info)


def _from_times(cfg: Config, case_dir: Path, where: str) -> DataFigures:
    """The candles training would use, from their timestamps alone (no price read), one asset at
    a time: exact unless cleaning drops rows for bad prices (NaN, <= 0), which are counted here."""
    market = load_market_data(cfg, case_dir, times_only=True)
    # no per-file cleaning report: without the prices it would be half of one (data check's job)
    prepared = prepare_streamed(cfg, dataclasses.replace(market, files={}))
    basis = (
        f"estimated from the timestamps in {where} (prices not read, so rows that cleaning drops for bad "
        "prices still count; `marketgpt data check` is exact)"
    )
    return _figures(cfg, prepared_rows(prepared, cfg.data.interval, bool(cfg.data.intervals)), basis, prepared.info)


def _figures(cfg: Config, rows: Sequence[Row], basis: str, info: Optional[dict] = None) -> DataFigures:
    """Counts from per-series (asset, interval, category, (train, val, test) candles) rows; a
    series too short to train is left out. info: the prepared data's data_info (exact counts),
    which says what was left out and why; else an estimate's rows say it."""
    window = cfg.model.context_length + 1
    kept = [r for r in rows if r[3][0] >= window]
    _check_intervals(cfg, rows, kept)
    windows = [asset_windows(r[3][0], window, cfg.data.window_stride) for r in kept]
    candles = {split: sum(r[3][i] for r in kept) for i, split in enumerate(SPLITS)}
    lines, warnings = left_out(info if info is not None else _estimated_info(cfg, rows))
    return DataFigures(
        candles,
        sum(windows),
        epoch_windows(windows, cfg.data.epoch_stride),
        basis,
        len({r[0] for r in kept}),
        len({r[2] for r in rows}),
        by=breakdown(kept),
        left_out=lines,
        warnings=warnings,
    )


def _estimated_info(cfg: Config, rows: Sequence[Row]) -> dict:
    """The data_info keys common.data.check.left_out reads, from an estimate's rows."""
    window = cfg.model.context_length + 1
    assets, dropped = {}, []
    for symbol, interval, category, counts in rows:
        name = series_name(symbol, interval) if cfg.data.intervals else symbol
        if counts[0] < window:
            dropped.append(
                {
                    "symbol": name,
                    "category": category,
                    "reason": f"{counts[0]} candles before the train/val cut (estimated)",
                }
            )
        else:
            short = [split for split, n in zip(SPLITS[1:], counts[1:]) if n < EVAL_MIN_CANDLES[split]]
            assets[name] = {"category": category, "no_windows_in": short}
    return {
        "context_length": cfg.model.context_length,
        "intervals": list(cfg.data.intervals),
        "assets": assets,
        "dropped": dropped,
    }


def _check_intervals(cfg: Config, rows: Sequence[Row], kept: Sequence[Row]) -> None:
    """Refuse, as training does (common.data.prepare), an interval none of whose series would hold
    a training, validation or test window; for an estimate too, from its per-series counts."""
    d = cfg.data
    texts, lost = [], []
    for interval in d.intervals:
        mine = [r[3] for r in kept if r[1] == interval]
        lacks = (
            ["train"]
            if not mine
            else [SPLITS[i] for i in (1, 2) if all(c[i] < EVAL_MIN_CANDLES[SPLITS[i]] for c in mine)]
        )
        if lacks:
            counts = [r[3] for r in rows if r[1] == interval]
            most = "/".join(f"{max((c[i] for c in counts), default=0):,}" for i in range(3))
            texts.append(lost_text(interval, lacks, f"{len(counts)} series, at most {most} train/val/test candles"))
            lost.append(interval)
    if lost:
        raise short_intervals_error(texts, lost, cfg.model.context_length, d.purge_gap or cfg.model.context_length)


def estimated_candles(asset: Asset, interval: str, start: pd.Timestamp, end: pd.Timestamp) -> int:
    """Candles of one asset between start and end from its market's trading calendar."""
    first = max(start, _FIRST_CANDLE.get(asset.source, start))
    if asset.source == "yfinance" and interval in LOOKBACK_LIMITS:  # Yahoo serves recent intraday only
        first = max(first, end - LOOKBACK_LIMITS[interval])
    days, hours = _SESSIONS.get(asset.category, _STOCK_SESSION)
    per_day = 1.0 if interval == "1d" else hours * 3600 / INTERVAL_SECONDS[interval]
    years = max(0.0, (end - first).total_seconds() / (365.25 * 86400))
    return int(years * days * per_day)


def _estimate(cfg: Config, assets: Sequence[Asset]) -> DataFigures:
    d = cfg.data
    start, end = start_bound(d.start_date), _end(cfg)
    since = d.start_date
    if start is None:  # each asset from its first candle: ccxt's since the exchange opened (_FIRST_CANDLE)
        start = MAX_ESTIMATE_START
        sources = {a.source for a in assets}
        firsts = [
            f"{source} assets from {when:%Y-%m-%d}" for source, when in _FIRST_CANDLE.items() if source in sources
        ]
        if sources - set(_FIRST_CANDLE):
            firsts.append(f"the others from {start:%Y-%m-%d}: their first trades are known once downloaded")
        since = f"max ({', '.join(firsts)})"
    rows = [
        (a.symbol, iv, a.category, _split(cfg, estimated_candles(a, iv, start, end)))
        for a in assets
        for iv in d.run_intervals()
    ]
    basis = (
        f"estimated from the universe, {since} to {d.end_date or 'today'}, {', '.join(d.run_intervals())} "
        "candles and each market's trading hours (nothing cached)"
    )
    return _figures(cfg, rows, basis)


def _synthetic_estimate(cfg: Config) -> DataFigures:
    """data.source = "synthetic" from its spec alone: candles * (1 - gap_prob) rows per asset, or
    every slot of the grid for crypto assets (training fills their gaps with empty candles)."""
    d = cfg.data
    # several intervals: the market is made at the finest and aggregated (common.data.loading)
    finest = min(d.run_intervals(), key=INTERVAL_SECONDS.__getitem__)
    spec = synthetic_spec(at_interval(cfg, finest))
    assets = [a for a in synthetic_assets(spec) if not d.categories or a.category in d.categories]
    rows = []
    for iv in d.run_intervals():
        slots = -(-spec.candles * INTERVAL_SECONDS[finest] // INTERVAL_SECONDS[iv])
        rows += [
            (
                a.symbol,
                iv,
                a.category,
                _split(cfg, slots if a.category == "crypto" else round(slots * (1 - spec.gap_prob))),
            )
            for a in assets
        ]
    basis = (
        f"estimated from data.synthetic: {spec.assets} assets x {spec.candles:,} {finest} slots from "
        f"{d.start_date}, gap_prob {spec.gap_prob:g} (nothing generated)"
    )
    return _figures(cfg, rows, basis)


def _split(cfg: Config, n: int) -> tuple[int, int, int]:
    """(train, val, test) candles of an asset of n at the config's ratios; val and test lose
    data.purge_gap candles at their start, as in training."""
    d = cfg.data
    purge = d.purge_gap or cfg.model.context_length
    train, val = int(n * d.train_ratio), int(n * d.val_ratio)
    return train, max(0, val - purge), max(0, n - train - val - purge)


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
