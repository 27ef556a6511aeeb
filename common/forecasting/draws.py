"""What the samples of one forecast share across the assets of a date: draws seeded by the
forecast's seed and the origin's close time, never by an origin's place in the call, so the
assets of one date (one market) read the same draws, sample for sample, whichever call or batch
forecasts them (the scorecard calls forecasters date by date, common.evaluation.walk_forward).

    market futures  (market_future = "analogs") each sample's future market ids, MarketContext.analogs
    uniforms        (shared_draws = True) the uniform of each sample's draw at each step: the
                    token drawn is the first whose cumulative probability passes it, and token ids
                    run in the order of the move (common.tokens.tokenizer), so sample s of two
                    assets of a date draws from the same quantile of each one's next move.

Shared uniforms are common random numbers: each asset's samples are draws from its own forecast
as before (its quantiles, CRPS and coverage are unbiased), but the Monte Carlo error of two
assets' forecasts of a date moves together, so a ranking of the assets by their forecast mean is
not reshuffled by it. They make the assets' samples comonotone draw for draw, so sample s across
assets is no joint scenario: a portfolio's spread is not read from them (nor was it before, when
they were independent).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

__all__ = ["per_close"]


def per_close(
    closes: np.ndarray,
    seed: Optional[int],
    draw: Callable[[int, np.random.Generator], np.ndarray],
    stream: tuple[int, ...] = (),
) -> np.ndarray:
    """(len(closes), ...) draw(close, rng) for each origin, one draw per distinct close time (int64
    ns), with rng seeded by (seed, close, *stream); any integer seed, None: fresh entropy per close."""
    drawn = {}
    for c in map(int, np.unique(closes)):
        drawn[c] = draw(c, np.random.default_rng(None if seed is None else [seed % 2**64, c % 2**64, *stream]))
    return np.stack([drawn[int(c)] for c in closes])
