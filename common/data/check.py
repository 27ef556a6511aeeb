"""`marketgpt data check`: which cached assets training under a config would use, and why not the others.

`check_usable` runs training's own loading and cleaning (common.data.loading,
common.data.prepare) on the cache, without the network, asset by asset: an asset with fewer
candles before the first split cut than a context window is not usable. Memory holds one
asset's candles (prepare_streamed), whatever the corpus' size; a token shard already prepared
from the same inputs answers without reading a candle. `marketgpt data download` runs it after
each download and writes the result to <cache>/training_check.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, TextIO

import numpy as np
import pandas as pd

from common.atomic import read_json
from common.config import Config, DataConfig
from common.data.cleaning import clean_asset, real_rows
from common.data.loading import load_market_data
from common.data.market_data import LazyFrames, MarketData
from common.data.prepare import EVAL_MIN_CANDLES, PreparedData, drop_kind, split_data
from common.data.universe import load_universe, universe_as_of, universe_path
from common.errors import UserError
from common.markets import INTERVAL_SECONDS, interval_step, split_series
from common.run.files import DATA_INFO_JSON
from common.tokens.shard_paths import shard_folder
from common.tokens.token_set import read_index

__all__ = [
    "Usability",
    "breakdown",
    "check_usable",
    "format_breakdown",
    "left_out",
    "prepare_streamed",
    "print_left_out",
    "prepared_rows",
    "shard_summary",
]


@dataclass
class Usability:
    """Which cached assets training under a config would use, and why the others would not."""

    case_dir: Path
    interval: str
    context_length: int
    total: int
    usable: list[str]
    unusable: dict[str, str]  # symbol -> why, universe order
    problem: str | None = None  # why nothing is usable, when nothing is
    fixes: dict[str, int] = field(default_factory=dict)  # cleaning fixes over the usable assets
    universe_as_of: str | None = None
    universe_file: str | None = None  # the universe read (with data.universe = "exchange": the newest dated one)
    by: dict = field(default_factory=dict)  # the usable series' candles per interval and category (breakdown)

    def format(self) -> str:
        lines = [
            f"Usable for training ({self.interval}, context {self.context_length}): "
            f"{len(self.usable)} of {self.total} assets"
        ]
        if self.problem:
            lines.append(f"  none: {self.problem}")
        if self.unusable:
            lines.append("  not usable:")
            lines += [f"    {symbol}: {why}" for symbol, why in self.unusable.items()]
        lines += format_breakdown(self.by)
        repaired = {k: v for k, v in self.fixes.items() if v}
        if repaired:
            lines.append("  cleaning: " + ", ".join(f"{k} {v}" for k, v in repaired.items()))
        if self.universe_as_of:
            lines.append(
                f"  universe {self.universe_file} as of {self.universe_as_of}: today's constituents trained on "
                "past data (survivorship bias: assets that failed or were delisted before then are absent)"
            )
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "case": self.case_dir.name,
            "interval": self.interval,
            "context_length": self.context_length,
            "assets": self.total,
            "usable": len(self.usable),
            "usable_symbols": self.usable,
            "not_usable": self.unusable,
            "problem": self.problem,
            "fixes": self.fixes,
            "universe_as_of": self.universe_as_of,
            "universe_file": self.universe_file,
            "by": self.by,
            "checked_at": pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds"),
        }


def check_usable(cfg: Config, case_dir: Path) -> Usability:
    """Run training's own loading and preparation on the cache (no network) and report the result."""
    case_dir = Path(case_dir)
    if cfg.data.source != "files":  # the cache, even under a config that trains on the sample
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source="download"))
    d = cfg.data
    listed = d.universe != "files"  # data.universe = "files": the files are the universe
    universe = universe_path(case_dir, d.universe, d.exchange) if listed else None  # "exchange": the newest
    assets = load_universe(universe, d.universe_counts or None) if universe else []
    result = Usability(
        case_dir=case_dir,
        interval=d.interval,
        context_length=cfg.model.context_length,
        total=len(assets),
        usable=[],
        unusable={},
        universe_as_of=universe_as_of(universe) if universe else None,
        universe_file=universe.name if universe else None,
    )
    shard = shard_summary(cfg, case_dir)
    if shard is not None:  # prepared from these very files: its data_info.json says it all
        info = shard.info
        result.usable = list(info["assets"])
        result.unusable = {r["symbol"]: r["reason"] for r in info["dropped"]}
        result.total = len(result.usable) + len(result.unusable)
        result.fixes = dict(info["totals"]["fixes"])
        result.by = breakdown(shard.rows)
        return result
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # loading's "left out" warning: reported below
            market = load_market_data(d, case_dir)
            result.total = len(market.assets)
            prepared = prepare_streamed(d, cfg.model.context_length, market)
    except UserError as e:
        result.problem = str(e)
        return result
    result.usable = [a.symbol for a in prepared.assets]
    result.unusable = dict(prepared.dropped)
    result.fixes = dict(prepared.info["totals"]["fixes"])
    result.by = breakdown(prepared_rows(prepared, d.interval, bool(d.intervals)))
    return result


def prepare_streamed(d: DataConfig, context_length: int, market: MarketData) -> PreparedData:
    """prepare_data's assets, splits, drops and data_info, holding one asset's candles at a time.

    Each asset is read and cleaned in turn; its cleaned timestamps wait in a temporary folder
    for the split (common.data.prepare.split_data reads them from there, asset by asset). The
    cleaned candles themselves are not kept: the result's `candles` is empty."""
    files: dict[str, Path] = {}
    records: dict[str, dict[str, Any]] = {}
    dropped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="marketgpt-stamps-") as tmp:
        for i, asset in enumerate(market.assets):
            s = asset.symbol
            step = interval_step(market.interval_of(s))  # a series' own interval (data.intervals)
            frame, records[s], why = clean_asset(
                asset, market.candles[s], step, reader_fixes=market.fixes.get(s), file=market.files.get(s)
            )
            if frame is None:
                assert why is not None  # clean_asset gives the reason with every dropped asset
                dropped[s] = why
                continue
            files[s] = Path(tmp) / f"{i:06d}.npz"
            np.savez(files[s], ts=frame.index.asi8, real=real_rows(frame))
            del frame  # not alive while the next asset is read

        def stamps(s: str) -> np.ndarray:
            with np.load(files[s]) as z:
                return z["ts"]

        def real(s: str) -> np.ndarray:  # the real candles' stamps (not the rows fill_gaps added)
            with np.load(files[s]) as z:
                return z["ts"][z["real"]]

        symbols = list(files)
        return split_data(
            d,
            context_length,
            market.assets,
            market.interval,
            LazyFrames(symbols, stamps),
            LazyFrames(symbols, real),
            records,
            dropped,
            LazyFrames([], stamps),
        )


@dataclass
class ShardSummary:
    """What a prepared token shard says of its corpus, read from its JSON files alone."""

    folder: Path
    info: dict  # its data_info.json
    rows: list["Row"]  # per series: (asset, interval, category, (train, val, test) candles)


def shard_summary(cfg: Config, case_dir: Path) -> Optional[ShardSummary]:
    """The config's prepared token shard (common.tokens.shards), if there is one: made from the
    same settings and the same input files (sizes and time stamps), so its counts are exact."""
    try:
        folder, _ = shard_folder(cfg, case_dir)
    except (OSError, UserError):  # no universe or files to key it by: no shard either
        return None
    if not (folder / "manifest.json").is_file():
        return None
    try:
        index = read_index(folder / "tokens")
        info = read_json(folder / DATA_INFO_JSON)
    except (OSError, ValueError, UserError):
        return None  # a damaged shard: counted from the candles instead
    d = cfg.data
    rows = [
        (
            *(split_series(s) if d.intervals else (s, d.interval)),
            info["assets"][s]["category"],
            tuple(int(hi) - int(lo) for lo, hi in ranges),
        )
        for s, ranges in zip(index["symbols"], index["ranges"])
    ]
    return ShardSummary(folder, info, rows)


# one row per series: (asset symbol, interval, category, (train, val, test) candles)
Row = tuple[str, str, str, tuple[int, int, int]]


def prepared_rows(prepared, interval: str, several: bool) -> list[Row]:
    """The rows of a PreparedData's kept series; several: their names carry their interval."""
    return [
        (
            *(split_series(a.symbol) if several else (a.symbol, interval)),
            a.category,
            tuple(len(getattr(prepared.splits[a.symbol], name)) for name in ("train", "val", "test")),
        )
        for a in prepared.assets
    ]


def breakdown(rows: list[Row]) -> dict:
    """{"interval": {...}, "category": {...}}: per interval and per category the series, the
    candles of all splits (= tokens) and the training, validation and test tokens, in interval
    and first-seen order."""
    out: dict = {"interval": {}, "category": {}}
    for _, interval, category, (train, val, test) in sorted(rows, key=lambda r: INTERVAL_SECONDS[r[1]]):
        for by, key in (("interval", interval), ("category", category)):
            row = out[by].setdefault(
                key, {"series": 0, "candles": 0, "train_tokens": 0, "val_tokens": 0, "test_tokens": 0}
            )
            row["series"] += 1
            row["candles"] += train + val + test
            row["train_tokens"] += train
            row["val_tokens"] += val
            row["test_tokens"] += test
    return out


def format_breakdown(by: dict, parameters: int | None = None) -> list[str]:
    """Lines of a breakdown (nothing for an empty one); parameters: also train tokens per parameter."""
    lines = []
    for what in ("interval", "category"):
        if not by.get(what):
            continue
        lines.append(
            f"  per {what}: series, candles (= tokens) of all splits, training tokens"
            + (", training tokens per parameter" if parameters else "")
        )
        for key, r in by[what].items():
            per = f", {r['train_tokens'] / parameters:.3g} per parameter" if parameters else ""
            lines.append(
                f"    {key:<10} {r['series']:>5} series {r['candles']:>14,} candles {r['train_tokens']:>14,} train{per}"
            )
    return lines


# --------------------------------------------------------------------------- what was left out

_NAMED = 5  # symbols named per line of the summary; the rest are counted


def _names(symbols: list[str]) -> str:
    return ", ".join(symbols[:_NAMED]) + (f" and {len(symbols) - _NAMED} more" if len(symbols) > _NAMED else "")


def _per_category(categories: list[str]) -> str:
    return ", ".join(f"{c} {n}" for c, n in Counter(categories).items())


def left_out(info: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """What preparation left out, from data_info.json (PreparedData.info): (summary lines, warnings).

    The lines count the dropped assets (series, with data.intervals) per reason and category and
    name the first few, then the kept ones without validation or test windows: a few lines for
    600 assets. A warning for each category or interval that lost all its series, or all its
    validation or test windows. Nothing when nothing was left out."""
    several = bool(info.get("intervals"))
    noun = "series" if several else "assets"
    window = info["context_length"] + 1
    kept, dropped = info["assets"], info["dropped"]
    lines = []
    if dropped:
        lines.append(
            f"Left out: {len(dropped)} of {len(kept) + len(dropped)} {noun} "
            '(each one\'s reason: "dropped" in data_info.json)'
        )
        kinds: dict[str, list[dict]] = {}
        for d in dropped:
            kinds.setdefault(drop_kind(d["reason"], window), []).append(d)
        lines += [
            f"  {len(ds)} with {kind}: {_per_category([d['category'] for d in ds])}; "
            f"{_names([d['symbol'] for d in ds])}"
            for kind, ds in kinds.items()
        ]
    for split, word in (("val", "validation"), ("test", "test")):
        short = [s for s, r in kept.items() if split in r.get("no_windows_in", ())]
        if short:
            lines.append(
                f"No {word} windows in {len(short)} of {len(kept)} kept {noun} ({_too_few(split, word)} "
                "after the purge gap): "
                f"{_per_category([kept[s]['category'] for s in short])}; {_names(short)}"
            )
    return lines, _lost_groups(info, noun)


def print_left_out(info: Mapping[str, Any], out: Optional[TextIO] = None) -> None:
    """left_out's lines, then its warnings, one a line: what `marketgpt train` and `data prepare`
    print (`marketgpt plan` prints the same lines in its figures, its warnings at its end)."""
    lines, warnings = left_out(info)
    for line in lines + warnings:
        print(line, file=out or sys.stdout)


def _too_few(split: str, word: str) -> str:
    need = EVAL_MIN_CANDLES[split]
    return f"no {word} candle" if need == 1 else f"fewer than {need} {word} candles"


def _lost_groups(info: Mapping[str, Any], noun: str) -> list[str]:
    """A warning for all the data, each category, interval, or category at an interval whose
    series were all dropped, or none of which has a validation (or test) window; not repeated
    for the parts of a group already named."""
    several = bool(info.get("intervals"))
    series = [(s, r["category"], True) for s, r in info["assets"].items()] + [
        (d["symbol"], d["category"], False) for d in info["dropped"]
    ]
    groups: dict[tuple[str, ...], list[tuple[str, bool]]] = {}
    for symbol, category, is_kept in series:
        keys = [("all",), ("category", category)]
        if several:
            interval = split_series(symbol)[1]
            keys += [("interval", interval), ("category", category, interval)]
        for key in keys:
            groups.setdefault(key, []).append((symbol, is_kept))
    # group -> (what it lost: 0 every series, 1 its validation windows, 2 its test windows only; the words)
    lost: dict[tuple[str, ...], tuple[int, str]] = {}
    for key, members in groups.items():
        mine = [info["assets"][s] for s, is_kept in members if is_kept]
        if not mine:
            lost[key] = 0, f"{len(members)} of {len(members)} {noun} left out: the run neither trains nor tests on it"
            continue
        lacking = [
            word
            for split, word in (("val", "validation"), ("test", "test"))
            if all(split in r.get("no_windows_in", ()) for r in mine)
        ]
        if lacking:
            lost[key] = (
                1 if "validation" in lacking else 2,
                f"none of {len(mine)} kept {noun} has a {' or '.join(lacking)} window",
            )
    warnings = []
    for key, (rank, what) in sorted(lost.items(), key=lambda kv: (len(kv[0]), kv[0][0] != "interval")):
        parents = [] if key == ("all",) else [("all",)] + ([key[:2], ("interval", key[2])] if len(key) == 3 else [])
        if any(p in lost and lost[p][0] <= rank for p in parents):
            continue  # said of the whole it is part of
        name = (
            f"all {noun}" if key == ("all",) else " ".join(key) if len(key) == 2 else f"category {key[1]} at {key[2]}"
        )
        warnings.append(f'WARNING: {name}: {what} (see "dropped" and "no_windows_in" in data_info.json)')
    return warnings
