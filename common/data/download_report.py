"""What a download shows: progress while it runs, and the summary at the end.

`DownloadSummary` holds one `AssetResult` per asset of the universe (status ok | empty | failed |
unreachable | inactive) and formats the summary `marketgpt data download` prints; `Progress` is a
tqdm bar on a terminal and plain lines otherwise (a Slurm log, a pipe).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import pandas as pd
from tqdm import tqdm

from common.data.check import Usability

__all__ = ["AssetResult", "DownloadSummary", "Progress", "format_day", "resume_from"]


@dataclass
class AssetResult:
    symbol: str
    source: str
    status: str = "pending"  # ok | empty | failed | unreachable | inactive
    rows_added: int = 0
    reason: str = ""
    first: pd.Timestamp | None = None  # cached range after this run
    last: pd.Timestamp | None = None


@dataclass
class DownloadSummary:
    case_dir: Path
    interval: str
    cache_dir: Path
    assets: dict[str, AssetResult] = field(default_factory=dict)  # universe order
    unavailable: dict[str, str] = field(default_factory=dict)  # source name -> why
    refused: dict[str, str] = field(default_factory=dict)  # source name -> why (a user error: e.g. location)
    notes: list[str] = field(default_factory=list)
    usable: Usability | None = None  # set after the download

    def with_status(self, status: str) -> list[AssetResult]:
        return [a for a in self.assets.values() if a.status == status]

    @property
    def ok(self) -> list[AssetResult]:
        return self.with_status("ok")

    @property
    def empty(self) -> list[AssetResult]:
        return self.with_status("empty")

    @property
    def failed(self) -> list[AssetResult]:
        return self.with_status("failed")

    @property
    def unreachable(self) -> list[AssetResult]:
        return self.with_status("unreachable")

    @property
    def inactive(self) -> list[AssetResult]:
        return self.with_status("inactive")

    @property
    def exit_code(self) -> int:
        """0: everything downloaded; 1: some assets failed, are inactive or were not reached."""
        return 1 if self.failed or self.inactive or self.unreachable else 0

    @property
    def rows_added(self) -> int:
        return sum(a.rows_added for a in self.assets.values())

    @property
    def date_range(self) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        kept = self.ok + self.inactive
        firsts = [a.first for a in kept if a.first is not None]
        lasts = [a.last for a in kept if a.last is not None]
        return (min(firsts), max(lasts)) if firsts else None

    def format(self) -> str:
        span = self.date_range
        lines = [
            f"Download summary: {self.case_dir.name}, {self.interval} candles, cache {self.cache_dir}",
            f"  assets: {len(self.ok)} ok, {len(self.empty)} empty, {len(self.failed)} failed"
            + (f", {len(self.inactive)} inactive" if self.inactive else "")
            + (
                f", {len(self.unreachable)} not downloaded (unreachable: a rerun fetches them)"
                if self.unreachable
                else ""
            ),
            f"  rows added: {self.rows_added:,}",
            f"  date range: {format_day(span[0])} -> {format_day(span[1])}" if span else "  date range: -",
        ]
        titles = (
            ("failed (no data from the source: fix or replace them in the universe)", self.failed),
            ("empty", self.empty),
            ("inactive (halted or delisted on the exchange; candles up to then are kept)", self.inactive),
            ("unreachable (rate limited or timed out; run the same command again later)", self.unreachable),
        )
        for title, items in titles:
            if items:
                lines.append(f"  {title}:")
                lines += [f"    {a.symbol} ({a.source}): {a.reason}" for a in items]
        for source, why in self.unavailable.items():
            lines.append(f"  unreachable: {source}: {why}")
        for source, why in self.refused.items():
            lines.append(f"  refused: {source}: {why}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.usable is not None:
            lines.append(self.usable.format())
        return "\n".join(lines)


def resume_from(frame: pd.DataFrame) -> pd.Timestamp:
    """Where an incremental fetch starts: one complete candle before the last cached one."""
    return frame.index[-2] if len(frame) >= 2 else frame.index[-1]


def format_day(ts: pd.Timestamp) -> str:
    """The date, with the time of day only when the candle is not at midnight."""
    return ts.strftime("%Y-%m-%d") if ts.hour == ts.minute == 0 else ts.strftime("%Y-%m-%d %H:%M")


class Progress:
    """A tqdm bar on a terminal, plain lines otherwise (Slurm logs, pipes)."""

    def __init__(self, total: int, enabled: bool | None, stream: TextIO) -> None:
        self.total, self.done, self.stream = total, 0, stream
        if enabled is None:
            enabled = hasattr(stream, "isatty") and stream.isatty()
        self.bar = None
        if enabled:
            self.bar = tqdm(total=total, unit="asset", file=stream, dynamic_ncols=True)

    def advance(self, n: int, text: str) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix_str(text, refresh=True)
        else:
            print(f"[{self.done}/{self.total}] {text}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
