"""The price-space scorecard: walk-forward forecasts over the test split, scored beside baselines.

    per asset: whole cleaned candles + train / test ranges (the run's, purge gap included)
      ──► origin dates: every `stride`-th date of the test split (or `n_origins` evenly spaced),
          and per horizon H only origins whose close H bars later exists inside the series
      ──► common.forecasting.forecaster.History(symbol, copy of candles[: origin + 1]): all a forecaster is given
      ──► model and baselines (common.evaluation.price_baselines) sample H-step log returns on the SAME origins
      ──► common.evaluation.metrics: CRPS, coverage, PIT, MAE/MASE, direction, QLIKE, rank IC, block-bootstrap skill
      ──► common.evaluation.backtest: sign(mean) positions vs buy-and-hold and 20-period momentum
      ──► scorecard.json (jq: .horizons["1"].skill.crps.garch), scorecard.png, verdict lines

`make_scorecard(series, forecast_fn, interval=...)` does the work on any candles; `run_scorecard
(run_dir, forecast_fn)` reads a run folder's data and writes the files into it. The realized
returns are read from the full frame by the scorecard alone, after the forecasts are made.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from common.atomic import atomic_path, atomic_write_json
from common.evaluation.backtest import DEFAULT_COST_BP, backtest, signal_positions
from common.errors import UserError
from common.evaluation.metrics import (COVERAGE_LEVELS, coverage_flags, crps, format_verdict, newey_west_t, pit_histogram,
                            pit_values, qlike, rank_ic, skill_interval, wilson_interval)
from common.forecasting.forecaster import History
from common.evaluation.price_baselines import (ForecastFn, GarchT, HistoricalBootstrap, RandomWalkEWMA, ewma_lambda, log_returns,
                                    momentum_signal)

__all__ = [
    "AssetSeries",
    "BASELINE_NAMES",
    "DEFAULT_HORIZONS",
    "SCORECARD_JSON",
    "SCORECARD_PNG",
    "fit_price_baselines",
    "forecaster_fn",
    "make_scorecard",
    "origin_indices",
    "run_scorecard",
    "series_from_prepared",
    "series_from_run",
    "verdict_lines",
    "write_scorecard",
]

DEFAULT_HORIZONS = (1, 5, 20)
SCORECARD_JSON = "scorecard.json"
SCORECARD_PNG = "scorecard.png"
BASELINE_NAMES = {"rw_ewma": "RW-EWMA", "bootstrap": "bootstrap", "garch": "GARCH"}
SKILL_KINDS = {"crps": "ratio", "mae": "ratio", "qlike": "diff"}
_BATCH = 256  # origins per forecast call: bounds the memory of the history copies


@dataclass
class AssetSeries:
    """One asset: its whole cleaned candle frame and the run's split ranges into it."""
    symbol: str
    category: str
    candles: pd.DataFrame
    train: range
    test: range  # starts after the purge gap


# --------------------------------------------------------------------------- inputs


def series_from_prepared(prepared) -> list[AssetSeries]:
    """AssetSeries of every kept asset of a `common.data.prepare.PreparedData`."""
    return [AssetSeries(a.symbol, a.category, prepared.candles[a.symbol], prepared.splits[a.symbol].train,
                        prepared.splits[a.symbol].test) for a in prepared.assets]


def series_from_run(run_dir: str | Path) -> tuple[list[AssetSeries], str]:
    """(series, interval) of a run folder: its config's candles, cleaned as training did, with the
    split ranges the run recorded in tokens.npz (so the test split and purge gap are the run's)."""
    from common.config import load_config
    from common.data.loading import load_market_data
    from common.data.prepare import prepare_data
    from common.training.run_folder import TokenSet

    run_dir = Path(run_dir)
    for name in ("config.json", "tokens.npz"):
        if not (run_dir / name).is_file():
            raise UserError(f"{run_dir}: missing {name}; pass a run folder like "
                            "case_c_crypto/checkpoints/<experiment>_YYYYMMDD_HHMMSS")
    cfg = load_config(run_dir / "config.json")
    tokens = TokenSet.load(run_dir / "tokens.npz")
    prepared = prepare_data(cfg, load_market_data(cfg, run_dir.parent.parent))
    by_symbol = {s.symbol: s for s in series_from_prepared(prepared)}
    out = []
    for symbol in tokens.symbols:
        s = by_symbol.get(symbol)
        if s is None or len(s.candles) != len(tokens.tokens[symbol]):
            raise UserError(f"{run_dir}: the candles of {symbol} are no longer those the run was trained on "
                            "(the data cache changed since); score the run on a copy of the old cache")
        ranges = tokens.ranges[symbol]
        out.append(AssetSeries(symbol, s.category, s.candles, range(*ranges["train"]), range(*ranges["test"])))
    return out, cfg.data.interval


def origin_indices(series: Sequence[AssetSeries], stride: Optional[int] = None,
                   n_origins: Optional[int] = None) -> tuple[dict[str, np.ndarray], int]:
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
    stamps = [s.candles.index[valid[s.symbol]].asi8 for s in series]
    grid = np.unique(np.concatenate(stamps)) if stamps else np.zeros(0, np.int64)
    if len(grid) == 0:
        raise UserError("no asset has a candle in its test split; train on more data or a longer date range")
    if stride is not None:
        if stride < 1:
            raise UserError(f"stride must be >= 1, got {stride}")
        chosen, step = grid[::stride], stride
    else:
        if n_origins < 1:
            raise UserError(f"origins must be >= 1, got {n_origins}")
        chosen = grid[np.unique(np.linspace(0, len(grid) - 1, min(n_origins, len(grid))).round().astype(int))]
        step = max(1, len(grid) // max(len(chosen), 1))
    out = {s.symbol: valid[s.symbol][np.isin(stamps[k], chosen)] for k, s in enumerate(series)}
    return out, step


def fit_price_baselines(series: Sequence[AssetSeries], interval: str) -> dict[str, ForecastFn]:
    """The sampling baselines; GARCH sees each asset's train-split returns only."""
    lam = ewma_lambda(interval)
    train = {s.symbol: log_returns(s.candles.iloc[s.train.start:s.train.stop]) for s in series}
    return {"rw_ewma": RandomWalkEWMA(lam), "bootstrap": HistoricalBootstrap(), "garch": GarchT.fit(train, lam)}


# --------------------------------------------------------------------------- forecasting


def forecaster_fn(forecaster, **options) -> ForecastFn:
    """A trained run's `common.forecasting.forecaster.Forecaster` as a scorecard forecaster: the log returns
    log(close_h / close_0), h = 1..horizon, of its sampled paths. options go to
    `Forecaster.forecast` (temperature, top_k, max_batch, ...)."""
    def fn(histories: Sequence[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        close = forecaster.forecast(list(histories), horizon, n_samples, seed=seed, return_paths=True,
                                    **options).paths["close"]  # (N, S, H + 1), step 0 the last real close
        return np.log(close[:, :, 1:] / close[:, :, :1])
    return fn


@dataclass
class _Origins:
    """(asset, origin) pairs, flat, in asset order, with the realized return at each horizon."""
    series: np.ndarray  # index into the series list
    index: np.ndarray  # origin candle index
    dates: np.ndarray  # origin timestamps (int64 ns)
    y: dict[int, np.ndarray]  # horizon -> realized log return, NaN where that horizon has no target

    def subset(self, mask: np.ndarray, horizon: int) -> "_Origins":
        return _Origins(self.series[mask], self.index[mask], self.dates[mask], {horizon: self.y[horizon][mask]})


def _all_origins(series: Sequence[AssetSeries], origins: Mapping[str, np.ndarray], horizons: Sequence[int]) -> _Origins:
    """Every origin with a target at one horizon at least (the shortest)."""
    ks, idx, dates, ys = [], [], [], {h: [] for h in horizons}
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
        dates.append(s.candles.index[i].asi8)
    cat = lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)  # noqa: E731
    y = {h: cat(ys[h], np.float64) for h in horizons}
    keep = np.isfinite(y[horizons[0]])
    return _Origins(cat(ks, np.int64)[keep], cat(idx, np.int64)[keep], cat(dates, np.int64)[keep],
                    {h: v[keep] for h, v in y.items()})


def _history(s: AssetSeries, i: int) -> History:
    # a copy, unlike common.forecasting.forecaster.histories_at's view: a forecaster cannot reach the rows
    # after the origin through the view's base array
    return History(s.symbol, s.candles.iloc[: i + 1].copy())


def _sample_stats(samples: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    stats = {"crps": crps(samples, y), "pit": pit_values(samples, y),
             "median": np.median(samples, axis=1), "mean": samples.mean(1),
             "var": samples.var(1), "p_up": (samples > 0).mean(1)}
    stats.update({f"cover{k}": v for k, v in coverage_flags(samples, y).items()})
    return stats


def _call(name: str, fn: ForecastFn, histories: list[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
    """The forecaster's samples, checked: (n, S, horizon) paths or (n, S) H-step returns, finite."""
    out = np.asarray(fn(histories, horizon, n_samples, seed), dtype=np.float64)
    n = len(histories)
    if out.shape not in ((n, n_samples, horizon), (n, n_samples)) or not np.all(np.isfinite(out)):
        raise ValueError(f"forecaster {name!r} returned {out.shape} samples with "
                         f"{np.size(out) - np.isfinite(out).sum()} non-finite values; expected finite log returns, "
                         f"({n}, {n_samples}, {horizon}) paths or ({n}, {n_samples}) at the horizon")
    return out


def _forecast_all(series: Sequence[AssetSeries], o: _Origins, forecasters: Mapping[str, ForecastFn],
                  horizons: Sequence[int], n_samples: int, seed: int, say: Callable[[str], None]
                  ) -> tuple[dict[int, dict[str, dict[str, np.ndarray]]], np.ndarray]:
    """horizon -> forecaster -> per-origin stats (crps, pit, median, ...) over the origins with a
    target at that horizon; and the 20-period momentum signal of every origin.

    One call per batch and forecaster at the longest horizon serves every horizon when the
    forecaster returns paths; one returning only H-step returns is called once per horizon."""
    longest = horizons[-1]
    parts = {h: {name: [] for name in forecasters} for h in horizons}
    mom = np.zeros(len(o.index))
    for b, lo in enumerate(range(0, len(o.index), _BATCH)):
        hi = min(lo + _BATCH, len(o.index))
        say(f"origins {lo + 1}-{hi} of {len(o.index)}")
        histories = [_history(series[o.series[j]], int(o.index[j])) for j in range(lo, hi)]
        mom[lo:hi] = [momentum_signal(h) for h in histories]
        for f, (name, fn) in enumerate(forecasters.items()):
            call_seed = lambda h: int(np.random.SeedSequence([seed, b, f, h]).generate_state(1)[0])  # noqa: E731
            out = _call(name, fn, histories, longest, n_samples, call_seed(longest))
            for h in horizons:
                if out.ndim == 3:
                    samples = out[:, :, h - 1]
                else:
                    samples = out if h == longest else _call(name, fn, histories, h, n_samples, call_seed(h))
                    if samples.ndim != 2:
                        raise ValueError(f"forecaster {name!r} returned paths for horizon {h} but not for {longest}")
                y = o.y[h][lo:hi]
                ok = np.isfinite(y)
                parts[h][name].append(_sample_stats(samples[ok], y[ok]))
    stats = {h: {name: {k: np.concatenate([p[k] for p in ps]) for k in ps[0]} for name, ps in by_name.items()}
             for h, by_name in parts.items()}
    return stats, mom


# --------------------------------------------------------------------------- scoring


def _mean(x: np.ndarray) -> Optional[float]:
    return float(np.mean(x)) if len(x) else None


def _scores(st: dict[str, np.ndarray], y: np.ndarray) -> dict:
    abs_err, rw_err = np.abs(y - st["median"]), np.abs(y)
    return {"crps": _mean(st["crps"]), "mae": _mean(abs_err),
            "mase": float(abs_err.sum() / rw_err.sum()) if rw_err.sum() > 0 else None,
            "qlike": _mean(qlike(st["var"], y)),
            "coverage": {str(l): _mean(st[f"cover{l}"].astype(float)) for l in COVERAGE_LEVELS}}


def _direction(predicted_up: np.ndarray, y: np.ndarray) -> dict:
    moved = y != 0
    hits, n = int((predicted_up[moved] == (y[moved] > 0)).sum()), int(moved.sum())
    lo, hi = wilson_interval(hits, n)
    return {"accuracy": hits / n if n else None, "ci95": [lo, hi], "n": n}


def _losses(st: dict[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
    return {"crps": st["crps"], "mae": np.abs(y - st["median"]), "qlike": qlike(st["var"], y)}


def _groups(labels: np.ndarray, stats: dict[str, dict[str, np.ndarray]], y: np.ndarray) -> dict:
    out = {}
    for label in dict.fromkeys(labels.tolist()):
        m = labels == label
        entry = {"n": int(m.sum()), "crps": {name: _mean(st["crps"][m]) for name, st in stats.items()}}
        model = stats["model"]
        entry["coverage90"] = _mean(model["cover90"][m].astype(float))
        entry["direction"] = _direction(model["p_up"][m] >= 0.5, y[m])["accuracy"]
        out[label] = entry
    return out


def _horizon_card(series: Sequence[AssetSeries], o: _Origins, stats: dict[str, dict[str, np.ndarray]],
                  ranked: Sequence[str], horizon: int, stride: int, n_boot: int, seed: int) -> dict:
    y = o.y[horizon]
    card: dict = {"n": int(len(y)), "n_dates": int(len(np.unique(o.dates)))}
    scores = {name: _scores(st, y) for name, st in stats.items()}
    for key in ("crps", "mae", "mase", "qlike"):
        card[key] = {name: sc[key] for name, sc in scores.items()}
    card["coverage"] = {name: sc["coverage"] for name, sc in scores.items()}
    card["pit"] = {name: pit_histogram(st["pit"]) for name, st in stats.items()}
    card["direction"] = {name: _direction(st["p_up"] >= 0.5, y) for name, st in stats.items()}
    card["direction"]["always_up"] = _direction(np.ones(len(y), bool), y)

    card["rank_ic"] = {}
    for name in ranked:  # zero-mean baselines rank noise: left out
        _, ic = rank_ic(o.dates, stats[name]["mean"], y)
        lags = max(math.ceil(horizon / stride) - 1, math.floor(4 * (len(ic) / 100) ** (2 / 9))) if len(ic) else 0
        card["rank_ic"][name] = ({"mean": float(ic.mean()), "t_nw": newey_west_t(ic, lags), "n_dates": int(len(ic)),
                                  "nw_lags": lags} if len(ic) >= 2 else None)

    model_losses = _losses(stats["model"], y)
    card["skill"] = {key: {} for key in SKILL_KINDS}
    for name, st in stats.items():
        if name == "model":
            continue
        base_losses = _losses(st, y)
        for key, kind in SKILL_KINDS.items():
            card["skill"][key][name] = skill_interval(model_losses[key], base_losses[key], o.dates, horizon=horizon,
                                                      stride=stride, kind=kind, n_boot=n_boot, seed=seed)
    symbols = np.array([series[k].symbol for k in o.series], dtype=object)
    categories = np.array([series[k].category for k in o.series], dtype=object)
    card["by_asset"] = _groups(symbols, stats, y)
    card["by_category"] = _groups(categories, stats, y)
    return card


def _backtest_card(series: Sequence[AssetSeries], o: _Origins, model: dict[str, np.ndarray], momentum: np.ndarray,
                   horizon: int, cost_bp: float, n_boot: int, seed: int) -> dict:
    """Positions at each origin held to the asset's next origin: model sign(mean), buy-and-hold, momentum."""
    symbols = [series[k].symbol for k in o.series]
    hold = np.full(len(o.index), np.nan)
    for k, s in enumerate(series):
        rows = np.flatnonzero(np.asarray(o.series) == k)
        if len(rows) < 2:
            continue
        log_close = np.log(s.candles["close"].to_numpy(dtype=np.float64))
        i = o.index[rows]
        hold[rows[:-1]] = log_close[i[1:]] - log_close[i[:-1]]  # the last origin has no next one: not held
    frame = pd.DataFrame({"date": pd.to_datetime(o.dates, utc=True), "symbol": symbols, "r": hold,
                          "model": signal_positions(model["mean"], model["p_up"]),
                          "buy_and_hold": 1.0, "momentum20": momentum})
    frame = frame[np.isfinite(frame["r"])]
    if frame.empty:
        return {"horizon": horizon, "strategies": {}, "sharpe": None, "sharpe_ci95": [None, None]}
    wide = lambda col: frame.pivot(index="date", columns="symbol", values=col).sort_index()  # noqa: E731
    r = wide("r")
    strategies = {name: backtest(wide(name), r, cost_bp=cost_bp, n_boot=n_boot, seed=seed)
                  for name in ("model", "buy_and_hold", "momentum20")}
    return {"horizon": horizon, "signal": "sign(mean)", "cost_bp": cost_bp,
            "sharpe": strategies["model"]["sharpe"], "sharpe_ci95": strategies["model"]["sharpe_ci95"],
            "strategies": strategies}


def make_scorecard(series: Sequence[AssetSeries], forecast_fn: ForecastFn, *, interval: str,
                   horizons: Sequence[int] = DEFAULT_HORIZONS, stride: Optional[int] = 5,
                   n_origins: Optional[int] = None, n_samples: int = 200, seed: int = 0,
                   cost_bp: float = DEFAULT_COST_BP, n_boot: int = 1000, assets: Optional[Sequence[str]] = None,
                   baselines: Optional[Mapping[str, ForecastFn]] = None,
                   progress: Optional[Callable[[str], None]] = None) -> dict:
    """The scorecard (a JSON-ready dict) of `forecast_fn` against the price baselines.

    series: every asset's candles and the run's split ranges; interval: the bar length ("1d").
    baselines: name -> forecaster; by default `fit_price_baselines(series, interval)`.
    """
    horizons = sorted({int(h) for h in horizons})
    if not horizons or horizons[0] < 1:
        raise UserError(f"horizons must be positive integers, got {list(horizons)}")
    if n_samples < 2:
        raise UserError(f"samples must be >= 2, got {n_samples}")
    if assets:
        unknown = sorted(set(assets) - {s.symbol for s in series})
        if unknown:
            raise UserError(f"unknown assets {', '.join(unknown)}; the run has {', '.join(s.symbol for s in series)}")
        series = [s for s in series if s.symbol in set(assets)]
    say = progress or (lambda _msg: None)
    if baselines is None:
        say("fitting the baselines (GARCH on the train split)")
        baselines = fit_price_baselines(series, interval)
    forecasters = {"model": forecast_fn, **baselines}
    ranked = [name for name, fn in forecasters.items() if name == "model" or getattr(fn, "drift", True)]
    origins, step = origin_indices(series, stride=stride, n_origins=n_origins)
    bt_horizon = min(horizons, key=lambda h: (abs(h - step), h))  # the horizon closest to the holding period

    card: dict = {"interval": interval, "samples": n_samples, "seed": seed, "horizons": {},
                  "origins": {"stride": step, "assets": len(series)},
                  "baselines": sorted(baselines), "crps_estimator": "scoringrules crps_ensemble (pwm = fair)"}
    garch = baselines.get("garch")
    if isinstance(garch, GarchT):
        card["garch_fallback"] = list(garch.fallback)
    o = _all_origins(series, origins, horizons)
    if len(o.index) == 0:
        raise UserError(f"no origin in the test split has a candle {horizons[0]} bars later; use shorter horizons")
    say(f"{len(o.index)} origins x {len(forecasters)} forecasters x {n_samples} samples, H up to {horizons[-1]}")
    stats, momentum = _forecast_all(series, o, forecasters, horizons, n_samples, seed, say)
    for h in horizons:
        oh = o.subset(np.isfinite(o.y[h]), h)
        if len(oh.index) == 0:
            raise UserError(f"no origin in the test split has a candle {h} bars later; use shorter horizons")
        card["horizons"][str(h)] = _horizon_card(series, oh, stats[h], ranked, h, step, n_boot, seed)
        if h == bt_horizon:
            card["backtest"] = _backtest_card(series, oh, stats[h]["model"], momentum[np.isfinite(o.y[h])], h,
                                              cost_bp, n_boot, seed)
    first = card["horizons"][str(horizons[0])]
    card["calibration"] = {"horizon": horizons[0], "coverage": first["coverage"]["model"], "pit": first["pit"]["model"]}
    # `marketgpt status`'s SCORE: CRPS skill against the best baseline (lowest CRPS) at the shortest horizon
    best = min(first["skill"]["crps"], key=lambda name: first["crps"][name], default=None)
    card["headline"] = {"horizon": horizons[0], "baseline": best, **first["skill"]["crps"][best]} if best else None
    card["verdicts"] = verdict_lines(card)
    return card


def verdict_lines(card: dict) -> list[str]:
    """One CRPS verdict line per horizon and baseline."""
    lines = []
    for h, hc in card["horizons"].items():
        for name, skill in hc["skill"]["crps"].items():
            lines.append(format_verdict(int(h), "CRPS", BASELINE_NAMES.get(name, name), skill))
    return lines


# --------------------------------------------------------------------------- outputs


def write_scorecard(card: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """scorecard.json and scorecard.png in `out_dir`, each written atomically."""
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / SCORECARD_JSON, card)
    _plot(card, out_dir / SCORECARD_PNG)
    return out_dir / SCORECARD_JSON, out_dir / SCORECARD_PNG


def _plot(card: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    horizons = list(card["horizons"])
    names = list(next(iter(card["horizons"].values()))["skill"]["crps"])
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        sk = [card["horizons"][h]["skill"]["crps"][name] for h in horizons]
        v = np.array([s["value"] for s in sk]) * 100
        err = np.abs(np.array([s["ci95"] for s in sk]).T * 100 - v)
        ax[0, 0].bar(np.arange(len(horizons)) + j * width, v, width, yerr=err, capsize=3,
                     label=BASELINE_NAMES.get(name, name))
    ax[0, 0].axhline(0, color="k", lw=0.8)
    ax[0, 0].set_xticks(np.arange(len(horizons)) + width * (len(names) - 1) / 2, [f"H={h}" for h in horizons])
    ax[0, 0].set(title="CRPS skill vs baseline (95% block-bootstrap CI)", ylabel="skill, %")
    ax[0, 0].legend(fontsize=8)

    levels = [int(l) for l in COVERAGE_LEVELS]
    ax[0, 1].plot(levels, levels, "k--", lw=0.8, label="nominal")
    for h in horizons:
        cov = card["horizons"][h]["coverage"]["model"]
        ax[0, 1].plot(levels, [100 * (cov[str(l)] or 0) for l in levels], "o-", label=f"H={h}")
    ax[0, 1].set(title="central interval coverage (model)", xlabel="nominal %", ylabel="actual %")
    ax[0, 1].legend(fontsize=8)

    pit = card["calibration"]["pit"]
    ax[1, 0].bar(np.arange(len(pit)) / len(pit), pit, 1 / len(pit), align="edge", edgecolor="w")
    ax[1, 0].axhline(1 / len(pit), color="k", ls="--", lw=0.8)
    ax[1, 0].set(title=f"PIT histogram (model, H={card['calibration']['horizon']})", xlabel="PIT", ylabel="share")

    bt = card.get("backtest", {})
    for name, st in bt.get("strategies", {}).items():
        ax[1, 1].plot(pd.to_datetime(st["dates"]), st["equity"], label=f"{name} (Sharpe {_fmt(st['sharpe'])})")
    ax[1, 1].set(title=f"backtest equity, {bt.get('cost_bp', DEFAULT_COST_BP):g} bp per side "
                       f"(H={bt.get('horizon', '-')})", ylabel="growth of 1")
    if bt.get("strategies"):
        ax[1, 1].legend(fontsize=8)
    ax[1, 1].tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def run_scorecard(run_dir: str | Path, forecast_fn: ForecastFn, *, horizons: Sequence[int] = DEFAULT_HORIZONS,
                  stride: Optional[int] = 5, n_origins: Optional[int] = None, n_samples: int = 200, seed: int = 0,
                  cost_bp: float = DEFAULT_COST_BP, assets: Optional[Sequence[str]] = None,
                  out_dir: str | Path | None = None, progress: Optional[Callable[[str], None]] = None,
                  precision: Optional[str] = None) -> dict:
    """`marketgpt scorecard RUN_DIR`: score `forecast_fn` on the run's test split, write
    scorecard.json and scorecard.png into the run folder (or `out_dir`), return the card.
    precision: the model's (fp32 or bf16 autocast), recorded in the card when given."""
    series, interval = series_from_run(run_dir)
    card = make_scorecard(series, forecast_fn, interval=interval, horizons=horizons, stride=stride,
                          n_origins=n_origins, n_samples=n_samples, seed=seed, cost_bp=cost_bp, assets=assets,
                          progress=progress)
    card["run"] = str(run_dir)
    if precision is not None:
        card["precision"] = precision
    try:
        write_scorecard(card, out_dir or run_dir)
    except OSError as e:
        raise UserError(f"cannot write the scorecard into {out_dir or run_dir} ({e.strerror or e})") from None
    return card
