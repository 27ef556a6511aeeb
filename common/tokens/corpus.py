"""A corpus ready to train on (Prepared), and the steps both ways of preparing one share: the
tokenizer and volume-bin fits on the train ranges only, and each asset's encoding. The in-memory
way (data.shards = false, prepare_in_memory) is here; the shard way is common.tokens.shards."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator, Mapping, Optional, TextIO, cast

import numpy as np
import pandas as pd

from common.config import Config, ModelConfig, TokenizerConfig
from common.data.loading import load_market_data
from common.data.prepare import PreparedData, prepare_data
from common.tokens.features import VolLevel, candle_features, fit_volume_edges, relative_volume
from common.tokens.ids import RunInfo
from common.tokens.market_context import MarketContext, SeriesMoves, check_cross_section, series_moves
from common.tokens.token_set import TokenSet
from common.tokens.tokenizer import OHLCTokenizer

__all__ = [
    "FIT_CANDLES",
    "Prepared",
    "encode_asset",
    "fit_stride",
    "fit_tokenizer",
    "fit_volume",
    "prepare_in_memory",
    "ranges_of",
    "with_market_context",
    "wants_features",
]


@dataclasses.dataclass
class Prepared:
    """A corpus ready to train on: its token set (memory-mapped from a shard, or in memory) and
    what a run folder records beside it."""

    tokens: TokenSet
    tokenizer: OHLCTokenizer
    info: RunInfo  # asset_info.json
    data_info: dict


# The quantile fits pool at most about this many training candles: every k-th candle of each
# asset beyond it (k = fit_stride). Quantile edges from 16M draws are as good as from 1B, and the
# fit's memory (16 bytes a pooled candle) stays near 300 MB whatever the corpus.
FIT_CANDLES = 2**24


def fit_stride(prepared: PreparedData) -> int:
    """k: pool each asset's every k-th training candle, so at most about FIT_CANDLES in all."""
    train = sum(len(prepared.splits[a.symbol].train) for a in prepared.assets)
    return max(1, -(-train // FIT_CANDLES))


def fit_tokenizer(
    tok: TokenizerConfig, vocab_size: int, prepared: PreparedData, parent: Optional[Path] = None
) -> OHLCTokenizer:
    """The tokenizer of the tokenizer section and model.vocab_size fitted on the train ranges only
    (asset by asset), or a fine-tuning parent's."""
    if parent is not None:
        return OHLCTokenizer.load(parent)
    train = (
        prepared.candles[a.symbol].iloc[prepared.splits[a.symbol].train.start : prepared.splits[a.symbol].train.stop]
        for a in prepared.assets
    )
    return OHLCTokenizer.from_config(tok, vocab_size).fit(train, every=fit_stride(prepared))


def fit_volume(prepared: PreparedData) -> list[float]:
    """The volume-bin edges, fitted on the train ranges only."""
    every = fit_stride(prepared)

    def train_relative() -> Iterator[np.ndarray]:
        for a in prepared.assets:
            split = prepared.splits[a.symbol].train
            volume = prepared.candles[a.symbol]["volume"].to_numpy(dtype=np.float64)
            yield relative_volume(volume)[split.start : split.stop : every]

    return fit_volume_edges(train_relative())


def encode_asset(
    tokenizer: OHLCTokenizer,
    frame: pd.DataFrame,
    symbol: str,
    interval: str,
    edges: Optional[list[float]],
    vol_level: bool = False,
) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """One asset's (tokens, moves, time and volume ids or None when `edges` is None); vol_level:
    the vol-level ids as a 4th column (model.vol_level_input)."""
    tokens = tokenizer.encode(frame, asset=symbol)
    moves = tokenizer.features(frame, asset=symbol)[0]
    vol = VolLevel.of(tokenizer) if vol_level else None
    features = None if edges is None else candle_features(frame, interval, edges, vol=vol)
    return tokens, moves, features


def with_market_context(
    features: dict[str, np.ndarray], series: dict[str, SeriesMoves], train_candles: Optional[Mapping[str, int]] = None
) -> tuple[dict[str, np.ndarray], Optional[dict[str, str]]]:
    """(each series' feature ids with its market-context ids appended, model.market_context; with
    train_candles, each series' training candles (model.market_peer), the peers fitted on them,
    whose column comes last)."""
    check_cross_section({s: m.interval for s, m in series.items()})
    context = MarketContext(series)
    peers = None if train_candles is None else context.fit_peers(train_candles)
    out = {s: np.concatenate([f, context.own_ids(s, peers).astype(f.dtype)], axis=1) for s, f in features.items()}
    return out, peers


def ranges_of(prepared: PreparedData, symbol: str) -> dict[str, tuple[int, int]]:
    split = prepared.splits[symbol]
    return {name: (r.start, r.stop) for name, r in (("train", split.train), ("val", split.val), ("test", split.test))}


def wants_features(m: ModelConfig) -> bool:
    return m.reads_features


def prepare_in_memory(
    cfg: Config, case_dir: Path, parent: Optional[Path] = None, out: Optional[TextIO] = None
) -> Prepared:
    """The same corpus prepared in memory for one run (data.shards = false): every asset's
    candles held at once, nothing written to the data cache."""
    market = load_market_data(cfg.data, case_dir)
    prepared = prepare_data(cfg.data, cfg.model.context_length, market)
    tokenizer = fit_tokenizer(cfg.tokenizer, cfg.model.vocab_size, prepared, parent)
    edges = fit_volume(prepared) if wants_features(cfg.model) else None
    symbols = [a.symbol for a in prepared.assets]
    tokens: dict[str, np.ndarray] = {}
    moves: dict[str, np.ndarray] = {}
    features: dict[str, Optional[np.ndarray]] = {}
    series: dict[str, SeriesMoves] = {}
    for s in symbols:
        tokens[s], moves[s], features[s] = encode_asset(
            tokenizer, prepared.candles[s], s, market.interval_of(s), edges, cfg.model.vol_level_input
        )
        if cfg.model.market_context:
            series[s] = series_moves(tokenizer, prepared.candles[s], market.interval_of(s), moves[s])
    peers = None
    if cfg.model.market_context:
        train = {s: prepared.splits[s].train.stop for s in symbols} if cfg.model.reads_peer else None
        with_market, peers = with_market_context(cast("dict[str, np.ndarray]", features), series, train)
        features = dict(with_market)
    data_info = dict(prepared.info, tokenizer_clip_counts=dict(tokenizer.clip_counts))
    if edges is not None:
        data_info["volume_edges"] = edges
    # encode_asset gives every asset's features when there are volume edges
    token_set = TokenSet(
        symbols,
        tokens,
        moves,
        {s: ranges_of(prepared, s) for s in symbols},
        cast("dict[str, np.ndarray]", features) if edges is not None else None,
    )
    info = RunInfo.of_assets(prepared.assets, cfg.data.intervals)
    return Prepared(token_set, tokenizer, dataclasses.replace(info, peers=peers) if peers else info, data_info)
