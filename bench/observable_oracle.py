"""The observable oracle of the rich synthetic market: the exact predictive distribution of the
next candle given only the candles seen up to the origin.

The full-information oracle (scaling_floors.oracle_nll) is told the next candle's latent regime
and jump. This one is told neither: it mirrors common/data/synthetic_rich.py exactly (the 3-state
chain with its transition matrix, the jump with its probability, the HAR variance with leverage,
the tanh mean, the season of the next timestamp) and infers the latent path from what it sees.
Because the variance feeds on past unit-scale returns x = (r - mu)^2 / scale^2, every past
regime and jump changes every later variance: the state is the whole path, so the filter is a
particle filter (fully adapted: each particle weighs its 6 next (regime, jump) options by prior
times likelihood, is resampled by its total, then draws one option), exact as particles grow.

What it sees of asset i: its close-to-close log returns from candle 1 on (candle 0's return needs
the unseen start price: the filter draws that shock from its prior) and, with `ranges`, each
candle's log(high / low), whose density beyond |r| given |r| / sd is scaling_floors._range_table's
(tabulated by Monte Carlo). Not the open's jitter nor the volume (which also carry the scale, but
no token does), nor the other assets, which share the regime, the jumps and the market factor.
A follower (odd i) also sees its leader's (asset i - 1) candles: its mean carries the leader's
previous unit shock, which depends on the same latent path, so leader and follower are filtered
jointly, their same-candle shocks dependent through the market factor (`pair_correction`).

`components(spec, candles, rows)` yields, for the target candles `rows` (each predicted from the
candles before it), the predictive mixture: per target, particles x 6 options of (weight, log sd,
m = mu / sd), in chunks, so memory is O(chunk x particles) whatever the number of targets.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Optional

import numpy as np

from common.data.synthetic_rich import HAR_WEIGHTS, HAR_WINDOWS, JUMP_PROB, JUMP_SCALE, KAPPA, LEAD_LAG, LEVERAGE
from common.markets import INTERVAL_SECONDS

__all__ = ["PARTICLES", "components", "pair_correction", "transition_matrix"]

PARTICLES = 256
OPTIONS = 6  # (next regime, jump): regime j = option // 2, jump = option % 2


def transition_matrix(spec: Any) -> np.ndarray:
    """(3, 3) P(next regime | regime) of synthetic_rich.regimes: one uniform u per slot, up when
    u < p_stress (not from stressed), else down when u > 1 - p_calm (not from calm)."""
    up, down = spec.p_stress, 1 - spec.p_calm
    trans = np.zeros((3, 3))
    trans[0, 1] = up
    trans[1, 2] = up
    trans[1, 0] = 1 - max(up, down)
    trans[2, 1] = spec.p_calm
    trans[np.arange(3), np.arange(3)] = 1 - trans.sum(axis=1)
    return trans


def _t_logpdf(z: np.ndarray, nu: float) -> np.ndarray:
    const = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
    return const - (nu + 1) / 2 * np.log1p(z * z / nu)


Z_KNOTS = np.linspace(-12.0, 12.0, 241)  # the pair correction's grid of unit shocks


def pair_correction(nu: float, beta: float, knots: np.ndarray = Z_KNOTS) -> tuple[np.ndarray, np.ndarray]:
    """The joint density of two assets' same-candle standard-t shocks z_i = (beta g + c n_i) /
    sqrt(w_i / nu) (g shared, c = sqrt(1 - beta^2), w_i ~ chi2(nu) their own) as (log of it minus
    the two marginals' logs on knots x knots, the marginal log density on knots), by quadrature:
    Gauss-Hermite over g, a fine log grid over w. Zero when beta is 0."""
    if abs(beta) >= 0.999:
        raise ValueError(f"market_beta {beta} leaves no idiosyncratic shock: the pair's density is degenerate")
    c = math.sqrt(1 - beta * beta)
    g, gw = np.polynomial.hermite_e.hermegauss(48)
    gw = gw / gw.sum()
    log_u = np.linspace(-14.0, 5.0, 3000)  # w = 2u, u ~ Gamma(nu / 2): integrate over log u
    u = np.exp(log_u)
    log_gamma = (nu / 2) * log_u - u - math.lgamma(nu / 2)  # density in log u
    du = log_u[1] - log_u[0]
    s = np.sqrt(2 * u / nu)  # z = x / s, x = beta g + c n ~ N(beta g, c^2)
    dens = np.empty((len(knots), len(g)))  # p(z | g)
    for k, gk in enumerate(g):
        x = knots[:, None] * s[None, :]
        inner = np.exp(log_gamma - 0.5 * ((x - beta * gk) / c) ** 2) * s / (c * math.sqrt(2 * math.pi))
        dens[:, k] = inner.sum(axis=1) * du
    marginal = dens @ gw
    joint = (dens * gw) @ dens.T
    return np.log(joint) - np.log(marginal)[:, None] - np.log(marginal)[None, :], np.log(marginal)


def _bilinear(table: np.ndarray, knots: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    step = knots[1] - knots[0]

    def place(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.clip((x - knots[0]) / step, 0, len(knots) - 1 - 1e-9)
        i = pos.astype(np.int64)
        return i, pos - i

    i, f = place(a)
    j, h = place(b)
    return (1 - f) * ((1 - h) * table[i, j] + h * table[i, j + 1]) + f * (
        (1 - h) * table[i + 1, j] + h * table[i + 1, j + 1]
    )


class _Asset:
    """One asset's HAR state per particle: the last 48 unit-scale returns x, their sums over the
    medium and long windows, the last two unit shocks e and whether the last one was negative."""

    def __init__(self, n: int, r: np.ndarray, log_range: Optional[np.ndarray]) -> None:
        self.r, self.log_range = r, log_range
        self.x = np.zeros((n, HAR_WINDOWS[2]))
        self.s2, self.s3 = np.zeros(n), np.zeros(n)
        self.e1, self.e2 = np.zeros(n), np.zeros(n)  # e_{t-1}, e_{t-2}

    def take(self, idx: np.ndarray) -> None:
        for name in ("x", "s2", "s3", "e1", "e2"):
            setattr(self, name, getattr(self, name)[idx])

    def variance(self, t: int, v: float) -> np.ndarray:
        """h_t of each particle (t >= 1), as synthetic_rich.rich_returns."""
        a1, a2, a3 = HAR_WEIGHTS
        _, w2, w3 = HAR_WINDOWS
        last = self.x[:, (t - 1) % w3]
        h = v * (1 - a1 - a2 - a3 - LEVERAGE / 2) + a1 * last + a2 * self.s2 / min(t, w2) + a3 * self.s3 / min(t, w3)
        return h + LEVERAGE * last * (self.e1 < 0)

    def push(self, t: int, x: np.ndarray, e: np.ndarray) -> None:
        """Candle t's x and e, per particle."""
        _, w2, w3 = HAR_WINDOWS
        self.s2 += x - (self.x[:, (t - w2) % w3] if t >= w2 else 0.0)
        self.s3 += x - (self.x[:, t % w3] if t >= w3 else 0.0)
        self.x[:, t % w3] = x
        self.e2, self.e1 = self.e1, e


def components(
    spec: Any,
    candles: Any,
    rows: np.ndarray,
    leader: Any = None,
    particles: int = PARTICLES,
    ranges: bool = True,
    seed: int = 0,
    chunk: int = 4096,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """For the candles `rows` (sorted, >= 1) of one asset's `candles` (and its leader's, for a
    follower), yields (rows, weight, log sd, m), each but rows (len, particles * 6): the predictive
    mixture of each row's return r = mu + sd T(nu), m = mu / sd, made from the candles before it."""
    from common.data.synthetic import _season

    from scaling_floors import _range_table

    if spec.process != "rich" or spec.gap_prob != 0:
        raise ValueError("the observable oracle models the rich market without gaps (process 'rich', gap_prob 0)")
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows.min() < 1 or np.any(np.diff(rows) <= 0)):
        raise ValueError("rows must be increasing candle indices from 1 on")
    nu, n = spec.nu, particles
    days = INTERVAL_SECONDS[spec.interval] / 86400
    v, drift, t_sd = spec.daily_vol**2 * days, spec.drift * days, math.sqrt((nu - 2) / nu)
    levels = np.array([1.0, math.sqrt(spec.stress_vol), spec.stress_vol])
    opt_k = np.repeat(levels, 2) * np.tile([1.0, JUMP_SCALE], 3)  # scale factor of each option
    trans = transition_matrix(spec)
    prior = np.repeat(trans, 2, axis=1) * np.tile([1 - JUMP_PROB, JUMP_PROB], 3)  # (regime, option)
    season = _season(spec, candles.index)
    table = _range_table() if ranges else None
    rng = np.random.default_rng(seed)

    def observed(frame: Any) -> _Asset:
        log_close = np.log(frame["close"].to_numpy())
        w = np.log(frame["high"].to_numpy() / frame["low"].to_numpy()) if ranges else None
        return _Asset(n, np.diff(log_close, prepend=log_close[0]), w)

    pair = [observed(candles)] if leader is None else [observed(leader), observed(candles)]
    if leader is not None and len(leader) != len(candles):
        raise ValueError("a follower and its leader share the time grid: their candles must be as many")
    corr = pair_correction(nu, spec.market_beta)[0] if leader is not None and spec.market_beta else None
    # candle 0: regime and jump from the chain's first step, shocks from their prior (jointly for a pair)
    regime = rng.choice(3, n, p=trans[0])  # candle 0's jump changes nothing: x_0 = h_0 e_0^2 needs no scale
    g = rng.standard_normal(n)
    for a in pair:
        z = (spec.market_beta * g + math.sqrt(1 - spec.market_beta**2) * rng.standard_normal(n)) / np.sqrt(
            rng.chisquare(nu, n) / nu
        )
        e = z * t_sd
        a.push(0, v * e * e, e)
    want = iter(rows.tolist())
    target = next(want, None)
    out: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    for t in range(1, len(candles)):
        if target is None:
            break
        hs = [a.variance(t, v) for a in pair]
        sd = season[t] * opt_k[None, :] * np.sqrt(hs[-1])[:, None] * t_sd  # (particles, options)
        # each asset's mean in units of its sd: the follower's carries the leader's last shock
        m_units = [KAPPA * np.tanh(a.e1 + a.e2) for a in pair]
        if leader is not None:
            m_units[1] = m_units[1] + LEAD_LAG * pair[0].e1
        m = drift / sd + m_units[-1][:, None]
        q = prior[regime]
        if t == target:
            out.append((t, (q / n).ravel(), np.log(sd).ravel(), m.ravel()))
            target = next(want, None)
            if len(out) == chunk or target is None:
                yield _stack(out)
                out = []
            if target is None:
                break
        # candle t's likelihood under each (particle, option), then resample and draw the option
        ll = np.zeros_like(sd)
        units = []
        for a, h, mean_unit in zip(pair, hs, m_units):
            s = season[t] * opt_k[None, :] * np.sqrt(h)[:, None] * t_sd
            z = (a.r[t] - drift - s * mean_unit[:, None]) / s
            ll += _t_logpdf(z, nu) - np.log(s)
            if table is not None:
                ll += _range_loglik(abs(a.r[t]) / s, a.log_range[t] / s, table) - np.log(s)
            units.append(z)
        if corr is not None:
            ll += _bilinear(corr, Z_KNOTS, units[0], units[1])
        joint = q * np.exp(ll - ll.max())
        total = joint.sum(axis=1)
        ancestors = _systematic(total / total.sum(), rng)
        joint = joint[ancestors]
        cum = np.cumsum(joint, axis=1)
        option = (cum < rng.random(n)[:, None] * cum[:, -1:]).sum(axis=1)
        option = np.minimum(option, OPTIONS - 1)
        regime = option // 2
        for a, h, z in zip(pair, hs, units):
            a.take(ancestors)
            h, z = h[ancestors], z[ancestors, option]
            e = z * t_sd
            a.push(t, h * e * e, e)
    if out:
        yield _stack(out)


def _stack(out: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array([o[0] for o in out]),
        np.stack([o[1] for o in out]),
        np.stack([o[2] for o in out]),
        np.stack([o[3] for o in out]),
    )


def _systematic(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = len(weights)
    idx = np.searchsorted(np.cumsum(weights), (rng.random() + np.arange(n)) / n)
    return np.minimum(idx, n - 1)


def _range_loglik(a: np.ndarray, w: np.ndarray, table: np.ndarray) -> np.ndarray:
    """log density of the range w = log(high / low) / sd given the move a = |r| / sd (both in
    units of sd), from scaling_floors' table of v = w - a (the Jacobian 1 / sd is the caller's)."""
    from scaling_floors import _LOG_FLOOR, _RANGE_A, _RANGE_V

    row = np.minimum(np.rint(a / (_RANGE_A[1] - _RANGE_A[0])).astype(np.int64), len(_RANGE_A) - 1)
    col = np.searchsorted(_RANGE_V, w - a, side="right") - 1
    inside = (col >= 0) & (col < table.shape[1])
    return np.where(inside, table[row, np.clip(col, 0, table.shape[1] - 1)], _LOG_FLOOR)
