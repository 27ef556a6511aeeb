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
candle's log(high / low), whose density beyond |r| given |r| / sd is range_density.range_table's
(tabulated by Monte Carlo). Not the open's jitter nor the volume (which also carry the scale, but
no token does), nor the other assets, which share the regime, the jumps and the market factor.
A follower (odd i) also sees its leader's (asset i - 1) candles: its mean carries the leader's
previous unit shock, which depends on the same latent path, so leader and follower are filtered
jointly, their same-candle shocks dependent through the market factor (`pair_correction`).

`forecaster(spec)` is the oracle as a scorecard forecaster (`marketgpt scorecard` adds it on a
rich run as the ceiling). `components(spec, candles, rows)` yields, for the target candles `rows`
(each predicted from the candles before it), the predictive mixture: per target, particles x 6
options of (weight, log sd, m = mu / sd), in chunks, so memory is O(chunk x particles) whatever
the number of targets.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from common.data.synthetic import generate_asset, season
from common.data.synthetic_rich import HAR_WEIGHTS, HAR_WINDOWS, JUMP_PROB, JUMP_SCALE, KAPPA, LEAD_LAG, LEVERAGE
from common.evaluation.range_density import range_loglik, range_table
from common.markets import INTERVAL_SECONDS

if TYPE_CHECKING:
    from common.evaluation.price_baselines import ForecastFn

__all__ = ["PARTICLES", "components", "forecaster", "models", "pair_correction", "paths", "transition_matrix"]

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


class _Step(NamedTuple):
    """The filter before candle t is seen: per particle, each asset's HAR state (pair: the
    leader, then the asset, or the asset alone), the regime of candle t - 1, the variances h_t,
    and each asset's mean in units of its sd."""

    t: int
    pair: list
    regime: np.ndarray
    hs: list
    m_units: list


class _Market(NamedTuple):
    """The generator's constants for one asset's candles."""

    nu: float
    beta: float
    v: float  # the calm variance per candle
    drift: float
    t_sd: float  # sqrt((nu - 2) / nu): a t shock's sd
    opt_k: np.ndarray  # the scale factor of each (regime, jump) option
    prior: np.ndarray  # (regime, option): P(next option | regime)
    season: np.ndarray  # per candle


def _market(spec: Any, candles: Any) -> _Market:
    _check_modelled(spec)
    nu, days = spec.nu, INTERVAL_SECONDS[spec.interval] / 86400
    levels = np.array([1.0, math.sqrt(spec.stress_vol), spec.stress_vol])
    prior = np.repeat(transition_matrix(spec), 2, axis=1) * np.tile([1 - JUMP_PROB, JUMP_PROB], 3)
    return _Market(
        nu,
        spec.market_beta,
        spec.daily_vol**2 * days,
        spec.drift * days,
        math.sqrt((nu - 2) / nu),
        np.repeat(levels, 2) * np.tile([1.0, JUMP_SCALE], 3),
        prior,
        season(spec, candles.index),
    )


def _filter(
    spec: Any, mk: _Market, candles: Any, leader: Any, particles: int, ranges: bool, rng: np.random.Generator
) -> Iterator[_Step]:
    """The particle filter over one asset's candles (with its leader's, for a follower): yields
    the state before each candle t >= 1, then takes candle t in."""
    n, nu, v, drift, t_sd = particles, mk.nu, mk.v, mk.drift, mk.t_sd
    table = range_table() if ranges else None
    trans = transition_matrix(spec)

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
    for t in range(1, len(candles)):
        hs = [a.variance(t, v) for a in pair]
        # each asset's mean in units of its sd: the follower's carries the leader's last shock
        m_units = [KAPPA * np.tanh(a.e1 + a.e2) for a in pair]
        if leader is not None:
            m_units[1] = m_units[1] + LEAD_LAG * pair[0].e1
        yield _Step(t, pair, regime, hs, m_units)
        q = mk.prior[regime]
        # candle t's likelihood under each (particle, option), then resample and draw the option
        ll = np.zeros((n, OPTIONS))
        units = []
        for a, h, mean_unit in zip(pair, hs, m_units):
            s = mk.season[t] * mk.opt_k[None, :] * np.sqrt(h)[:, None] * t_sd
            z = (a.r[t] - drift - s * mean_unit[:, None]) / s
            ll += _t_logpdf(z, nu) - np.log(s)
            if table is not None:
                assert a.log_range is not None  # read with ranges: the table and the ranges go together
                ll += range_loglik(abs(a.r[t]) / s, a.log_range[t] / s, table) - np.log(s)
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
    rows = _check_rows(rows)
    mk = _market(spec, candles)
    want = iter(rows.tolist())
    target = next(want, None)
    out: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    for step in _filter(spec, mk, candles, leader, particles, ranges, np.random.default_rng(seed)):
        if target is None:
            break
        if step.t != target:
            continue
        t = step.t
        sd = mk.season[t] * mk.opt_k[None, :] * np.sqrt(step.hs[-1])[:, None] * mk.t_sd  # (particles, options)
        m = mk.drift / sd + step.m_units[-1][:, None]
        out.append((t, (mk.prior[step.regime] / particles).ravel(), np.log(sd).ravel(), m.ravel()))
        target = next(want, None)
        if len(out) == chunk or target is None:
            yield _stack(out)
            out = []
    if out:
        yield _stack(out)


def paths(
    spec: Any,
    candles: Any,
    rows: np.ndarray,
    horizon: int,
    samples: int,
    leader: Any = None,
    particles: int = PARTICLES,
    seed: int = 0,
) -> dict[int, np.ndarray]:
    """row -> (samples, horizon) log returns log(close_{row - 1 + h} / close_{row - 1}), h = 1..horizon:
    paths drawn from the filtered state before candle `row` (the candles before it only), each
    particle's regime chain, jumps, HAR variance, mean and (for a follower) its leader's shocks
    simulated forward as common/data/synthetic_rich.py makes them. `candles` must reach
    row + horizon - 1 for the season of the future timestamps (their prices are not read)."""
    rows = _check_rows(rows)
    mk = _market(spec, candles)
    if len(rows) and rows[-1] + horizon - 1 >= len(candles):
        raise ValueError("the candles must reach the last row's horizon: its timestamps give the season")
    out: dict[int, np.ndarray] = {}
    wanted = set(rows.tolist())
    for step in _filter(spec, mk, candles, leader, particles, True, np.random.default_rng(seed)):
        if step.t in wanted:
            out[step.t] = _simulate(mk, step, horizon, samples, np.random.default_rng([seed, step.t]))
            if len(out) == len(wanted):
                break
    return out


def models(spec: Any) -> bool:
    """Whether the oracle models this synthetic market: the rich process without gaps."""
    return spec.process == "rich" and spec.gap_prob == 0


def _check_modelled(spec: Any) -> None:
    if not models(spec):
        raise ValueError("the observable oracle models the rich market without gaps (process 'rich', gap_prob 0)")


def forecaster(spec: Any, particles: int = PARTICLES, candles: Optional[Mapping[int, Any]] = None) -> "ForecastFn":
    """The oracle as a scorecard forecaster: (histories, horizon, n_samples, seed) -> (N, n_samples,
    horizon) log returns. Each history is placed by its last timestamp in its asset's candles
    (`candles`: asset index -> frame; by default generated again from `spec`), whose later rows
    the filter never reads before their turn (the forecast for a candle reads the candles before
    it only) but for their times (the season of the horizon's candles).

    One filter per asset (seeded by the asset's index) runs forward through its candles and
    stays where it stopped, so a walk-forward's origins, asked in order, cost one pass over
    the candles, not one per call; an earlier origin starts the asset's filter again (the same
    seed, the same state). Each origin's paths are drawn with the generator seeded by (seed, origin)."""
    _check_modelled(spec)  # before generating the candles
    symbols = {spec.symbol(i): i for i in range(spec.assets)}
    frames = dict(candles) if candles is not None else {i: generate_asset(spec, i).candles for i in range(spec.assets)}
    markets = {i: _market(spec, frames[i]) for i in frames}
    filters: dict[int, tuple[Iterator[_Step], _Step]] = {}

    def state_before(i: int, row: int) -> _Step:
        f = filters.get(i)
        if f is None or f[1].t > row:
            leader = frames[i - 1] if i % 2 else None
            steps = _filter(spec, markets[i], frames[i], leader, particles, True, np.random.default_rng(i))
            f = (steps, next(steps))
        while f[1].t < row:
            f = (f[0], next(f[0]))
        filters[i] = f
        return f[1]

    def fn(histories: Sequence[Any], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        out = np.zeros((len(histories), n_samples, horizon))
        placed = []
        for k, h in enumerate(histories):
            i = symbols[h.symbol]
            row = int(frames[i].index.get_loc(h.candles.index[-1])) + 1  # the first candle predicted
            if row + horizon > len(frames[i]):
                raise ValueError(
                    f"{h.symbol}: the market's candles end before the horizon's (their times give the season)"
                )
            placed.append((i, row, k))
        for i, row, k in sorted(placed):  # forward through each asset's candles
            step = state_before(i, row)
            out[k] = _simulate(markets[i], step, horizon, n_samples, np.random.default_rng([seed, row]))
        return out

    return fn


def _simulate(mk: _Market, step: _Step, horizon: int, samples: int, rng: np.random.Generator) -> np.ndarray:
    """(samples, horizon) cumulative log returns from `samples` particles drawn from the filter's
    (equally weighted) set, moved forward on copies of their state."""
    pick = rng.integers(0, len(step.regime), samples)
    # take() gives the copy its own state arrays; the observed candles (r, log_range) stay shared, unread
    pair = [copy.copy(a) for a in step.pair]
    for a in pair:
        a.take(pick)
    regime = step.regime[pick]
    follower = len(pair) == 2
    r = np.zeros((samples, horizon))
    for k in range(horizon):
        t = step.t + k
        hs = [a.variance(t, mk.v) for a in pair]
        m_units = [KAPPA * np.tanh(a.e1 + a.e2) for a in pair]
        if follower:
            m_units[1] = m_units[1] + LEAD_LAG * pair[0].e1
        cum = np.cumsum(mk.prior[regime], axis=1)
        option = np.minimum((cum < rng.random(samples)[:, None]).sum(axis=1), OPTIONS - 1)
        regime = option // 2
        g = rng.standard_normal(samples)  # the market factor the pair's shocks share
        for j, (a, h, mean_unit) in enumerate(zip(pair, hs, m_units)):
            gauss = mk.beta * g + math.sqrt(1 - mk.beta**2) * rng.standard_normal(samples)
            z = gauss / np.sqrt(rng.chisquare(mk.nu, samples) / mk.nu)
            sd = mk.season[t] * mk.opt_k[option] * np.sqrt(h) * mk.t_sd
            e = z * mk.t_sd
            if j == len(pair) - 1:
                r[:, k] = mk.drift + sd * mean_unit + sd * z
            a.push(t, h * e * e, e)
    return np.cumsum(r, axis=1)


def _check_rows(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows.min() < 1 or np.any(np.diff(rows) <= 0)):
        raise ValueError("rows must be increasing candle indices from 1 on")
    return rows


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
