"""What the rest of the market did (model.market_context): three ids per candle summarizing the
cross-section of every series of the same interval, as of the candle's close.

    market_move        the mean of the series' last moves (log-close move / the tokenizer's sigma)
    market_dispersion  their standard deviation across series
    market_vol         the mean of their volatility levels (common.tokens.features.vol_level_ratio)

Each is cut at FIXED edges (nothing is fitted, nothing stored); id 0 is "unknown": fewer than
MIN_SERIES series with a fresh reading. The candle's own series counts like any other.

Strictly causal. The context of a candle closing at t reads, of every series, its last candle
that closed at or before t, and only if that candle closed after t - one interval (fresh). A
position's context thus never holds a candle that closed after the one it sits on, and the
candle it predicts opens after that close. When a candle closes:
    intraday   its timestamp + the interval;
    daily      the end of its UTC date (date + 1 day). Daily bars are dated by their exchange
               (common.data.yahoo), so a European and a US candle of date D both count as closed
               at D+1 00:00 UTC: a US position of date D sees Europe's day D (it closed at 16:30
               UTC, before the US close), a European one sees the US day D, which closed (21:00
               UTC) before Europe's D+1 trading day opens, and crypto's day D closes at D+1 00:00
               UTC exactly. Markets whose next trading day opens before midnight UTC (Sydney,
               Auckland) would break this; no case universe holds them.
Why summaries and not attention across the assets of a timestamp: the ids go through the same
path as the other candle inputs (shards, windows, forecasts, exports) at the cost of three
embedding tables; the cross-section is computed once, not in every forward pass; and series of
different calendars (stocks, crypto) need no alignment inside the model. What a summary cannot
carry is which asset moved: a pairwise lead-lag stays invisible (docs/training.md).
A forecast's sampled future reads, per sample, the ids that followed a past close like the
origin's (MarketContext.analog_closes), or the origin's ids held (common.forecasting.core).

Which asset moved (model.market_peer): a 4th id, the last move of the series' peer, binned at
PEER_EDGES. A series' peer is the other series of its interval whose last move best predicts its
next one on the training candles (MarketContext.fit_peers: the largest absolute lag-one
correlation between the peer's reading as of a close of the interval's grid and the series' move
at the next close); it is fitted once, when the shard is prepared, and kept in asset_info.json
("peers"), so a forecast reads the peer the model was trained with.
"""

from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple, Optional

import numpy as np
import pandas as pd

from common.errors import UserError
from common.markets import INTERVAL_SECONDS
from common.tokens.features import MARKET_BINS, MARKET_COLUMNS, VOL_LEVEL_EDGES, VolLevel, binned, vol_level_ratio
from common.tokens.tokenizer import OHLCTokenizer

__all__ = [
    "MARKET_BINS",
    "MARKET_COLUMNS",
    "MarketContext",
    "PEER_EDGES",
    "SeriesMoves",
    "check_cross_section",
    "close_times",
    "series_moves",
]

# the cross-section's mean move, in sigmas: of 20 crypto pairs moving together (correlation ~0.7)
# it spreads nearly as one asset's move; of 600 mixed assets it is narrower
MOVE_EDGES = (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0)
# the standard deviation of the series' moves, in sigmas: about 1 for unrelated series, lower when
# the market moves as one, higher on days some assets gap
DISPERSION_EDGES = (0.4, 0.6, 0.8, 1.0, 1.2, 1.5, 2.0)
EDGES = (MOVE_EDGES, DISPERSION_EDGES, VOL_LEVEL_EDGES)
assert all(len(e) == MARKET_BINS - 1 for e in EDGES)  # the model's tables have MARKET_BINS + 1 rows
# one series' move, in sigmas (about unit spread, wider than the cross-section's mean)
PEER_EDGES = (-1.5, -0.75, -0.25, 0.0, 0.25, 0.75, 1.5)
assert len(PEER_EDGES) == MARKET_BINS - 1
PEER_FIT_CLOSES = 20_000  # the training grid's last closes a peer is fitted on (memory: closes x series)
MIN_PEER_PAIRS = 100  # fewer readings paired with a next move: no peer
MIN_SERIES = 2  # a cross-section of the series alone is no context
MIN_ANALOGS = 50  # past closes a forecast's market futures are drawn from (MarketContext.analogs)
_DAY_NS = 86_400 * 10**9


class SeriesMoves(NamedTuple):
    """One series as the market context reads it: its interval, each candle's timestamp (int64 ns
    UTC), its move in sigmas (NaN for a missing or warm-up candle) and its volatility level (NaN
    while not warm)."""

    interval: str
    stamps: np.ndarray
    move: np.ndarray
    level: np.ndarray


def series_moves(
    tokenizer: OHLCTokenizer, frame: pd.DataFrame, interval: str, move: Optional[np.ndarray] = None
) -> SeriesMoves:
    """A cleaned candle frame as the market context reads it; move: the tokenizer's move_z of
    the frame (tokenizer.features), when already computed."""
    if move is None:
        move = tokenizer.features(frame)[0]
    level = vol_level_ratio(frame, VolLevel.of(tokenizer))
    return SeriesMoves(interval, pd.DatetimeIndex(frame.index).as_unit("ns").asi8, np.asarray(move, np.float64), level)


def check_cross_section(intervals: Mapping[str, str]) -> None:
    """A UserError where an interval of the training data (series name -> its interval) has fewer
    than MIN_SERIES series: its market would be "unknown" at every candle, and no forecast of the
    run could read one."""
    pools: dict[str, list[str]] = {}
    for name, interval in intervals.items():
        pools.setdefault(interval, []).append(name)
    for interval, names in sorted(pools.items()):
        if len(names) < MIN_SERIES:
            raise UserError(
                f"model.market_context reads the cross-section of each interval's series, and {interval} has "
                f"{len(names)} ({', '.join(sorted(names))}): its market would be unknown at every candle and no "
                f"forecast could read one; train on at least {MIN_SERIES} series of each interval, or "
                "--set model.market_context=false"
            )


def close_times(stamps: np.ndarray, interval: str) -> np.ndarray:
    """(n,) int64 ns: when each candle of the interval closes (see the module docstring)."""
    stamps = np.asarray(stamps, dtype=np.int64)
    if interval == "1d":
        return (stamps // _DAY_NS + 1) * _DAY_NS
    return stamps + INTERVAL_SECONDS[interval] * 10**9


class _Readings(NamedTuple):
    closes: np.ndarray  # ascending close times; NaN values are no reading
    values: np.ndarray


class _Series(NamedTuple):
    interval: str
    closes: np.ndarray  # every candle's close time
    move: _Readings
    level: _Readings


def _held(s: SeriesMoves) -> _Series:
    """What the context keeps of a series: 24 bytes a candle. Where its candles close at least one
    interval apart (every cleaned series: one candle per interval, or per date), the last candle
    closed by t is the only one that can be fresh at t, so a NaN value answers "no reading" in
    place and the closes are shared; otherwise each kind keeps its finite readings only."""
    closes = close_times(s.stamps, s.interval)
    move, level = np.asarray(s.move, np.float64), np.asarray(s.level, np.float64)
    if len(closes) < 2 or np.diff(closes).min() >= INTERVAL_SECONDS[s.interval] * 10**9:
        return _Series(s.interval, closes, _Readings(closes, move), _Readings(closes, level))
    keep_m, keep_l = np.isfinite(move), np.isfinite(level)
    return _Series(
        s.interval, closes, _Readings(closes[keep_m], move[keep_m]), _Readings(closes[keep_l], level[keep_l])
    )


class MarketContext:
    """The cross-section of a set of series, asked at any close time. Built from whole histories;
    an answer at t depends on the candles closed at or before t only. `series`: name -> series, or
    (name, series) pairs, e.g. a generator reading one series at a time from disk (only what the
    context keeps is held)."""

    def __init__(self, series: Mapping[str, SeriesMoves] | Iterable[tuple[str, SeriesMoves]]) -> None:
        pairs = series.items() if isinstance(series, Mapping) else series
        self.series: dict[str, _Series] = {name: _held(s) for name, s in pairs}
        self.names: dict[str, list[str]] = {}  # interval -> its series' names, sorted
        for name in sorted(self.series):  # one order, so every caller's sums round alike
            self.names.setdefault(self.series[name].interval, []).append(name)
        self.pools = {interval: [self.series[n] for n in names] for interval, names in self.names.items()}
        self._tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def own_ids(self, name: str, peers: Optional[Mapping[str, str]] = None) -> np.ndarray:
        """(n, MARKET_COLUMNS) int64 ids of each candle of the series `name`, at its close; with
        `peers` (model.market_peer: name -> peer, fit_peers) a last column, its peer's."""
        s = self.series[name]
        ids = self.ids(s.interval, s.closes)
        if peers is None:
            return ids
        return np.concatenate([ids, self.peer_ids(peers.get(name), s.interval, s.closes)[:, None]], axis=1)

    def peer_ids(self, peer: Optional[str], interval: str, closes: np.ndarray) -> np.ndarray:
        """(n,) int64 ids of the series `peer`'s last move as of each close time (0: unknown, also
        where the peer is None or not in this market)."""
        s = self.series.get(peer) if peer is not None else None
        if s is None or s.interval != interval:
            return np.zeros(len(closes), dtype=np.int64)
        return binned(_as_of(s.move, np.asarray(closes, np.int64), INTERVAL_SECONDS[interval] * 10**9), PEER_EDGES)

    def fit_peers(self, train_candles: Mapping[str, int]) -> dict[str, str]:
        """name -> its peer (model.market_peer; module docstring), from each series' first
        train_candles[name] candles (its training split) and nothing later: on the last
        PEER_FIT_CLOSES closes of the interval's grid they reach. A series without a peer (fewer
        than MIN_PEER_PAIRS paired readings with every other) is left out."""
        peers: dict[str, str] = {}
        for interval, names in self.names.items():
            pool = self.pools[interval]
            last = [min(train_candles[n], len(s.closes)) - 1 for n, s in zip(names, pool)]
            until = np.array([s.closes[j] if j >= 0 else np.iinfo(np.int64).min for s, j in zip(pool, last)])
            times = self._table(interval)[0]
            times = times[times <= until.max()][-PEER_FIT_CLOSES:]
            fresh_ns = INTERVAL_SECONDS[interval] * 10**9
            seen = times[:-1, None] <= until[None, :]  # a reading counts where its series trained by then
            x = np.stack([_as_of(s.move, times[:-1], fresh_ns) for s in pool], axis=1)
            y = np.stack([_at(s.move, times[1:]) for s in pool], axis=1)
            x[~seen] = np.nan
            y[~(times[1:, None] <= until[None, :])] = np.nan
            r, pairs = _lagged_correlation(x, y)
            np.fill_diagonal(r, 0.0)  # a series' own last move is in its tokens already
            r[pairs < MIN_PEER_PAIRS] = 0.0
            for j, name in enumerate(names):
                best = int(np.argmax(np.abs(r[:, j])))
                if r[best, j] != 0.0:
                    peers[name] = names[best]
        return peers

    def ids(self, interval: str, closes: np.ndarray) -> np.ndarray:
        """(n, MARKET_COLUMNS) int64 ids at the close times `closes` in the interval's pool (all 0
        when the pool is empty). A close time of one of the pool's candles is read from the
        pool's table of every distinct close time, computed once (a corpus of S series and N
        candles costs S x distinct times, not S x N); any other is computed on its own."""
        closes = np.asarray(closes, dtype=np.int64)
        times, table = self._table(interval)
        at = np.minimum(np.searchsorted(times, closes), max(len(times) - 1, 0))
        hit = times[at] == closes if len(times) else np.zeros(len(closes), dtype=bool)
        out = np.empty((len(closes), MARKET_COLUMNS), dtype=np.int64)
        out[hit] = table[at[hit]]
        if not hit.all():
            out[~hit] = self._compute(interval, closes[~hit])
        return out

    def analogs(self, interval: str, close: int, horizon: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, horizon, MARKET_COLUMNS) int64 ids: the market ids at analog_closes."""
        return self.ids(interval, self.analog_closes(interval, close, horizon, n, rng).ravel()).reshape(n, horizon, -1)

    def analog_closes(self, interval: str, close: int, horizon: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, horizon) int64 close times: n futures of the interval's market after the close time
        `close`, each the `horizon` closes that followed a past close whose ids are the nearest to
        those at `close` (the MIN_ANALOGS nearest or more, ties kept), drawn with `rng`. Only
        futures complete by `close` are drawn, so nothing after it is read; where there is none
        yet, `close` held over the horizon."""
        times, table = self._table(interval)
        now = self.ids(interval, np.array([close], dtype=np.int64))[0]
        last = int(np.searchsorted(times, close, side="right")) - 1 - horizon  # the last start whose future closed
        if last < 0:
            return np.full((n, horizon), close, dtype=np.int64)
        distance = np.abs(table[: last + 1] - now).sum(axis=1)
        k = min(MIN_ANALOGS, last + 1)
        starts = np.flatnonzero(distance <= np.partition(distance, k - 1)[k - 1])
        picked = rng.choice(starts, size=n)
        return times[picked[:, None] + 1 + np.arange(horizon)]

    def _table(self, interval: str) -> tuple[np.ndarray, np.ndarray]:
        if interval not in self._tables:
            times = np.zeros(0, np.int64)
            for s in self.pools.get(interval, []):  # a union grown series by series: memory ~ distinct times
                at = np.minimum(np.searchsorted(times, s.closes), max(len(times) - 1, 0))
                if not len(times) or not np.array_equal(times[at], s.closes):
                    times = np.union1d(times, s.closes)
            self._tables[interval] = (times, self._compute(interval, times))
        return self._tables[interval]

    def _compute(self, interval: str, closes: np.ndarray, chunk: int = 16_384) -> np.ndarray:
        """The ids at `closes`, from every series' readings, `chunk` times at a time (memory)."""
        out = np.zeros((len(closes), MARKET_COLUMNS), dtype=np.int64)
        pool = self.pools.get(interval, [])
        fresh_ns = INTERVAL_SECONDS[interval] * 10**9
        for start in range(0, len(closes), chunk):
            t = closes[start : start + chunk]
            if pool:
                moves = np.stack([_as_of(s.move, t, fresh_ns) for s in pool], axis=1)
                levels = np.stack([_as_of(s.level, t, fresh_ns) for s in pool], axis=1)
                out[start : start + chunk] = _summary_ids(moves, levels)
        return out


def _as_of(r: _Readings, t: np.ndarray, fresh_ns: int) -> np.ndarray:
    """(len(t),) the series' last reading closed at or before each t and after t - fresh_ns; else NaN."""
    if not len(r.closes):
        return np.full(len(t), np.nan)
    j = np.searchsorted(r.closes, t, side="right") - 1
    last = np.maximum(j, 0)
    fresh = (j >= 0) & (r.closes[last] > t - fresh_ns)
    return np.where(fresh, r.values[last], np.nan)


def _at(r: _Readings, t: np.ndarray) -> np.ndarray:
    """(len(t),) the series' reading of the candle closing exactly at each t; else NaN."""
    if not len(r.closes):
        return np.full(len(t), np.nan)
    j = np.minimum(np.searchsorted(r.closes, t), len(r.closes) - 1)
    return np.where(r.closes[j] == t, r.values[j], np.nan)


def _lagged_correlation(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, k) correlations of x's column i with y's column j over the rows where both read (NaN:
    no reading), and the (k, k) counts of those rows; 0 where either side is constant."""
    mx, my = np.isfinite(x).astype(np.float64), np.isfinite(y).astype(np.float64)
    x0, y0 = np.where(mx > 0, x, 0.0), np.where(my > 0, y, 0.0)
    n = mx.T @ my
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_x, mean_y = (x0.T @ my) / n, (mx.T @ y0) / n
        cov = (x0.T @ y0) / n - mean_x * mean_y
        var_x = ((x0**2).T @ my) / n - mean_x**2
        var_y = (mx.T @ y0**2) / n - mean_y**2
        r = cov / np.sqrt(var_x * var_y)
    return np.where(np.isfinite(r), r, 0.0), n


def _summary_ids(moves: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """(n, 3) ids of the mean move, the dispersion and the mean level across the columns (series)."""
    n_moves = np.isfinite(moves).sum(axis=1)
    n_levels = np.isfinite(levels).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        sum_m = np.nansum(moves, axis=1)
        mean = np.where(n_moves >= MIN_SERIES, sum_m / np.maximum(n_moves, 1), np.nan)
        dev = np.nansum((moves - mean[:, None]) ** 2, axis=1)
        dispersion = np.where(n_moves >= MIN_SERIES, np.sqrt(dev / np.maximum(n_moves - 1, 1)), np.nan)
        level = np.where(n_levels >= MIN_SERIES, np.nansum(levels, axis=1) / np.maximum(n_levels, 1), np.nan)
    return np.stack([binned(x, e) for x, e in zip((mean, dispersion, level), EDGES)], axis=1)
