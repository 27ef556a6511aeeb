"""Calibrated quantiles: read a run's calibration.json and widen (or narrow) the forecast's intervals.

The calibration is split-conformal, conformalized quantile regression style (CQR, Romano,
Patterson and Candes 2019), fitted by `marketgpt calibrate RUN_DIR` on the validation split
(common.evaluation.calibration). Per forecast step h and central level L (50, 80, 90, 95), in
log-return space from the origin close:

    lo, hi = the (1 - L)/2 and (1 + L)/2 quantiles of the model's samples
    score  = max(lo - y, y - hi)                     (> 0: y outside; < 0: inside, by that much)
    q[h,L] = the ceil((n + 1) L)-th smallest score over the n validation origins
    calibrated interval = [lo - q, hi + q]           (in prices: the close quantile times exp(-q), exp(q))

This module holds what applying it needs (the interval ends, the score, reading the file and
shifting a forecast table), so `marketgpt forecast --calibrated` does not reach the evaluation floor.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from common.errors import UserError
from common.run.files import CALIBRATION_JSON

__all__ = [
    "CALIBRATION_LEVELS",
    "Calibration",
    "calibrate_table",
    "central_intervals",
    "conformity_scores",
    "load_calibration",
]

# central levels. The forecast table has the ends of 50, 80 and 90 (p25/p75, p10/p90, p5/p95); 95 is
# fitted for the scorecard's coverage of the calibrated forecaster and the records.
CALIBRATION_LEVELS = (50, 80, 90, 95)
FORMAT_VERSION = 1


def central_intervals(
    samples: np.ndarray, levels: Sequence[int] = CALIBRATION_LEVELS
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """level -> (lo, hi), each (n,): the central level% interval of each row of samples (n, S),
    numpy's linear quantiles (as the scorecard's coverage and the forecast's columns)."""
    out = {}
    for level in levels:
        q = np.quantile(samples, [(1 - level / 100) / 2, (1 + level / 100) / 2], axis=1)
        out[str(level)] = (q[0], q[1])
    return out


def conformity_scores(
    samples: np.ndarray, y: np.ndarray, levels: Sequence[int] = CALIBRATION_LEVELS
) -> dict[str, np.ndarray]:
    """level -> (n,) CQR score max(lo - y, y - hi): y lies in [lo - q, hi + q] exactly when score <= q."""
    y = np.asarray(y, dtype=np.float64)
    return {level: np.maximum(lo - y, y - hi) for level, (lo, hi) in central_intervals(samples, levels).items()}


@dataclass(frozen=True)
class Calibration:
    """A fitted calibration.json: adjustments[h][level] in log return, for steps 1..max(horizons)."""

    path: Path
    horizons: tuple[int, ...]
    levels: tuple[int, ...]
    adjustments: dict[int, dict[int, float]]
    sampling: dict[str, Any]  # the sampling settings it was fitted with (temperature, top_k, top_p)
    checkpoint_sha256: Optional[str]
    raw: dict  # the whole file, for the records (forecast.json, the scorecard)

    def check_forecast(self, horizon: int, sampling: Mapping[str, Any], checkpoint_sha256: Optional[str]) -> None:
        """A UserError when the adjustments do not fit this forecast: a step it was not fitted for,
        other sampling settings, another model."""
        if horizon > max(self.horizons):
            raise UserError(
                f"--calibrated: {self.path} covers steps 1..{max(self.horizons)}, not --horizon {horizon}; "
                f"pass --horizon {max(self.horizons)} or refit with `marketgpt calibrate "
                f"{self.path.parent} --horizon {horizon}`"
            )
        for key, fitted in self.sampling.items():
            if sampling.get(key) != fitted:
                raise UserError(
                    f"--calibrated: {self.path} was fitted with {key} {fitted}, not {sampling.get(key)}; "
                    "its adjustments hold for the model's own distribution only (drop the sampling flag)"
                )
        if checkpoint_sha256 and self.checkpoint_sha256 and checkpoint_sha256 != self.checkpoint_sha256:
            raise UserError(
                f"--calibrated: {self.path} was fitted for another best_model.pt (sha256 "
                f"{self.checkpoint_sha256[:12]}); refit it with `marketgpt calibrate {self.path.parent}`"
            )


def load_calibration(folder: str | Path) -> Calibration:
    """The calibration.json of a run folder; a UserError saying how to make it when absent or damaged."""
    path = Path(folder) / CALIBRATION_JSON
    if not path.is_file():
        raise UserError(f"{path} not found; fit it on the run's validation split with `marketgpt calibrate {folder}`")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        adjustments = {
            int(h): {int(level): float(q) for level, q in by_level.items()}
            for h, by_level in raw["adjustments"].items()
        }
        horizons, levels = tuple(int(h) for h in raw["horizons"]), tuple(int(v) for v in raw["levels"])
        ok = (
            horizons == tuple(range(1, len(horizons) + 1))
            and set(adjustments) == set(horizons)
            and all(set(a) == set(levels) and all(map(math.isfinite, a.values())) for a in adjustments.values())
        )
        if not ok:
            raise ValueError("horizons, levels and adjustments do not agree")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(
            f"{path} is damaged ({type(e).__name__}: {e}); refit it with `marketgpt calibrate {folder}`"
        ) from None
    return Calibration(
        path, horizons, levels, adjustments, dict(raw.get("sampling", {})), raw.get("checkpoint_sha256"), raw
    )


def calibrate_table(table: pd.DataFrame, cal: Calibration) -> pd.DataFrame:
    """A copy of a forecast table (common.forecasting.forecaster.summarize_paths's columns, a `step`
    column) with each level's quantile columns moved out by exp(+-q[step, level]) around the close.

    Different levels get different q, so the quantiles of one row are sorted afterwards
    (rearrangement, Chernozhukov et al. 2010: never further from the truth than before)."""
    out = table.copy()
    steps = out["step"].to_numpy()
    for level in cal.levels:
        lo, hi = f"p{(100 - level) // 2}", f"p{(100 + level) // 2}"
        if (100 - level) % 2 or lo not in out.columns:  # a level without quantile columns (95: p2.5)
            continue
        q = np.array([cal.adjustments[int(s)][level] for s in steps])
        out[lo] = out[lo].to_numpy() * np.exp(-q)
        out[hi] = out[hi].to_numpy() * np.exp(q)
    cols = sorted((c for c in out.columns if c[:1] == "p" and c[1:].isdigit()), key=lambda c: int(c[1:]))
    out[cols] = np.sort(out[cols].to_numpy(dtype=np.float64), axis=1)
    return out
