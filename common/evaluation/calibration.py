"""Split-conformal calibration of the model's forecast intervals, fitted on the validation split.

    per asset: the candles up to the last row of the validation split (nothing after: no purge
      gap, no test row exists in what the fit sees) ──► origins every `stride`-th val date
      ──► the model's samples of steps 1..H at each origin (the scorecard's walk-forward)
      ──► per step h and central level L: the CQR scores max(lo - y, y - hi) of the n origins
          whose close h bars later is inside the val split; q[h, L] = the ceil((n+1) L)-th smallest
      ──► calibration.json in the run folder (atomic): the adjustments, n per step, the dates used

Why CQR (Romano et al. 2019) rather than a per-quantile shift: one number per interval moves
both ends, and under exchangeable origins the adjusted interval covers at least L of new
outcomes for any n (the ceil((n+1) L) rank is what makes it finite-sample). A shift per
quantile would also re-centre a biased median but has no such guarantee. Scores are pooled
over the assets, so the guarantee is marginal: an asset calmer than the pool is over-covered.
`common.forecasting.calibrated` reads the file and applies it; the scorecard reports the
coverage it gives on the test split (`calibration_card`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

from common.atomic import atomic_write_json
from common.errors import UserError
from common.evaluation.asset_series import AssetSeries, LazyCandles
from common.evaluation.pit import GRID_EDGES, GRID_TEST, calibrated_grid_bins, grid_bins, pit_uniformity
from common.evaluation.price_baselines import ForecastFn
from common.evaluation.walk_forward import Origins, all_origins, forecast_all, origin_indices
from common.forecasting.calibrated import CALIBRATION_LEVELS, FORMAT_VERSION, Calibration
from common.run.files import CALIBRATION_JSON

__all__ = [
    "MIN_VAL_ORIGINS",
    "calibration_card",
    "calibrated_pit_card",
    "cqr_adjustment",
    "fit_calibration",
    "val_series",
    "write_calibration",
]

MIN_VAL_ORIGINS = 20  # per step: fewer, and the 90% adjustment is one of the two largest scores


def cqr_adjustment(scores: np.ndarray, level: int) -> float:
    """The ceil((n + 1) L)-th smallest of n conformity scores (L = level / 100)."""
    scores = np.sort(np.asarray(scores, dtype=np.float64))
    k = math.ceil((len(scores) + 1) * level / 100)
    if k > len(scores):
        raise UserError(
            f"{len(scores)} validation origins cannot calibrate a {level}% interval "
            f"(need {math.ceil(level / (100 - level))} or more)"
        )
    return float(scores[k - 1])


def val_series(series: Sequence[AssetSeries]) -> list[AssetSeries]:
    """Each asset with a validation split, cut after its last val row; the walk-forward draws its
    origins from `.test`, so here `.test` is the val range. A target h bars after an origin exists
    only inside the val split: by construction no candle of the purge gap or the test split is read."""
    recent: OrderedDict = OrderedDict()  # cut when used, like a run's series (LazyCandles)
    return [dataclasses.replace(s, candles=_cut(s, recent), test=s.val) for s in series if len(s.val) > 0]


def _cut(s: AssetSeries, recent: OrderedDict) -> LazyCandles:
    return LazyCandles(s.symbol, lambda: s.candles.iloc[: s.val.stop], recent, rows=s.val.stop)


def fit_calibration(
    series: Sequence[AssetSeries],
    forecast_fn: ForecastFn,
    *,
    horizon: int,
    stride: Optional[int] = 5,
    n_origins: Optional[int] = None,
    n_samples: int = 200,
    seed: int = 0,
    levels: Sequence[int] = CALIBRATION_LEVELS,
    source: str = "the run",
    progress: Optional[Callable[[str], None]] = None,
) -> dict:
    """calibration.json's content: CQR adjustments of `forecast_fn` for steps 1..horizon, from
    origins in each asset's validation split (never its test split). A UserError when the run has
    no validation split or a step has fewer than MIN_VAL_ORIGINS origins."""
    if horizon < 1:
        raise UserError(f"--horizon {horizon}: must be at least 1")
    say = progress or (lambda _msg: None)
    val = val_series(series)
    if not val:
        raise UserError(
            f"{source} has no validation split (data.val_ratio 0 or too few candles); calibration is "
            "fitted on the validation split only: retrain with data.val_ratio > 0"
        )
    steps = list(range(1, horizon + 1))
    o, step, counts = _val_origins(val, steps, stride, n_origins, source)
    say(f"calibrating on {len(o.index)} validation origins x {n_samples} samples, steps 1..{horizon}")
    stats, _ = forecast_all(val, o, {"model": forecast_fn}, steps, n_samples, seed, say)
    adjustments, coverage = _adjustments(stats, steps, levels)
    last_target = max(int(s.candles.index[-1].value) for s in val)  # the latest candle any fit could read
    return {
        "version": FORMAT_VERSION,
        "method": "split-conformal CQR: q = ceil((n+1)L)-th smallest max(lo-y, y-hi)",
        "space": "log return from the origin close",
        "split": "val",
        "horizons": steps,
        "levels": [int(lv) for lv in levels],
        "adjustments": adjustments,
        "n_origins": {str(h): counts[h] for h in steps},
        "n_dates": int(len(np.unique(o.dates))),
        "assets": len(val),
        "stride": step,
        "samples": n_samples,
        "seed": seed,
        "val_coverage_raw": coverage,
        "dates": {
            "first_origin": _iso(o.dates.min()),
            "last_origin": _iso(o.dates.max()),
            "last_candle_read": _iso(last_target),
        },
        "test_starts": _iso(min(int(s.candles.index[s.test.start].value) for s in series if len(s.test)))
        if any(len(s.test) for s in series)
        else None,
        "sampling": {"temperature": 1.0, "top_k": None, "top_p": None},
    }


def _val_origins(
    val: Sequence[AssetSeries], steps: list[int], stride: Optional[int], n_origins: Optional[int], source: str
) -> tuple[Origins, int, dict[int, int]]:
    """The validation origins, their stride and, per step, how many have a target; a UserError when a step
    has fewer than MIN_VAL_ORIGINS."""
    origins, step = origin_indices(val, stride=stride, n_origins=n_origins)
    o = all_origins(val, origins, steps)
    counts = {h: int(np.isfinite(o.y[h]).sum()) for h in steps}
    short = [h for h in steps if counts[h] < MIN_VAL_ORIGINS]
    if short:
        raise UserError(
            f"{source}: the validation split has {counts[short[0]]} origins with a close {short[0]} bars "
            f"later, {MIN_VAL_ORIGINS} needed per step; pass a shorter --horizon or a smaller --stride"
        )
    return o, step, counts


def _adjustments(stats: dict, steps: list[int], levels: Sequence[int]) -> tuple[dict, dict]:
    """Per step and level: the CQR adjustment of the model's scores, and the raw coverage on val."""
    adjustments, coverage = {}, {}
    for h in steps:
        model = stats[h]["model"]
        adjustments[str(h)] = {str(lv): cqr_adjustment(model[f"score{lv}"], lv) for lv in levels}
        coverage[str(h)] = {str(lv): float(np.mean(model[f"score{lv}"] <= 0)) for lv in levels}
    return adjustments, coverage


def _iso(ns: int) -> str:
    """A UTC timestamp in ns as ISO 8601."""
    return pd.Timestamp(int(ns), tz="UTC").isoformat()


def write_calibration(content: dict, run_dir: str | Path) -> Path:
    """calibration.json in the run folder, written atomically."""
    path = Path(run_dir) / CALIBRATION_JSON
    try:
        atomic_write_json(path, content)
    except OSError as e:
        raise UserError(f"cannot write {path} ({e.strerror or e})") from None
    return path


def calibration_card(cal: Optional[Calibration], model_stats: dict[str, np.ndarray], horizon: int) -> Optional[dict]:
    """The coverage of the calibrated intervals at one scorecard horizon (share of test origins
    with score <= q), or None without a calibration covering that horizon."""
    if cal is None or horizon not in cal.adjustments:
        return None
    return {
        str(lv): float(np.mean(model_stats[f"score{lv}"] <= cal.adjustments[horizon][lv]))
        for lv in cal.levels
        if f"score{lv}" in model_stats
    }


def calibrated_pit_card(
    cal: Optional[Calibration],
    model_stats: dict[str, np.ndarray],
    y: np.ndarray,
    dates: np.ndarray,
    *,
    horizon: int,
    stride: int,
) -> Optional[dict]:
    """The PIT of the calibrated and the raw model on the grid of the 50/80/90% interval ends
    (common.evaluation.pit), with each one's uniformity test; None without a calibration of the
    three levels at this horizon."""
    if cal is None or horizon not in cal.adjustments or not {50, 80, 90} <= set(cal.adjustments[horizon]):
        return None
    expected = np.diff(GRID_EDGES)
    scores = {lv: model_stats[f"score{lv}"] for lv in (50, 80, 90)}
    bins = {
        "calibrated": calibrated_grid_bins(scores, cal.adjustments[horizon], y >= model_stats["median"]),
        "raw": grid_bins(model_stats["pit"]),
    }
    out: dict = {"edges": list(GRID_EDGES), "expected": expected.tolist()}
    for name, b in bins.items():
        out[name] = (np.bincount(b, minlength=len(expected)) / max(len(b), 1)).tolist()
        test_expected = np.bincount(GRID_TEST, weights=expected)  # the tails' 5% bins merged
        out[f"test_{name}"] = pit_uniformity(GRID_TEST[b], test_expected, dates, horizon=horizon, stride=stride)
    return out
