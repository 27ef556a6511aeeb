"""The price-space scorecard: walk-forward forecasts over the test split, scored beside baselines.

    per asset: whole cleaned candles + train / test ranges (the run's, purge gap included)
      ──► origin dates: every `stride`-th date of the test split (or `n_origins` evenly spaced),
          and per horizon H only origins whose close H bars later exists inside the series
      ──► common.forecasting.forecast_io.History(symbol, copy of candles[: origin + 1]): all a forecaster is given
      ──► model and baselines (common.evaluation.price_baselines) sample H-step log returns on the SAME origins
      ──► common.evaluation.metrics: CRPS, coverage, PIT, MAE/MASE, direction, QLIKE, rank IC, block-bootstrap skill
      ──► common.evaluation.significance: Diebold-Mariano (HLN) per baseline, the 90% model confidence set;
          Holm's adjustment over the card's tests decides the verdict lines
      ──► common.evaluation.backtest: sign(mean) positions vs buy-and-hold and 20-period momentum
      ──► scorecard.json (jq: .horizons["1"].skill.crps.garch), scorecard.png, verdict lines

`make_scorecard(series, forecast_fn, interval=...)` does the work on any candles; `run_scorecard
(run_dir, forecast_fn)` reads a run folder's data and writes the files into it. The realized
returns are read from the full frame by the scorecard alone, after the forecasts are made.

The parts, by concern: common.evaluation.asset_series (the inputs and the fitted baselines),
common.evaluation.walk_forward (origins, histories, the forecasters' samples),
common.evaluation.price_scoring (per-horizon scores, skill, breakdowns, the backtest card),
common.evaluation.scorecard_plot (scorecard.png); this module puts them together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from common.atomic import atomic_write_json
from common.errors import UserError
from common.evaluation.asset_series import AssetSeries, fit_price_baselines, series_from_run
from common.evaluation.backtest import DEFAULT_COST_BP
from common.evaluation.calibration import calibrated_pit_card, calibration_card
from common.evaluation.har_baselines import HarRange
from common.evaluation.metrics import format_verdict, skill_interval
from common.evaluation.price_baselines import ForecastFn, GarchT
from common.evaluation.price_scoring import backtest_card, horizon_card
from common.evaluation.scorecard_plot import plot_scorecard
from common.evaluation.significance import FAMILY_ALPHA, family_verdict, holm
from common.evaluation.walk_forward import Origins, all_origins, forecast_all, origin_indices, within_budget
from common.forecasting.calibrated import Calibration
from common.forecasting.forecast_io import History
from common.forecasting.price_paths import barrier_outcomes, brier_score

__all__ = [
    "BASELINE_NAMES",
    "DEFAULT_HORIZONS",
    "SCORECARD_JSON",
    "SCORECARD_PNG",
    "barrier_card",
    "barrier_lines",
    "cross_section_lines",
    "forecaster_fn",
    "headline_lines",
    "make_scorecard",
    "mcs_lines",
    "pit_lines",
    "run_scorecard",
    "verdict_lines",
    "write_scorecard",
]

DEFAULT_HORIZONS = (1, 5, 20)
SCORECARD_JSON = "scorecard.json"
SCORECARD_PNG = "scorecard.png"
BASELINE_NAMES = {
    "rw_ewma": "RW-EWMA",
    "bootstrap": "bootstrap",
    "garch": "GARCH",
    "har": "HAR-range",
    "log_har": "log-HAR-range",
}


def forecaster_fn(forecaster, **options) -> ForecastFn:
    """A trained run's `common.forecasting.forecaster.Forecaster` as a scorecard forecaster: the log returns
    log(close_h / close_0), h = 1..horizon, of its sampled paths. options go to
    `Forecaster.forecast` (temperature, top_k, max_batch, ...)."""

    def fn(histories: Sequence[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        close = forecaster.forecast(list(histories), horizon, n_samples, seed=seed, return_paths=True, **options).paths[
            "close"
        ]  # (N, S, H + 1), step 0 the last real close
        return np.log(close[:, :, 1:] / close[:, :, :1])

    return fn


def make_scorecard(
    series: Sequence[AssetSeries],
    forecast_fn: ForecastFn,
    *,
    interval: str,
    horizons: Sequence[int] = DEFAULT_HORIZONS,
    stride: Optional[int] = 5,
    n_origins: Optional[int] = None,
    n_samples: int = 200,
    seed: int = 0,
    cost_bp: float = DEFAULT_COST_BP,
    n_boot: int = 1000,
    assets: Optional[Sequence[str]] = None,
    baselines: Optional[Mapping[str, ForecastFn]] = None,
    progress: Optional[Callable[[str], None]] = None,
    calibration: Optional[Calibration] = None,
    barrier: Optional[tuple[float, float]] = None,
    keep: Optional[dict] = None,
    budget: Optional[int] = None,
) -> dict:
    """The scorecard (a JSON-ready dict) of `forecast_fn` against the price baselines.

    series: every asset's candles and the run's split ranges; interval: the bar length ("1d").
    baselines: name -> forecaster; by default `fit_price_baselines(series, interval)`.
    calibration: the run's calibration.json (fitted on val): the card adds its coverage on test.
    barrier: (upper, lower), e.g. (0.05, -0.03): also the Brier scores of the barrier probabilities
    (card["barrier"], see barrier_card).
    budget: at most this many (asset, origin) forecasts, drawn by walk_forward.within_budget
    (card["origins"]["budget"] says how); None: every origin.
    keep: a dict that receives the per-origin "stats" (horizon -> forecaster -> arrays), the
    "origins" and the "stride" (common.evaluation.benchmark pools them across tasks).
    """
    horizons = _check_request(horizons, n_samples)
    series = _chosen_assets(series, assets)
    say = progress or (lambda _msg: None)
    if baselines is None:
        say("fitting the baselines (GARCH on the train split)")
        baselines = fit_price_baselines(series, interval)
    forecasters = {"model": forecast_fn, **baselines}
    ranked = [name for name, fn in forecasters.items() if name == "model" or getattr(fn, "drift", True)]
    origins, step = origin_indices(series, stride=stride, n_origins=n_origins)
    bt_horizon = min(horizons, key=lambda h: (abs(h - step), h))  # the horizon closest to the holding period

    card: dict = {
        "interval": interval,
        "samples": n_samples,
        "seed": seed,
        "horizons": {},
        "origins": {"stride": step, "assets": len(series)},
        "baselines": sorted(baselines),
        "crps_estimator": "scoringrules crps_ensemble (pwm = fair)",
    }
    garch = baselines.get("garch")
    if isinstance(garch, GarchT):
        card["garch_fallback"] = list(garch.fallback)
    har = baselines.get("har")
    if isinstance(har, HarRange):
        card["har_fallback"] = list(har.fallback)
    o = all_origins(series, origins, horizons)
    if len(o.index) == 0:
        raise UserError(f"no origin in the test split has a candle {horizons[0]} bars later; use shorter horizons")
    if budget is not None:
        o, step, drawn = within_budget(o, budget, step, seed)
        card["origins"].update(stride=step, budget=budget, drawn=drawn)
        if drawn:
            say(drawn)
    say(f"{len(o.index)} origins x {len(forecasters)} forecasters x {n_samples} samples, H up to {horizons[-1]}")
    stats, momentum = forecast_all(series, o, forecasters, horizons, n_samples, seed, say, barrier=barrier)
    if keep is not None:
        keep.update(stats=stats, origins=o, stride=step)
    for h in horizons:
        oh = o.subset(np.isfinite(o.y[h]), h)
        if len(oh.index) == 0:
            raise UserError(f"no origin in the test split has a candle {h} bars later; use shorter horizons")
        card["horizons"][str(h)] = horizon_card(series, oh, stats[h], ranked, h, step, n_boot, seed)
        card["horizons"][str(h)]["pit_calibrated"] = calibrated_pit_card(
            calibration, stats[h]["model"], oh.y[h], oh.dates, horizon=h, stride=step
        )
        if h == bt_horizon:
            edge = card["horizons"][str(h)]["cross_section"]["edge"]
            card["backtest"] = backtest_card(
                series,
                oh,
                stats[h]["model"],
                momentum[np.isfinite(o.y[h])],
                h,
                cost_bp,
                n_boot,
                seed,
                best_factor=edge["best_factor"] if edge else None,
            )
    _add_summary(card, horizons[0])
    _add_calibrated(card, stats, calibration)
    if barrier is not None:
        card["barrier"] = barrier_card(series, o, stats, barrier, step, n_boot, seed)
        card["barrier_lines"] = barrier_lines(card["barrier"])
    return card


def _add_calibrated(card: dict, stats: dict, calibration: Optional[Calibration]) -> None:
    """Per horizon and in `calibration`, the coverage of the model's intervals once calibrated
    (common.evaluation.calibration), beside the raw coverage and PIT; null without calibration.json."""
    for h, hc in card["horizons"].items():
        hc["coverage_calibrated"] = calibration_card(calibration, stats[int(h)]["model"], int(h))
    card["calibration"]["coverage_calibrated"] = card["horizons"][str(card["calibration"]["horizon"])][
        "coverage_calibrated"
    ]
    card["calibration"]["calibrated_by"] = (
        None
        if calibration is None
        else {
            "file": str(calibration.path),
            "split": "val",
            "dates": calibration.raw.get("dates"),
            "n_origins": calibration.raw.get("n_origins", {}).get(str(card["calibration"]["horizon"])),
        }
    )


def barrier_card(
    series: Sequence[AssetSeries],
    o: Origins,
    stats: dict,
    barrier: tuple[float, float],
    stride: int,
    n_boot: int,
    seed: int,
) -> dict:
    """Per horizon H: the mean Brier score of each forecaster's P(upper first), P(lower first),
    P(neither) within H candles (its sampled closes) against what the closes did, the realized
    frequencies, and the model's Brier skill 1 - BS_model / BS_baseline with a block-bootstrap 95%
    interval over the origin dates. Closes only: the baselines have no candle highs and lows."""
    upper, lower = barrier
    out: dict = {
        "upper": upper,
        "lower": lower,
        "prices": "close",
        "score": "Brier, 3 outcomes, in [0, 2]",
        "horizons": {},
    }
    for h, by_name in stats.items():
        oh = o.subset(np.isfinite(o.y[h]), h)
        paths = np.full((len(oh.index), h + 1), np.nan)
        for j, (k, i) in enumerate(zip(oh.series, oh.index)):
            log_close = np.log(series[k].candles["close"].to_numpy(dtype=np.float64)[i : i + h + 1])
            paths[j] = np.exp(log_close - log_close[0])
        ok = np.isfinite(paths).all(axis=1)  # a gap row inside the horizon: that origin is left out
        happened = barrier_outcomes(paths[ok], upper, lower)["outcome"]
        scores = {
            name: brier_score(st["barrier_p"][ok], happened)
            for name, st in by_name.items()
            if np.isfinite(st["barrier_p"][ok]).all()
        }
        hc: dict = {
            "n": int(ok.sum()),
            "realized": {
                "upper_first": float((happened == 1).mean()),
                "lower_first": float((happened == -1).mean()),
                "neither": float((happened == 0).mean()),
            }
            if ok.any()
            else None,
            "brier": {name: float(b.mean()) if len(b) else None for name, b in scores.items()},
            "skill": {},
        }
        if ok.any() and "model" in scores:
            for name, b in scores.items():
                if name != "model":
                    hc["skill"][name] = skill_interval(
                        scores["model"], b, oh.dates[ok], horizon=h, stride=stride, n_boot=n_boot, seed=seed
                    )
        out["horizons"][str(h)] = hc
    return out


def barrier_lines(bc: dict) -> list[str]:
    """`Barrier +5%/-3% at H=5: Brier model 0.512, GARCH 0.530 (skill +3.4% [95% CI ...], no edge), ...`"""
    lines = []
    for h, hc in bc["horizons"].items():
        if not hc["skill"]:
            continue
        parts = [
            f"{BASELINE_NAMES.get(name, name)} {hc['brier'][name]:.3f} (skill {s['value']:+.1%} "
            f"[{s['ci95'][0]:+.1%}, {s['ci95'][1]:+.1%}], {s['verdict']})"
            for name, s in hc["skill"].items()
        ]
        lines.append(
            f"Barrier {bc['upper']:+.1%}/{bc['lower']:+.1%} at H={h} (n={hc['n']}): Brier model "
            f"{hc['brier']['model']:.3f}; " + "; ".join(parts)
        )
    return lines


def _check_request(horizons: Sequence[int], n_samples: int) -> list[int]:
    """The horizons, sorted and unique; a UserError for a horizon or sample count that cannot be scored."""
    horizons = sorted({int(h) for h in horizons})
    if not horizons or horizons[0] < 1:
        raise UserError(f"horizons must be positive integers, got {list(horizons)}")
    if n_samples < 2:
        raise UserError(f"samples must be >= 2, got {n_samples}")
    return horizons


def _chosen_assets(series: Sequence[AssetSeries], assets: Optional[Sequence[str]]) -> Sequence[AssetSeries]:
    if not assets:
        return series
    unknown = sorted(set(assets) - {s.symbol for s in series})
    if unknown:
        raise UserError(f"unknown assets {', '.join(unknown)}; the run has {', '.join(s.symbol for s in series)}")
    return [s for s in series if s.symbol in set(assets)]


def _add_summary(card: dict, shortest: int) -> None:
    """The card's calibration at the shortest horizon, the Holm-adjusted tests, its headline and
    its verdict and MCS lines."""
    first = card["horizons"][str(shortest)]
    card["calibration"] = {
        "horizon": shortest,
        "coverage": first["coverage"]["model"],
        "pit": first["pit"]["model"],
        "pit_test": first["pit_test"]["model"],
        "pit_calibrated": first["pit_calibrated"],
    }
    card["significance"] = _adjust_tests(card)
    # `marketgpt status`'s SCORE: CRPS skill against the best baseline (lowest CRPS) at the shortest horizon
    for hc in card["horizons"].values():
        hc["best_baseline"] = _best_baseline(hc)
    card["headline"] = None if first["best_baseline"] is None else {"horizon": shortest, **first["best_baseline"]}
    card["headlines"] = {h: hc["best_baseline"] for h, hc in card["horizons"].items()}
    card["headline_lines"] = headline_lines(card)
    card["verdicts"] = verdict_lines(card)
    card["mcs_lines"] = mcs_lines(card)
    card["pit_lines"] = pit_lines(card)
    card["cross_section_lines"] = cross_section_lines(card)


def _best_baseline(hc: dict) -> Optional[dict]:
    """The baseline with the lowest CRPS at one horizon and the model's skill against it, with the
    family-wise verdict of its DM test (as in the verdict lines)."""
    best = min(hc["skill"]["crps"], key=lambda name: hc["crps"][name], default=None)
    if best is None:
        return None
    dm = hc["dm"]["crps"][best]
    return {
        "baseline": best,
        **hc["skill"]["crps"][best],
        "verdict": dm["verdict"],
        "p_value": dm["p_value"],
        "p_holm": dm["p_holm"],
    }


def headline_lines(card: dict) -> list[str]:
    """Per horizon, the model against its best baseline (lowest CRPS):
    `Best baseline at H=5: log-HAR-range; CRPS skill -1.2% [-3.0, 0.5], Holm 0.410 (no edge)`."""
    lines = []
    for h, best in card.get("headlines", {}).items():
        if best is not None:
            verdict = format_verdict(int(h), "CRPS", "", best, detail=f", Holm {_p(best['p_holm'])}")
            name = BASELINE_NAMES.get(best["baseline"], best["baseline"])
            lines.append(f"Best baseline at H={h}: {name}; CRPS skill{verdict.split('skill vs ', 1)[1]}")
    return lines


def _adjust_tests(card: dict) -> dict:
    """Holm's adjustment over every DM test of the card (all horizons and baselines: the family
    the verdict lines draw from), and each test's verdict at the family-wise level."""
    tests = [dm for hc in card["horizons"].values() for dm in hc["dm"]["crps"].values()]
    for dm, p in zip(tests, holm([dm["p_value"] for dm in tests])):
        dm["p_holm"] = p
        dm["verdict"] = family_verdict(dm["mean_diff"], p)
    return {
        "test": "Diebold-Mariano with the Harvey-Leybourne-Newbold correction, per-date CRPS",
        "adjustment": "holm",
        "family_alpha": FAMILY_ALPHA,
        "family": sum(dm["p_value"] is not None for dm in tests),
    }


def _p(p: Optional[float]) -> str:
    return "n/a" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def verdict_lines(card: dict) -> list[str]:
    """One CRPS verdict line per horizon and baseline: the skill with its interval, the DM
    p-value, Holm's adjusted one, and the verdict at the family-wise 5% level."""
    lines = []
    for h, hc in card["horizons"].items():
        for name, skill in hc["skill"]["crps"].items():
            dm = hc.get("dm", {}).get("crps", {}).get(name)
            if dm is None:  # a card made before the tests: the interval's own verdict
                lines.append(format_verdict(int(h), "CRPS", BASELINE_NAMES.get(name, name), skill))
                continue
            lines.append(
                format_verdict(
                    int(h),
                    "CRPS",
                    BASELINE_NAMES.get(name, name),
                    {**skill, "verdict": dm["verdict"]},
                    detail=f", DM p {_p(dm['p_value'])}, Holm {_p(dm['p_holm'])}",
                )
            )
    return lines


def cross_section_lines(card: dict) -> list[str]:
    """`Rank IC at H=1: model 0.044 (t 0.9); best factor reversal 0.061 (t 2.3); model - best -0.017 (t -0.4)`."""
    lines = []
    t = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
    for h, hc in card["horizons"].items():
        edge, model = (hc.get("cross_section") or {}).get("edge"), hc.get("rank_ic", {}).get("model")
        if edge is None or model is None or edge["model_minus_best"] is None:
            continue
        best = hc["cross_section"]["factors"][edge["best_factor"]]
        lines.append(
            f"Rank IC at H={h}: model {model['mean']:.3f} (t {t(model['t_nw'])}); best factor "
            f"{edge['best_factor']} {best['mean']:.3f} (t {t(best['t_nw'])}); model - best "
            f"{edge['model_minus_best']:+.3f} (t {t(edge['t_nw'])}, {edge['n_dates']} dates)"
        )
    return lines


def pit_lines(card: dict) -> list[str]:
    """`PIT uniform at H=1: model p 0.412, GARCH p 0.088; not: RW-EWMA p <0.001`, one line per horizon."""
    lines = []
    for h, hc in card["horizons"].items():
        tests = {k: t for k, t in hc.get("pit_test", {}).items() if t is not None}
        if not tests:
            continue
        named = {k: f"{BASELINE_NAMES.get(k, k)} p {_p(t['p_value'])}" for k, t in tests.items()}
        yes = ", ".join(named[k] for k, t in tests.items() if t["uniform"]) or "none"
        no = ", ".join(named[k] for k, t in tests.items() if not t["uniform"])
        lines.append(f"PIT uniform at H={h}: {yes}" + (f"; not: {no}" if no else ""))
    return lines


def mcs_lines(card: dict) -> list[str]:
    """`MCS 90% at H=1: model, GARCH (out: RW-EWMA, bootstrap)`, one line per horizon."""
    lines = []
    for h, hc in card["horizons"].items():
        mcs = hc.get("mcs")
        if mcs is None:
            continue
        label = f"MCS {round(100 * (1 - mcs['alpha']))}% at H={h}:"
        if mcs["included"] is None:
            lines.append(f"{label} n/a ({mcs['note']})")
            continue

        def name(k: str) -> str:
            return BASELINE_NAMES.get(k, k)

        out = [name(k) for k in mcs["pvalues"] if k not in mcs["included"]]
        lines.append(
            f"{label} {', '.join(name(k) for k in mcs['included'])}"
            + (f" (out: {', '.join(out)})" if out else " (none out)")
        )
    return lines


def write_scorecard(card: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """scorecard.json and scorecard.png in `out_dir`, each written atomically."""
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / SCORECARD_JSON, card)
    plot_scorecard(card, out_dir / SCORECARD_PNG, BASELINE_NAMES)
    return out_dir / SCORECARD_JSON, out_dir / SCORECARD_PNG


def run_scorecard(
    run_dir: str | Path,
    forecast_fn: ForecastFn,
    *,
    horizons: Sequence[int] = DEFAULT_HORIZONS,
    stride: Optional[int] = 5,
    n_origins: Optional[int] = None,
    n_samples: int = 200,
    seed: int = 0,
    cost_bp: float = DEFAULT_COST_BP,
    assets: Optional[Sequence[str]] = None,
    out_dir: str | Path | None = None,
    progress: Optional[Callable[[str], None]] = None,
    precision: Optional[str] = None,
    calibration: Optional[Calibration] = None,
    barrier: Optional[tuple[float, float]] = None,
    interval: Optional[str] = None,
    budget: Optional[int] = None,
) -> dict:
    """`marketgpt scorecard RUN_DIR`: score `forecast_fn` on the run's test split, write
    scorecard.json and scorecard.png into the run folder (or `out_dir`), return the card.
    precision: the model's (fp32 or bf16 autocast), recorded in the card when given.
    calibration: the run's calibration.json, whose coverage on the test split the card reports.
    interval: which of a run's data.intervals (None: its first), forecast by forecast_fn.
    budget: at most this many (asset, origin) forecasts (make_scorecard)."""
    series, interval = series_from_run(run_dir, interval)
    card = make_scorecard(
        series,
        forecast_fn,
        interval=interval,
        horizons=horizons,
        stride=stride,
        n_origins=n_origins,
        n_samples=n_samples,
        seed=seed,
        cost_bp=cost_bp,
        assets=assets,
        progress=progress,
        calibration=calibration,
        barrier=barrier,
        budget=budget,
    )
    card["run"] = str(run_dir)
    if precision is not None:
        card["precision"] = precision
    try:
        write_scorecard(card, out_dir or run_dir)
    except OSError as e:
        raise UserError(f"cannot write the scorecard into {out_dir or run_dir} ({e.strerror or e})") from None
    return card
