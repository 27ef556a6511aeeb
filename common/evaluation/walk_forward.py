"""The walk-forward: origins in the test split, the histories a forecaster sees, its samples.

origin dates: every `stride`-th date of the test split (or `n_origins` evenly spaced);
per origin: History(symbol, a copy of candles[: origin + 1]), all a forecaster is given;
the realized H-step log return, read from the full frame by the scorecard alone;
per horizon and forecaster: per-origin stats of its samples (CRPS, PIT, median, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from common.errors import UserError
from common.evaluation.asset_series import AssetSeries
from common.evaluation.metrics import coverage_flags, crps, pit_values
from common.evaluation.price_baselines import ForecastFn, momentum_signal
from common.forecasting.calibrated import conformity_scores
from common.forecasting.forecast_io import History
from common.forecasting.price_paths import barrier_probability_table

__all__ = ["Origins", "all_origins", "forecast_all", "origin_indices", "within_budget"]

_BATCH = 256  # origins per forecast call: bounds the memory of the history copies
_BATCH_CANDLES = 2_000_000  # and candles in them (about 100 MB of copies): long hourly series


def origin_indices(
    series: Sequence[AssetSeries], stride: Optional[int] = None, n_origins: Optional[int] = None
) -> tuple[dict[str, np.ndarray], int]:
    """Origin candle indices per asset, and the stride in dates between consecutive origins.

    The dates are the union of the assets' test-split dates with a valid close; every `stride`-th
    of them (or `n_origins` evenly spaced) is an origin date, and each asset has an origin on
    those dates it has a candle. Origins never fall outside an asset's test range.
    """
    if (stride is None) == (n_origins is None):
        raise UserError("give exactly one of stride (every K-th test candle) and n_origins")
    valid = {}
    for s in series:
        idx = np.arange(s.test.start, s.test.stop)
        close = s.candles["close"].to_numpy(dtype=np.float64)[idx] if len(idx) else np.zeros(0)
        valid[s.symbol] = idx[np.isfinite(close) & (close > 0)]
    stamps = [s.candles.index[valid[s.symbol]].as_unit("ns").asi8 for s in series]  # ns whatever the index unit
    grid = np.unique(np.concatenate(stamps)) if stamps else np.zeros(0, np.int64)
    if len(grid) == 0:
        raise UserError("no asset has a candle in its test split; train on more data or a longer date range")
    if stride is not None:
        if stride < 1:
            raise UserError(f"stride must be >= 1, got {stride}")
        chosen, step = grid[::stride], stride
    else:
        assert n_origins is not None  # exactly one of the two (checked above)
        if n_origins < 1:
            raise UserError(f"origins must be >= 1, got {n_origins}")
        chosen = grid[np.unique(np.linspace(0, len(grid) - 1, min(n_origins, len(grid))).round().astype(int))]
        step = max(1, len(grid) // max(len(chosen), 1))
    out = {s.symbol: valid[s.symbol][np.isin(stamps[k], chosen)] for k, s in enumerate(series)}
    return out, step


@dataclass
class Origins:
    """(asset, origin) pairs, flat, in asset order, with the realized return at each horizon."""

    series: np.ndarray  # index into the series list
    index: np.ndarray  # origin candle index
    dates: np.ndarray  # origin timestamps (int64 ns)
    y: dict[int, np.ndarray]  # horizon -> realized log return, NaN where that horizon has no target

    def subset(self, mask: np.ndarray, horizon: int) -> "Origins":
        return Origins(self.series[mask], self.index[mask], self.dates[mask], {horizon: self.y[horizon][mask]})


def all_origins(series: Sequence[AssetSeries], origins: Mapping[str, np.ndarray], horizons: Sequence[int]) -> Origins:
    """Every origin with a target at one horizon at least (the shortest)."""
    ks, idx, dates = [], [], []
    ys: dict[int, list[np.ndarray]] = {h: [] for h in horizons}
    for k, s in enumerate(series):
        log_close = np.log(s.candles["close"].to_numpy(dtype=np.float64))  # NaN at gap rows
        i = origins[s.symbol]
        i = i[i + horizons[0] < len(log_close)]
        for h in horizons:
            target = np.full(len(i), np.nan)
            inside = i + h < len(log_close)
            target[inside] = log_close[i[inside] + h]
            ys[h].append(target - log_close[i])
        ks.append(np.full(len(i), k))
        idx.append(i)
        dates.append(s.candles.index[i].as_unit("ns").asi8)  # Origins.dates are int64 ns
    cat = lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)  # noqa: E731
    y = {h: cat(ys[h], np.float64) for h in horizons}
    keep = np.isfinite(y[horizons[0]])
    return Origins(
        cat(ks, np.int64)[keep],
        cat(idx, np.int64)[keep],
        cat(dates, np.int64)[keep],
        {h: v[keep] for h, v in y.items()},
    )


def within_budget(o: Origins, budget: int, stride: int, seed: int) -> tuple[Origins, int, Optional[str]]:
    """At most `budget` (asset, origin) forecasts: (the origins kept, their stride in dates, a line
    saying how they were drawn, or None when all fit).

    Over the budget, each origin date keeps k = budget // dates of its assets, drawn uniformly
    without replacement and independently per date (seeded), so that the bootstrap over dates
    also carries the variance of which assets were drawn; with fewer forecasts than dates, one
    asset on each of `budget` evenly spaced dates."""
    if budget < 1:
        raise UserError(f"the forecast budget must be at least 1, got {budget}")
    if len(o.index) <= budget:
        return o, stride, None
    dates = np.unique(o.dates)
    if budget < len(dates):
        kept_dates = dates[np.unique(np.linspace(0, len(dates) - 1, budget).round().astype(int))]
        stride = max(stride, round(stride * len(dates) / len(kept_dates)))
    else:
        kept_dates = dates
    k = max(1, budget // len(kept_dates))
    rng = np.random.default_rng(np.random.SeedSequence([seed, budget]))
    keep = np.zeros(len(o.index), bool)
    for d in kept_dates:
        rows = np.flatnonzero(o.dates == d)
        keep[rng.choice(rows, size=min(k, len(rows)), replace=False)] = True
    out = Origins(o.series[keep], o.index[keep], o.dates[keep], {h: y[keep] for h, y in o.y.items()})
    line = (
        f"{len(o.index)} forecasts over the budget of {budget}: {len(out.index)} drawn, up to {k} assets "
        f"at random on each of {len(kept_dates)} origin dates"
    )
    return out, stride, line


def _history(s: AssetSeries, i: int) -> History:
    # a copy, unlike common.forecasting.forecaster.histories_at's view: a forecaster cannot reach the rows
    # after the origin through the view's base array
    return History(s.symbol, s.candles.iloc[: i + 1].copy())


def _sample_stats(samples: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    stats = {
        "crps": crps(samples, y),
        "pit": pit_values(samples, y),
        "median": np.median(samples, axis=1),
        "mean": samples.mean(1),
        "var": samples.var(1),
        "p_up": (samples > 0).mean(1),
    }
    stats.update({f"cover{k}": v for k, v in coverage_flags(samples, y).items()})
    stats.update({f"score{k}": v for k, v in conformity_scores(samples, y).items()})  # CQR: calibration
    return stats


def _call(name: str, fn: ForecastFn, histories: list[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
    """The forecaster's samples, checked: (n, S, horizon) paths or (n, S) H-step returns, finite."""
    out = np.asarray(fn(histories, horizon, n_samples, seed), dtype=np.float64)
    n = len(histories)
    if out.shape not in ((n, n_samples, horizon), (n, n_samples)) or not np.all(np.isfinite(out)):
        raise ValueError(
            f"forecaster {name!r} returned {out.shape} samples with "
            f"{np.size(out) - np.isfinite(out).sum()} non-finite values; expected finite log returns, "
            f"({n}, {n_samples}, {horizon}) paths or ({n}, {n_samples}) at the horizon"
        )
    return out


def _batches(lengths: np.ndarray, dates: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) runs of origins in date order (dates ascending) whose histories hold at most
    _BATCH_CANDLES candles together (one origin at least): at most _BATCH origins, but a date's
    origins stay in one run (one forecast call, so they share its draws, common.forecasting.draws),
    unless its histories alone pass the candle bound."""
    out, lo = [], 0
    while lo < len(lengths):
        hi = lo + 1
        total = int(lengths[lo])
        while (
            hi < len(lengths)
            and (hi - lo < _BATCH or dates[hi] == dates[hi - 1])
            and total + int(lengths[hi]) <= _BATCH_CANDLES
        ):
            total += int(lengths[hi])
            hi += 1
        if hi < len(lengths) and dates[hi] == dates[hi - 1]:  # stopped inside a date: end before it,
            before = int(np.searchsorted(dates[lo:hi], dates[hi - 1]))  # unless it began this run
            hi = lo + before if before else hi
        out.append((lo, hi))
        lo = hi
    return out


def forecast_all(
    series: Sequence[AssetSeries],
    o: Origins,
    forecasters: Mapping[str, ForecastFn],
    horizons: Sequence[int],
    n_samples: int,
    seed: int,
    say: Callable[[str], None],
    barrier: Optional[tuple[float, float]] = None,
) -> tuple[dict[int, dict[str, dict[str, np.ndarray]]], np.ndarray]:
    """horizon -> forecaster -> per-origin stats (crps, pit, median, ...) over the origins with a
    target at that horizon; and the 20-period momentum signal of every origin.

    One call per batch and forecaster at the longest horizon serves every horizon when the
    forecaster returns paths; one returning only H-step returns is called once per horizon.
    barrier (upper, lower): also "barrier_p", the (n, 3) barrier probabilities of its paths (NaN
    for a forecaster without paths; common.forecasting.price_paths)."""
    longest = horizons[-1]
    parts: dict[int, dict[str, list[dict[str, np.ndarray]]]] = {h: {name: [] for name in forecasters} for h in horizons}
    mom = np.zeros(len(o.index))
    order = np.lexsort((o.series, o.dates))  # date by date: the assets of one date in one call
    for b, (lo, hi) in enumerate(_batches(o.index[order] + 1, o.dates[order])):
        rows = order[lo:hi]
        say(f"origins {lo + 1}-{hi} of {len(o.index)}")
        histories = [_history(series[o.series[j]], int(o.index[j])) for j in rows]
        mom[rows] = [momentum_signal(h) for h in histories]
        for f, (name, fn) in enumerate(forecasters.items()):
            call_seed = lambda h, b=b, f=f: int(np.random.SeedSequence([seed, b, f, h]).generate_state(1)[0])  # noqa: E731
            out = _call(name, fn, histories, longest, n_samples, call_seed(longest))
            for h in horizons:
                if out.ndim == 3:
                    samples = out[:, :, h - 1]
                else:
                    samples = out if h == longest else _call(name, fn, histories, h, n_samples, call_seed(h))
                    if samples.ndim != 2:
                        raise ValueError(f"forecaster {name!r} returned paths for horizon {h} but not for {longest}")
                y = o.y[h][rows]
                ok = np.isfinite(y)
                st = _sample_stats(samples[ok], y[ok])
                if barrier is not None:
                    st["barrier_p"] = (
                        barrier_probability_table(out[ok, :, :h], *barrier)
                        if out.ndim == 3
                        else np.full((int(ok.sum()), 3), np.nan)
                    )
                parts[h][name].append(st)
    stats = {}
    for h, by_name in parts.items():
        scored = order[np.isfinite(o.y[h][order])]  # the origins of the parts, in call order
        back = np.argsort(scored, kind="stable")  # to the origins' own (asset) order
        stats[h] = {name: {k: np.concatenate([p[k] for p in ps])[back] for k in ps[0]} for name, ps in by_name.items()}
    return stats, mom
