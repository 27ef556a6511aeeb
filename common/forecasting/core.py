"""Forecasts from a trained run: sampled price paths, quantile bands, P(up), one batched call.
This module holds all of it but the sampler (ForecasterCore); Forecaster (common.forecasting.forecaster)
samples with the torch model, ExportedForecaster (common.forecasting.infer) with onnxruntime.

    fc = Forecaster.from_run("case_c_crypto/checkpoints/crypto_prototype_20240601_120000")
    histories = fc.load_history(["BTC/USDT", "ETH/USDT"], as_of="2024-06-01T00:00")
    result = fc.forecast(histories, horizon=24, samples=256, seed=0, return_paths=True)
    result.table     # one row per origin x step: quantiles of the close, log-return moments, P(up)
    result.paths     # closes (N, samples, horizon + 1), step 0 = the last real close; high, low

The one forecasting path: `marketgpt forecast`, the scorecard and exports all call
`Forecaster.forecast`. It takes `History` objects (an asset and its candles up to the origin)
and never reads candles itself, so a caller that cuts each history at its origin can be sure
no later candle reaches the model: a walk-forward scorecard passes many (asset, origin) pairs
in one call. `load_history` is the CLI's way to get them from the run's data source.

Per history: encode the candles with the run's tokenizer (the volatility state after the last
candle is carried exactly into the decoded future), take the last context_length tokens, sample
`samples` token paths of `horizon` candles (common.model.sampling: KV cache, every origin and sample
in one batch), decode them into OHLC paths (`OHLCTokenizer.decode_ohlc`, each token's move and
range drawn within its bins: within_bin). The future is made of
candles: MISSING, PAD, BOS and the unused ids are never sampled (the rest renormalized).
A run with model.time_features / volume_input / vol_level_input also gets each candle's ids: the
history's as training computed them, the future's calendar with volume bin 0 (unknown) and the
origin's vol-level ids held (the sampled candles' volatility level is not recomputed: see
candle_features). A run with model.market_context reads the other assets' candles too:
set_market, or by default every asset of the run from its data source; each sample's future
market ids are those that followed a past close like the origin's (market_future = "analogs";
"held" holds the origin's; "unknown" reads none, for a model trained with model.market_mask).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd

from common.config import Config
from common.errors import UserError
from common.forecasting.draws import per_close
from common.forecasting.forecast_io import ForecastResult, History, future_timestamps, summarize_paths
from common.forecasting.frames import DEFAULT_LEVELS, check_levels, frame_history, frame_items, quantile_frame
from common.forecasting.history import clean_history, history_loader, load_histories
from common.forecasting.reversion import Reversion, load_reversion, long_run_variance, revert_paths
from common.markets import interval_step
from common.model.sampling_settings import SamplingSettings
from common.special_tokens import BOS_TOKEN, MISSING_TOKEN, PAD_TOKEN
from common.tokens.features import MARKET_COLUMNS, VOLUME_BINS, VolLevel, calendar_ids, candle_features
from common.tokens.ids import RunInfo
from common.tokens.market_context import MarketContext, close_times, series_moves
from common.tokens.tokenizer import OHLCTokenizer

__all__ = ["ForecasterCore"]

MAX_SAMPLES = 100_000
MARKET_FUTURES = ("analogs", "held", "unknown")
HORIZON_CONTEXTS = 10  # a horizon beyond 10 context lengths is refused as absurd


class ForecasterCore:
    """Everything a forecaster does but draw tokens: the run's assets and histories, encoding,
    decoding sampled token paths into candles and their summaries. A subclass gives sample_tokens:
    Forecaster (a torch model, common.forecasting.forecaster) or ExportedForecaster (onnxruntime,
    common.forecasting.infer, without torch)."""

    def __init__(
        self,
        tokenizer: OHLCTokenizer,
        info: RunInfo,
        cfg: Config,
        run_dir: Optional[Path] = None,
        checkpoint_sha256: Optional[str] = None,
        volume_edges: Optional[Sequence[float]] = None,
        interval: Optional[str] = None,
    ) -> None:
        self.volume_edges = None if volume_edges is None else list(volume_edges)  # data_info.json's, if stored
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.run_dir = run_dir
        self.checkpoint_sha256 = checkpoint_sha256
        self.info = info  # asset_info.json
        self.assets = {r.symbol: r for r in info.assets}
        self.symbols = list(info.symbols)
        # the interval forecast (a run of several intervals: --interval, default its first);
        # the model reads its id as model.default_interval
        self.interval = interval or cfg.data.interval
        # model.market_context: the cross-section the histories' candles are placed in (set_market),
        # and what it does over a forecast's future: "analogs" (each sample the ids that followed a
        # past close like the origin's, MarketContext.analogs: better at 5 steps on validation,
        # bench/results/2026-12-05-market-analogs), "held" (the origin's ids at every step) or
        # "unknown" (id 0: no market, what a model trained with model.market_mask has learnt to read)
        self.market: Optional[MarketContext] = None
        self.market_future = "analogs"
        # the samples of one date share their uniforms across assets (common.forecasting.draws)
        self.shared_draws = False
        # each sampled token's move and range drawn within its bins (OHLCTokenizer.decode_draw), not
        # its bins' medians, where the tokenizer has the within-bin quantiles: better calibrated at
        # every horizon and +0.10% CRPS at H=1 on validation (bench/results/2026-12-06-within-bin)
        self.within_bin = True
        # the volatility reversion fitted on validation at the end of training (reversion.json in
        # the run or export folder; None: the paths as sampled), common.forecasting.reversion
        self.reversion = load_reversion(run_dir, checkpoint_sha256)

    def active_reversion(self) -> Optional[Reversion]:
        """The reversion this forecaster's paths get: the run's, where it was fitted on the interval
        forecast (a run of several intervals fits its first)."""
        r = self.reversion
        return r if r is not None and r.interval in (None, self.interval) else None

    def reversion_taus(self) -> list[Optional[float]]:
        """The volatility reversion each run of this forecaster applies (tau; None: paths as sampled)."""
        active = self.active_reversion()
        return [active.tau if active is not None else None]

    def resolve_symbol(self, symbol: str) -> str:
        """`symbol` if the run knows it; else a UserError naming the nearest known one."""
        if symbol in self.assets:
            return symbol
        raise UserError(
            f"unknown symbol {symbol!r}: the run was trained on {len(self.symbols)} assets"
            f"{self._nearest(symbol)} (--all forecasts every one)"
        )

    def _nearest(self, symbol: str) -> str:
        close = difflib.get_close_matches(symbol, self.symbols, n=1, cutoff=0.0)
        return f"; did you mean {close[0]!r}?" if close else ""

    def load_history(self, symbols: Optional[Sequence[str]] = None, as_of: Optional[str] = None) -> list[History]:
        """Candles up to `as_of` (default: each asset's last candle) from the run's data source."""
        chosen = [self.resolve_symbol(s) for s in (symbols or self.symbols)]
        categories = {s: self.assets[s].category for s in chosen}
        return [
            History(s, frame)
            for s, frame in load_histories(self.cfg.data, self.run_dir, categories, chosen, as_of, self.interval)
        ]

    def set_market(self, candles: Mapping[str, pd.DataFrame]) -> None:
        """The market a model with model.market_context reads: symbol -> cleaned candles of the
        forecast interval, for every asset of the cross-section (the forecast asset among them).
        Whole histories may be given: a candle's context reads the candles closed by its own
        close only (common.tokens.market_context). Without it, the first forecast reads every
        asset of the run from its data source."""
        if len(candles) < 2:
            raise UserError(
                f"model.market_context: the market needs the candles of at least 2 assets, got {len(candles)}; "
                "pass the other assets' candles too"
            )
        self.market = MarketContext({s: series_moves(self.tokenizer, c, self.interval) for s, c in candles.items()})

    def _market(self) -> MarketContext:
        if self.market is None:  # every asset of the run, read one at a time: 24 bytes a candle held
            categories = {s: self.assets[s].category for s in self.symbols}
            load = history_loader(self.cfg.data, self.run_dir, categories, None, self.interval)
            self.market = MarketContext((s, series_moves(self.tokenizer, load(s), self.interval)) for s in self.symbols)
        return self.market

    # ------------------------------------------------------------------ forecasting

    def min_history(self) -> int:
        """Candles a history needs: a whole context, and a warm volatility estimate."""
        return max(self.cfg.model.context_length, self.tokenizer.vol_warmup + 2)

    def check_request(self, horizon: int, samples: int) -> None:
        limit = HORIZON_CONTEXTS * self.cfg.model.context_length
        if not 1 <= horizon <= limit:
            raise UserError(
                f"--horizon {horizon}: must be between 1 and {limit} steps "
                f"({HORIZON_CONTEXTS} context lengths of this model)"
            )
        if not 1 <= samples <= MAX_SAMPLES:
            raise UserError(f"--samples {samples}: must be between 1 and {MAX_SAMPLES:,}")

    def forecast(
        self,
        histories: Union[Sequence[History], Mapping[str, pd.DataFrame]],
        horizon: int,
        samples: int = 256,
        *,
        seed: int = 0,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        return_paths: bool = False,
        max_batch: Optional[int] = None,
    ) -> ForecastResult:
        """Sample `samples` paths of `horizon` candles for every history, in one batch.

        histories: History objects (the same asset may appear with several origins) or a
        mapping symbol -> candles. The table has one row per history x step, histories in the
        order given. Same arguments and seed, same result (on the CPU: byte for byte).
        """
        if isinstance(histories, Mapping):
            histories = [History(s, c) for s, c in histories.items()]
        if not histories:
            raise UserError("nothing to forecast: no history given")
        self.check_request(horizon, samples)
        settings = SamplingSettings(  # checks the sampling knobs before any encoding
            horizon, samples, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_batch=max_batch
        )
        contexts, states, origins, features = self._encode(histories, horizon)
        tokens = self.sample_tokens(
            np.stack(contexts),
            np.array([self.assets[o["symbol"]].id for o in origins]),
            np.array([self.assets[o["symbol"]].category_id for o in origins]),
            settings,
            **({"features": np.stack(features)} if features else {}),
            **self._shared_draws(origins, samples, horizon, seed),
        )  # (N, S, H)

        close, ohlc = self._decode_paths(tokens, states, self._within_uniforms(origins, samples, horizon, seed))
        reversion = self.active_reversion()
        if reversion is not None:  # each asset's long-run variance from its candles up to the origin
            closes = [h.candles["close"].to_numpy() for h in histories]
            v_long = np.array([long_run_variance(c, reversion.long_run) for c in closes])
            close, ohlc = revert_paths(close, ohlc, v_long, reversion.weights(horizon))
        table = self._forecast_table(origins, close, ohlc, horizon)
        paths = {"close": close, **{k: ohlc[k] for k in ("open", "high", "low")}} if return_paths else None
        return ForecastResult(table=table, paths=paths, tokens=tokens if return_paths else None, origins=origins)

    def _shared_draws(self, origins: list, samples: int, horizon: int, seed: int) -> dict[str, np.ndarray]:
        """What the samples of one origin close share across assets (common.forecasting.draws):
        "path_features", (N, samples, horizon, 3) market ids of each sample's future, with
        market_future = "analogs" (the closes drawn are shared; with model.market_peer a 4th
        column, each origin's peer's ids at those closes; zeros with "unknown"); "uniforms",
        (N, samples, horizon), with shared_draws."""
        if self.market_future not in MARKET_FUTURES:
            raise UserError(f"market_future {self.market_future!r}: expected one of {', '.join(MARKET_FUTURES)}")
        stamps = np.array([pd.Timestamp(o["as_of"]).value for o in origins], dtype=np.int64)
        closes = close_times(stamps, self.interval)
        out = {}
        if self.cfg.model.market_context and self.market_future == "analogs":
            market, interval = self._market(), self.interval
            futures = per_close(
                closes, seed, lambda close, rng: market.analog_closes(interval, close, horizon, samples, rng)
            )  # (N, samples, horizon) close times
            ids = market.ids(interval, futures.ravel()).reshape(*futures.shape, -1)
            if self.cfg.model.reads_peer:
                peers = [self.info.peer_of(o["symbol"], interval) for o in origins]
                peer_ids = np.stack([market.peer_ids(p, interval, f.ravel()) for p, f in zip(peers, futures)])
                ids = np.concatenate([ids, peer_ids.reshape(futures.shape)[..., None]], axis=-1)
            out["path_features"] = ids
        elif self.cfg.model.market_context and self.market_future == "unknown":
            # id 0 in every market column: what a model trained with model.market_mask reads as no market
            columns = MARKET_COLUMNS + int(self.cfg.model.reads_peer)
            out["path_features"] = np.zeros((len(origins), samples, horizon, columns), dtype=np.int64)
        if self.shared_draws:
            out["uniforms"] = per_close(closes, seed, lambda _, rng: rng.random((samples, horizon)), stream=(1,))
        return out

    def _within_uniforms(self, origins: list, samples: int, horizon: int, seed: int) -> Optional[np.ndarray]:
        """With within_bin (and a tokenizer that has the within-bin quantiles): the levels at which
        each sampled token's move and range are drawn within their bins, (N, S, H, 2), seeded by
        the seed and the origin's close time (common.forecasting.draws) as the other draws are;
        else None (bin medians)."""
        if not (self.within_bin and self.tokenizer.within_bins):
            return None
        stamps = np.array([pd.Timestamp(o["as_of"]).value for o in origins], dtype=np.int64)
        closes = close_times(stamps, self.interval)
        return per_close(closes, seed, lambda _, rng: rng.random((samples, horizon, 2)), stream=(2,))

    def _decode_paths(
        self, tokens: np.ndarray, states: list, u: Optional[np.ndarray] = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The sampled token paths (N, S, H) as candles: the closes (N, S, H + 1), step 0 each history's last
        real close, and the OHLC arrays (N, S, H), decoded from each history's volatility state (u: the
        within-bin levels of _within_uniforms, or None)."""
        N, samples, horizon = tokens.shape
        rep = lambda values: np.repeat(np.asarray(values, dtype=np.float64), samples)  # noqa: E731
        ohlc = self.tokenizer.decode_ohlc(
            tokens.reshape(N * samples, horizon),
            rep([s.last_close for s in states]),
            rep([s.sigma for s in states]),
            rep([s.ewma_weight for s in states]),
            u=None if u is None else u.reshape(N * samples, horizon, 2),
        )
        ohlc = {k: v.reshape(N, samples, horizon) for k, v in ohlc.items()}
        last = np.array([s.last_close for s in states])[:, None, None]
        close = np.concatenate([np.broadcast_to(last, (N, samples, 1)), ohlc["close"]], axis=2)
        return close, ohlc

    def _forecast_table(
        self, origins: list, close: np.ndarray, ohlc: dict[str, np.ndarray], horizon: int
    ) -> pd.DataFrame:
        """One row per origin x step: the origin, the step's timestamp and the paths' summary statistics."""
        frames = []
        for i, o in enumerate(origins):
            stats = summarize_paths(close[i], ohlc["high"][i], ohlc["low"][i])
            when = future_timestamps(o["as_of"], self.interval, o["category"], horizon)
            frames.append(
                pd.DataFrame(
                    {
                        "symbol": o["symbol"],
                        "as_of": o["as_of"],
                        "step": np.arange(1, horizon + 1),
                        "timestamp": when,
                        "last_close": o["last_close"],
                        **stats,
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)

    def predict_df(
        self,
        df: pd.DataFrame,
        horizon: int,
        quantile_levels: Sequence[float] = DEFAULT_LEVELS,
        *,
        samples: int = 256,
        seed: int = 0,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        id_column: str = "item_id",
        timestamp_column: str = "timestamp",
        market: Optional[pd.DataFrame] = None,
    ) -> pd.DataFrame:
        """Forecasts for a long data frame, in the convention of the forecasting libraries.

        df: one row per item and timestamp with columns item_id, timestamp, open, high, low,
        close (and volume: needed by a model with model.volume_input); an item is an asset the
        run was trained on, its rows in increasing time, its candles up to the forecast origin.
        Returns one row per item and future timestamp (the run's interval, on the asset's
        calendar): item_id, timestamp, "mean" (the mean sampled close) and one column per level
        named str(level) ("0.1", "0.5", ...): quantiles of the sampled close. The candles are
        cleaned as training cleaned them (common.forecasting.history.clean_history), then
        forecast() samples the paths; same arguments and seed, same frame. Timestamps come back
        tz-aware UTC, or naive (UTC) if the frame's column was a naive datetime64 one. A model with
        model.market_context reads the frame's items as the market, with `market`'s (a frame of
        the same columns: the other assets' candles, not forecast): give every asset of the run.
        """
        levels = check_levels(quantile_levels)
        self.check_request(horizon, samples)
        items = frame_items(df, id_column, timestamp_column)
        histories = [self._frame_history(item, raw) for item, raw in items]
        kept = self.market
        if self.cfg.model.market_context:  # the frame's items and the market's are the cross-section
            others = frame_items(market, id_column, timestamp_column) if market is not None else []
            step = interval_step(self.interval)
            market_items = [(self._known(i, "market item"), raw) for i, raw in others]
            cleaned = {s: clean_history(raw, s, self.assets[s].category, step) for s, raw in market_items}
            self.set_market({**cleaned, **{h.symbol: h.candles for h in histories}})
        try:
            result = self.forecast(
                histories,
                horizon,
                samples,
                seed=seed,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                return_paths=True,
            )
        finally:
            self.market = kept
        assert result.paths is not None  # return_paths
        stamps = pd.DatetimeIndex(result.table["timestamp"])
        column = df[timestamp_column] if timestamp_column in df.columns else df.index.get_level_values(timestamp_column)
        if isinstance(column.dtype, np.dtype) and column.dtype.kind == "M":  # naive datetime64 in, naive out
            stamps = stamps.tz_localize(None)
        future = result.paths["close"][:, :, 1:]  # (N, S, H): the sampled closes
        return quantile_frame([item for item, _ in items], future, stamps, levels, id_column, timestamp_column)

    def _known(self, item: Any, role: str) -> str:
        """predict_df's `item` as a symbol of the run; else a UserError naming the nearest."""
        symbol = str(item)
        if symbol not in self.assets:
            raise UserError(
                f"predict_df: {role} {item!r} is not an asset this model was trained on "
                f"({len(self.symbols)} assets{self._nearest(symbol)})"
            )
        return symbol

    def _frame_history(self, item: Any, raw: pd.DataFrame) -> History:
        """One item of predict_df's frame as a History: a known asset, candles on the run's
        interval, cleaned as training cleaned them (frame_history), long enough."""
        symbol = self._known(item, "item")
        needs_volume = self.cfg.model.volume_input
        candles = frame_history(item, raw, self.assets[symbol].category, self.interval, needs_volume=needs_volume)
        if len(candles) < self.min_history():
            raise UserError(
                f"predict_df: item {item!r}: {len(candles)} candles up to {_last_time(candles)} "
                f"after cleaning, {self.min_history()} needed (model.context_length "
                f"{self.cfg.model.context_length}, tokenizer warm-up {self.tokenizer.vol_warmup + 2})"
            )
        return History(symbol, candles)

    def _encode(self, histories: Sequence[History], horizon: int) -> tuple[list, list, list, list]:
        """Per history: its last context_length tokens, its volatility state after the last candle,
        its origin (symbol, as_of, last_close, category) and, for a model that reads them, its
        candle ids (the future's included)."""
        T = self.cfg.model.context_length
        contexts, states, origins, features = [], [], [], []
        for h in histories:
            symbol = self.resolve_symbol(h.symbol)
            candles = h.candles
            need = self.min_history()
            if len(candles) < need:
                raise UserError(
                    f"{symbol}: {len(candles)} candles up to {_last_time(candles)}, {need} needed "
                    f"(model.context_length {T}, tokenizer warm-up {self.tokenizer.vol_warmup + 2}); "
                    "pick a later --as-of or another asset"
                )
            tokens = self.tokenizer.encode(candles, asset=symbol)
            state = self.tokenizer.vol_state(candles, asset=symbol)
            contexts.append(tokens[-T:].astype(np.int64))
            states.append(state)
            origins.append(
                {
                    "symbol": symbol,
                    "as_of": candles.index[-1],
                    "last_close": state.last_close,
                    "category": self.assets[symbol].category,
                }
            )
            if self.cfg.model.reads_features:
                ids = self.candle_features(candles, origins[-1]["category"], horizon, symbol)
                features.append(ids[-(T + horizon) :])
        return contexts, states, origins, features

    def sample_tokens(
        self,
        contexts: np.ndarray,
        asset_ids: np.ndarray,
        category_ids: np.ndarray,
        settings: SamplingSettings,
        features: Optional[np.ndarray] = None,
        path_features: Optional[np.ndarray] = None,
        uniforms: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        """(N, samples, horizon) token ids continuing contexts (N, L) as settings say, never a
        banned id (banned_ids). features: (N, L + horizon, 3 or 4) candle ids, only for a model with
        time_features / volume_input / vol_level_input; path_features (N, samples, horizon, k): each
        sample's own future in their last k columns; uniforms (N, samples, horizon): each draw's
        uniform (None: the settings' seed draws them). The one step each subclass gives."""
        raise NotImplementedError

    def candle_features(
        self, candles: pd.DataFrame, category: str, horizon: int, symbol: Optional[str] = None
    ) -> np.ndarray:
        """(len(candles) + horizon, 3) ids: the history's as training computed them (the run's
        volume edges), then the future steps' calendar with volume 0 (no reading: it is unknown).
        With model.vol_level_input a 4th column, the vol-level ids, and with model.market_context 3
        more, the market's (set_market), every future step holding the origin's (forecast() gives
        each sample its own future market with market_future = "analogs"); with model.market_peer
        one more, the last move of `symbol`'s peer (asset_info.json's peers; unknown without one). A simplification: a
        sampled path's own level drifts from it over a horizon near vol_halflife; following it
        would need each path's decoded volatility inside the sampler's cached loop."""
        interval = self.interval
        edges = self.volume_edges
        if edges is None:
            if self.cfg.model.volume_input:
                raise UserError(
                    "model.volume_input is on but the run's volume edges are unknown "
                    "(data_info.json volume_edges); retrain the run"
                )
            edges = [0.0] * (VOLUME_BINS - 1)  # the volume ids are not read by this model
        if "volume" not in candles.columns:
            candles = candles.assign(volume=np.nan)  # no readings: volume id 0
        future = calendar_ids(future_timestamps(candles.index[-1], interval, category, horizon), interval)
        future = np.concatenate([future, np.zeros((horizon, 1), dtype=np.int64)], axis=1)
        tok = self.tokenizer
        vol = VolLevel.of(tok) if self.cfg.model.vol_level_input else None
        past = candle_features(candles, interval, edges, vol=vol)
        if self.cfg.model.market_context:
            stamps = pd.DatetimeIndex(candles.index).as_unit("ns").asi8
            closes = close_times(stamps, interval)
            columns = [past, self._market().ids(interval, closes)]
            if self.cfg.model.reads_peer:
                peer = self.info.peer_of(symbol, interval) if symbol is not None else None
                columns.append(self._market().peer_ids(peer, interval, closes)[:, None])
            past = np.concatenate(columns, axis=1)
        # the ids after the first three (vol level, market) are the origin's, held over the future
        held = np.repeat(past[-1:, future.shape[1] :], horizon, axis=0)
        return np.concatenate([past, np.concatenate([future, held], axis=1)], axis=0)

    def banned_ids(self) -> np.ndarray:
        """(V,) bool: ids a forecast never samples, the specials and the ids the tokenizer never emits."""
        banned = np.zeros(self.cfg.model.vocab_size, dtype=bool)
        banned[[PAD_TOKEN, MISSING_TOKEN, BOS_TOKEN]] = True
        banned[self.tokenizer.num_used_ids :] = True
        return banned


def _last_time(candles: pd.DataFrame) -> str:
    return candles.index[-1].isoformat() if len(candles) else "the start"
