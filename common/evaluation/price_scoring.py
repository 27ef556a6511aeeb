"""The scorecard's numbers from the walk-forward's per-origin stats: per horizon the scores
(CRPS, MAE/MASE, QLIKE, coverage, PIT, direction), rank IC, skill against each baseline with its
block-bootstrap interval, the Diebold-Mariano tests and the model confidence set
(common.evaluation.significance) and the per-asset / per-category breakdown; and the backtest of the
model's sign(mean) positions beside buy-and-hold and momentum; and, where a ceiling is known (the
observable oracle of a rich synthetic run), the share of its edge over the best baseline the model holds.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from common.evaluation.asset_series import AssetSeries
from common.evaluation.backtest import backtest, decile_positions, signal_positions
from common.evaluation.factors import edge_over, factor_card, factor_signals, nw_lags
from common.evaluation.metrics import (
    COVERAGE_LEVELS,
    block_bootstrap_sums,
    block_length,
    newey_west_t,
    pit_histogram,
    qlike,
    rank_ic,
    skill_interval,
    wilson_interval,
)
from common.evaluation.pit import TEST_BINS, pit_bins, pit_uniformity
from common.evaluation.significance import significance_card
from common.evaluation.walk_forward import Origins

__all__ = ["SKILL_KINDS", "backtest_card", "ceiling_card", "ceiling_ranking", "horizon_card"]

SKILL_KINDS = {"crps": "ratio", "mae": "ratio", "qlike": "diff"}


def _mean(x: np.ndarray) -> Optional[float]:
    return float(np.mean(x)) if len(x) else None


def _scores(st: dict[str, np.ndarray], y: np.ndarray) -> dict:
    abs_err, rw_err = np.abs(y - st["median"]), np.abs(y)
    return {
        "crps": _mean(st["crps"]),
        "mae": _mean(abs_err),
        "mase": float(abs_err.sum() / rw_err.sum()) if rw_err.sum() > 0 else None,
        "qlike": _mean(qlike(st["var"], y)),
        "coverage": {str(level): _mean(st[f"cover{level}"].astype(float)) for level in COVERAGE_LEVELS},
    }


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


def horizon_card(
    series: Sequence[AssetSeries],
    o: Origins,
    stats: dict[str, dict[str, np.ndarray]],
    ranked: Sequence[str],
    horizon: int,
    stride: int,
    n_boot: int,
    seed: int,
) -> dict:
    """One horizon's card on the origins `o` (those with a target at `horizon`): each forecaster's scores,
    coverage, PIT and direction, the rank IC of the `ranked` ones, the cross-sectional factors, the model's
    skill against each baseline, the significance tests and the per-asset / per-category breakdown."""
    y = o.y[horizon]
    card: dict = {"n": int(len(y)), "n_dates": int(len(np.unique(o.dates)))}
    scores = {name: _scores(st, y) for name, st in stats.items()}
    for key in ("crps", "mae", "mase", "qlike"):
        card[key] = {name: sc[key] for name, sc in scores.items()}
    card["coverage"] = {name: sc["coverage"] for name, sc in scores.items()}
    card["pit"] = {name: pit_histogram(st["pit"]) for name, st in stats.items()}
    card["pit_test"] = {
        name: pit_uniformity(
            pit_bins(st["pit"], TEST_BINS), np.full(TEST_BINS, 1 / TEST_BINS), o.dates, horizon=horizon, stride=stride
        )
        for name, st in stats.items()
    }
    card["direction"] = {name: _direction(st["p_up"] >= 0.5, y) for name, st in stats.items()}
    card["direction"]["always_up"] = _direction(np.ones(len(y), bool), y)

    card["rank_ic"] = _rank_ic_card(o, stats, ranked, horizon, stride)

    # the factors a quant ranks by without a model, on the same origins, and the model's edge over the best
    card["cross_section"] = factor_card(
        o.dates, y, stats["model"]["mean"], factor_signals(series, o), horizon, stride, stats["model"]["p_up"]
    )

    card["skill"] = _skill_card(o, stats, horizon, stride, n_boot, seed)
    # Diebold-Mariano against each baseline and the model confidence set, on the per-date CRPS
    card.update(
        significance_card(
            {name: st["crps"] for name, st in stats.items()},
            o.dates,
            horizon=horizon,
            stride=stride,
            n_boot=n_boot,
            seed=seed,
        )
    )
    symbols = np.array([series[k].symbol for k in o.series], dtype=object)
    categories = np.array([series[k].category for k in o.series], dtype=object)
    card["by_asset"] = _groups(symbols, stats, y)
    card["by_category"] = _groups(categories, stats, y)
    return card


def ceiling_card(
    stats: dict[str, dict[str, np.ndarray]],
    ceiling: dict[str, dict[str, np.ndarray]],
    dates: np.ndarray,
    horizon: int,
    stride: int,
    n_boot: int,
    seed: int,
) -> dict[str, dict]:
    """Per ceiling forecaster (scored on the same origins, not a baseline): its mean CRPS, the best
    baseline's (the lowest mean CRPS) and the model's share of the ceiling's edge over that baseline,
    (best - model) / (best - ceiling): 1 is the ceiling, 0 the baseline. The 95% interval resamples
    the origin dates in blocks, the three losses together (as the skill's interval does)."""
    best = min((n for n in stats if n != "model"), key=lambda n: float(stats[n]["crps"].mean()))
    uniq, inverse = np.unique(np.asarray(dates), return_inverse=True)
    block = block_length(len(uniq), horizon, stride)
    out = {}
    for name, st in ceiling.items():
        sums = [np.bincount(inverse, weights=x["crps"], minlength=len(uniq)) for x in (stats[best], stats["model"], st)]
        b, m, c = block_bootstrap_sums(sums, block, n_boot, np.random.default_rng(seed))
        with np.errstate(divide="ignore", invalid="ignore"):
            boots = (b - m) / (b - c)
        lo, hi = np.nanpercentile(boots, [2.5, 97.5]) if np.isfinite(boots).any() else (np.nan, np.nan)
        edge = float(stats[best]["crps"].mean() - st["crps"].mean())
        out[name] = {
            "crps": float(st["crps"].mean()),
            "best_baseline": best,
            "best_baseline_crps": float(stats[best]["crps"].mean()),
            "edge": edge,  # the ceiling's CRPS edge over the best baseline (mean per origin)
            "model_share": float((stats[best]["crps"].sum() - stats["model"]["crps"].sum()) / (edge * len(dates)))
            if edge != 0
            else None,
            "model_share_ci95": None if np.isnan(lo) else [float(lo), float(hi)],
        }
    return out


def ceiling_ranking(
    series: Sequence[AssetSeries],
    o: Origins,
    ceiling: dict[str, dict[str, np.ndarray]],
    best_factor: str,
    horizon: int,
    stride: int,
) -> dict[str, dict]:
    """Per ceiling forecaster, on the origins `o` of one horizon: the rank IC of its mean and its edge
    over `best_factor` (the factor the model is judged against), as the model's: how far across assets
    the best possible forecast ranks above a factor, and so what the model's ranking can reach."""
    ics = _rank_ic_card(o, ceiling, list(ceiling), horizon, stride)
    factor = factor_signals(series, o)[best_factor]
    return {
        name: {
            "rank_ic": ics[name],
            "over_best_factor": {
                "best_factor": best_factor,
                **edge_over(o.dates, o.y[horizon], st["mean"], factor, horizon, stride),
            },
        }
        for name, st in ceiling.items()
    }


def _rank_ic_card(
    o: Origins, stats: dict[str, dict[str, np.ndarray]], ranked: Sequence[str], horizon: int, stride: int
) -> dict[str, Optional[dict]]:
    """Per forecaster in `ranked`: the mean per-date rank IC of its mean forecast and the Newey-West t
    (None with fewer than two dates)."""
    y = o.y[horizon]
    out: dict[str, Optional[dict]] = {}
    for name in ranked:  # zero-mean baselines rank noise: left out
        _, ic = rank_ic(o.dates, stats[name]["mean"], y)
        lags = nw_lags(len(ic), horizon, stride)
        out[name] = (
            {"mean": float(ic.mean()), "t_nw": newey_west_t(ic, lags), "n_dates": int(len(ic)), "nw_lags": lags}
            if len(ic) >= 2
            else None
        )
    return out


def _skill_card(
    o: Origins, stats: dict[str, dict[str, np.ndarray]], horizon: int, stride: int, n_boot: int, seed: int
) -> dict[str, dict]:
    """Per loss (SKILL_KINDS) and baseline: the model's skill with its block-bootstrap interval."""
    y = o.y[horizon]
    model_losses = _losses(stats["model"], y)
    out: dict[str, dict] = {key: {} for key in SKILL_KINDS}
    for name, st in stats.items():
        if name == "model":
            continue
        base_losses = _losses(st, y)
        for key, kind in SKILL_KINDS.items():
            out[key][name] = skill_interval(
                model_losses[key],
                base_losses[key],
                o.dates,
                horizon=horizon,
                stride=stride,
                kind=kind,
                n_boot=n_boot,
                seed=seed,
            )
    return out


def backtest_card(
    series: Sequence[AssetSeries],
    o: Origins,
    model: dict[str, np.ndarray],
    momentum: np.ndarray,
    horizon: int,
    cost_bp: float,
    n_boot: int,
    seed: int,
    best_factor: Optional[str] = None,
) -> dict:
    """Positions at each origin held to the asset's next origin: model sign(mean), buy-and-hold,
    momentum; and long-short deciles of the model's mean and of `best_factor` (the horizon's best
    cross-section factor, common.evaluation.factors)."""
    symbols = [series[k].symbol for k in o.series]
    hold = np.full(len(o.index), np.nan)
    for k, s in enumerate(series):
        rows = np.flatnonzero(np.asarray(o.series) == k)
        if len(rows) < 2:
            continue
        log_close = np.log(s.candles["close"].to_numpy(dtype=np.float64))
        i = o.index[rows]
        hold[rows[:-1]] = log_close[i[1:]] - log_close[i[:-1]]  # the last origin has no next one: not held
    frame = pd.DataFrame(
        {
            "date": pd.to_datetime(o.dates, utc=True),
            "symbol": symbols,
            "r": hold,
            "model": signal_positions(model["mean"], model["p_up"]),
            "buy_and_hold": 1.0,
            "momentum20": momentum,
            "model_long_short": decile_positions(o.dates, model["mean"]),
        }
    )
    names = ["model", "buy_and_hold", "momentum20", "model_long_short"]
    if best_factor is not None:
        frame[f"{best_factor}_long_short"] = decile_positions(o.dates, factor_signals(series, o)[best_factor])
        names.append(f"{best_factor}_long_short")
    frame = frame[np.isfinite(frame["r"])]
    if frame.empty:
        return {"horizon": horizon, "strategies": {}, "sharpe": None, "sharpe_ci95": [None, None]}
    wide = lambda col: frame.pivot(index="date", columns="symbol", values=col).sort_index()  # noqa: E731
    r = wide("r")
    strategies = {name: backtest(wide(name), r, cost_bp=cost_bp, n_boot=n_boot, seed=seed) for name in names}
    return {
        "horizon": horizon,
        "signal": "sign(mean)",
        "cost_bp": cost_bp,
        "sharpe": strategies["model"]["sharpe"],
        "sharpe_ci95": strategies["model"]["sharpe_ci95"],
        "strategies": strategies,
    }
