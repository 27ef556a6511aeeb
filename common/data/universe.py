"""Asset universes: which assets a case trains on, read from a small CSV in the case folder.

    # As of 2025-06-30: constituents on that date (comment lines and blank lines are allowed)
    symbol,source,category,name
    AAPL,yfinance,us_stock,Apple
    BTC/USDT,ccxt,crypto,Bitcoin

The symbol drives the model's asset embedding and the category its category embedding; the
ids of both go to asset_info.json in the run folder (common.tokens.ids). Every problem in the file is a UserError
that names the file and the line, because a bad universe only shows up days later otherwise.
A comment "# As of YYYY-MM-DD" dates the list (`universe_as_of`): a universe is a list of the
constituents on that day, trained on their past, so it carries survivorship bias.

data.universe = "exchange" names no file: `marketgpt data download` writes the pairs it resolves
to a dated file per exchange and day (common/data/exchange_universe.py), and `universe_path`
finds the newest one for training, `plan` and `data check`.
"""

from __future__ import annotations

import csv
import difflib
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from common.errors import UserError
from common.markets import CATEGORIES

__all__ = [
    "Asset",
    "EXCHANGE_UNIVERSE",
    "SOURCES",
    "HEADER",
    "exchange_universe_file",
    "load_universe",
    "universe_as_of",
    "universe_path",
]

SOURCES: tuple[str, ...] = ("yfinance", "ccxt", "sample")
HEADER: tuple[str, ...] = ("symbol", "source", "category", "name")
EXCHANGE_UNIVERSE = "exchange"  # data.universe value: resolved from data.exchange at download time


@dataclass(frozen=True)
class Asset:
    symbol: str
    source: str  # "yfinance" | "ccxt" | "sample"
    category: str  # one of CATEGORIES
    name: str


def _suggest(value: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'?" if close else f"expected one of {', '.join(choices)}"


_AS_OF = re.compile(r"^\s*#\s*as of\s*:?\s*(\d{4}-\d{2}-\d{2})\b", re.IGNORECASE)


def universe_as_of(path: str | os.PathLike) -> str | None:
    """The date of the "# As of YYYY-MM-DD" comment line of a universe file, or None."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError:
        return None
    for line in text.splitlines():
        match = _AS_OF.match(line)
        if match:
            return match.group(1)
    return None


def exchange_universe_file(case_dir: str | os.PathLike, exchange: str, day: str) -> Path:
    """Where the universe of `exchange` resolved on `day` (YYYY-MM-DD) is written."""
    return Path(case_dir) / f"universe_exchange_{exchange.strip().lower()}_{day}.csv"


def universe_path(case_dir: str | os.PathLike, universe: str, exchange: str) -> Path:
    """The file data.universe names: case-relative, or for "exchange" the newest dated file of
    data.exchange; a UserError when the download has not written one yet."""
    case_dir = Path(case_dir)
    if universe != EXCHANGE_UNIVERSE:
        return case_dir / universe
    pattern = exchange_universe_file(case_dir, exchange, "*").name
    dated = sorted(p for p in case_dir.glob(pattern) if re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.stem.rsplit("_", 1)[-1]))
    if not dated:
        raise UserError(
            f"data.universe = 'exchange': no resolved universe of {exchange} in {case_dir} "
            f"({pattern}); run `marketgpt data download` first (needs network)"
        )
    return dated[-1]  # ISO dates sort by name


def load_universe(path: str | os.PathLike, expected_counts: dict[str, int] | None = None) -> list[Asset]:
    """Read and check a universe file; assets come back in file order.

    `expected_counts` (the config's data.universe_counts) is the number of assets per category
    the file must hold; None or {} skips that check.
    """
    path = Path(path)
    text = _read_text(path)

    assets: list[Asset] = []
    first_line: dict[str, int] = {}  # upper-cased symbol -> line number, to report duplicates
    last_line_of: dict[str, int] = {}  # category -> its last line, to point at in count errors
    header_seen = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}, line {lineno}"
        fields = [f.strip() for f in next(csv.reader([line]))]
        if not header_seen:
            if tuple(f.lower() for f in fields) != HEADER:
                raise UserError(f"{where}: bad header '{line.strip()}'; the first line must be '{','.join(HEADER)}'")
            header_seen = True
            continue
        asset = _row_asset(fields, line, where)
        key = asset.symbol.upper()
        if key in first_line:
            raise UserError(
                f"{where}: duplicate symbol '{asset.symbol}' (already on line {first_line[key]}); "
                "each asset may appear once"
            )
        first_line[key] = lineno
        last_line_of[asset.category] = lineno
        assets.append(asset)

    if not header_seen:
        raise UserError(f"{path}: empty universe file; the first line must be the header '{','.join(HEADER)}'")
    if not assets:
        raise UserError(f"{path}: the universe lists no assets; add one row per asset after the header")
    if expected_counts:
        _check_counts(path, assets, expected_counts, last_line_of)
    return assets


def _read_text(path: Path) -> str:
    """The universe file's text (a spreadsheet's BOM dropped); a UserError when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8-sig")  # -sig: spreadsheets like to add a BOM
    except FileNotFoundError:
        raise UserError(
            f"{path}: universe file not found; create it with the header "
            f"'{','.join(HEADER)}' or point data.universe at the right file"
        ) from None
    except OSError as e:
        raise UserError(f"{path}: cannot read the universe file ({e.strerror})") from None


def _row_asset(fields: list[str], line: str, where: str) -> Asset:
    """The Asset of one data row of the universe file, its fields checked (`where`: file and line)."""
    if len(fields) != len(HEADER):
        raise UserError(
            f"{where}: expected {len(HEADER)} fields ({','.join(HEADER)}), found "
            f"{len(fields)} in '{line.strip()}'; quote a name that contains a comma"
        )
    symbol, source, category, name = fields
    if not symbol:
        raise UserError(f"{where}: empty symbol")
    if source not in SOURCES:
        raise UserError(f"{where}: unknown source '{source}' for {symbol} ({_suggest(source, SOURCES)})")
    if category not in CATEGORIES:
        raise UserError(f"{where}: unknown category '{category}' for {symbol} ({_suggest(category, CATEGORIES)})")
    if source == "ccxt" and "/" not in symbol:
        raise UserError(f"{where}: ccxt symbol '{symbol}' must look like BASE/QUOTE, e.g. BTC/USDT")
    return Asset(symbol=symbol, source=source, category=category, name=name or symbol)


def _check_counts(path: Path, assets: list[Asset], expected: dict[str, int], last_line_of: dict[str, int]) -> None:
    for category in expected:
        if category not in CATEGORIES:
            raise UserError(
                f"{path}: data.universe_counts names unknown category '{category}' ({_suggest(category, CATEGORIES)})"
            )
    found = Counter(a.category for a in assets)
    for category in CATEGORIES:  # a fixed order, so the same file always gives the same message
        want, have = expected.get(category, 0), found.get(category, 0)
        if want == have:
            continue
        where = f"{path}, line {last_line_of[category]}" if category in last_line_of else str(path)
        last = f" (its last row is line {last_line_of[category]})" if category in last_line_of else ""
        raise UserError(
            f"{where}: category '{category}' has {have} assets{last}, but the config's "
            f"data.universe_counts expects {want}; fix the universe or the counts"
        )
