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
from dataclasses import asdict, replace
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
from common.evaluation.scorecard import BASELINE_NAMES, make_scorecard

__all__ = ["aggregate_skill", "format_table", "run_benchmark"]


def _best_baseline(hc: dict) -> str:
    return min((name for name in hc["crps"] if name != "model"), key=lambda name: hc["crps"][name])


def _score_task(
    task: Task,
    forecast_fn: ForecastFn,
    symbols: Optional[set],
    interval: Optional[str],
    cutoff: Optional[pd.Timestamp],
    min_history: int,
    n_samples: int,
    seed: int,
    n_boot: int,
    say: Callable[[str], None],
    series_of: Callable[[Task], list[AssetSeries]],
    aliases: Mapping[str, str],
    budget: Optional[int] = None,
) -> tuple[dict, Optional[dict]]:
    """The task's row, and its per-date CRPS sums (model, best baseline) per horizon for the aggregate.
    aliases: sample symbol -> the model's name for it (sample_aliases); its series go by that name.
    budget: at most this many (asset, origin) forecasts (make_scorecard's)."""
    row: dict = {
        "task": task.name,
        "interval": task.interval,
        "start": task.start,
        "end": task.end,
        "assets": list(task.assets),
        "status": "scored",
        "reason": None,
        "leakage": None if cutoff is None else bool(cutoff > pd.Timestamp(task.start, tz="UTC")),
        "horizons": {},
    }
    if interval is not None and interval != task.interval:
        return {**row, "status": "skipped", "reason": f"the model forecasts {interval} candles"}, None
    series = [replace(s, symbol=aliases.get(s.symbol, s.symbol)) for s in series_of(task)]
    series = [s for s in series if symbols is None or s.symbol in symbols]
    short = [s.symbol for s in series if len(s.train) < min_history]  # a context longer than the history
    series = [s for s in series if s.symbol not in short]
    row["assets_scored"], row["assets_short"] = [s.symbol for s in series], short
    if not series:
        why = (
            f"{', '.join(short)}: fewer than the model's {min_history} candles before {task.start}"
            if short
            else "none of the task's assets is in the model's universe"
        )
        return {**row, "status": "skipped", "reason": why}, None
    keep: dict = {}
    card = make_scorecard(
        series,
        forecast_fn,
        interval=task.interval,
        horizons=task.horizons,
        stride=task.stride,
        n_samples=n_samples,
        seed=seed,
        n_boot=n_boot,
        keep=keep,
        budget=budget,
        progress=lambda msg: say(f"[{task.name}] {msg}"),
    )
    if budget is not None:
        row["origins"] = card["origins"]  # the budget, and how the forecasts were drawn
    o, grid = keep["origins"], np.unique(keep["origins"].dates)
    sums = {}
    for h in task.horizons:
        hc = card["horizons"][str(h)]
        best = _best_baseline(hc)
        dm = hc["dm"]["crps"][best]
        row["horizons"][str(h)] = {
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
    return row, {"sums": sums, "block": block_length(len(grid), max(task.horizons), keep["stride"])}


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
    *,
    symbols: Optional[set] = None,
    interval: Optional[str] = None,
    cutoff: Optional[pd.Timestamp] = None,
    min_history: int = 0,
    n_samples: int = 100,
    seed: int = 0,
    n_boot: int = 1000,
    progress: Optional[Callable[[str], None]] = None,
    series: Optional[Mapping[str, Sequence[AssetSeries]]] = None,
    budget: Optional[int] = None,
) -> dict:
    """The benchmark's result (a JSON-ready dict) for one forecaster.

    symbols: the assets the model can forecast (None: any); interval: its candle length (None:
    any), tasks of another interval are skipped; cutoff: its data cut-off (data_cutoff), None
    when unknown (leakage then null); min_history: the candles a history needs (a task's assets
    with fewer before `start` are left out, named in assets_short). series: task name -> its
    series for tasks not on the sample (after_cutoff_task's); such a result is marked
    "task_set": "after-cutoff", "comparable": false. The sample's crypto series go by the
    model's pair of the same base (sample_aliases; "symbol_map"). budget: at most this many
    (asset, origin) forecasts in each task of `series` (a run's 600 assets over years); the fixed
    tasks are scored whole, so their results compare."""
    say = progress or (lambda _msg: None)
    own = dict(series or {})
    series_of = lambda task: list(own[task.name]) if task.name in own else task_series(task)  # noqa: E731
    aliases = sample_aliases([t for t in tasks if t.name not in own], symbols)
    rows, parts = [], []
    for task in tasks:
        say(f"task {task.name} ({task.interval}, {len(task.assets)} assets, from {task.start})")
        row, part = _score_task(
            task,
            forecast_fn,
            symbols,
            interval,
            cutoff,
            min_history,
            n_samples,
            seed,
            n_boot,
            say,
            series_of,
            aliases,
            budget if task.name in own else None,
        )
        rows.append(row)
        if part is not None and row["leakage"] is not True:
            parts.append(part)
    agg = aggregate_skill(parts, n_boot, seed)
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
        "samples": n_samples,
        "seed": seed,
        "data_cutoff": None if cutoff is None else cutoff.isoformat(),
        "tasks": rows,
        "aggregate": agg,
        "task_definitions": [asdict(t) for t in tasks],
    }


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def format_table(result: dict) -> str:
    """The result as a table a person reads: one line per task and horizon, then the aggregate."""
    head = (
        f"{'task':<12} {'int':<3} {'assets':>6} {'H':>3} {'n':>5} {'CRPS model':>10}  {'best baseline':<18} "
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
                f"{hc['crps']['model']:>10.5f}  {BASELINE_NAMES.get(best, best):<9}{hc['crps'][best]:>9.5f} "
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
