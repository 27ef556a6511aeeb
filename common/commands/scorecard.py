"""The scorecard of a trained run: `marketgpt scorecard RUN_DIR` (the small one every run writes
at the end of training: common/evaluation/final_scorecard.py).

    marketgpt scorecard RUN_DIR [--horizons 1,5,20] [--stride K | --origins N] [--samples 200]
                                [--assets A,B] [--seed 0] [--cost-bp 10] [--device cpu]
                                [--precision auto|fp32|bf16] [--barrier +5%,-3%]
                                [--baseline chronos:ID_OR_PATH] [--baseline timesfm:ID_OR_PATH]

Both score the run's best model (`common.forecasting.forecaster.Forecaster`) with
`common.evaluation.scorecard.run_scorecard` and write scorecard.json and scorecard.png into the
run folder. The end-of-training one uses `training.scorecard_origins` origin dates (0 turns it
off), at most `training.scorecard_budget` (asset, origin) forecasts drawn among them, and
`training.scorecard_samples` paths at horizons 1, 5 and 20, with its progress in the job log;
the command defaults to the issue's full scorecard (every 5th test candle, 200 samples).
--baseline adds foundation models, zero-shot, beside the fitted baselines
(common.evaluation.foundation_baselines, docs/foundation-baselines.md); never at the end of training.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from common.atomic import atomic_write_json
from common.errors import UserError
from common.evaluation.foundation_baselines import FOUNDATION_KINDS, load_foundation_baseline
from common.evaluation.scorecard import ScorecardSettings, forecaster_fn, run_scorecard
from common.forecasting.calibrated import load_calibration
from common.forecasting.ensemble import Ensemble, forecaster_for
from common.forecasting.price_paths import parse_barriers
from common.run.files import CALIBRATION_JSON, SCORECARD_JSON, SCORECARD_PNG

__all__ = [
    "ScorecardRequest",
    "parse_baselines",
    "parse_device",
    "parse_horizons",
    "run_scorecard_command",
]


@dataclass(frozen=True)
class ScorecardRequest:
    """What `marketgpt scorecard` was asked for (the flags' defaults are common.cli's)."""

    run_dirs: Sequence[Path]  # one run, or several: their equal-weight ensemble
    horizons: Sequence[int] = (1, 5, 20)  # candles ahead (parse_horizons reads the flag)
    stride: Optional[int] = None  # every K-th test candle is an origin (5 when neither this nor origins)
    origins: Optional[int] = None  # or N origin dates, evenly spaced
    samples: int = 200
    assets: Optional[Sequence[str]] = None  # None: every asset of the run
    seed: int = 0
    cost_bp: float = 10.0
    device: str = "cpu"
    precision: str = "auto"
    barrier: Optional[str] = None  # "+5%,-3%": also the Brier scores of the barrier probabilities
    interval: Optional[str] = None  # which of a run's data.intervals (None: its first)
    baselines: Sequence[str] = ()  # "chronos:ID_OR_PATH", "timesfm:ID_OR_PATH" (parse_baselines)


def parse_horizons(text: str) -> tuple[int, ...]:
    """'1,5,20' -> (1, 5, 20); a UserError for anything but positive integers."""
    try:
        horizons = tuple(int(h) for h in text.split(","))
    except ValueError:
        horizons = ()
    if not horizons or min(horizons) < 1:
        raise UserError(f"--horizons {text!r}: expected comma-separated positive integers, e.g. 1,5,20")
    return horizons


def parse_baselines(texts: Sequence[str]) -> dict[str, tuple[str, str]]:
    """["chronos:amazon/chronos-bolt-small", ...] -> {card name: (kind, spec)}; the card name is
    the kind and the spec's last part ("chronos:chronos-bolt-small"). UserError for a bad form."""
    out: dict[str, tuple[str, str]] = {}
    for text in texts:
        kind, _, spec = text.partition(":")
        if not spec or kind not in FOUNDATION_KINDS:
            raise UserError(
                f"--baseline {text!r}: expected KIND:ID_OR_PATH with KIND one of {', '.join(FOUNDATION_KINDS)}"
            )
        out[f"{kind}:{spec.rstrip('/').split('/')[-1]}"] = (kind, spec)
    return out


def run_scorecard_command(req: ScorecardRequest) -> int:
    """`marketgpt scorecard`: verdict lines on stdout, progress on stderr."""
    barrier = parse_barriers(req.barrier) if req.barrier is not None else None
    if req.stride is not None and req.origins is not None:
        raise UserError("give --stride K (every K-th test candle) or --origins N (N evenly spaced), not both")
    for flag, value in (("--stride", req.stride), ("--origins", req.origins)):
        if value is not None and value < 1:
            raise UserError(f"{flag} {value}: must be at least 1")
    stride = req.stride if req.stride is not None or req.origins is not None else 5
    if req.samples < 2:
        raise UserError(f"--samples {req.samples}: must be at least 2")
    if req.cost_bp < 0:
        raise UserError(f"--cost-bp {req.cost_bp:g}: must be zero or positive (basis points per side)")
    foundation = parse_baselines(req.baselines)
    runs = list(req.run_dirs)
    forecaster = forecaster_for(
        runs, device=parse_device(req.device), precision=req.precision, interval=req.interval
    )  # several: an ensemble
    # an ensemble's card goes beside the first run's own, with the member list; a run's card of
    # another interval than its first in scorecard_<interval>/
    out = Path(runs[0]) if len(runs) == 1 else Path(runs[0]) / f"ensemble_{len(runs)}"
    if forecaster.interval != forecaster.cfg.data.interval:
        out = out / f"scorecard_{forecaster.interval}"
    if isinstance(forecaster, Ensemble):  # several runs
        atomic_write_json(out / "ensemble.json", {"runs": forecaster.ensemble, "weights": "equal"})
    settings = ScorecardSettings(
        interval=forecaster.interval,
        horizons=tuple(req.horizons),
        stride=stride,
        n_origins=req.origins,
        n_samples=req.samples,
        seed=req.seed,
        cost_bp=req.cost_bp,
        assets=req.assets,
        barrier=barrier,
    )
    card = run_scorecard(
        runs[0],
        forecaster_fn(forecaster),
        settings,
        out_dir=out,
        precision=forecaster.precision,
        reversion_tau=forecaster.reversion_taus(),
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
        calibration=_run_calibration(runs, forecaster.checkpoint_sha256),
        extra_baselines=_foundation_models(foundation, req.device) if foundation else None,
    )
    print(
        "\n".join(
            card["headline_lines"]
            + card["verdicts"]
            + card["mcs_lines"]
            + card["pit_lines"]
            + card["cross_section_lines"]
            + card.get("ceiling_lines", [])
            + card.get("barrier_lines", [])
        )
    )
    print(f"Wrote {out / SCORECARD_JSON} and {out / SCORECARD_PNG}")
    return 0


def _foundation_models(foundation: dict[str, tuple[str, str]], device: str) -> dict[str, Callable]:
    """The --baseline foundation models, loaded: name -> forecaster (beside the fitted baselines)."""
    return {name: load_foundation_baseline(kind, spec, device) for name, (kind, spec) in foundation.items()}


def _run_calibration(runs: Sequence[Path], checkpoint_sha256: Optional[str]):
    """The run's calibration.json (`marketgpt calibrate`) when it was fitted for this model: one run,
    the same best_model.pt; else None (an ensemble's intervals are not the run's)."""
    if len(runs) != 1 or not (Path(runs[0]) / CALIBRATION_JSON).is_file():
        return None
    cal = load_calibration(runs[0])
    if cal.checkpoint_sha256 and checkpoint_sha256 and cal.checkpoint_sha256 != checkpoint_sha256:
        print(
            f"warning: {cal.path} was fitted for another best_model.pt; not used (refit: marketgpt calibrate "
            f"{runs[0]})",
            file=sys.stderr,
        )
        return None
    return cal


def parse_device(name: str) -> torch.device:
    """The torch device a --device NAME asks for; UserError for a CUDA device this machine lacks or a bad name."""
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no usable CUDA GPU here; use --device cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r}: expected cpu or cuda") from None
