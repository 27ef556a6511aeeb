"""Ensembles: several runs (seeds) on the same data and tokenizer as one forecaster.

    fc = Ensemble.from_runs([run_seed1, run_seed2, run_seed3])
    result = fc.forecast(histories, horizon=24, samples=300)   # 100 paths from each run

The forecast is an equal-weight mixture: the samples are split evenly between the runs (the
first few take one more when they don't divide), each run samples its share with its own
seed, and the paths are pooled before the quantiles, P(up) and the rest are computed. Runs
must share the tokenizer (tokenizer.json byte for byte: a token id must mean the same candle
in every run), the assets and the interval; anything else is refused, naming the run.
`marketgpt forecast` and `marketgpt scorecard` take several run folders and use this.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from common.errors import UserError
from common.forecasting.forecast_io import ForecastResult, summarize_paths
from common.forecasting.forecaster import Forecaster
from common.run.files import TOKENIZER_JSON

__all__ = ["Ensemble", "forecaster_for"]

_SEED_STEP = 1_000_003  # run i samples with seed + i * _SEED_STEP: distinct streams per run


class Ensemble(Forecaster):
    """Forecaster over several runs; everything but `forecast` reads the first run."""

    def __init__(self, members: Sequence[Forecaster]) -> None:
        if len(members) < 2:
            raise UserError("an ensemble needs at least two run folders")
        first = members[0]
        for m in members[1:]:
            _check_same(first, m)
        # each member samples in its own precision (auto follows how each run trained): recorded as is
        precision = "+".join(sorted({m.precision for m in members}))
        super().__init__(
            first.model,
            first.tokenizer,
            first.info,
            first.cfg,
            run_dir=None,  # each member read its own reversion.json; the ensemble has none to read
            checkpoint_sha256=first.checkpoint_sha256,
            precision=precision,
        )
        self.run_dir = first.run_dir
        self.members = list(members)
        self.ensemble = [{"run": str(m.run_dir), "checkpoint_sha256": m.checkpoint_sha256} for m in members]

    def reversion_taus(self) -> list[Optional[float]]:
        return [tau for m in self.members for tau in m.reversion_taus()]  # each member reverts its own paths

    @classmethod
    def from_runs(
        cls,
        run_dirs: Sequence[Union[str, Path]],
        device: Union[str, torch.device, None] = None,
        precision: str = "auto",
        interval: Optional[str] = None,
    ) -> "Ensemble":
        members = [Forecaster.from_run(r, device=device, precision=precision, interval=interval) for r in run_dirs]
        ensemble = cls(members)
        ensemble.interval = members[0].interval
        return ensemble

    def min_history(self) -> int:
        return max(m.min_history() for m in self.members)

    def check_request(self, horizon: int, samples: int) -> None:
        for m in self.members:
            m.check_request(horizon, samples)
        if samples < len(self.members):
            raise UserError(
                f"--samples {samples}: an ensemble of {len(self.members)} runs needs at least one path per run"
            )

    def forecast(
        self,
        histories: Any,
        horizon: int,
        samples: int = 256,
        *,
        seed: int = 0,
        return_paths: bool = False,
        **options: Any,
    ) -> ForecastResult:
        """The members' paths pooled (samples split evenly); the table from the pooled paths."""
        self.check_request(horizon, samples)
        shares = [len(part) for part in np.array_split(np.arange(samples), len(self.members))]
        results = [
            m.forecast(histories, horizon, n, seed=seed + i * _SEED_STEP, return_paths=True, **options)
            for i, (m, n) in enumerate(zip(self.members, shares))
        ]
        every = [r.paths for r in results if r.paths is not None]  # each member's: return_paths
        paths = {k: np.concatenate([p[k] for p in every], axis=1) for k in every[0]}
        tokens = np.concatenate([r.tokens for r in results], axis=1)
        table = results[0].table.copy()
        stats = [
            summarize_paths(paths["close"][i], paths["high"][i], paths["low"][i])
            for i in range(len(results[0].origins))
        ]
        for column in stats[0]:
            table[column] = np.concatenate([s[column] for s in stats])
        return ForecastResult(
            table=table,
            paths=paths if return_paths else None,
            tokens=tokens if return_paths else None,
            origins=results[0].origins,
        )


def _check_same(first: Forecaster, other: Forecaster) -> None:
    mine, theirs = _tokenizer_text(first), _tokenizer_text(other)
    if mine != theirs:
        raise UserError(
            f"{other.run_dir}: its tokenizer differs from {first.run_dir}'s; an ensemble pools token "
            "paths, so every run must share one tokenizer (train the seeds on the same data and "
            "tokenizer settings, e.g. `marketgpt submit --array seeds=1,2,3`)"
        )
    if sorted(first.symbols) != sorted(other.symbols):
        diff = sorted(set(first.symbols) ^ set(other.symbols))
        raise UserError(
            f"{other.run_dir}: trained on other assets than {first.run_dir} "
            f"({', '.join(diff[:5])}); ensemble runs of the same universe"
        )
    if first.interval != other.interval:
        raise UserError(
            f"{other.run_dir}: interval {other.interval!r}, {first.run_dir} has "
            f"{first.interval!r}; ensemble runs of the same interval (--interval)"
        )


def _tokenizer_text(fc: Forecaster) -> Optional[str]:
    path = Path(fc.run_dir) / TOKENIZER_JSON if fc.run_dir is not None else None
    return path.read_text(encoding="utf-8") if path is not None and path.is_file() else None


def forecaster_for(
    run_dirs: Union[Path, Sequence[Path]],
    device: Union[str, torch.device, None] = None,
    precision: str = "auto",
    interval: Optional[str] = None,
) -> Forecaster:
    """One run folder: its Forecaster; several: their Ensemble. interval: --interval (None: each run's first)."""
    runs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    if len(runs) == 1:
        return Forecaster.from_run(runs[0], device=device, precision=precision, interval=interval)
    if len({Path(r).resolve() for r in runs}) < len(runs):
        raise UserError("the same run folder is given twice; an ensemble needs distinct runs")
    return Ensemble.from_runs(runs, device=device, precision=precision, interval=interval)
