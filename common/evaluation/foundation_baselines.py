"""Foundation-model baselines, zero-shot: Chronos-Bolt / Chronos-2 (`chronos-forecasting`) and
TimesFM 2.5 (`timesfm`), as ForecastFns beside the price baselines (the `foundation` extra).

What each is given: the origin's last `context` valid closes (NaN rows of 24/7 gaps dropped),
nothing else: no highs, lows, volumes, other assets or calendar. Each returns quantile forecasts
of the next `horizon` closes (levels QUANTILES); they become sampled paths by the piecewise-linear
quantile function, one uniform per path shared by every step (a path at its 80th percentile at
step 1 stays at the 80th at step 20). Limits of that choice: the steps are perfectly
rank-correlated (the model gives marginals only, no joint law), and the tails beyond the outer
levels (0.1, 0.9) are flat, so about 20% of draws sit exactly at an outer quantile and wide
intervals (95%) are too narrow. Closes become log returns against the origin's close; a
quantile at or below zero is floored at a tiny fraction of it.

Weights: a local folder, or a Hugging Face id already in the user's cache; nothing is fetched
(local_files_only and HF_HUB_OFFLINE), and a missing one is a UserError.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from common.errors import UserError
from common.evaluation.price_baselines import ForecastFn
from common.forecasting.forecast_io import History

__all__ = ["FOUNDATION_KINDS", "QUANTILES", "load_foundation_baseline", "paths_from_quantiles"]

QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # what both libraries predict
CHRONOS_CONTEXT = 2048  # Chronos-Bolt's context (Chronos-2 reads more, but 2048 keeps the two alike)
TIMESFM_CONTEXT = 1024  # a multiple of TimesFM's 32-candle patch
_EXTRA = "pip install -e '.[foundation]'"
_PRICE_FLOOR = 1e-6  # a quantile close at or below zero: this fraction of the origin's close


def paths_from_quantiles(quantiles: np.ndarray, last_close: np.ndarray, n_samples: int, seed: int) -> np.ndarray:
    """(n, horizon, len(QUANTILES)) quantile closes -> (n, n_samples, horizon) cumulative log
    returns: one uniform per path, read through each step's piecewise-linear quantile function
    (flat beyond the outer levels)."""
    rng = np.random.default_rng(seed)
    q = np.sort(quantiles, axis=-1)  # a model's quantiles may cross
    levels = np.asarray(QUANTILES)
    u = rng.uniform(levels[0], levels[-1], size=(q.shape[0], n_samples))  # np.interp would clip there anyway
    out = np.empty((q.shape[0], n_samples, q.shape[1]))
    for i in range(q.shape[0]):
        for h in range(q.shape[1]):
            out[i, :, h] = np.interp(u[i], levels, q[i, h])
    floor = _PRICE_FLOOR * last_close[:, None, None]
    return np.log(np.maximum(out, floor) / last_close[:, None, None])


def _closes(histories: Sequence[History], context: int) -> list[np.ndarray]:
    """Each origin's last `context` valid closes."""
    out = []
    for hist in histories:
        close = hist.candles["close"].to_numpy(dtype=np.float64)
        close = close[np.isfinite(close) & (close > 0)]
        if len(close) == 0:
            raise UserError(f"{hist.symbol}: no valid close before the origin {hist.candles.index[-1]}")
        out.append(close[-context:])
    return out


class QuantileBaseline:
    """A ForecastFn from a `predict(closes, horizon) -> (n, horizon, 9) quantile closes`."""

    drift = True  # ranked by the scorecard's direction and backtest tables like the model

    def __init__(self, predict: Callable[[list[np.ndarray], int], np.ndarray], context: int, batch: int = 64):
        self.predict = predict
        self.context = context
        self.batch = batch

    def __call__(self, histories: Sequence[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        closes = _closes(histories, self.context)
        parts = [self.predict(closes[i : i + self.batch], horizon) for i in range(0, len(closes), self.batch)]
        last = np.array([c[-1] for c in closes])
        return paths_from_quantiles(np.concatenate(parts), last, n_samples, seed)


def _hf_offline() -> None:
    """Nothing is fetched: an id must already be in the Hugging Face cache. huggingface_hub reads
    HF_HUB_OFFLINE once, when imported, so an already imported one is told too."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        setattr(constants, "HF_HUB_OFFLINE", True)  # noqa: B010 (a module attribute mypy can't see)


def _cached(spec: str, file: str) -> bool:
    """Whether `spec` is a folder, or a Hugging Face id whose `file` is in the local cache (asked
    before a library is: some log and go on, or look the id up, when it is not)."""
    if Path(spec).is_dir():
        return True
    from huggingface_hub import try_to_load_from_cache  # lazy: the `foundation` extra

    try:
        return isinstance(try_to_load_from_cache(spec, file), str)
    except ValueError:  # not a valid id either (a path that does not exist)
        return False


def _missing_weights(kind: str, spec: str) -> UserError:
    return UserError(
        f"--baseline {kind}:{spec}: no such folder and not in the Hugging Face cache "
        f"(download it on a machine with internet first; nothing is fetched here)"
    )


def _chronos(spec: str, device: str) -> ForecastFn:
    _hf_offline()
    try:
        import torch
        from chronos import BaseChronosPipeline
    except ImportError:
        raise UserError(f"--baseline chronos needs chronos-forecasting: {_EXTRA}") from None
    if not _cached(spec, "config.json"):
        raise _missing_weights("chronos", spec)
    try:
        pipe = BaseChronosPipeline.from_pretrained(spec, device_map=device, local_files_only=True)
    except (OSError, ValueError):
        raise _missing_weights("chronos", spec) from None

    def predict(closes: list[np.ndarray], horizon: int) -> np.ndarray:
        q, _mean = pipe.predict_quantiles(
            [torch.tensor(c, dtype=torch.float32) for c in closes],
            prediction_length=horizon,
            quantile_levels=list(QUANTILES),
        )
        if isinstance(q, list):  # Chronos-2: one (variates, horizon, 9) tensor per series, one variate here
            q = torch.stack([t[0] for t in q])
        return q.numpy().astype(np.float64)  # (n, horizon, 9)

    return QuantileBaseline(predict, CHRONOS_CONTEXT)


def _timesfm(spec: str, device: str) -> ForecastFn:
    _hf_offline()
    try:
        import timesfm
    except ImportError:
        raise UserError(f"--baseline timesfm needs timesfm[torch]: {_EXTRA}") from None
    if not hasattr(timesfm, "TimesFM_2p5_200M_torch"):
        raise UserError(f"--baseline timesfm needs timesfm's torch model (torch installed): {_EXTRA}")
    if not _cached(spec, "model.safetensors"):
        raise _missing_weights("timesfm", spec)
    try:
        model = timesfm.TimesFM_2p5_200M_torch.from_pretrained(spec, local_files_only=True, torch_compile=False)
    except (OSError, ValueError):
        raise _missing_weights("timesfm", spec) from None

    def predict(closes: list[np.ndarray], horizon: int) -> np.ndarray:
        # compiled for this batch (TimesFM pads a call to a multiple of its batch) and the longest
        # context in it, in whole 32-candle patches: setting the config, no torch.compile
        context = min(TIMESFM_CONTEXT, -(-max(len(c) for c in closes) // 32) * 32)
        model.compile(
            timesfm.ForecastConfig(
                max_context=context, max_horizon=horizon, normalize_inputs=True, per_core_batch_size=len(closes)
            )
        )
        _point, q = model.forecast(horizon=horizon, inputs=list(closes))
        return np.asarray(q, dtype=np.float64)[:, :horizon, 1:]  # [..., 0] is the mean

    return QuantileBaseline(predict, TIMESFM_CONTEXT)


FOUNDATION_KINDS: dict[str, Callable[[str, str], ForecastFn]] = {"chronos": _chronos, "timesfm": _timesfm}


def load_foundation_baseline(kind: str, spec: str, device: str = "cpu") -> ForecastFn:
    """The ForecastFn of `--baseline KIND:SPEC` (SPEC: a local folder or a cached Hugging Face id)."""
    if kind not in FOUNDATION_KINDS:
        raise UserError(
            f"--baseline {kind}:{spec}: unknown kind {kind!r}; expected one of {', '.join(FOUNDATION_KINDS)}"
        )
    return FOUNDATION_KINDS[kind](spec, device)
