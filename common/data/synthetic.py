"""A synthetic market at any scale, for tests and benchmarks, with the true forecast of every candle.

Each asset's close-to-close log return r_t follows

    r_t = drift + m_t * k(s_t) * sqrt(h_t) * e_t,     e_t = z_t * sqrt((nu - 2) / nu)   (unit variance)
    h_{t+1} = omega + garch_alpha * h_t * e_t**2 + garch_beta * h_t                      (GARCH(1,1))
    z_t = (market_beta * g_t + sqrt(1 - market_beta**2) * n_t) / sqrt(w_t / nu)         (standard t, nu)

- s_t: a market-wide 2-state Markov regime (calm, stressed); k(calm) = 1, k(stressed) = stress_vol.
- g_t: the market factor, N(0, 1), shared by every asset; n_t ~ N(0, 1) and w_t ~ chi2(nu) are the
  asset's own, so z_t is exactly Student-t(nu) and assets co-move with correlation ~ market_beta**2.
- m_t: intraday seasonality for sub-daily intervals (a U over the hour of day: busy open and close,
  quiet middle, mean square 1 over a day); 1 for daily candles.
- omega sets the calm unconditional variance to daily_vol**2 scaled to the candle length.
- Gaps: each slot of the time grid is missing with probability gap_prob, like a closed market; the
  process runs over the candles that exist (a gap is no time for it), so every return is one step.

`truth` (aligned with the candles) is the true distribution of the NEXT candle's log return
r_{t+1} = log(close_{t+1} / close_t): drift + sigma * T(nu), with sigma = m_{t+1} k(s_{t+1})
sqrt(h_{t+1}) sqrt((nu-2)/nu) (so its sd is sigma * sqrt(nu/(nu-2))). It is conditional on every
candle up to t AND on two things no forecaster sees: the latent regime s_{t+1} of the next candle
and the next candle's timestamp (which a gap may move). That is the oracle: by Gibbs' inequality
its expected NLL is a lower bound on the expected NLL of any forecaster that uses the candles up
to t. It does not know the next candle's market factor g_{t+1} (other assets' next candles would
tell some of it). `nll_next` is -log density of the realized r_{t+1} under it; the last candle,
with nothing after it, has NaN in every column.

Generation is deterministic per asset: the market (regime, factor, gaps) comes from
SeedSequence([seed, 2**32]) and asset i from SeedSequence([seed, i]), so one asset can be made
alone and `iter_assets` streams assets in memory bounded by one asset's candles.

Training reads it as data.source = "synthetic" (common.data.loading): `synthetic_spec(cfg.data)` is
data.synthetic at data.interval from data.start_date, and the loader makes each asset's candles
only when they are looked up (generate_asset; the market all assets share is made once per spec).
SyntheticSpec itself lives in common/config/synthetic.py, on the root floor, so the config checks
data.synthetic as the spec does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from common.atomic import atomic_path
from common.config import DataConfig
from common.config.synthetic import SyntheticSpec, spec_from_dict
from common.data.synthetic_rich import JUMP_PROB, JUMP_SCALE, regimes, rich_returns
from common.data.universe import Asset
from common.errors import UserError
from common.markets import INTERVAL_SECONDS, interval_step

__all__ = [
    "SyntheticAsset",
    "SyntheticSpec",
    "aggregate",
    "generate_asset",
    "iter_assets",
    "oracle_nll",
    "read_truth",
    "season",
    "synthetic_assets",
    "synthetic_spec",
    "t_nll",
    "write_files",
]

OHLCV = ("open", "high", "low", "close", "volume")
TRUTH = ("mu", "sigma", "nu", "nll_next")
MARKET_STREAM = 2**32  # beyond any asset index: the market's seed never equals an asset's


@dataclass
class SyntheticAsset:
    symbol: str
    category: str
    candles: pd.DataFrame  # open, high, low, close, volume (float64), UTC index named timestamp
    truth: pd.DataFrame  # mu, sigma, nu, nll_next: the next candle's log return (module docstring)


@dataclass
class _Market:
    """What every asset shares, one value per slot of the time grid."""

    times: pd.DatetimeIndex
    regime_scale: np.ndarray
    factor: np.ndarray
    season: np.ndarray
    present: np.ndarray


def _utc(when: object) -> pd.Timestamp:
    stamp = pd.Timestamp(when)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def _grid(spec: SyntheticSpec) -> pd.DatetimeIndex:
    ns = _utc(spec.start).as_unit("ns").value + interval_step(spec.interval).value * np.arange(spec.candles)
    return pd.DatetimeIndex(ns.view("datetime64[ns]"), name="timestamp").tz_localize("UTC")


def season(spec: SyntheticSpec, times: pd.DatetimeIndex) -> np.ndarray:
    """U over the hour of day, mean square 1 over the day's 24 hours; flat for daily candles."""
    if INTERVAL_SECONDS[spec.interval] >= 86400 or spec.seasonality == 0:
        return np.ones(len(times))

    def u(day_fraction: np.ndarray) -> np.ndarray:
        return 1 + spec.seasonality * (2 * day_fraction - 1) ** 2

    norm = np.sqrt(np.mean(u((np.arange(24) + 0.5) / 24) ** 2))
    mid_hour = times.hour + times.minute / 60 + 0.5 * INTERVAL_SECONDS[spec.interval] / 3600  # the candle's middle
    return np.asarray(u(mid_hour / 24)) / norm


@functools.lru_cache(maxsize=1)  # shared by every asset of a spec made one at a time (generate_asset)
def _market(spec: SyntheticSpec) -> _Market:
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, MARKET_STREAM]))
    n = spec.candles
    flips = rng.random(n)
    stressed = np.zeros(n, dtype=bool)
    state = rng.random() < spec.p_stress / max(spec.p_stress + spec.p_calm, 1e-12)  # start stationary
    for t in range(n):
        if t:  # Markov step from the previous slot
            state = flips[t] >= spec.p_calm if state else flips[t] < spec.p_stress
        stressed[t] = state
    factor = rng.standard_normal(n)
    present = rng.random(n) >= spec.gap_prob
    present[0] = True  # every asset starts at `start`
    times = _grid(spec)
    scale = np.where(stressed, spec.stress_vol, 1.0)
    if spec.process == "rich":  # three regimes from the same draws, and market-wide volatility jumps
        scale = regimes(spec, flips) * np.where(rng.random(n) < JUMP_PROB, JUMP_SCALE, 1.0)
    return _Market(times, scale, factor, season(spec, times), present)


def t_nll(r: np.ndarray, mu: np.ndarray, sigma: np.ndarray, nu: float) -> np.ndarray:
    """-log density of r under mu + sigma * Student-t(nu)."""
    x = (np.asarray(r) - mu) / sigma
    const = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
    return -(const - np.log(sigma) - (nu + 1) / 2 * np.log1p(x * x / nu))


def _returns(
    spec: SyntheticSpec, market: _Market, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The asset's log returns on the present slots, their t scales (sigma) and unit shocks e_t."""
    keep = market.present
    n, nu = int(keep.sum()), spec.nu
    days = INTERVAL_SECONDS[spec.interval] / 86400
    b = spec.market_beta
    gauss = b * market.factor[keep] + math.sqrt(1 - b * b) * rng.standard_normal(n)
    z = gauss / np.sqrt(rng.chisquare(nu, n) / nu)
    e = z * math.sqrt((nu - 2) / nu)
    omega = spec.daily_vol**2 * days * (1 - spec.garch_alpha - spec.garch_beta)
    h = np.empty(n)
    h[0] = spec.daily_vol**2 * days
    for t in range(1, n):  # the recursion is sequential; n floats, fast enough at 1e6 candles
        h[t] = omega + (spec.garch_alpha * e[t - 1] ** 2 + spec.garch_beta) * h[t - 1]
    sigma = market.season[keep] * market.regime_scale[keep] * np.sqrt(h) * math.sqrt((nu - 2) / nu)
    return spec.drift * days + sigma * z, sigma, e


def _ohlcv(r: np.ndarray, sigma: np.ndarray, e: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Candles from the close-to-close returns: close compounds r from a random start price; open is
    the previous close times a small jitter (0.1 of the candle's scale); high and low stretch
    max/min(open, close) by |N(0, 1)| * 0.5 * scale; volume is lognormal, larger with |e|."""
    n = len(r)
    close = math.exp(rng.uniform(math.log(10), math.log(1000))) * np.exp(np.cumsum(r))
    prev = np.concatenate([[close[0] * math.exp(-r[0])], close[:-1]])
    open_ = prev * np.exp(0.1 * sigma * rng.standard_normal(n))
    high = np.maximum(open_, close) * np.exp(0.5 * sigma * np.abs(rng.standard_normal(n)))
    low = np.minimum(open_, close) * np.exp(-0.5 * sigma * np.abs(rng.standard_normal(n)))
    volume = math.exp(rng.uniform(math.log(1e4), math.log(1e7))) * np.exp(
        0.5 * np.abs(e) + 0.3 * rng.standard_normal(n)
    )
    return np.column_stack([open_, high, low, close, volume])


def _asset(spec: SyntheticSpec, i: int, market: _Market) -> SyntheticAsset:
    if not 0 <= i < spec.assets:
        raise UserError(f"asset index {i} is outside 0..{spec.assets - 1} (SyntheticSpec.assets = {spec.assets})")
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, i]))
    keep = market.present
    if spec.process == "rich":
        scale = market.season[keep] * market.regime_scale[keep]
        r, mu, sigma, e = rich_returns(spec, i, scale, market.factor[keep], rng)
    else:
        r, sigma, e = _returns(spec, market, rng)
        mu = np.full(len(r), spec.drift * INTERVAL_SECONDS[spec.interval] / 86400)
    index = market.times[keep]
    candles = pd.DataFrame(_ohlcv(r, sigma, e, rng), index=index, columns=list(OHLCV))
    n = len(r)
    next_mu, next_sigma = np.append(mu[1:], np.nan), np.append(sigma[1:], np.nan)
    nll = np.append(t_nll(r[1:], mu[1:], sigma[1:], spec.nu), np.nan)
    truth = pd.DataFrame(
        {"mu": next_mu, "sigma": next_sigma, "nu": np.full(n, float(spec.nu)), "nll_next": nll}, index=index
    )
    truth.loc[truth.index[-1], "mu"] = np.nan  # nothing follows the last candle
    truth.loc[truth.index[-1], "nu"] = np.nan
    return SyntheticAsset(spec.symbol(i), spec.category(i), candles, truth)


def generate_asset(spec: SyntheticSpec, i: int) -> SyntheticAsset:
    """Asset i alone: the same frames as the i-th item of iter_assets(spec)."""
    return _asset(spec, i, _market(spec))


def iter_assets(spec: SyntheticSpec) -> Iterator[SyntheticAsset]:
    """Every asset in index order, one at a time (memory: the market plus one asset)."""
    market = _market(spec)
    for i in range(spec.assets):
        yield _asset(spec, i, market)


def synthetic_spec(d: DataConfig) -> SyntheticSpec:
    """The market of data.source = "synthetic": data.synthetic's settings at data.interval from
    data.start_date (the config checked them when it loaded)."""
    return spec_from_dict(d.synthetic, {"interval": d.interval, "start": d.start_date})


def aggregate(candles: pd.DataFrame, interval: str) -> pd.DataFrame:
    """Candles of a coarser `interval` made from finer ones, as an exchange makes them: the first
    open, highest high, lowest low, last close and summed volume of each bar (bars aligned to the
    UTC epoch; a bar without any fine candle is left out). Several intervals of one synthetic
    market (data.intervals) are its finest interval's candles aggregated, so they tell one story."""
    bars = candles.resample(interval_step(interval), origin="epoch", label="left", closed="left")
    out = bars.agg({"open": "first", "high": "max", "low": "min", "close": "last", "volume": "sum"})
    return out[out["close"].notna()]


def synthetic_assets(spec: SyntheticSpec) -> list[Asset]:
    """The spec's assets in index order, as a universe lists them; nothing is generated."""
    return [
        Asset(symbol=spec.symbol(i), source="synthetic", category=spec.category(i), name=f"synthetic asset {i}")
        for i in range(spec.assets)
    ]


def write_files(spec: SyntheticSpec, folder: str | Path) -> list[Path]:
    """One <symbol>.parquet per asset (timestamp, open, high, low, close, volume) that data.source =
    "files" reads as is, and truth/<symbol>.parquet (timestamp, mu, sigma, nu, nll_next); each written
    atomically. Returns the candle files, in asset order."""
    folder = Path(folder)
    written = []
    for asset in iter_assets(spec):
        for frame, path in (
            (asset.candles, folder / f"{asset.symbol}.parquet"),
            (asset.truth, folder / "truth" / f"{asset.symbol}.parquet"),
        ):
            with atomic_path(path) as tmp:
                frame.reset_index().to_parquet(tmp, index=False)
        written.append(folder / f"{asset.symbol}.parquet")
    return written


def read_truth(folder: str | Path, symbol: str) -> pd.DataFrame:
    """truth/<symbol>.parquet written by write_files, indexed by its UTC timestamps."""
    return pd.read_parquet(Path(folder) / "truth" / f"{symbol}.parquet").set_index("timestamp")


def oracle_nll(truths: pd.DataFrame | Iterable[pd.DataFrame], start: object = None, end: object = None) -> float:
    """The oracle's mean NLL of the next log return over the candles (timestamps in [start, end))
    of one or more truth frames: the floor for a model's mean NLL on the same candles' next log
    returns (in return space: a density over prices differs by the Jacobian, -log of 1/price)."""
    frames = [truths] if isinstance(truths, pd.DataFrame) else list(truths)
    values = []
    for frame in frames:
        keep = np.ones(len(frame), dtype=bool)
        if start is not None:
            keep &= frame.index >= _utc(start)
        if end is not None:
            keep &= frame.index < _utc(end)
        values.append(frame["nll_next"].to_numpy()[keep])
    joined = np.concatenate(values) if values else np.empty(0)
    joined = joined[np.isfinite(joined)]
    if joined.size == 0:
        raise UserError("oracle_nll: no candle with a next return in the given range")
    return float(joined.mean())
