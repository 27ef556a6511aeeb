"""The benchmark's tasks: a fixed, versioned set of questions on the real series shipped in the
package (common.data.sample), and the task of the same scheme built from a run's own candles after
its data cut-off. Scoring them is common.evaluation.benchmark.

A task never changes once released: a change is a new BENCHMARK_VERSION, and the leaderboard
rows carry the version they were scored under (TASKS_FINGERPRINT holds each version to it).

A crypto model's ccxt pairs answer for the sample's Yahoo series of the same base asset
(BTC/USDT for BTC-USD: sample_aliases). A model whose cut-off covers every task it could answer
has no out-of-sample answer on them (check_answerable says so); after_cutoff_task builds a task
of the same scheme from the run's own candles after its cut-off instead: not a fixed task, so
not comparable across models.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import AbstractSet, Mapping, Optional, Sequence

import pandas as pd

from common.atomic import read_json_or_empty
from common.data.cleaning import clean_asset
from common.data.sample import load_sample, sample_assets
from common.errors import UserError
from common.evaluation.asset_series import AssetSeries
from common.forecasting.model_card import data_cutoff_of
from common.markets import interval_step
from common.run.files import DATA_INFO_JSON

__all__ = [
    "AFTER_CUTOFF",
    "BENCHMARK_NAME",
    "BENCHMARK_VERSION",
    "MIN_HISTORY",
    "TASKS",
    "TASKS_FINGERPRINT",
    "Task",
    "after_cutoff_task",
    "check_answerable",
    "choose_tasks",
    "data_cutoff",
    "known_assets",
    "sample_aliases",
    "task_scheme",
    "task_series",
    "tasks_fingerprint",
]

BENCHMARK_NAME = "marketgpt-sample"
# "2": version 1's tasks, judged against the best of the scorecard's five baselines (HAR-range and
# log-HAR added), so its aggregates do not compare with version 1's
BENCHMARK_VERSION = "2"
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


# Versions 1 and 2 (the same tasks). Spread over the sample's eras and markets; the later tasks lie after the quickstart
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
TASKS_FINGERPRINT = {"1": "b744905e5f04ac53", "2": "b744905e5f04ac53"}


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


def sample_aliases(tasks: Sequence[Task], symbols: Optional[AbstractSet[str]]) -> dict[str, str]:
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


def known_assets(task: Task, symbols: Optional[AbstractSet[str]], aliases: Mapping[str, str]) -> list[str]:
    """The task's assets the model can forecast, under the sample's names."""
    return [a for a in task.assets if symbols is None or a in symbols or a in aliases]


def check_answerable(
    tasks: Sequence[Task],
    *,
    symbols: Optional[AbstractSet[str]],
    intervals: Optional[Sequence[str]],
    cutoff: Optional[pd.Timestamp],
    chosen: bool = False,
) -> None:
    """A UserError, before any scoring, when no task can be scored out of sample: none has the
    model's interval and one of its assets, or the model's data cut-off is after the start of every
    one that has (it learned from or was selected on their periods: the aggregate would be empty).
    intervals: those the model is scored at (None: any)."""
    aliases = sample_aliases(tasks, symbols)
    fit = [t for t in tasks if (intervals is None or t.interval in intervals) and known_assets(t, symbols, aliases)]
    which = "chosen benchmark task" if chosen else "benchmark task"
    after = (
        "run `marketgpt benchmark MODEL --after-cutoff` to score the period after the cut-off from the run's "
        "own candles (a task set of its own, not comparable across models)"
    )
    if not fit:
        raise UserError(
            f"no {which} fits the model ({', '.join(intervals or ['any'])} candles of {len(symbols or ())} assets; "
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
    cut = data_cutoff_of(read_json_or_empty(folder / DATA_INFO_JSON))
    if cut is None:
        card = read_json_or_empty(folder / "model_card.json")
        cut = card.get("data_cutoff") or card.get("validation_end")
    return pd.Timestamp(cut) if cut else None
