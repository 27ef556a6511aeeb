"""`marketgpt benchmark`: a fixed, versioned set of evaluation tasks on the real series shipped in
the package (common.data.sample), scored like the scorecard, so that runs trained on different
data can be compared on the same questions.

    task (TASKS): an interval, assets of the sample, a cut-off date `start` and an `end`
      ──► each asset's cleaned candles (common.data.prepare.clean_asset) before `end`; the
          candles before `start` are the history and GARCH's fit, origins are every `stride`-th
          date in [start, end), targets must fall before `end`
      ──► common.evaluation.scorecard.make_scorecard on the assets the model knows: the same
          walk-forward, CRPS, block-bootstrap skill, Diebold-Mariano and MCS as the scorecard
      ──► per task and horizon: CRPS of the model and each baseline, skill against the best
          baseline; leakage when the run's data cut-off is after `start`
      ──► aggregate: 1 - geometric mean over (task, horizon) of CRPS_model / CRPS_best baseline,
          with a block-bootstrap 95% interval (dates resampled within each task), leaked tasks out

A task never changes once released: a change is a new BENCHMARK_VERSION, and the leaderboard
rows carry the version they were scored under.

A crypto model's ccxt pairs answer for the sample's Yahoo series of the same base asset
(BTC/USDT for BTC-USD: sample_aliases). A model whose cut-off covers every task it could answer
has no out-of-sample answer on them (check_answerable says so); after_cutoff_task builds a task
of the same scheme from the run's own candles after its cut-off instead: not a fixed task, so
not comparable across models.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from common.atomic import read_json_or_empty
from common.data.prepare import clean_asset
from common.data.sample import load_sample, sample_assets
from common.errors import UserError
from common.evaluation.asset_series import AssetSeries
from common.evaluation.metrics import block_bootstrap_indices, block_length, verdict
from common.evaluation.price_baselines import ForecastFn
from common.evaluation.scorecard import BASELINE_NAMES, make_scorecard
from common.forecasting.export import data_cutoff_of
from common.markets import interval_step

__all__ = [
    "AFTER_CUTOFF",
    "BENCHMARK_NAME",
    "BENCHMARK_VERSION",
    "TASKS",
    "TASKS_FINGERPRINT",
    "Task",
    "after_cutoff_task",
    "aggregate_skill",
    "check_answerable",
    "choose_tasks",
    "data_cutoff",
    "format_table",
    "run_benchmark",
    "sample_aliases",
    "task_scheme",
    "task_series",
    "tasks_fingerprint",
]

BENCHMARK_NAME = "marketgpt-sample"
BENCHMARK_VERSION = "1"
MIN_HISTORY = 250  # candles every task asset has before `start`: a context, volatility warm-up, GARCH's fit
AFTER_CUTOFF = "after-cutoff"  # the task set (and its one task's name) built from a run's own candles
QUOTE_ORDER = ("USD", "USDT", "USDC")  # which of a model's pairs of one base answers for the sample's series


@dataclass(frozen=True)
class Task:
    """One evaluation question: forecast these assets from `start` on, at these horizons."""

    name: str
    interval: str
    assets: tuple[str, ...]
    start: str  # the cut-off: the first origin date (UTC); nothing from it on is history
    end: str  # exclusive: no origin and no target at or after it
    horizons: tuple[int, ...]
    stride: int  # every stride-th candle date in [start, end) is an origin date
    about: str


# Version 1. Spread over the sample's eras and markets; the later tasks lie after the quickstart
# run's data cut-off (2017-03-10), the 2008 one inside it (a leakage example).
TASKS: tuple[Task, ...] = (
    Task(
        "us-2008",
        "1d",
        ("AAPL", "IBM", "MSFT", "^GSPC", "^IXIC"),
        "2008-06-02",
        "2009-06-01",
        (1, 5, 20),
        5,
        "US stocks and indices through the 2008 crash",
    ),
    Task(
        "us-2017",
        "1d",
        ("^GSPC", "^IXIC", "AMZN", "NVDA", "GOOGL"),
        "2017-06-01",
        "2018-06-01",
        (1, 5, 20),
        5,
        "US stocks and indices, a calm year then the February 2018 volatility spike",
    ),
    Task(
        "long-2023",
        "1d",
        ("NVDA", "005930.KS"),
        "2023-07-03",
        "2024-07-01",
        (1, 5, 20),
        5,
        "a US and a Korean chip maker, the AI rally",
    ),
    Task(
        "btc-2021",
        "1d",
        ("BTC-USD",),
        "2021-01-04",
        "2021-10-27",
        (1, 5, 20),
        5,
        "bitcoin's 2021 boom and crash, daily",
    ),
    Task("btc-1h-2021", "1h", ("BTC-USD",), "2021-11-15", "2021-12-29", (1, 6, 24), 12, "bitcoin, hourly candles"),
    Task("fx-1h-2017", "1h", ("EURUSD=X",), "2017-10-02", "2017-12-29", (1, 6, 24), 12, "EUR/USD, hourly candles"),
)

# version -> tasks_fingerprint(TASKS): a test fails when a task changes without a new version
TASKS_FINGERPRINT = {"1": "b744905e5f04ac53"}


def tasks_fingerprint(tasks: Sequence[Task]) -> str:
    """The first 16 hex digits of the SHA-256 of the tasks' definitions (sorted-key JSON)."""
    return hashlib.sha256(json.dumps([asdict(t) for t in tasks], sort_keys=True).encode()).hexdigest()[:16]


def choose_tasks(names: Optional[Sequence[str]]) -> list[Task]:
    """The named tasks (all by default); a UserError naming the known ones for any other name."""
    if not names:
        return list(TASKS)
    by_name = {t.name: t for t in TASKS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise UserError(
            f"unknown benchmark task {', '.join(unknown)}; version {BENCHMARK_VERSION} has {', '.join(by_name)}"
        )
    return [by_name[n] for n in dict.fromkeys(names)]


def task_series(task: Task) -> list[AssetSeries]:
    """The task's assets from the shipped sample, cleaned as training cleans them, cut at `end`:
    `train` the candles before `start`, `test` those from `start` on."""
    raw = load_sample(task.interval)
    assets = {a.symbol: a for a in sample_assets(task.interval)}
    end = pd.Timestamp(task.end, tz="UTC")
    out = []
    for symbol in task.assets:
        frame, _, why = clean_asset(assets[symbol], raw[symbol], interval_step(task.interval))
        if frame is None:
            raise ValueError(f"benchmark task {task.name}: {symbol} has no candles ({why})")
        out.append(_split_at(symbol, assets[symbol].category, frame[frame.index < end], task.start))
    return out


def _split_at(symbol: str, category: str, frame: pd.DataFrame, start: str | pd.Timestamp) -> AssetSeries:
    """An asset's candles as a task's series: `train` (the history) before `start`, `test` from it on."""
    i0 = int(frame.index.searchsorted(_utc(start)))
    return AssetSeries(symbol, category, frame, range(0, i0), range(i0, len(frame)))


def _utc(t: str | pd.Timestamp) -> pd.Timestamp:
    t = pd.Timestamp(t)
    return t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")


def _pair_base(symbol: str) -> Optional[str]:
    """A ccxt pair's base asset (BTC of BTC/USDT or BTC/USDT:USDT); None for any other symbol."""
    return symbol.split("/")[0].upper() if "/" in symbol else None


def _quote_rank(pair: str) -> tuple[int, str]:
    """USD-like quotes first (QUOTE_ORDER), then by name: the pair nearest a Yahoo -USD series."""
    quote = pair.split("/")[1].split(":")[0].upper()
    return (QUOTE_ORDER.index(quote) if quote in QUOTE_ORDER else len(QUOTE_ORDER), pair)


def sample_aliases(tasks: Sequence[Task], symbols: Optional[set]) -> dict[str, str]:
    """{sample symbol: model symbol} for the tasks' crypto series the model knows by another name:
    Yahoo's BTC-USD is the model's ccxt pair of base BTC (_quote_rank's first when it has several).
    Symbols the model has as they are need no alias."""
    symbols = symbols or set()
    pairs: dict[str, list[str]] = {}
    for symbol in symbols:
        if base := _pair_base(symbol):
            pairs.setdefault(base, []).append(symbol)
    if not pairs:
        return {}
    crypto = {(iv, a.symbol) for iv in {t.interval for t in tasks} for a in sample_assets(iv) if a.category == "crypto"}
    out = {}
    for task in tasks:
        for symbol in task.assets:
            base = symbol.rsplit("-", 1)[0].upper()  # Yahoo's crypto tickers: BASE-QUOTE
            if (task.interval, symbol) in crypto and symbol not in symbols and base in pairs:
                out[symbol] = min(pairs[base], key=_quote_rank)
    return out


def _known(task: Task, symbols: Optional[set], aliases: Mapping[str, str]) -> list[str]:
    """The task's assets the model can forecast, under the sample's names."""
    return [a for a in task.assets if symbols is None or a in symbols or a in aliases]


def check_answerable(
    tasks: Sequence[Task],
    *,
    symbols: Optional[set],
    interval: Optional[str],
    cutoff: Optional[pd.Timestamp],
    chosen: bool = False,
) -> None:
    """A UserError, before any scoring, when no task can be scored out of sample: none has the
    model's interval and one of its assets, or the model's data cut-off is after the start of every
    one that has (it learned from or was selected on their periods: the aggregate would be empty)."""
    aliases = sample_aliases(tasks, symbols)
    fit = [t for t in tasks if (interval is None or t.interval == interval) and _known(t, symbols, aliases)]
    which = "chosen benchmark task" if chosen else "benchmark task"
    after = (
        "run `marketgpt benchmark MODEL --after-cutoff` to score the period after the cut-off from the run's "
        "own candles (a task set of its own, not comparable across models)"
    )
    if not fit:
        raise UserError(
            f"no {which} fits the model ({interval or 'any'} candles of {len(symbols or ())} assets; "
            f"the tasks: {', '.join(f'{t.name} {t.interval}' for t in tasks)}); {after}"
        )
    if cutoff is not None and all(cutoff > _utc(t.start) for t in fit):
        last = max(fit, key=lambda t: _utc(t.start))
        raise UserError(
            f"the model's data cut-off {_stamp(cutoff)} is after the start of every {which} it can "
            f"answer ({', '.join(t.name for t in fit)}; the latest, {last.name}, starts {last.start}), "
            f"so none is out of sample: train with data.end_date before {last.start}, or {after}"
        )


def task_scheme(interval: str) -> tuple[tuple[int, ...], int]:
    """The fixed tasks' (horizons, stride) at `interval`: the scheme an after-cut-off task follows."""
    for t in TASKS:
        if t.interval == interval:
            return t.horizons, t.stride
    known = ", ".join(dict.fromkeys(t.interval for t in TASKS))
    raise UserError(
        f"--after-cutoff: the benchmark's tasks have no {interval} candles (only {known}), so there is "
        f"no horizons and origins scheme to follow at {interval}"
    )


def after_cutoff_task(
    histories: Mapping[str, tuple[str, pd.DataFrame]], interval: str, cutoff: pd.Timestamp
) -> tuple[Task, list[AssetSeries]]:
    """A task of the fixed tasks' scheme at `interval` (task_scheme) on a run's own candles after
    its data cut-off, and its series: start the cut-off (everything before it is the history, the
    baselines' fit included), end after the last candle; the assets with a candle past the
    longest horizon after the cut-off. histories: symbol -> (category, cleaned candles).
    A UserError when no asset has that."""
    horizons, stride = task_scheme(interval)
    series = [_split_at(symbol, category, frame, cutoff) for symbol, (category, frame) in histories.items()]
    after = [s for s in series if len(s.test)]
    if not after:
        last = max((s.candles.index[-1] for s in series if len(s.candles)), default=None)
        raise UserError(
            f"--after-cutoff: the run's {interval} candles end before its data cut-off {_stamp(cutoff)} "
            f"(the last is {'none' if last is None else _stamp(last)}): nothing after it to score "
            "(a downloaded case's `marketgpt data download` fetches newer candles)"
        )
    enough = [s for s in after if len(s.test) > max(horizons)]
    if not enough:
        raise UserError(
            f"--after-cutoff: at most {max(len(s.test) for s in after)} {interval} candles after the data "
            f"cut-off {_stamp(cutoff)}, fewer than the {max(horizons) + 1} the longest horizon needs"
        )
    end = max(s.candles.index[-1] for s in enough) + interval_step(interval)
    task = Task(
        AFTER_CUTOFF,
        interval,
        tuple(s.symbol for s in enough),
        _stamp(cutoff),
        _stamp(end),
        horizons,
        stride,
        "the model's own assets after its data cut-off, from its candle cache (not a fixed task)",
    )
    return task, enough


def _stamp(t: pd.Timestamp) -> str:
    """A UTC time as a task writes it: the date, with the time of day when it has one."""
    t = _utc(t)
    return t.strftime("%Y-%m-%d") if t == t.normalize() else t.strftime("%Y-%m-%dT%H:%M")


def data_cutoff(folder: str | Path) -> Optional[pd.Timestamp]:
    """The first date the model in `folder` has not learned from or been selected on: the latest
    test_start of its eras (data_info.json of a run; model_card.json's data_cutoff, or its
    validation_end for an export made before it, of a `marketgpt export` folder); None when not
    recorded."""
    folder = Path(folder)
    cut = data_cutoff_of(read_json_or_empty(folder / "data_info.json"))
    if cut is None:
        card = read_json_or_empty(folder / "model_card.json")
        cut = card.get("data_cutoff") or card.get("validation_end")
    return pd.Timestamp(cut) if cut else None


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
