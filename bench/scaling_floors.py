"""The two floors of the scaling study on the synthetic market: what the oracle and what a filter lose.

The oracle (`oracle_table`, `oracle_probs`, `oracle_target_probs`, `oracle_nll`): with drift 0, a
candle's token is (move bin of r/s_e, shape bin of log(high/low)/s_e), s_e being the tokenizer's
EWMA volatility of the past returns, and the generator makes r = s z and log(high/low) = s (|z - 0.1 n1| + 0.5 |n2| +
0.5 |n3|) (z Student-t(nu), n_i N(0, 1); _ohlcv in common/data/synthetic.py), where s is the true
scale of the candle (GARCH and regime, the truth frame's sigma). So the token's true distribution
depends on one number, rho = s / s_e: it is tabulated by Monte Carlo (100,000 draws of (z, n1, n2,
n3) per rho on a log grid of 100 points over the rhos seen; add-0.5 smoothing; linear
interpolation in log rho) and binned with the run's own tokenizer edges. Like synthetic.py's
oracle it knows the latent regime of the next candle and its exact GARCH variance, so its loss is
a floor below the best a forecaster can reach from the candles. A market with a mean (the rich
market's mu_t, common/data/synthetic_rich.py, or a drift) adds a second number, m = mu / s: the
move is rho (m + z) and the range rho (|m + z - 0.1 n1| + ...), so the table gains an axis of m
(MEAN_KNOTS points over the m seen, the same draws at every knot) and the token's distribution is
interpolated bilinearly in (log rho, m).

The observable oracle (`observable_nll`, common/evaluation/observable_oracle.py): on the rich market, the
exact predictive distribution of the next token given only the candles up to the origin (a
particle filter of the latent regime and jump path), mixed over its components in the same
table (`observable_cube`, widened to where the components fall; `observable_probs`). Its loss
is the floor a forecaster of the candles can reach; the oracle's is below it.

The filter (`filter_nll`): a forecaster that knows the generator's parameters but sees only the
asset's own past candles, as the model does. It infers the regime and the GARCH variance with a
Kim filter (Kim 1994): the probability of each regime and, per regime, one variance (the mixture
over the regime paths collapsed to its mean each candle, the filter's one approximation), updated
by each candle's return (Student-t) and range (common/evaluation/range_density.py: the density of the range beyond
|r| given |r| / s). Its forecast of the next token is the oracle's distribution mixed over the four
(regime now, regime next) combinations. Its loss bounds the reachable floor from above: what a
forecaster can do is somewhere between the oracle's loss and the filter's. (It ignores volume,
which carries |e| in the generator, and the market factor, shared across assets: a model that read
them could beat it.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from common.evaluation.range_density import range_loglik, range_table

__all__ = [
    "by_role",
    "filter_nll",
    "floor_losses",
    "kim_filter",
    "observable_cube",
    "observable_nll",
    "observable_probs",
    "oracles_by_role",
    "oracle_nll",
    "oracle_probs",
    "oracle_table",
    "oracle_target_probs",
]


MEAN_KNOTS = 25  # points on the m = mu / s axis of a market with a mean
CHUNK = 1_000_000  # targets interpolated at a time by oracle_target_probs (a few arrays of this length)


def oracle_table(
    move_edges: np.ndarray,
    shape_edges: np.ndarray,
    nu: float,
    log_rho: np.ndarray,
    draws: int = 100_000,
    seed: int = 0,
    mean: float = 0.0,
) -> np.ndarray:
    """(len(log_rho), move_bins * shape_bins) probabilities of each candle token (move bin x
    shape bin) at each rho = s / s_e for a candle of mean m = `mean` scales, by Monte Carlo
    (module docstring), add-0.5 smoothed. The draws depend on the seed only, not on m."""
    rng = np.random.default_rng(seed)
    t = rng.standard_t(nu, draws)
    z = mean + t
    wide = np.abs(z - 0.1 * rng.standard_normal(draws)) + 0.5 * (
        np.abs(rng.standard_normal(draws)) + np.abs(rng.standard_normal(draws))
    )
    n_shape = len(shape_edges) + 1
    cells = (len(move_edges) + 1) * n_shape
    table = np.empty((len(log_rho), cells))
    for i, rho in enumerate(np.exp(log_rho)):
        ids = np.searchsorted(move_edges, rho * z, side="right") * n_shape + np.searchsorted(
            shape_edges, rho * wide, side="right"
        )
        counts = np.bincount(ids, minlength=cells) + 0.5
        table[i] = counts / counts.sum()
    return table


def _span(x: np.ndarray, n: int) -> np.ndarray:
    """n knots spanning x."""
    return np.linspace(x.min() - 1e-6, x.max() + 1e-6, n)


def _place(x: np.ndarray, knots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each x's lower knot and weight on the upper one (elementwise, so a chunk of x places as the whole)."""
    pos = np.clip((x - knots[0]) / (knots[1] - knots[0]), 0, len(knots) - 1 - 1e-9)
    k = pos.astype(np.int64)
    return k, pos - k


def _oracle_cube(
    log_rho: np.ndarray,
    mean: Optional[np.ndarray],
    move_edges: np.ndarray,
    shape_edges: np.ndarray,
    nu: float,
    grid: int,
    draws: int,
) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """The oracle table over the knots spanning every target (grid, mean knots, tokens), its log rho
    knots and its m knots (None, and one mean slot, when `mean` is None or all zero)."""
    knots = _span(log_rho, grid)
    if mean is None or not np.any(mean):
        return oracle_table(move_edges, shape_edges, nu, knots, draws)[:, None, :], knots, None
    m_knots = _span(np.asarray(mean, dtype=float), MEAN_KNOTS)
    return _cube_at(knots, m_knots, move_edges, shape_edges, nu, draws), knots, m_knots


def _cube_at(
    knots: np.ndarray, m_knots: np.ndarray, move_edges: np.ndarray, shape_edges: np.ndarray, nu: float, draws: int
) -> np.ndarray:
    """The oracle table at every (log rho knot, m knot): (knots, m knots, tokens)."""
    return np.stack([oracle_table(move_edges, shape_edges, nu, knots, draws, mean=m) for m in m_knots], axis=1)


def _interpolate(
    cube: np.ndarray,
    knots: np.ndarray,
    m_knots: Optional[np.ndarray],
    log_rho: np.ndarray,
    mean: Optional[np.ndarray],
    y: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Each target's token distribution from the cube, linear in log rho (and in m with m_knots);
    only its probability of token y when y is given, read from the table's corners without
    building the rows."""
    k, w = _place(log_rho, knots)
    hi = np.minimum(k + 1, len(knots) - 1)
    col = slice(None) if y is None else y
    if y is None:
        w = w[:, None]
    if m_knots is None:
        return (1 - w) * cube[k, 0, col] + w * cube[hi, 0, col]
    j, v = _place(np.asarray(mean, dtype=float), m_knots)
    jh = np.minimum(j + 1, len(m_knots) - 1)
    if y is None:
        v = v[:, None]
    return (1 - w) * ((1 - v) * cube[k, j, col] + v * cube[k, jh, col]) + w * (
        (1 - v) * cube[hi, j, col] + v * cube[hi, jh, col]
    )


def oracle_probs(
    rho: np.ndarray,
    move_edges: np.ndarray,
    shape_edges: np.ndarray,
    nu: float,
    grid: int = 100,
    draws: int = 100_000,
    mean: Optional[np.ndarray] = None,
) -> np.ndarray:
    """(len(rho), move_bins * shape_bins): each target's true token distribution (token id minus
    the special tokens), interpolated linearly in log rho between the knots of oracle_table, and in
    m = mu / s too when `mean` (each target's m) is given and not all zero. Targets x tokens
    floats: for a loss, oracle_target_probs."""
    log_rho = np.log(rho)
    cube, knots, m_knots = _oracle_cube(log_rho, mean, move_edges, shape_edges, nu, grid, draws)
    return _interpolate(cube, knots, m_knots, log_rho, mean)


def oracle_target_probs(
    rho: np.ndarray,
    y: np.ndarray,
    move_edges: np.ndarray,
    shape_edges: np.ndarray,
    nu: float,
    grid: int = 100,
    draws: int = 100_000,
    mean: Optional[np.ndarray] = None,
    chunk: int = CHUNK,
) -> np.ndarray:
    """(len(rho),): each target's probability of its token y, oracle_probs(...)[i, y[i]] to the
    bit: one table over all targets' knots, then `chunk` targets at a time, so memory is the table
    plus O(chunk), not targets x tokens (10^8 training tokens score ~1.5e7 targets)."""
    log_rho = np.log(rho)
    cube, knots, m_knots = _oracle_cube(log_rho, mean, move_edges, shape_edges, nu, grid, draws)
    m = None if m_knots is None else np.asarray(mean, dtype=float)
    out = np.empty(len(log_rho))
    for b in range(0, len(out), chunk):
        s = slice(b, b + chunk)
        out[s] = _interpolate(cube, knots, m_knots, log_rho[s], None if m is None else m[s], y[s])
    return out


@dataclass
class _Split:
    """One split's scored targets of a synthetic run, with what the floors need to score them."""

    spec: Any  # the run's SyntheticSpec
    tok: Any  # its tokenizer
    tokens: Any  # its TokenSet
    assets: list[dict[str, Any]]  # per scored asset: the generated asset, the target rows, s_e and y


def _scored(run_dir: Path, split: str, assets: Optional[int], tokens: Any = None) -> _Split:
    """The split's targets (positions 1 .. n-1 of each asset's split, as the model is scored),
    per asset: the asset's candles and truth, the rows of the targets, the tokenizer's scale s_e
    of each and the target token (minus the specials). `tokens`: the run's TokenSet, if already read."""
    from common.config import load_config
    from common.data.synthetic import generate_asset, synthetic_spec
    from common.special_tokens import NUM_SPECIAL_TOKENS
    from common.tokens.token_set import TokenSet, token_path
    from common.tokens.tokenizer import OHLCTokenizer

    spec = synthetic_spec(load_config(run_dir / "config.json").data)
    tok = OHLCTokenizer.load(run_dir / "tokenizer.json")
    ts = TokenSet.load(token_path(run_dir)) if tokens is None else tokens
    out = []
    for i in range(spec.assets if assets is None else min(assets, spec.assets)):
        asset = generate_asset(spec, i)
        toks = np.asarray(ts.tokens[asset.symbol])
        if len(toks) != len(asset.candles):
            raise RuntimeError(f"{asset.symbol}: {len(toks)} tokens for {len(asset.candles)} candles (rows dropped?)")
        b, e = ts.ranges[asset.symbol][split]
        rows = np.arange(b + 1, e)
        log_close = np.log(asset.candles["close"].to_numpy())
        r = log_close[rows] - log_close[rows - 1]
        y = toks[rows].astype(np.int64) - NUM_SPECIAL_TOKENS
        if (y < 0).any():
            raise RuntimeError("a scored target is a special token: the split starts inside the warm-up")
        out.append({"asset": asset, "rows": rows, "s_e": r / np.asarray(ts.moves[asset.symbol])[rows], "y": y})
    return _Split(spec, tok, ts, out)


def oracle_nll(
    run_dir: Path,
    split: str,
    grid: int = 100,
    draws: int = 100_000,
    assets: Optional[int] = None,
    tokens: Any = None,
) -> float:
    """The oracle's mean NLL of the split's targets in the run's token space, for a data.source =
    "synthetic" run; of the first `assets` assets only, when given (--nested). `tokens`: the run's
    TokenSet when the caller has read it (a large run's index is read once)."""
    return _oracle_loss(_scored(run_dir, split, assets, tokens), grid, draws)


def floor_losses(run_dir: Path, split: str, assets: Optional[int] = None, draws: int = 100_000) -> dict[str, float]:
    """The oracle's, the filter's and the token filter's mean NLL of the split's targets (as
    oracle_nll and filter_nll), from one generation of the assets."""
    sp = _scored(run_dir, split, assets)
    return {
        "oracle": _oracle_loss(sp, 100, draws),
        "filter": _filter_loss(sp, "candles", 200, draws),
        "filter_tokens": _filter_loss(sp, "tokens", 200, draws),
    }


def _oracle_loss(sp: _Split, grid: int, draws: int) -> float:
    return float(np.mean(np.concatenate(_oracle_nlls(sp, grid, draws))))


def _truth(sp: _Split) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per asset, each target's true log rho = log(sigma / s_e) and m = mu / sigma (truth at t is candle t + 1's)."""
    sigma = [a["asset"].truth["sigma"].to_numpy()[a["rows"] - 1] for a in sp.assets]
    mean = [a["asset"].truth["mu"].to_numpy()[a["rows"] - 1] / s for a, s in zip(sp.assets, sigma)]
    return [np.log(s / a["s_e"]) for s, a in zip(sigma, sp.assets)], mean


def _oracle_nlls(sp: _Split, grid: int, draws: int) -> list[np.ndarray]:
    """The full-information oracle's NLL of each target, per asset."""
    log_rho, mean = _truth(sp)
    y = np.concatenate([a["y"] for a in sp.assets])
    edges = (sp.tok.move_binning.edges, sp.tok.shape_binning.edges)
    p = oracle_target_probs(np.exp(np.concatenate(log_rho)), y, *edges, sp.spec.nu, grid, draws, np.concatenate(mean))
    return np.split(-np.log(p), np.cumsum([len(a["y"]) for a in sp.assets])[:-1])


def by_role(nlls: list[np.ndarray]) -> dict[str, float]:
    """Mean NLL over all targets, over the leaders' (even assets: no lead-lag term) and the
    followers' (odd assets, whose mean carries the previous asset's shock), from per-asset NLLs."""
    out = {"all": float(np.mean(np.concatenate(nlls)))}
    for role, parity in (("leaders", 0), ("followers", 1)):
        part = [x for i, x in enumerate(nlls) if i % 2 == parity]
        if part:
            out[role] = float(np.mean(np.concatenate(part)))
    return out


# --------------------------------------------------------------------------- the observable oracle


def observable_cube(
    spec: Any, log_rho: np.ndarray, mean: np.ndarray, edges: tuple, grid: int = 200, draws: int = 100_000
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The oracle table (cube, log rho knots, m knots) for the observable oracle's components, over
    the targets' true (log rho, m) widened by what a component may differ by: a jump and two regime
    levels in scale (plus 0.5), 1 in m. A component beyond is read at the edge (it is one the
    candles made unlikely)."""
    from common.data.synthetic_rich import JUMP_SCALE

    pad = math.log(JUMP_SCALE * max(spec.stress_vol, 1 / spec.stress_vol)) + 0.5
    knots = np.linspace(log_rho.min() - pad, log_rho.max() + pad, grid)
    m_knots = np.linspace(mean.min() - 1.0, mean.max() + 1.0, MEAN_KNOTS + 15)
    return _cube_at(knots, m_knots, *edges, spec.nu, draws), knots, m_knots


def observable_probs(
    cube: tuple[np.ndarray, np.ndarray, np.ndarray],
    weight: np.ndarray,
    log_sd: np.ndarray,
    m: np.ndarray,
    s_e: np.ndarray,
    y: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The mixture of observable_oracle.components' chunk (targets x components) in token space:
    each target's probability of its token y (targets,), or its whole distribution (targets,
    tokens) without y."""
    table, knots, m_knots = cube
    log_rho = (log_sd - np.log(s_e)[:, None]).ravel()
    k = log_sd.shape[1]
    if y is not None:
        p = _interpolate(table, knots, m_knots, log_rho, m.ravel(), np.repeat(y, k))
        return (weight * p.reshape(weight.shape)).sum(axis=1)
    p = _interpolate(table, knots, m_knots, log_rho, m.ravel())
    return np.einsum("tk,tkv->tv", weight, p.reshape(*weight.shape, -1))


def observable_nll(
    run_dir: Path,
    split: str,
    grid: int = 200,
    draws: int = 100_000,
    assets: Optional[int] = None,
    tokens: Any = None,
    particles: Optional[int] = None,
) -> dict[str, float]:
    """The observable oracle's mean NLL (common/evaluation/observable_oracle.py: the exact predictive given the
    candles up to each origin) of the same targets as oracle_nll, for a rich-market run: "all",
    "leaders" and "followers" (by_role)."""
    return by_role(_observable_nlls(_scored(run_dir, split, assets, tokens), grid, draws, particles))


def oracles_by_role(
    run_dir: Path, split: str, tokens: Any = None, draws: int = 100_000, particles: Optional[int] = None
) -> dict[str, dict[str, float]]:
    """{"oracle": the full-information oracle's by_role losses, "observable": the observable
    oracle's (only on the rich market without gaps, which it models)} from one generation of the
    assets."""
    sp = _scored(run_dir, split, None, tokens)
    out = {"oracle": by_role(_oracle_nlls(sp, 100, draws))}
    if sp.spec.process == "rich" and sp.spec.gap_prob == 0:
        out["observable"] = by_role(_observable_nlls(sp, 200, draws, particles))
    return out


def _observable_nlls(sp: _Split, grid: int, draws: int, particles: Optional[int] = None) -> list[np.ndarray]:
    from common.data.synthetic import generate_asset
    from common.evaluation.observable_oracle import OPTIONS, PARTICLES, components

    n = particles or PARTICLES
    log_rho, mean = _truth(sp)
    edges = (sp.tok.move_binning.edges, sp.tok.shape_binning.edges)
    cube = observable_cube(sp.spec, np.concatenate(log_rho), np.concatenate(mean), edges, grid, draws)
    chunk = max(1, CHUNK // (n * OPTIONS))  # targets x components per chunk: about CHUNK
    out = []
    for i, a in enumerate(sp.assets):
        leader = generate_asset(sp.spec, i - 1).candles if i % 2 else None
        rows, nll = a["rows"], []
        for r, w, log_sd, m in components(sp.spec, a["asset"].candles, rows, leader, n, seed=i, chunk=chunk):
            at = np.searchsorted(rows, r)
            nll.append(-np.log(observable_probs(cube, w, log_sd, m, a["s_e"][at], a["y"][at])))
        out.append(np.concatenate(nll))
    return out


# --------------------------------------------------------------------------- the filter


def _candle_loglik(r: float, w: float, sigma: np.ndarray, nu: float, table: np.ndarray) -> np.ndarray:
    """log p(return r, log range w | scale sigma) for each sigma: Student-t(nu) for r, times the
    range's density beyond |r| given |r| / sigma (the Jacobian 1 / sigma for each)."""
    z = abs(r) / sigma
    const = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
    t = const - np.log(sigma) - (nu + 1) / 2 * np.log1p(z * z / nu)
    return t + range_loglik(z, w / sigma, table) - np.log(sigma)


def kim_filter(
    r2: np.ndarray, loglik: Callable[[int, np.ndarray], np.ndarray], spec: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The Kim filter over an asset's n candles. r2[t]: candle t's squared return as the filter
    knows it (for the GARCH update); loglik(t, scales): log p(what it sees of candle t | each
    scale). Returns, for each candle t >= 2, the forecast made after candle t - 1: (n, 4) weights
    of the (regime now, regime next) pairs and (n, 4) candle t's scale under each (rows 0 and 1
    unused; candle 0 only anchors the first return)."""
    if spec.process != "garch" or spec.drift != 0 or spec.seasonality != 0 or spec.gap_prob != 0:
        raise ValueError("the filter models the GARCH market with drift 0, no seasonality and no gaps")
    from common.markets import INTERVAL_SECONDS

    days = INTERVAL_SECONDS[spec.interval] / 86400
    alpha, beta, nu = spec.garch_alpha, spec.garch_beta, spec.nu
    omega = spec.daily_vol**2 * days * (1 - alpha - beta)
    c = math.sqrt((nu - 2) / nu)
    k = np.array([1.0, spec.stress_vol])
    trans = np.array([[1 - spec.p_stress, spec.p_stress], [spec.p_calm, 1 - spec.p_calm]])
    n = len(r2)
    weights, scales = np.zeros((n, 4)), np.ones((n, 4))
    prob = np.array([spec.p_calm, spec.p_stress]) / (spec.p_calm + spec.p_stress)  # stationary
    h = np.full(2, spec.daily_vol**2 * days)  # the variance of candle 1 under each regime of candle 1
    ll = loglik(1, k * np.sqrt(h) * c)  # candle 1 (the first return) updates the stationary prior
    post = prob * np.exp(ll - ll.max())
    prob = post / post.sum()
    for t in range(2, n):
        e2 = r2[t - 1] / (k * k * h)  # the unit shock of candle t - 1 under each regime i
        h_next = omega + (alpha * e2 + beta) * h  # variance of candle t given regime i at t - 1
        wij = (prob[:, None] * trans).ravel()  # (i, j) -> i * 2 + j
        sij = (np.sqrt(h_next)[:, None] * k[None, :]).ravel() * c
        weights[t], scales[t] = wij, sij
        ll = loglik(t, sij)
        post = wij * np.exp(ll - ll.max())
        post = (post / post.sum()).reshape(2, 2)
        prob = post.sum(axis=0)
        h = (post * h_next[:, None]).sum(axis=0) / np.maximum(prob, 1e-300)  # collapse per regime j
    return weights, scales


def _candle_observer(candles: Any, nu: float, table: np.ndarray):
    """(r2, loglik) of a filter that sees the candles: exact returns and ranges."""
    log_close = np.log(candles["close"].to_numpy())
    r = np.diff(log_close, prepend=log_close[0])
    w = np.log(candles["high"].to_numpy() / candles["low"].to_numpy())
    return r * r, lambda t, scales: _candle_loglik(r[t], w[t], scales, nu, table)


def _token_observer(
    tokens: np.ndarray, s_e: np.ndarray, m2: np.ndarray, n_shape: int, knots: np.ndarray, log_table: np.ndarray
):
    """(r2, loglik) of a filter that sees what the model sees: each candle's token (its move and
    shape bins) and the tokenizer's scale s_e. The GARCH update takes the move bin's mean squared
    move (m2, from the training split) times s_e^2; the likelihood of a token is the oracle table's
    at rho = scale / s_e (a warm-up candle, with no token, tells nothing)."""
    real = (tokens >= 0) & np.isfinite(s_e) & (s_e > 0)
    r2 = np.zeros(len(tokens))
    r2[real] = m2[np.minimum(tokens[real] // n_shape, len(m2) - 1)] * s_e[real] ** 2
    step = knots[1] - knots[0]

    def loglik(t: int, scales: np.ndarray) -> np.ndarray:
        if not real[t]:
            return np.zeros(len(scales))
        pos = np.clip((np.log(scales / s_e[t]) - knots[0]) / step, 0, len(knots) - 1 - 1e-9)
        i = pos.astype(np.int64)
        f = pos - i
        return (1 - f) * log_table[i, tokens[t]] + f * log_table[np.minimum(i + 1, len(knots) - 1), tokens[t]]

    return r2, loglik


def filter_nll(
    run_dir: Path,
    split: str,
    grid: int = 200,
    draws: int = 100_000,
    assets: Optional[int] = None,
    sees: str = "candles",
) -> float:
    """The filter's mean NLL (module docstring) of the same targets as oracle_nll; sees="candles"
    (exact returns and ranges) or "tokens" (the model's inputs: the token of each candle)."""
    return _filter_loss(_scored(run_dir, split, assets), sees, grid, draws)


def _filter_loss(sp: _Split, sees: str, grid: int, draws: int) -> float:
    from common.special_tokens import NUM_SPECIAL_TOKENS

    spec, ts = sp.spec, sp.tokens
    move_edges, shape_edges = sp.tok.move_binning.edges, sp.tok.shape_binning.edges
    if sees == "candles":
        table = range_table()
    elif sees == "tokens":
        knots = np.linspace(-3.0, 3.0, 241)  # log rho
        log_table = np.log(oracle_table(move_edges, shape_edges, spec.nu, knots, draws))
        m2 = _bin_mean_square(ts, [a["asset"].symbol for a in sp.assets], move_edges)
    else:
        raise ValueError(f"sees must be 'candles' or 'tokens', not {sees!r}")
    rho, mix, y = [], [], []
    for a in sp.assets:
        asset = a["asset"]
        if sees == "candles":
            r2, loglik = _candle_observer(asset.candles, spec.nu, table)
        else:
            log_close = np.log(asset.candles["close"].to_numpy())
            with np.errstate(divide="ignore", invalid="ignore"):
                s_e = np.diff(log_close, prepend=log_close[0]) / np.asarray(ts.moves[asset.symbol])
            tokens = np.asarray(ts.tokens[asset.symbol]).astype(np.int64) - NUM_SPECIAL_TOKENS
            r2, loglik = _token_observer(tokens, s_e, m2, len(shape_edges) + 1, knots, log_table)
        weights, scales = kim_filter(r2, loglik, spec)
        rows = a["rows"]
        if rows.min() < 2:
            raise RuntimeError("the filter forecasts from the third candle on")
        rho.append(scales[rows] / a["s_e"][:, None])
        mix.append(weights[rows])
        y.append(a["y"])
    rho_all, mix_all, y_all = np.concatenate(rho), np.concatenate(mix), np.concatenate(y)
    # each target's token under each of its four scales: the table's column, not the four rows
    p = oracle_target_probs(rho_all.ravel(), np.repeat(y_all, 4), move_edges, shape_edges, spec.nu, grid, draws)
    p_target = (mix_all * p.reshape(len(y_all), 4)).sum(axis=1)
    return float(np.mean(-np.log(p_target)))


def _bin_mean_square(ts: Any, symbols: list, move_edges: np.ndarray) -> np.ndarray:
    """Mean squared normalized move of the training candles in each move bin (the token filter's
    stand-in for a candle's exact move; 1 for a bin no training candle fell in)."""
    moves = np.concatenate([np.asarray(ts.moves[s])[slice(*ts.ranges[s]["train"])] for s in symbols])
    moves = moves[np.isfinite(moves)]
    bins = np.searchsorted(move_edges, moves, side="right")
    count = np.bincount(bins, minlength=len(move_edges) + 1)
    total = np.bincount(bins, weights=moves**2, minlength=len(move_edges) + 1)
    return np.where(count > 0, total / np.maximum(count, 1), 1.0)
