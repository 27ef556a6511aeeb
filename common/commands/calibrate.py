"""`marketgpt calibrate RUN_DIR`: fit the model's interval calibration on the validation split.

    marketgpt calibrate RUN_DIR [--horizon 24] [--stride K | --origins N] [--samples 200] [--seed 0]
                                [--device cpu] [--precision auto|fp32|bf16]
    marketgpt calibrate RUN_DIR --reversion [--samples 200] [--seed 0]

Writes RUN_DIR/calibration.json (common.evaluation.calibration: split-conformal CQR per step and
level), which `marketgpt forecast --calibrated` applies and `marketgpt scorecard` reports on the
test split. A separate command rather than a side effect of the scorecard: its cost (one more
walk-forward, over the val split) is paid once and named, and one fitted file serves both.
With --reversion it fits the volatility reversion instead (reversion.json,
common.evaluation.vol_reversion), as the end of training does: for a run trained without it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from common.commands.scorecard import parse_device  # the scorecard's --device check (torch)
from common.errors import UserError
from common.evaluation.asset_series import series_from_run
from common.evaluation.calibration import fit_calibration, write_calibration
from common.evaluation.scorecard import forecaster_fn
from common.evaluation.vol_reversion import fit_run_reversion, reversion_line
from common.forecasting.forecaster import Forecaster
from common.run.files import REVERSION_JSON

__all__ = ["CalibrateRequest", "run_calibrate_command"]


@dataclass(frozen=True)
class CalibrateRequest:
    """What `marketgpt calibrate` was asked for (the flags' defaults are common.cli's)."""

    run_dir: Path
    horizon: int = 24  # steps 1..horizon (forecast's default horizon)
    stride: Optional[int] = None  # every K-th val candle is an origin (5 when neither this nor origins)
    origins: Optional[int] = None  # or N origin dates, evenly spaced
    samples: int = 200
    seed: int = 0
    device: str = "cpu"
    precision: str = "auto"
    reversion: bool = False  # reversion.json instead of calibration.json


def run_calibrate_command(req: CalibrateRequest) -> int:
    """Fit, write calibration.json, print the adjustments at a few steps; exit code 0."""
    if req.stride is not None and req.origins is not None:
        raise UserError("give --stride K (every K-th val candle) or --origins N (N evenly spaced), not both")
    for flag, value in (("--stride", req.stride), ("--origins", req.origins), ("--horizon", req.horizon)):
        if value is not None and value < 1:
            raise UserError(f"{flag} {value}: must be at least 1")
    if req.samples < 2:
        raise UserError(f"--samples {req.samples}: must be at least 2")
    stride = req.stride if req.stride is not None or req.origins is not None else 5
    forecaster = Forecaster.from_run(req.run_dir, device=parse_device(req.device), precision=req.precision)
    if req.reversion:  # reads the run's series itself
        say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
        fitted = fit_run_reversion(req.run_dir, forecaster, n_samples=req.samples, seed=req.seed, progress=say)
        print(reversion_line(fitted))
        print(f"Wrote {Path(req.run_dir) / REVERSION_JSON}")
        return 0
    series, _ = series_from_run(req.run_dir)
    forecaster.check_request(req.horizon, req.samples)
    content = fit_calibration(
        series,
        forecaster_fn(forecaster),
        horizon=req.horizon,
        stride=stride,
        n_origins=req.origins,
        n_samples=req.samples,
        seed=req.seed,
        source=str(req.run_dir),
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    content.update(run=str(req.run_dir), checkpoint_sha256=forecaster.checkpoint_sha256, precision=forecaster.precision)
    path = write_calibration(content, req.run_dir)
    print(summary_lines(content))
    print(f"Wrote {path}")
    return 0


def summary_lines(content: dict) -> str:
    """Per shown step: the val coverage of the raw 90% interval and the adjustment q (log return)."""
    steps = sorted({1, 5, 20, content["horizons"][-1]} & set(content["horizons"]))
    d = content["dates"]
    lines = [
        f"Calibrated on the validation split: {content['n_dates']} origin dates, {d['first_origin'][:10]} to "
        f"{d['last_origin'][:10]} (no candle after {d['last_candle_read'][:10]})"
    ]
    for h in steps:
        raw, q = content["val_coverage_raw"][str(h)]["90"], content["adjustments"][str(h)]["90"]
        lines.append(
            f"  H={h}: raw 90% interval covered {raw:.0%} of {content['n_origins'][str(h)]} val origins; "
            f"ends moved by {q:+.4f} log return"
        )
    return "\n".join(lines)
