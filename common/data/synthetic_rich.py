"""The "rich" synthetic market (data.synthetic.process = "rich"): structure a small model or a
GARCH cannot hold, with the exact next-candle distribution still known.

Each asset's log return is r_t = mu_t + sigma_t * z_t, z_t Student-t(nu) (the shocks co-move
through the market factor as in common/data/synthetic.py), with

    sigma_t = m_t * k(s_t) * j_t * sqrt(h_t) * sqrt((nu - 2) / nu)
    h_t     = v * (1 - A) + a1 x_{t-1} + a2 mean(x_{t-6..t-1}) + a3 mean(x_{t-48..t-1})
              + g * x_{t-1} * [r_{t-1} < 0]                    x = (r - mu)^2 / (m k j)^2 / ((nu-2)/nu)
    mu_t    = drift + kappa * sigma_t * tanh(e_{t-1} + e_{t-2})    + lam * sigma_t * e^leader_{t-1} (followers)

- long memory: the variance answers squared returns over 1, 6 and 48 candles (HAR-like: a
  short, a medium and a long average), so its memory reaches far beyond a GARCH(1,1)'s decay;
- leverage: a down move raises the next variance more than an up move of the same size (g);
- three regimes s_t (calm, normal, stressed: k = 1, sqrt(stress_vol), stress_vol), a Markov
  chain that steps one level at a time (p_stress up, p_calm down);
- volatility jumps: a market-wide candle with j_t = JUMP_SCALE, probability JUMP_PROB per slot;
- a predictable mean: tanh of the last two unit shocks (kappa), a nonlinear short-term pattern;
- lead-lag: odd assets follow the even asset before them: their mean carries that leader's
  previous unit shock (lam). A model that reads one asset at a time cannot see it; the floor
  below does.
- m_t: the intraday seasonality of common/data/synthetic.py.

A = a1 + a2 + a3 + g / 2 < 1 keeps the variance stationary around v (E[x] = v: the calm
variance daily_vol^2 per day, scaled to the candle). The truth (mu_{t+1}, sigma_{t+1}, nu) is
the exact distribution of the next return given everything up to t and the next candle's latent
regime, jump and timestamp: the oracle, whose NLL no forecaster reaches.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from common.config.synthetic import SyntheticSpec
from common.markets import INTERVAL_SECONDS

__all__ = ["HAR_WINDOWS", "JUMP_PROB", "JUMP_SCALE", "regimes", "rich_returns"]

HAR_WINDOWS = (1, 6, 48)  # candles averaged by the variance's three components
HAR_WEIGHTS = (0.10, 0.30, 0.45)  # a1, a2, a3
LEVERAGE = 0.10  # g
KAPPA = 0.15  # the tanh mean's weight, in units of sigma
LEAD_LAG = 0.30  # lam: a follower's mean per unit of its leader's previous shock
JUMP_PROB = 0.003
JUMP_SCALE = 4.0


def regimes(spec: SyntheticSpec, flips: np.ndarray) -> np.ndarray:
    """The volatility multiplier k(s_t) of a 3-state chain (calm, normal, stressed) that moves one
    level at a time: up with p_stress, down with p_calm; starts calm."""
    levels = np.array([1.0, math.sqrt(spec.stress_vol), spec.stress_vol])
    state, out = 0, np.empty(len(flips), dtype=np.int8)
    for t, u in enumerate(flips):
        if u < spec.p_stress and state < 2:
            state += 1
        elif u > 1 - spec.p_calm and state > 0:
            state -= 1
        out[t] = state
    return levels[out]


def unit_shocks(spec: SyntheticSpec, factor: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(z, e): the asset's Student-t(nu) shocks, loading market_beta on the market factor, and the
    same at unit variance. The first draws of the asset's stream, so a follower remakes its
    leader's from the leader's seed alone."""
    n, nu, b = len(factor), spec.nu, spec.market_beta
    gauss = b * factor + math.sqrt(1 - b * b) * rng.standard_normal(n)
    z = gauss / np.sqrt(rng.chisquare(nu, n) / nu)
    return z, z * math.sqrt((nu - 2) / nu)


@functools.lru_cache(maxsize=4)
def _leader_shocks(spec: SyntheticSpec, leader: int, factor_key: bytes) -> np.ndarray:
    factor = np.frombuffer(factor_key)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, leader]))
    return unit_shocks(spec, factor, rng)[1]


def rich_returns(
    spec: SyntheticSpec, i: int, scale: np.ndarray, factor: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Asset i's (r, mu, sigma, e) on the present slots; scale: m_t k(s_t) j_t there, factor: the
    market factor there. rng: the asset's own stream, fresh."""
    n, nu = len(scale), spec.nu
    days = INTERVAL_SECONDS[spec.interval] / 86400
    z, e = unit_shocks(spec, factor, rng)
    leader = _leader_shocks(spec, i - 1, factor.tobytes()) if i % 2 else None
    v = spec.daily_vol**2 * days
    a1, a2, a3 = HAR_WEIGHTS
    _, w2, w3 = HAR_WINDOWS  # the short window is the last candle itself
    base = v * (1 - a1 - a2 - a3 - LEVERAGE / 2)
    t_sd = math.sqrt((nu - 2) / nu)
    r, mu, sigma = np.empty(n), np.empty(n), np.empty(n)
    x = np.zeros(n)  # each candle's squared unit-scale return, the variance's input
    s2 = s3 = 0.0  # running sums of x over the medium and long windows
    drift = spec.drift * days
    for t in range(n):  # sequential: each variance depends on the returns before it
        if t:
            h = base + a1 * x[t - 1] + a2 * s2 / min(t, w2) + a3 * s3 / min(t, w3)
            if r[t - 1] < mu[t - 1]:
                h += LEVERAGE * x[t - 1]
        else:
            h = v
        sd = scale[t] * math.sqrt(h) * t_sd
        m = drift + KAPPA * sd * math.tanh((e[t - 1] if t else 0.0) + (e[t - 2] if t > 1 else 0.0))
        if leader is not None and t:
            m += LEAD_LAG * sd * leader[t - 1]
        mu[t], sigma[t] = m, sd
        r[t] = m + sd * z[t]
        x[t] = h * e[t] * e[t]
        s2 += x[t] - (x[t - w2] if t >= w2 else 0.0)
        s3 += x[t] - (x[t - w3] if t >= w3 else 0.0)
    return r, mu, sigma, e
