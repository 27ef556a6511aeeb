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

`make_scorecard(series, forecast_fn, ScorecardSettings(interval=...))` does the work on any candles; `run_scorecard
(run_dir, forecast_fn)` reads a run folder's data and writes the files into it. The realized
returns are read from the full frame by the scorecard alone, after the forecasts are made.

The parts, by concern: common.evaluation.asset_series (the inputs and the fitted baselines),
common.evaluation.walk_forward (origins, histories, the forecasters' samples),
common.evaluation.price_scoring (per-horizon scores, skill, breakdowns, the backtest card),
common.evaluation.scorecard_plot (scorecard.png), common.evaluation.scorecard_summary (the Holm-adjusted
verdicts and the text lines); this module puts them together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from common.atomic import atomic_write_json
from common.config import load_config
from common.data.synthetic import synthetic_spec
from common.errors import UserError
from common.evaluation import observable_oracle
from common.evaluation.asset_series import AssetSeries, fit_price_baselines, series_from_run
from common.evaluation.backtest import DEFAULT_COST_BP
from common.evaluation.calibration import calibrated_pit_card, calibration_card
from common.evaluation.har_baselines import HarRange
from common.evaluation.metrics import skill_interval
from common.evaluation.price_baselines import ForecastFn, GarchT
from common.evaluation.price_scoring import backtest_card, ceiling_card, ceiling_ranking, horizon_card
from common.evaluation.result_lines import BASELINE_NAMES
from common.evaluation.scorecard_plot import plot_scorecard
from common.evaluation.scorecard_summary import add_summary
from common.evaluation.walk_forward import Origins, all_origins, forecast_all, origin_indices, within_budget
from common.forecasting.calibrated import Calibration
from common.forecasting.forecast_io import History
from common.forecasting.price_paths import barrier_outcomes, brier_score
from common.run.files import CONFIG_JSON, SCORECARD_JSON, SCORECARD_PNG

__all__ = [
    "DEFAULT_HORIZONS",
    "ScorecardSettings",
    "barrier_card",
    "barrier_lines",
    "forecaster_fn",
    "make_scorecard",
    "observable_ceiling",
    "run_scorecard",
    "write_scorecard",
]

DEFAULT_HORIZONS = (1, 5, 20)


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


@dataclass(frozen=True)
class ScorecardSettings:
    """What a scorecard scores and how, beside the candles and the forecasters.

    interval: the bar length ("1d"). horizons: the steps H scored. stride / n_origins: every
    `stride`-th test date as an origin, or `n_origins` evenly spaced (walk_forward.origin_indices).
    n_samples: sampled paths per origin and forecaster; seed: the forecasts' and the bootstrap's.
    cost_bp: the backtest's cost per side; n_boot: block-bootstrap resamples.
    assets: only these symbols (None: all). barrier: (upper, lower), e.g. (0.05, -0.03): also the
    Brier scores of the barrier probabilities (card["barrier"], see barrier_card).
    budget: at most this many (asset, origin) forecasts, drawn by walk_forward.within_budget
    (card["origins"]["budget"] says how); None: every origin.
    """

    interval: Optional[str] = None  # run_scorecard: None is the run's first; make_scorecard needs one
    horizons: Sequence[int] = DEFAULT_HORIZONS
    stride: Optional[int] = 5
    n_origins: Optional[int] = None
    n_samples: int = 200
    seed: int = 0
    cost_bp: float = DEFAULT_COST_BP
    n_boot: int = 1000
    assets: Optional[Sequence[str]] = None
    barrier: Optional[tuple[float, float]] = None
    budget: Optional[int] = None


def make_scorecard(
    series: Sequence[AssetSeries],
    forecast_fn: ForecastFn,
    settings: ScorecardSettings,
    *,
    baselines: Optional[Mapping[str, ForecastFn]] = None,
    progress: Optional[Callable[[str], None]] = None,
    calibration: Optional[Calibration] = None,
    keep: Optional[dict] = None,
    ceiling: Optional[Mapping[str, ForecastFn]] = None,
) -> dict:
    """The scorecard (a JSON-ready dict) of `forecast_fn` against the price baselines.

    series: every asset's candles and the run's split ranges; settings: what to score and how.
    baselines: name -> forecaster; by default `fit_price_baselines(series, settings.interval)`.
    calibration: the run's calibration.json (fitted on val): the card adds its coverage on test.
    keep: a dict that receives the per-origin "stats" (horizon -> forecaster -> arrays), the
    "origins" and the "stride" (common.evaluation.benchmark pools them across tasks).
    ceiling: name -> the best possible forecaster (the observable oracle on a rich synthetic run):
    forecast on the same origins but not a baseline; each horizon's "ceiling" says what share of its
    edge over the best baseline the model holds (price_scoring.ceiling_card).
    """
    interval, n_samples, seed, n_boot = settings.interval, settings.n_samples, settings.seed, settings.n_boot
    if interval is None:
        raise ValueError("make_scorecard needs settings.interval (the bar length of the series)")
    barrier = settings.barrier
    horizons = _check_request(settings.horizons, n_samples)
    series = _chosen_assets(series, settings.assets)
    say = progress or (lambda _msg: None)
    origins, step = origin_indices(series, stride=settings.stride, n_origins=settings.n_origins)
    bt_horizon = min(horizons, key=lambda h: (abs(h - step), h))  # the horizon closest to the holding period
    drawn: dict = {}
    o, scored_step = _scored_origins(series, origins, horizons, step, settings.budget, seed, drawn, say)
    if baselines is None:
        # each asset's fit is its own, so only the assets with an origin to forecast are fitted: under
        # a budget (case A's 600 assets, a few drawn a date) most GARCH fits would go unused
        say("fitting the baselines (GARCH on the train split)")
        baselines = fit_price_baselines([series[k] for k in np.unique(o.series)], interval)
    ceiling = dict(ceiling or {})
    forecasters = {"model": forecast_fn, **baselines, **ceiling}
    ranked = ["model"] + [name for name, fn in baselines.items() if getattr(fn, "drift", True)]

    card = _card_head(interval, n_samples, seed, step, len(series), baselines)
    card["origins"].update(drawn)
    step = scored_step
    say(f"{len(o.index)} origins x {len(forecasters)} forecasters x {n_samples} samples, H up to {horizons[-1]}")
    stats, momentum = forecast_all(series, o, forecasters, horizons, n_samples, seed, say, barrier=barrier)
    ceiling_stats = {h: {name: stats[h].pop(name) for name in ceiling} for h in horizons}
    if keep is not None:
        keep.update(stats=stats, origins=o, stride=step)
    scoring = _Scoring(series, o, stats, step, n_boot, seed)
    for h in horizons:
        hc = card["horizons"][str(h)] = _horizon_entry(scoring, ranked, h, calibration)
        if ceiling:
            oh = o.subset(np.isfinite(o.y[h]), h)
            hc["ceiling"] = ceiling_card(stats[h], ceiling_stats[h], oh.dates, h, step, n_boot, seed)
            edge = hc["cross_section"]["edge"]
            if edge is not None:
                ranking = ceiling_ranking(series, oh, ceiling_stats[h], edge["best_factor"], h, step)
                for name, entry in ranking.items():
                    hc["ceiling"][name].update(entry)
        if h == bt_horizon:
            card["backtest"] = _backtest_entry(scoring, momentum, hc, h, settings.cost_bp)
    add_summary(card, horizons[0])
    _add_calibrated(card, stats, calibration)
    if barrier is not None:
        card["barrier"] = barrier_card(series, o, stats, barrier, step, n_boot, seed)
        card["barrier_lines"] = barrier_lines(card["barrier"])
    return card


def _scored_origins(
    series: Sequence[AssetSeries],
    origins: Mapping[str, np.ndarray],
    horizons: list[int],
    stride: int,
    budget: Optional[int],
    seed: int,
    card_origins: dict,
    say: Callable[[str], None],
) -> tuple[Origins, int]:
    """The origins to forecast and their stride: every one with a target at the shortest horizon, or at most
    `budget` of them (walk_forward.within_budget, recorded in `card_origins`); a UserError when there is none."""
    o = all_origins(series, origins, horizons)
    if len(o.index) == 0:
        raise UserError(f"no origin in the test split has a candle {horizons[0]} bars later; use shorter horizons")
    if budget is not None:
        o, stride, drawn = within_budget(o, budget, stride, seed)
        card_origins.update(stride=stride, budget=budget, drawn=drawn)
        if drawn:
            say(drawn)
    return o, stride


@dataclass(frozen=True)
class _Scoring:
    """What every horizon's scores share: the assets, the origins forecast, the forecasters' per-origin
    stats (horizon -> name -> arrays), the origin stride and the block bootstrap's settings."""

    series: Sequence[AssetSeries]
    origins: Origins
    stats: dict
    stride: int
    n_boot: int
    seed: int


def _card_head(
    interval: str, n_samples: int, seed: int, stride: int, n_assets: int, baselines: Mapping[str, ForecastFn]
) -> dict:
    """The card before any score: the request, the origins' stride, the baselines and their fallbacks."""
    card: dict = {
        "interval": interval,
        "samples": n_samples,
        "seed": seed,
        "horizons": {},
        "origins": {"stride": stride, "assets": n_assets},
        "baselines": sorted(baselines),
        "crps_estimator": "scoringrules crps_ensemble (pwm = fair)",
    }
    garch = baselines.get("garch")
    if isinstance(garch, GarchT):
        card["garch_fallback"] = list(garch.fallback)
    har = baselines.get("har")
    if isinstance(har, HarRange):
        card["har_fallback"] = list(har.fallback)
    return card


def _horizon_entry(scoring: _Scoring, ranked: list[str], h: int, calibration: Optional[Calibration]) -> dict:
    """card["horizons"][str(h)]: the scores on the origins whose close h bars later exists, and the PIT of the
    calibrated model (null without calibration)."""
    o = scoring.origins
    oh = o.subset(np.isfinite(o.y[h]), h)
    if len(oh.index) == 0:
        raise UserError(f"no origin in the test split has a candle {h} bars later; use shorter horizons")
    stats = scoring.stats[h]
    hc = horizon_card(scoring.series, oh, stats, ranked, h, scoring.stride, scoring.n_boot, scoring.seed)
    hc["pit_calibrated"] = calibrated_pit_card(
        calibration, stats["model"], oh.y[h], oh.dates, horizon=h, stride=scoring.stride
    )
    return hc


def _backtest_entry(scoring: _Scoring, momentum: np.ndarray, hc: dict, h: int, cost_bp: float) -> dict:
    """card["backtest"]: the model's sign(mean) positions at horizon h (the one closest to the holding period)
    against buy-and-hold, momentum and the best cross-sectional factor of `hc`, the horizon's card."""
    o = scoring.origins
    scored = np.isfinite(o.y[h])
    edge = hc["cross_section"]["edge"]
    return backtest_card(
        scoring.series,
        o.subset(scored, h),
        scoring.stats[h]["model"],
        momentum[scored],
        h,
        cost_bp,
        scoring.n_boot,
        scoring.seed,
        best_factor=edge["best_factor"] if edge else None,
    )


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


def write_scorecard(card: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """scorecard.json and scorecard.png in `out_dir`, each written atomically."""
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / SCORECARD_JSON, card)
    plot_scorecard(card, out_dir / SCORECARD_PNG, BASELINE_NAMES)
    return out_dir / SCORECARD_JSON, out_dir / SCORECARD_PNG


def observable_ceiling(run_dir: str | Path, interval: str) -> dict[str, ForecastFn]:
    """{"observable_oracle": its forecaster} for a run of the rich synthetic market without gaps,
    scored at the market's own interval (the exact predictive given the candles up to each origin:
    common.evaluation.observable_oracle); else nothing, no ceiling being known."""
    data = load_config(Path(run_dir) / CONFIG_JSON).data
    if data.source != "synthetic":
        return {}
    spec = synthetic_spec(data)
    if not observable_oracle.models(spec) or interval != spec.interval:
        return {}
    return {"observable_oracle": observable_oracle.forecaster(spec)}


def run_scorecard(
    run_dir: str | Path,
    forecast_fn: ForecastFn,
    settings: Optional[ScorecardSettings] = None,
    *,
    out_dir: str | Path | None = None,
    progress: Optional[Callable[[str], None]] = None,
    precision: Optional[str] = None,
    calibration: Optional[Calibration] = None,
    extra_baselines: Optional[Mapping[str, ForecastFn]] = None,
    reversion_tau: Optional[Sequence[Optional[float]]] = None,
) -> dict:
    """`marketgpt scorecard RUN_DIR`: score `forecast_fn` on the run's test split, write
    scorecard.json and scorecard.png into the run folder (or `out_dir`), return the card.
    settings: what to score (default ScorecardSettings()); its interval: which of a run's
    data.intervals (None: its first), forecast by forecast_fn.
    precision: the model's (fp32 or bf16 autocast), recorded in the card when given.
    calibration: the run's calibration.json, whose coverage on the test split the card reports.
    extra_baselines: more forecasters beside the fitted baselines (the foundation models).
    reversion_tau: the volatility reversion of each run the model's paths came from (recorded).
    On a run of the rich synthetic market the observable oracle is scored too, as the ceiling."""
    settings = settings or ScorecardSettings()
    series, interval = series_from_run(run_dir, settings.interval)
    settings = dataclasses.replace(settings, interval=interval)
    baselines = {**fit_price_baselines(series, interval), **extra_baselines} if extra_baselines else None
    card = make_scorecard(
        series,
        forecast_fn,
        settings,
        baselines=baselines,
        progress=progress,
        calibration=calibration,
        ceiling=observable_ceiling(run_dir, interval),
    )
    card["run"] = str(run_dir)
    if precision is not None:
        card["precision"] = precision
    if reversion_tau is not None:
        card["reversion_tau"] = list(reversion_tau)
    try:
        write_scorecard(card, out_dir or run_dir)
    except OSError as e:
        raise UserError(f"cannot write the scorecard into {out_dir or run_dir} ({e.strerror or e})") from None
    return card
