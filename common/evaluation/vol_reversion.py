"""Fitting the volatility reversion (common.forecasting.reversion) on the validation split.

    per asset: the candles up to the last row of the validation split (val_series: no test row)
      ──► origins every FIT_STRIDE-th val date, at most `budget` forecasts (walk_forward.within_budget)
      ──► the model's raw sampled paths, once per origin
      ──► for each tau of TAUS the same paths reverted; mean CRPS at 1, 5 and 20 steps
      ──► tau with the lowest mean of CRPS / raw CRPS over the three horizons (none: raw is best)
      ──► reversion.json in the run folder (atomic): tau, the scores of every candidate, the dates

The end of training fits it (training.vol_reversion) before the small scorecard, so that card,
`marketgpt scorecard`, forecasts and exports all read the reverted paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd

from common.atomic import atomic_write_json
from common.errors import UserError
from common.evaluation.asset_series import AssetSeries, series_from_run
from common.evaluation.calibration import MIN_VAL_ORIGINS, val_series
from common.evaluation.price_baselines import ForecastFn
from common.evaluation.scorecard import forecaster_fn
from common.evaluation.walk_forward import all_origins, forecast_all, origin_indices, within_budget
from common.forecasting.reversion import LONG_RUN, Reversion, long_run_variance, revert_returns
from common.run.files import REVERSION_JSON

__all__ = ["FIT_HORIZONS", "TAUS", "fit_reversion", "fit_run_reversion", "reversion_line", "write_reversion"]

TAUS = (400.0, 200.0, 100.0, 50.0, 25.0, 12.0)  # W_20 from 0.05 to 0.63; W_1 at most 0.08
FIT_HORIZONS = (1, 5, 20)  # the scorecard's
FIT_STRIDE = 5
FIT_BUDGET = 2000  # (asset, origin) forecasts: a large universe draws assets per date
FORMAT_VERSION = 1


def _candidates(raw: ForecastFn) -> dict[str, ForecastFn]:
    """ "raw" (the model's samples, called first in each batch, as forecast_all does) and one
    forecaster per tau that reverts those same samples: every candidate reads the same draws."""
    last: dict[str, Any] = {}

    def model(histories, horizon, n, seed):
        x = np.asarray(raw(histories, horizon, n, seed))
        v_long = np.array([long_run_variance(h.candles["close"].to_numpy(), LONG_RUN) for h in histories])
        last.update(key=id(histories), x=x, v_long=v_long)
        return x

    def reverted(tau: float) -> ForecastFn:
        def fn(histories, horizon, n, seed):
            assert last["key"] == id(histories), "the raw model is called first in each batch"
            return revert_returns(last["x"], last["v_long"], Reversion(tau).weights(last["x"].shape[2]))

        return fn

    return {"raw": model, **{f"tau{tau:g}": reverted(tau) for tau in TAUS}}


def fit_reversion(
    series: Sequence[AssetSeries],
    raw: ForecastFn,
    *,
    n_samples: int = 100,
    seed: int = 0,
    budget: int = FIT_BUDGET,
    checkpoint_sha256: Optional[str] = None,
    progress: Optional[Callable[[str], None]] = None,
) -> dict:
    """reversion.json's content: the tau of TAUS (or none) whose reverted samples of `raw` (a
    forecaster whose paths are not reverted) score the lowest CRPS on the validation split, relative
    to raw, averaged over FIT_HORIZONS. A UserError when there is no validation split or fewer than
    MIN_VAL_ORIGINS origins with a target FIT_HORIZONS[-1] steps on."""
    say = progress or (lambda _msg: None)
    val = val_series(series)
    if not val:
        raise UserError(
            "no validation split (data.val_ratio 0 or too few candles): the volatility reversion is fitted "
            "on it; retrain with data.val_ratio > 0 or training.vol_reversion false"
        )
    origins, stride = origin_indices(val, stride=FIT_STRIDE)
    o, _, drawn = within_budget(all_origins(val, origins, FIT_HORIZONS), budget, stride, seed)
    longest = FIT_HORIZONS[-1]
    n_long = int(np.isfinite(o.y[longest]).sum())
    if n_long < MIN_VAL_ORIGINS:
        raise UserError(
            f"the validation split has {n_long} origins with a close {longest} bars later, {MIN_VAL_ORIGINS} "
            "needed to fit the volatility reversion; use a larger data.val_ratio or training.vol_reversion false"
        )
    say(f"fitting the volatility reversion on {len(o.index)} validation origins x {n_samples} samples")
    stats, _ = forecast_all(val, o, _candidates(raw), FIT_HORIZONS, n_samples, seed, say)
    mean_crps = {h: {name: float(np.mean(st["crps"])) for name, st in stats[h].items()} for h in FIT_HORIZONS}
    skill = {name: {str(h): 1 - mean_crps[h][name] / mean_crps[h]["raw"] for h in FIT_HORIZONS} for name in stats[1]}
    score = {name: float(np.mean(list(by_h.values()))) for name, by_h in skill.items()}
    chosen = max(score, key=score.__getitem__)  # raw's is 0: a pull is kept only where it pays
    tau = None if chosen == "raw" else float(chosen[3:])
    weights = Reversion(tau).weights(longest) if tau is not None else np.zeros(longest)
    return {
        "version": FORMAT_VERSION,
        "method": "v_k -> (1 - W_k) v_k + W_k k v_long, W_k = k / (k + tau); tau by validation CRPS",
        "tau": tau,
        "long_run": LONG_RUN,
        "weights": {str(h): float(weights[h - 1]) for h in FIT_HORIZONS},
        "split": "val",
        "origins": int(len(o.index)),
        "drawn": drawn,
        "samples": n_samples,
        "seed": seed,
        "val_crps_skill_vs_raw": skill,  # candidate -> horizon -> 1 - CRPS / raw CRPS
        "val_coverage90": {
            name: {str(h): float(np.mean(stats[h][name]["cover90"])) for h in FIT_HORIZONS} for name in stats[1]
        },
        "dates": {
            "first_origin": pd.Timestamp(int(o.dates.min()), tz="UTC").isoformat(),
            "last_origin": pd.Timestamp(int(o.dates.max()), tz="UTC").isoformat(),
        },
        "checkpoint_sha256": checkpoint_sha256,
    }


def fit_run_reversion(
    run_dir: Path, forecaster: Any, *, n_samples: int, seed: int, progress: Optional[Callable[[str], None]] = None
) -> dict:
    """Fit a run's reversion with its Forecaster (the paths as sampled: its own reversion set aside)
    on the run's validation split, write reversion.json and return its content."""
    forecaster.reversion = None
    series, interval = series_from_run(run_dir)  # the run's first interval, as forecaster's default
    content = fit_reversion(
        series,
        forecaster_fn(forecaster),
        n_samples=n_samples,
        seed=seed,
        checkpoint_sha256=forecaster.checkpoint_sha256,
        progress=progress,
    )
    content["interval"] = interval  # forecasts at another of the run's intervals are not reverted
    write_reversion(content, run_dir)
    return content


def reversion_line(content: dict) -> str:
    """The fit in one line: what it chose and the validation CRPS it gained over the raw paths."""
    tau = content["tau"]
    skill = content["val_crps_skill_vs_raw"]["raw" if tau is None else f"tau{tau:g}"]
    gains = ", ".join(f"H={h} {v:+.2%}" for h, v in skill.items())
    what = "none (the paths as sampled)" if tau is None else f"tau {tau:g} steps"
    return f"Volatility reversion on validation: {what}; CRPS vs raw {gains}"


def write_reversion(content: dict, run_dir: str | Path) -> Path:
    """reversion.json in the run folder, written atomically."""
    path = Path(run_dir) / REVERSION_JSON
    try:
        atomic_write_json(path, content)
    except OSError as e:
        raise UserError(f"cannot write {path} ({e.strerror or e})") from None
    return path
