"""What every run writes at the end of training (common.commands.train's final outputs): first the
volatility reversion fitted on the validation split (training.vol_reversion, reversion.json), then
the small scorecard: `training.scorecard_origins` origin dates (0 turns it off), at most
`training.scorecard_budget` (asset, origin) forecasts drawn among them, `training.scorecard_samples`
paths at horizons 1, 5 and 20, with its progress in the job log. `marketgpt scorecard RUN_DIR`
(common/commands/scorecard.py) scores the same best model in full.

Its scoring imports wait for the end of training: a training process (and every resume) starts
without scipy, scoringrules and the forecasting stack, and a node that lacks one of them still
keeps its trained run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, TextIO

import torch

from common.config import TrainingConfig

__all__ = ["end_of_training_reversion", "end_of_training_scorecard"]


def end_of_training_reversion(
    t: TrainingConfig, run_dir: Path, device: torch.device, out: Optional[TextIO] = None
) -> Optional[str]:
    """reversion.json (training.vol_reversion): the volatility reversion fitted on the validation
    split (common.evaluation.vol_reversion), before the scorecard so that it scores the reverted
    paths. Returns None when written or switched off, else the reason it failed (the run keeps
    its model; forecasts then read the paths as sampled)."""
    if not t.vol_reversion:
        return None
    out = out or sys.stdout
    try:
        from common.evaluation.vol_reversion import fit_run_reversion, reversion_line
        from common.forecasting.forecaster import Forecaster

        content = fit_run_reversion(
            run_dir,
            Forecaster.from_run(run_dir, device=device),  # an earlier fit's file is set aside, then replaced
            n_samples=t.scorecard_samples,
            seed=t.seed,
            progress=lambda msg: print(f"Reversion: {msg}", file=out, flush=True),
        )
    except Exception as e:  # noqa: BLE001 (the trained model and its test results matter more)
        reason = f"{type(e).__name__}: {e}"
        print(f"warning: reversion.json not written ({reason})", file=sys.stderr, flush=True)
        return reason
    print(reversion_line(content), file=out, flush=True)
    return None


def end_of_training_scorecard(
    t: TrainingConfig, run_dir: Path, device: torch.device, out: Optional[TextIO] = None
) -> Optional[str]:
    """The small end-of-training scorecard (training.scorecard_*), written into the run folder
    before the final test results. Returns None when it was written or is switched off, else
    the reason it failed: a scorecard that fails must not fail a trained run, and the reason
    goes into test_results.json (so --resume auto does not retry it forever)."""
    if t.scorecard_origins == 0:
        return None
    out = out or sys.stdout
    try:
        # lazy (scipy, pandas, empyrical), and inside the try: a node that lacks one still keeps its run
        from common.evaluation.scorecard import DEFAULT_HORIZONS, ScorecardSettings, forecaster_fn, run_scorecard
        from common.forecasting.forecaster import Forecaster

        forecaster = Forecaster.from_run(run_dir, device=device)  # the precision it trained in, where fast here
        settings = ScorecardSettings(
            horizons=DEFAULT_HORIZONS,
            stride=None,
            n_origins=t.scorecard_origins,
            n_samples=t.scorecard_samples,
            seed=t.seed,
            budget=t.scorecard_budget,
        )
        card = run_scorecard(
            run_dir,
            forecaster_fn(forecaster),
            settings,
            precision=forecaster.precision,
            reversion_tau=forecaster.reversion_taus(),
            progress=lambda msg: print(f"Scorecard: {msg}", file=out, flush=True),
        )
    except Exception as e:  # noqa: BLE001 (the trained model and its test results matter more)
        reason = f"{type(e).__name__}: {e}"
        print(f"warning: scorecard.json not written ({reason})", file=sys.stderr, flush=True)
        return reason
    drawn = f", {card['origins']['drawn']}" if card["origins"].get("drawn") else ""
    print(
        f"Scorecard ({t.scorecard_origins} origin dates, {t.scorecard_samples} samples{drawn}; "
        f"marketgpt scorecard {run_dir} for the full one):",
        file=out,
    )
    print(
        "\n".join(f"  {line}" for line in card["headline_lines"] + card["verdicts"] + card["mcs_lines"]),
        file=out,
        flush=True,
    )
    return None
