"""`marketgpt benchmark`: a fixed, versioned set of evaluation tasks on the real series shipped in
the package (common.data.sample), scored like the scorecard, so that runs trained on different
data can be compared on the same questions.

    task (TASKS): an interval, assets of the sample, a cut-off date `start` and an `end`
      ──► each asset's cleaned candles (common.data.cleaning.clean_asset) before `end`; the
          candles before `start` are the history and GARCH's fit, origins are every `stride`-th
          date in [start, end), targets must fall before `end`
      ──► common.evaluation.scorecard.make_scorecard on the assets the model knows: the same
          walk-forward, CRPS, block-bootstrap skill, Diebold-Mariano and MCS as the scorecard
      ──► per task and horizon: CRPS of the model and each baseline, skill against the best
          baseline; leakage when the run's data cut-off is after `start`
      ──► aggregate: 1 - geometric mean over (task, horizon) of CRPS_model / CRPS_best baseline,
          with a block-bootstrap 95% interval (dates resampled within each task), leaked tasks out

The tasks themselves, the crypto aliases, the refusal when no task is out of sample and the
after-cut-off task: common.evaluation.benchmark_tasks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from common.evaluation.asset_series import AssetSeries
from common.evaluation.benchmark_tasks import (
    AFTER_CUTOFF,
    BENCHMARK_NAME,
    BENCHMARK_VERSION,
    TASKS,
    Task,
    sample_aliases,
    task_series,
    tasks_fingerprint,
)
from common.evaluation.metrics import block_bootstrap_indices, block_length, verdict
from common.evaluation.price_baselines import ForecastFn
from common.evaluation.result_lines import BASELINE_NAMES
from common.evaluation.scorecard import ScorecardSettings, make_scorecard

__all__ = ["Draws", "ModelView", "aggregate_skill", "format_table", "run_benchmark"]


@dataclass(frozen=True)
class ModelView:
    """What the benchmark knows of the model it scores."""

    symbols: Optional[frozenset[str]] = None  # the assets it can forecast; None: any
    interval: Optional[str] = None  # its candle length; tasks of another are skipped; None: any
    cutoff: Optional[pd.Timestamp] = None  # its data cut-off (data_cutoff); None: unknown, leakage null
    min_history: int = 0  # candles a history needs: a task's assets with fewer are left out (assets_short)
    left_out: tuple[str, ...] = ()  # the model's other intervals, not asked for (`benchmark --interval`)


@dataclass(frozen=True)
class Draws:
    """How each task is scored: samples per forecast, the seed, bootstrap draws, and a budget of
    (asset, origin) forecasts for a task set of the model's own candles (a run's 600 assets over years)."""

    n_samples: int = 100
    seed: int = 0
    n_boot: int = 1000
    budget: Optional[int] = None


def _best_baseline(hc: dict) -> str:
    return min((name for name in hc["crps"] if name != "model"), key=lambda name: hc["crps"][name])


def _score_task(
    task: Task,
    forecast_fn: ForecastFn,
    model: ModelView,
    draws: Draws,
    say: Callable[[str], None],
    series: list[AssetSeries],
    budget: Optional[int] = None,
    forecasts: Sequence[str] = (),
) -> tuple[dict, Optional[dict]]:
    """The task's row, and its per-date CRPS sums (model, best baseline) per horizon for the aggregate.
    series: the task's series, under the model's names (sample_aliases). budget: at most this many
    (asset, origin) forecasts (make_scorecard's). forecasts: every interval the benchmark scores
    the model at (default: model.interval)."""
    row: dict = {
        "task": task.name,
        "interval": task.interval,
        "start": task.start,
        "end": task.end,
        "assets": list(task.assets),
        "status": "scored",
        "reason": None,
        "leakage": None if model.cutoff is None else bool(model.cutoff > pd.Timestamp(task.start, tz="UTC")),
        "horizons": {},
    }
    if model.interval is not None and model.interval != task.interval:
        why = (
            f"the model's {task.interval} candles were not asked for (--interval {model.interval}); "
            f"--interval {task.interval} scores them"
            if task.interval in model.left_out
            else f"the model forecasts {', '.join(forecasts or [model.interval])} candles"
        )
        return {**row, "status": "skipped", "reason": why}, None
    series = [s for s in series if model.symbols is None or s.symbol in model.symbols]
    short = [s.symbol for s in series if len(s.train) < model.min_history]  # a context longer than the history
    series = [s for s in series if s.symbol not in short]
    row["assets_scored"], row["assets_short"] = [s.symbol for s in series], short
    if not series:
        why = (
            f"{', '.join(short)}: fewer than the model's {model.min_history} candles before {task.start}"
            if short
            else "none of the task's assets is in the model's universe"
        )
        return {**row, "status": "skipped", "reason": why}, None
    keep: dict = {}
    card = make_scorecard(
        series,
        forecast_fn,
        ScorecardSettings(
            interval=task.interval,
            horizons=task.horizons,
            stride=task.stride,
            n_samples=draws.n_samples,
            seed=draws.seed,
            n_boot=draws.n_boot,
            budget=budget,
        ),
        keep=keep,
        progress=lambda msg: say(f"[{task.name}] {msg}"),
    )
    if budget is not None:
        row["origins"] = card["origins"]  # the budget, and how the forecasts were drawn
    rows, part = _horizon_rows(task, card, keep)
    row["horizons"] = rows
    return row, part


def _horizon_rows(task: Task, card: dict, keep: dict) -> tuple[dict, dict]:
    """Per horizon: the task's row entries (CRPS, the best baseline, its skill, DM, MCS, coverage),
    and the per-date CRPS sums (model, best baseline) with the bootstrap block for the aggregate."""
    rows: dict = {}
    o, grid = keep["origins"], np.unique(keep["origins"].dates)
    sums = {}
    for h in task.horizons:
        hc = card["horizons"][str(h)]
        best = _best_baseline(hc)
        dm = hc["dm"]["crps"][best]
        rows[str(h)] = {
            "n": hc["n"],
            "n_dates": hc["n_dates"],
            "crps": hc["crps"],
            "best_baseline": best,
            "skill": hc["skill"]["crps"][best],
            "dm": {"p_value": dm["p_value"], "p_holm": dm["p_holm"], "verdict": dm["verdict"]},
            "mcs": hc["mcs"]["included"],
            "coverage": hc["coverage"]["model"],
        }
        ok = np.isfinite(o.y[h])
        at = np.searchsorted(grid, o.dates[ok])
        sums[h] = tuple(
            np.bincount(at, weights=keep["stats"][h][name]["crps"], minlength=len(grid)) for name in ("model", best)
        )
    return rows, {"sums": sums, "block": block_length(len(grid), max(task.horizons), keep["stride"])}


def aggregate_skill(parts: Sequence[dict], n_boot: int = 1000, seed: int = 0) -> dict:
    """1 - exp(mean over every (task, horizon) of log(sum CRPS_model / sum CRPS_best)), and its 95%
    interval: a circular block bootstrap of each task's origin dates, the same draw for all of the
    task's horizons (they share dates) and independent draws across tasks (the interval treats
    tasks as independent: their periods or assets differ).

    parts: per task {"sums": {H: (model, best) per-date CRPS sums on the task's date grid},
    "block": dates per bootstrap block}."""
    rng = np.random.default_rng(seed)
    logs, boots = [], []
    for part in parts:
        n_dates = len(next(iter(part["sums"].values()))[0])
        idx = block_bootstrap_indices(n_dates, part["block"], n_boot, rng)
        for m, b in part["sums"].values():
            logs.append(math.log(m.sum() / b.sum()))
            with np.errstate(invalid="ignore", divide="ignore"):
                boots.append(np.log(m[idx].sum(1) / b[idx].sum(1)))
    if not logs:
        return {"value": None, "ci95": None, "verdict": None, "units": 0}
    value = 1 - math.exp(float(np.mean(logs)))
    # a draw made only of dates without a forecast at some horizon (a short task's last dates at its
    # longest horizon) has no ratio there: such draws are left out rather than turn the interval NaN
    with np.errstate(invalid="ignore", divide="ignore"):
        draws = np.mean(boots, axis=0)
    draws = draws[np.isfinite(draws)]
    if len(draws) < n_boot // 2:
        return {"value": value, "ci95": None, "verdict": None, "units": len(logs)}
    lo, hi = np.percentile(1 - np.exp(draws), [2.5, 97.5])
    return {
        "value": value,
        "ci95": [float(lo), float(hi)],
        "verdict": verdict(float(lo), float(hi)),
        "units": len(logs),
    }


def run_benchmark(
    forecast_fn: ForecastFn,
    tasks: Sequence[Task],
    model: ModelView = ModelView(),
    draws: Draws = Draws(),
    *,
    progress: Optional[Callable[[str], None]] = None,
    series: Optional[Mapping[str, Sequence[AssetSeries]]] = None,
    more: Optional[Mapping[str, tuple[ForecastFn, ModelView]]] = None,
) -> dict:
    """The benchmark's result (a JSON-ready dict) for one forecaster.

    model: what the benchmark knows of the model (ModelView); more: a model of several intervals
    (data.intervals), its other intervals -> (forecaster, view): a task at one of them is scored
    by that one, so the model answers at each of its intervals; draws: samples, seeds and the
    budget (Draws). series: task name -> its series for tasks not on the sample
    (after_cutoff_task's); such a result is marked "task_set": "after-cutoff", "comparable":
    false, and only its tasks are held to draws.budget (the fixed tasks are scored whole, so their
    results compare). The sample's crypto series go by the model's pair of the same base
    (sample_aliases; "symbol_map")."""
    say = progress or (lambda _msg: None)
    own = dict(series or {})
    series_of = lambda task: list(own[task.name]) if task.name in own else task_series(task)  # noqa: E731
    at: dict[Optional[str], tuple[ForecastFn, ModelView]] = {model.interval: (forecast_fn, model)}
    at.update(more or {})
    views = [v for _, v in at.values()]
    known = None if any(v.symbols is None for v in views) else frozenset().union(*(v.symbols or () for v in views))
    aliases = sample_aliases([t for t in tasks if t.name not in own], known)
    rows, parts = [], []
    for task in tasks:
        say(f"task {task.name} ({task.interval}, {len(task.assets)} assets, from {task.start})")
        mine = [replace(s, symbol=aliases.get(s.symbol, s.symbol)) for s in series_of(task)]
        fn, view = at.get(task.interval, (forecast_fn, model))
        budget = draws.budget if task.name in own else None
        row, part = _score_task(task, fn, view, draws, say, mine, budget, [iv for iv in at if iv is not None])
        rows.append(row)
        if part is not None and row["leakage"] is not True:
            parts.append(part)
    agg = aggregate_skill(parts, draws.n_boot, draws.seed)
    agg.update(
        tasks=[r["task"] for r in rows if r["status"] == "scored" and r["leakage"] is not True],
        against="the best baseline (lowest CRPS) of each task and horizon",
        excluded={
            r["task"]: r["reason"] if r["status"] != "scored" else "leakage"
            for r in rows
            if r["status"] != "scored" or r["leakage"] is True
        },
    )
    fixed = not own
    return {
        "benchmark": BENCHMARK_NAME,
        "version": BENCHMARK_VERSION,
        "task_set": "fixed" if fixed else AFTER_CUTOFF,
        "comparable": fixed,
        "tasks_fingerprint": tasks_fingerprint(TASKS if fixed else tasks),
        "symbol_map": aliases,
        "samples": draws.n_samples,
        "seed": draws.seed,
        "data_cutoff": None if model.cutoff is None else model.cutoff.isoformat(),
        "tasks": rows,
        "aggregate": agg,
        "task_definitions": [asdict(t) for t in tasks],
    }


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def format_table(result: dict) -> str:
    """The result as a table a person reads: one line per task and horizon, then the aggregate."""
    head = (
        f"{'task':<12} {'int':<3} {'assets':>6} {'H':>3} {'n':>5} {'CRPS model':>10}  {'best baseline':<23} "
        f"{'skill [95% CI]':<26} {'DM (Holm)':<14} leakage"
    )
    lines = [
        f"Benchmark {result['benchmark']} v{result['version']} ({result['samples']} samples, seed "
        f"{result['seed']}; model data cut-off {result['data_cutoff'] or 'unknown'})"
    ]
    if result.get("task_set") == AFTER_CUTOFF:
        lines.append(
            "After-cutoff tasks, NOT the fixed ones: built from this run's own candles after its data "
            "cut-off, so not comparable across models"
        )
    if result.get("symbol_map"):
        lines.append(
            "The sample's series answered by the model's pair of the same base asset: "
            + ", ".join(f"{k} -> {v}" for k, v in result["symbol_map"].items())
        )
    lines.append(head)
    for r in result["tasks"]:
        leak = {None: "unknown", True: "LEAKED", False: "no"}[r["leakage"]]
        if r["status"] != "scored":
            lines.append(f"{r['task']:<12} {r['interval']:<3} {'-':>6} {'-':>3} {'-':>5} skipped: {r['reason']}")
            continue
        assets = f"{len(r['assets_scored'])}/{len(r['assets'])}"
        for h, hc in r["horizons"].items():
            s, best = hc["skill"], hc["best_baseline"]
            lines.append(
                f"{r['task']:<12} {r['interval']:<3} {assets:>6} {h:>3} {hc['n']:>5} "
                f"{hc['crps']['model']:>10.5f}  {BASELINE_NAMES.get(best, best):<14}{hc['crps'][best]:>9.5f} "
                f"{_pct(s['value']) + ' [' + _pct(s['ci95'][0]) + ', ' + _pct(s['ci95'][1]) + ']':<26} "
                f"{hc['dm']['verdict'] + ' (' + _p(hc['dm']['p_holm']) + ')':<14} {leak}"
            )
    a = result["aggregate"]
    if a["value"] is None:
        lines.append("Aggregate: n/a (no task scored without leakage)")
    else:
        lines.append(
            f"Aggregate over {a['units']} task-horizons of {', '.join(a['tasks'])}: CRPS skill vs the best "
            f"baseline {_pct(a['value'])} [{_pct(a['ci95'][0])}, {_pct(a['ci95'][1])}] ({a['verdict']})"
        )
    return "\n".join(lines)


def _p(p: Optional[float]) -> str:
    return "n/a" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"
