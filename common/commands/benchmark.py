"""`marketgpt benchmark MODEL`: the fixed benchmark tasks (common.evaluation.benchmark) for a run
folder or a `marketgpt export --format hf` folder.

    marketgpt benchmark MODEL [--tasks us-2017,long-2023 | --after-cutoff] [--interval 1h] [--samples 100]
                              [--seed 0] [--device cpu] [--json] [--leaderboard PATH | --no-leaderboard]

A model of several intervals (data.intervals) answers each task at the task's own interval, every
one of its intervals that a task has (a line on stderr says which); --interval scores one of them
alone, and the rows of its other intervals say how to score them.

Writes MODEL/benchmark.json (atomically), prints the table (or, with --json, the same JSON for jq)
on stdout and progress on stderr, and appends one line to the leaderboard file (JSON lines,
default benchmark_leaderboard.jsonl in the repo root; one write of the whole line in append mode,
so concurrent benchmarks never interleave their lines). A model whose data cut-off covers every
task it could answer is refused before any scoring (one line, exit 2).

--after-cutoff: one task of the same scheme on the run's own candles after its data cut-off
(common.evaluation.benchmark.after_cutoff_task), written to MODEL/benchmark_after_cutoff.json and
never to the leaderboard (its tasks are the run's own, not comparable across models). It is
scored at one interval: --interval, else the model's first (a line names it and the others).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from common.atomic import atomic_write_json, read_json
from common.commands.scorecard import parse_device  # the scorecard's --device rule
from common.errors import UserError
from common.evaluation.asset_series import LazyCandles
from common.evaluation.benchmark import Draws, ModelView, format_table, run_benchmark
from common.evaluation.benchmark_tasks import after_cutoff_task, check_answerable, choose_tasks, data_cutoff
from common.evaluation.scorecard import forecaster_fn
from common.forecasting.forecaster import Forecaster
from common.forecasting.history import history_loader
from common.paths import REPO_ROOT
from common.run.files import BEST_MODEL_PT

__all__ = [
    "AFTER_CUTOFF_BUDGET",
    "AFTER_CUTOFF_JSON",
    "BENCHMARK_JSON",
    "DEFAULT_LEADERBOARD",
    "BenchmarkRequest",
    "append_line",
    "run_benchmark_command",
]

BENCHMARK_JSON = "benchmark.json"
AFTER_CUTOFF_JSON = "benchmark_after_cutoff.json"  # beside, never over, the fixed tasks' result
AFTER_CUTOFF_BUDGET = 2000  # (asset, origin) forecasts of --after-cutoff's task: 600 assets x years would take hours
DEFAULT_LEADERBOARD = REPO_ROOT / "benchmark_leaderboard.jsonl"


@dataclass(frozen=True)
class BenchmarkRequest:
    """What `marketgpt benchmark` was asked for (the flags' defaults are common.cli's)."""

    model_dir: Path  # a run folder (best_model.pt) or an hf export folder
    tasks: Optional[Sequence[str]] = None  # None: every task of the version
    samples: int = 100
    seed: int = 0
    device: str = "cpu"
    precision: str = "auto"
    as_json: bool = False
    leaderboard: Optional[Path] = None  # None: DEFAULT_LEADERBOARD
    append: bool = True  # False: no leaderboard line
    after_cutoff: bool = False  # a task from the run's own candles after its cut-off instead of the fixed ones
    budget: Optional[int] = None  # --after-cutoff's forecasts at most (None: AFTER_CUTOFF_BUDGET)
    interval: Optional[str] = None  # one of a multi-interval model's intervals; None: each task at its own


def append_line(path: Path, record: dict) -> None:
    """One JSON line appended with a single write in O_APPEND mode (never interleaved with another
    writer's line, never a partial line left by this one short of a crash mid-write), then fsync."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(f"short write to {path}")
        os.fsync(fd)
    finally:
        os.close(fd)


def leaderboard_record(result: dict, model_dir: Path, checkpoint_sha256: Optional[str]) -> dict:
    """The leaderboard's line: who, when, the aggregate and each task's skill per horizon."""
    return {
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "benchmark": result["benchmark"],
        "version": result["version"],
        "model": str(model_dir.resolve()),
        "checkpoint_sha256": checkpoint_sha256,
        "samples": result["samples"],
        "seed": result["seed"],
        "data_cutoff": result["data_cutoff"],
        "aggregate": {k: result["aggregate"][k] for k in ("value", "ci95", "verdict", "units", "tasks")},
        "tasks": {
            r["task"]: {
                "leakage": r["leakage"],
                "status": r["status"],
                "skill": {h: hc["skill"]["value"] for h, hc in r["horizons"].items()},
                "crps": {h: hc["crps"] for h, hc in r["horizons"].items()},
            }
            for r in result["tasks"]
        },
    }


def run_benchmark_command(req: BenchmarkRequest) -> int:
    """`marketgpt benchmark`: the table (or JSON) on stdout, progress on stderr."""
    tasks = _checked_tasks(req)  # --after-cutoff: its own task, below
    leaderboard = Path(req.leaderboard or DEFAULT_LEADERBOARD) if req.append and not req.after_cutoff else None
    model_dir = Path(req.model_dir)
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: no such folder; pass a run folder or a `marketgpt export --format hf` folder")
    device = parse_device(req.device)
    forecaster = Forecaster.from_run(model_dir, device=device, precision=req.precision, interval=req.interval)
    trained = list(forecaster.info.intervals) or [forecaster.interval]
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    cutoff = data_cutoff(model_dir)
    own, more = None, {}
    left_out = tuple(iv for iv in trained if iv != forecaster.interval) if req.interval or req.after_cutoff else ()
    if left_out:
        say(
            f"the model forecasts {', '.join(trained)} candles; scoring its {forecaster.interval} candles "
            f"(--interval {' or '.join(left_out)} scores another)"
        )
    if req.after_cutoff:
        task, series = after_cutoff_task(_own_candles(forecaster, model_dir, cutoff), forecaster.interval, cutoff)
        tasks, own = [task], {task.name: series}
    else:
        if len(trained) > 1 and not req.interval:
            say(f"the model forecasts {', '.join(trained)} candles: each task is scored at its own interval")
            wanted = {t.interval for t in tasks} & set(trained[1:])
            for iv in (iv for iv in trained[1:] if iv in wanted):  # the first is `forecaster`
                other = Forecaster.from_run(model_dir, device=device, precision=req.precision, interval=iv)
                more[iv] = (forecaster_fn(other), _view(other, cutoff))
        check_answerable(
            tasks,
            symbols=set(forecaster.symbols),
            intervals=[forecaster.interval, *more],
            cutoff=cutoff,
            chosen=req.tasks is not None,
        )
    result = run_benchmark(
        forecaster_fn(forecaster),
        tasks,
        _view(forecaster, cutoff, left_out),
        Draws(req.samples, req.seed, budget=req.budget or AFTER_CUTOFF_BUDGET),
        progress=say,
        series=own,
        more=more,
    )
    if result["aggregate"]["value"] is None:  # e.g. every asset's history shorter than the model's context
        raise UserError(
            "no task could be scored: " + "; ".join(f"{k}: {v}" for k, v in result["aggregate"]["excluded"].items())
        )
    result["model"] = {
        "path": str(model_dir),
        "checkpoint_sha256": forecaster.checkpoint_sha256,
        "interval": forecaster.interval,
        "intervals": [forecaster.interval, *more],  # the intervals it was scored at
        "precision": forecaster.precision,
    }
    out = model_dir / (AFTER_CUTOFF_JSON if req.after_cutoff else BENCHMARK_JSON)
    result = _write_results(result, out, leaderboard, model_dir, forecaster.checkpoint_sha256)
    _print_results(req, result, out, leaderboard)
    return 0


def _view(forecaster: Forecaster, cutoff: Optional[pd.Timestamp], left_out: tuple[str, ...] = ()) -> ModelView:
    """What the benchmark knows of the model at the forecaster's interval: the assets with a series
    there (all of them for a model of one interval)."""
    return ModelView(
        frozenset(_symbols_at(forecaster)), forecaster.interval, cutoff, forecaster.min_history(), left_out
    )


def _symbols_at(forecaster: Forecaster) -> list[str]:
    """The assets with a series at the forecaster's interval (every asset of a run of one interval)."""
    info = forecaster.info
    there = set(info.interval_series(forecaster.interval).values()) if info.intervals else None
    return [s for s in forecaster.symbols if there is None or s in there]


def _checked_tasks(req: BenchmarkRequest) -> list:
    """The fixed tasks the request chose (none for --after-cutoff), once its flags are checked."""
    if req.after_cutoff and req.tasks:
        raise UserError("--after-cutoff builds its own task from the run's candles; leave out --tasks")
    tasks = [] if req.after_cutoff else choose_tasks(req.tasks)  # --after-cutoff: its own task, built later
    if req.budget is not None and (not req.after_cutoff or req.budget < 1):
        raise UserError(
            f"--budget {req.budget}: "
            + (
                "must be at least 1"
                if req.after_cutoff
                else "applies to --after-cutoff only; the fixed tasks are scored whole, so their results compare"
            )
        )
    if req.samples < 2:
        raise UserError(f"--samples {req.samples}: must be at least 2")
    return tasks


def _write_results(
    result: dict, out: Path, leaderboard: Optional[Path], model_dir: Path, checkpoint_sha256: Optional[str]
) -> dict:
    """Write the result to `out` (and a leaderboard line) and return it as read back: plain JSON types."""
    try:
        atomic_write_json(out, result)
        result = read_json(out)  # plain JSON types: stdout prints what the file holds
        if leaderboard is not None:
            append_line(leaderboard, leaderboard_record(result, model_dir, checkpoint_sha256))
    except OSError as e:
        raise UserError(
            f"cannot write the benchmark's results ({e.strerror or e}); check the folder's "
            "permissions or pass --leaderboard PATH"
        ) from None
    return result


def _print_results(req: BenchmarkRequest, result: dict, out: Path, leaderboard: Optional[Path]) -> None:
    """The table (or JSON) on stdout, then where it was written."""
    print(json.dumps(result, indent=2) if req.as_json else format_table(result))
    if not req.as_json:
        where = (
            f" and appended a line to {leaderboard}"
            if leaderboard is not None
            else " (no leaderboard line: after-cutoff tasks are not comparable across models)"
            if req.after_cutoff
            else ""
        )
        print(f"Wrote {out}{where}")


def _own_candles(
    forecaster: Forecaster, model_dir: Path, cutoff: Optional[pd.Timestamp]
) -> dict[str, tuple[str, LazyCandles]]:
    """symbol -> (category, cleaned candles, read when used) of every asset of the run, from its
    own data source, the whole cache: data.end_date lifted (the candles after it are after the
    cut-off too)."""

    if cutoff is None:
        raise UserError(
            f"--after-cutoff: {model_dir} records no data cut-off (data_info.json's split_cuts, or "
            "model_card.json's data_cutoff), so there is no period after it to score"
        )
    cfg = forecaster.cfg
    if cfg.data.source in ("download", "files") and not (model_dir / BEST_MODEL_PT).is_file():
        raise UserError(
            f"--after-cutoff: {model_dir} is an export; pass its run folder, whose case holds the "
            f"{cfg.data.source} candles it was trained on"
        )
    data = replace(cfg.data, end_date=None)
    symbols = _symbols_at(forecaster)  # a run of several intervals: those with candles at this one
    categories = {s: forecaster.assets[s].category for s in symbols}
    # read when used, a few kept: the whole cache of a 10^8-candle run does not fit a process
    load = history_loader(data, model_dir, categories, None, forecaster.interval)
    recent: OrderedDict[str, pd.DataFrame] = OrderedDict()
    return {
        symbol: (categories[symbol], LazyCandles(symbol, functools.partial(load, symbol), recent)) for symbol in symbols
    }
