"""OHLC candle tokenizer: one token per candle, carrying its move and its shape.

Each candle is described by two scale-free numbers, both divided by sigma_t, a volatility
estimate built from PAST candles only (so one vocabulary serves BTC and a utility stock):

    move  r_t = log(close_t / close_prev)        close_prev: the last valid close before t
    shape s_t = log(max(o,h,l,c) / min(o,h,l,c)) the candle's range (>= 0, never NaN)
    sigma_t   = sqrt(EWMA of r^2 over the valid candles strictly before t)

The EWMA is the bias-corrected one (pandas `ewm(halflife=vol_halflife, adjust=True)`): every
past squared return has weight (1 - alpha)^age, normalised by the sum of the weights, with
alpha = 1 - 0.5 ** (1 / vol_halflife). With vol_estimator "range" it averages each candle's
Parkinson variance of its true range instead of r^2 (volatility.py).

`fit` learns quantile bin edges of move/sigma (ret_bins bins) and shape/sigma (shape_bins bins)
from training candles, so every bin is used about equally often, plus each bin's representative
value (the median of the training values in it, what `decode` gives) and its training values'
within-bin quantiles (what `decode_draw` draws from, so that sampled paths keep the moves' spread
and tails; tokenizer files written before them decode by medians). A token is

    token = NUM_SPECIAL_TOKENS + ret_bin * shape_bins + shape_bin

with ret_bins = (vocab_size - NUM_SPECIAL_TOKENS) // shape_bins. The few ids above
NUM_SPECIAL_TOKENS + ret_bins * shape_bins are never emitted (5 for the three cases' vocabularies);
`decode` gives NaN for them.

Special tokens:
  - MISSING for a candle with any of open/high/low/close NaN (or infinite). The data layer inserts
    NaN rows for absent bars, so a gap in time is a run of MISSING tokens; the next valid candle's
    move is measured from the last valid close and missing candles never touch the volatility.
  - BOS for the first valid candle (no move yet) and for the following ones until `vol_warmup`
    past returns have been seen (the volatility estimate is not trustworthy before that). So the
    first vol_warmup + 1 valid candles of every series are BOS.
  - PAD is never emitted here; batching code uses it.

Tokens are int16 when the vocabulary fits (vocab_size <= 32768, all the cases), else int32.
Everything is vectorised numpy per asset. `decode_path` / `decode_ohlc` are sequential over
steps by nature (each step's sigma depends on the previous steps' moves) and vectorised over
paths: thousands of sampled paths decode in one loop over the horizon.

This module is the tokenizer and its file format (tokenizer.json); the candle input it reads is
in candles.py, the volatility scaling and its inverse in volatility.py, the bins in bins.py.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd

from common.atomic import atomic_write_json
from common.config import TokenizerConfig
from common.errors import UserError
from common.special_tokens import BOS_TOKEN, MISSING_TOKEN, NUM_SPECIAL_TOKENS, PAD_TOKEN
from common.tokens.bins import QuantileBins
from common.tokens.candles import CandleInput
from common.tokens.volatility import (
    VOL_ESTIMATORS,
    ArrayOrFloat,
    CandleFeatures,
    VolState,
    candle_features,
    ewma_alpha,
    walk,
)

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "OHLCTokenizer", "token_entropy"]

FORMAT_NAME = "marketgpt.ohlc_tokenizer"
FORMAT_VERSION = 1


def token_entropy(tokens: np.ndarray, num_symbols: int) -> dict:
    """Shannon entropy (bits) of the token ids in `tokens`, against log2(num_symbols).

    `fraction` = bits / log2(num_symbols): 1.0 means every one of the num_symbols ids is used
    equally often. `fraction_of_distinct` measures against the ids that actually occur.
    """
    tokens = np.asarray(tokens).ravel()
    n = int(tokens.size)
    counts = np.bincount(tokens.astype(np.int64)) if n else np.zeros(0, dtype=np.int64)
    counts = counts[counts > 0]
    p = counts / max(n, 1)
    bits = float(-(p * np.log2(p)).sum()) if n else 0.0
    max_bits = math.log2(num_symbols) if num_symbols > 1 else 0.0
    distinct_bits = math.log2(len(counts)) if len(counts) > 1 else 0.0
    return {
        "tokens": n,
        "distinct": int(len(counts)),
        "bits": bits,
        "max_bits": max_bits,
        "fraction": bits / max_bits if max_bits else 0.0,
        "fraction_of_distinct": bits / distinct_bits if distinct_bits else 0.0,
    }


class OHLCTokenizer:
    """Candles -> one token each (move bin x shape bin), and back. See the module docstring."""

    def __init__(
        self,
        vocab_size: int = 1024,
        shape_bins: int = 8,
        vol_halflife: float = 20.0,
        vol_warmup: int = 20,
        ret_bins: Optional[int] = None,
        vol_estimator: str = "close",
    ) -> None:
        if shape_bins < 1:
            raise UserError(f"tokenizer shape_bins must be at least 1, got {shape_bins}")
        if vocab_size < NUM_SPECIAL_TOKENS + 2 * shape_bins:
            raise UserError(
                f"vocab_size {vocab_size} is too small: the tokenizer needs {NUM_SPECIAL_TOKENS} "
                f"special tokens plus at least 2 return bins x {shape_bins} shape bins"
            )
        if not vol_halflife > 0:
            raise UserError(f"tokenizer vol_halflife must be positive, got {vol_halflife}")
        if vol_warmup < 1:
            raise UserError(f"tokenizer vol_warmup must be at least 1, got {vol_warmup}")
        if vol_estimator not in VOL_ESTIMATORS:
            choices = ", ".join(VOL_ESTIMATORS)
            raise UserError(f"tokenizer vol_estimator must be one of {choices}, got {vol_estimator!r}")
        self.vocab_size = int(vocab_size)
        self.shape_bins = int(shape_bins)
        most = (self.vocab_size - NUM_SPECIAL_TOKENS) // self.shape_bins
        if ret_bins is not None and not 2 <= ret_bins <= most:
            raise UserError(f"tokenizer ret_bins must be from 2 to {most} for vocab_size {vocab_size}, got {ret_bins}")
        # fewer bins than the vocabulary holds (tokenizer.ret_bins): the rest of the ids go unused
        self.ret_bins = int(ret_bins) if ret_bins is not None else most
        # Ids from here to vocab_size - 1 are never emitted (the division above leaves a remainder).
        self.num_used_ids = NUM_SPECIAL_TOKENS + self.ret_bins * self.shape_bins
        self.vol_halflife = float(vol_halflife)
        self.vol_warmup = int(vol_warmup)
        self.vol_estimator = vol_estimator
        self.alpha = ewma_alpha(self.vol_halflife)
        self.dtype = np.int16 if self.vocab_size <= 2**15 else np.int32
        self.move_binning: Optional[QuantileBins] = None
        self.shape_binning: Optional[QuantileBins] = None
        self.fit_stats: dict = {}
        # Candles encoded beyond the training range, summed over encode() calls since fit/load.
        self.clip_counts: dict = _zero_clip_counts()

    @classmethod
    def from_config(cls, tok: TokenizerConfig, vocab_size: int) -> "OHLCTokenizer":
        """The tokenizer a config asks for: its tokenizer section and model.vocab_size."""
        return cls(
            vocab_size=vocab_size,
            shape_bins=tok.shape_bins,
            vol_halflife=tok.vol_halflife,
            vol_warmup=tok.vol_warmup,
            ret_bins=tok.ret_bins,
            vol_estimator=tok.vol_estimator,
        )

    @property
    def is_fitted(self) -> bool:
        return self.move_binning is not None

    def __repr__(self) -> str:
        state = (
            f"fitted on {self.fit_stats.get('candles', '?')} candles of {self.fit_stats.get('assets', '?')} assets"
            if self.is_fitted
            else "not fitted"
        )
        return (
            f"OHLCTokenizer(vocab_size={self.vocab_size}, ret_bins={self.ret_bins}, "
            f"shape_bins={self.shape_bins}, unused_ids={self.vocab_size - self.num_used_ids}, "
            f"specials=PAD:{PAD_TOKEN}/MISSING:{MISSING_TOKEN}/BOS:{BOS_TOKEN}, "
            f"vol_halflife={self.vol_halflife:g}, vol_warmup={self.vol_warmup}, "
            f"vol_estimator={self.vol_estimator}, {state})"
        )

    # ------------------------------------------------------------------ features

    def features(
        self, candles: CandleInput, asset: str = "?", timestamps: Optional[Sequence] = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(move/sigma, shape/sigma) per candle, NaN where the token is MISSING or BOS."""
        f = self._features(candles, asset, timestamps)
        return f.move_z, f.shape_z

    def vol_state(self, candles: CandleInput, asset: str = "?", timestamps: Optional[Sequence] = None) -> VolState:
        """Last close and volatility after the last candle: the starting point of `decode_path`.

        Meaningful once the history is warm (more than vol_warmup + 1 valid candles), like encode.
        """
        state = self._features(candles, asset, timestamps, want_state=True).state
        if state is None:
            raise UserError(f"{asset}: no valid candle, so there is no last close to continue from")
        return state

    def _features(
        self, candles: CandleInput, asset: str, timestamps: Optional[Sequence], want_state: bool = False
    ) -> CandleFeatures:
        return candle_features(
            candles, asset, timestamps, self.vol_halflife, self.vol_warmup, want_state, self.vol_estimator
        )

    # ------------------------------------------------------------------ fit / encode / decode

    def fit(self, frames: Union[Mapping[str, CandleInput], Iterable[CandleInput]], every: int = 1) -> "OHLCTokenizer":
        """Learn the bin edges from TRAINING candles only: a dict symbol -> frame, or frames.

        Warm-up (BOS) and MISSING candles do not enter the fit. every: pool only each series'
        every-th candle (its features still come from the whole series), which bounds the memory
        of the fit on a large corpus (common.tokens.corpus.fit_stride).
        """
        if isinstance(frames, pd.DataFrame):  # one series passed on its own
            frames = {"?": frames}
        items = frames.items() if isinstance(frames, Mapping) else ((f"#{i}", f) for i, f in enumerate(frames))
        moves, shapes, assets = [], [], 0
        for asset, frame in items:
            f = self._features(frame, str(asset), None)
            keep = f.special[::every] == 0
            moves.append(f.move_z[::every][keep])
            shapes.append(f.shape_z[::every][keep])
            assets += 1
        move_z = np.concatenate(moves) if moves else np.zeros(0)
        if move_z.size == 0:
            raise UserError(
                f"tokenizer fit: no usable training candles in {assets} series; each series "
                f"needs more than vol_warmup + 1 = {self.vol_warmup + 1} valid candles"
            )
        shape_z = np.concatenate(shapes)
        del moves, shapes
        self.move_binning = QuantileBins.fit(move_z, self.ret_bins)
        self.shape_binning = QuantileBins.fit(shape_z, self.shape_bins)
        self.fit_stats = {"assets": assets, "candles": int(move_z.size)}
        self.reset_clip_counts()
        self._build_tables()
        return self

    def encode(self, candles: CandleInput, asset: str = "?", timestamps: Optional[Sequence] = None) -> np.ndarray:
        """One token per candle, aligned one-to-one with the input rows.

        Accepts a canonical candle DataFrame (UTC DatetimeIndex, columns open/high/low/close[/volume]),
        a mapping of those column names to arrays, or an (n, 4|5) array in that column order.
        Non-positive prices raise UserError naming the asset and the timestamp (or row).
        """
        mb, sb = self._binnings()
        f = self._features(candles, asset, timestamps)
        tokens = f.special.astype(self.dtype)
        real = f.special == 0
        mz, sz = f.move_z[real], f.shape_z[real]
        counts = self.clip_counts
        counts["move_below"] += int(np.count_nonzero(mz < mb.low))
        counts["move_above"] += int(np.count_nonzero(mz > mb.high))
        counts["shape_below"] += int(np.count_nonzero(sz < sb.low))
        counts["shape_above"] += int(np.count_nonzero(sz > sb.high))
        tokens[real] = NUM_SPECIAL_TOKENS + mb.assign(mz) * self.shape_bins + sb.assign(sz)
        return tokens

    def reset_clip_counts(self) -> None:
        self.clip_counts = _zero_clip_counts()

    def split_token(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ret_bin, shape_bin) of each token; -1 for special and unused ids."""
        t = np.asarray(tokens).astype(np.int64)
        code = t - NUM_SPECIAL_TOKENS
        ok = (code >= 0) & (t < self.num_used_ids)
        return np.where(ok, code // self.shape_bins, -1), np.where(ok, code % self.shape_bins, -1)

    def decode(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each token's representative (move/sigma, shape/sigma); NaN for special and unused ids."""
        self._require_fitted()
        t = np.asarray(tokens)
        if t.size and (t.min() < 0 or t.max() >= self.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {t.min()}..{t.max()}")
        return self._move_table[t], self._shape_table[t]

    @property
    def within_bins(self) -> bool:
        """Whether the bins carry their training values' within-bin quantiles (fitted since they
        are stored): `decode_draw` and the decoders' `u` need them."""
        mb, sb = self._binnings()
        return mb.inner is not None and sb.inner is not None

    def decode_draw(self, tokens: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like `decode`, but each token's (move/sigma, shape/sigma) drawn within its bins: the
        training values' within-bin quantiles at levels u[..., 0] and u[..., 1] (u shaped
        tokens.shape + (2,), uniform on [0, 1) for a draw); NaN for special and unused ids."""
        move_z, shape_z = self.decode(tokens)
        if not self.within_bins:
            raise UserError(
                "this tokenizer has no within-bin quantiles (fitted before they were stored); decode by medians"
            )
        t = np.asarray(tokens)
        if np.shape(u) != (*t.shape, 2):
            raise ValueError(f"u must be shaped {(*t.shape, 2)}, got {np.shape(u)}")
        real = np.isfinite(move_z)
        ids = t[real].astype(np.int64) - NUM_SPECIAL_TOKENS
        mb, sb = self._binnings()
        move_z[real] = mb.draw(ids // self.shape_bins, u[..., 0][real])
        shape_z[real] = sb.draw(ids % self.shape_bins, u[..., 1][real])
        return move_z, shape_z

    def decode_path(
        self,
        tokens: np.ndarray,
        last_close: ArrayOrFloat,
        sigma: ArrayOrFloat,
        ewma_weight: Optional[ArrayOrFloat] = None,
        u: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        """Close prices of (sampled) token sequences, continuing from `last_close` with `sigma`.

        tokens: (H,) for one path or (P, H) for P paths; last_close, sigma, ewma_weight: one
        number for all paths or (P,), one per path. Returns closes shaped like tokens.
        Each move token multiplies the close by exp(move_z * sigma), then updates sigma with the
        same EWMA as `encode`. Pass `vol_state(history)` for an exact continuation; without
        `ewma_weight` the EWMA is taken as converged (weight 1/alpha). Special and unused tokens
        give NaN (no candle) and leave the close and sigma unchanged, like MISSING in `encode`.
        u: each token's values drawn within its bins at these levels (`decode_draw`), not its
        bins' medians.
        """
        log_close, _, _, _ = self._walk(tokens, last_close, sigma, ewma_weight, u)
        return np.exp(log_close)

    def decode_ohlc(
        self,
        tokens: np.ndarray,
        last_close: ArrayOrFloat,
        sigma: ArrayOrFloat,
        ewma_weight: Optional[ArrayOrFloat] = None,
        u: Optional[np.ndarray] = None,
    ) -> dict[str, np.ndarray]:
        """open, high, low, close of (sampled) token sequences, as `decode_path` takes them.

        A token holds the move and the range log(high / low), not where the open sits, so:
        open = the previous close; the body spans open..close; the range (at least the body)
        puts what it has beyond the body half above max(open, close) and half below min.
        """
        log_close, prev, sig, shape_z = self._walk(tokens, last_close, sigma, ewma_weight, u)
        body = np.abs(log_close - prev)
        wick = 0.5 * np.maximum(shape_z * sig - body, 0.0)  # NaN where there is no candle
        return {
            "open": np.exp(prev),
            "high": np.exp(np.maximum(prev, log_close) + wick),
            "low": np.exp(np.minimum(prev, log_close) - wick),
            "close": np.exp(log_close),
        }

    def _walk(
        self,
        tokens: np.ndarray,
        last_close: ArrayOrFloat,
        sigma: ArrayOrFloat,
        ewma_weight: Optional[ArrayOrFloat],
        u: Optional[np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(log close, log close before the step, sigma used, shape/sigma) per step, shaped like
        tokens: see volatility.walk."""
        t = np.asarray(tokens)
        if t.ndim not in (1, 2):
            raise ValueError(f"tokens must be (H,) or (paths, H), got shape {t.shape}")
        move_z, shape_z = self.decode(t) if u is None else self.decode_draw(t, u)
        ranges = np.atleast_2d(shape_z) if self.vol_estimator == "range" else None
        log_close, before, sig = walk(np.atleast_2d(move_z), last_close, sigma, ewma_weight, self.alpha, ranges)
        return log_close.reshape(t.shape), before.reshape(t.shape), sig.reshape(t.shape), shape_z

    def usage(self, tokens: np.ndarray) -> dict:
        """Entropy of the candle tokens (specials left out) against the ids the tokenizer can emit."""
        t = np.asarray(tokens).ravel()
        t = t[t >= NUM_SPECIAL_TOKENS]
        return token_entropy(t - NUM_SPECIAL_TOKENS, self.num_used_ids - NUM_SPECIAL_TOKENS)

    # ------------------------------------------------------------------ save / load

    def to_dict(self) -> dict:
        mb, sb = self._binnings()
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "vocab_size": self.vocab_size,
            "shape_bins": self.shape_bins,
            "ret_bins": self.ret_bins,
            "vol_halflife": self.vol_halflife,
            "vol_warmup": self.vol_warmup,
            "special_tokens": {"PAD": PAD_TOKEN, "MISSING": MISSING_TOKEN, "BOS": BOS_TOKEN},
            "move": mb.to_dict(),
            "shape": sb.to_dict(),
            "fit_stats": self.fit_stats,
        } | ({} if self.vol_estimator == "close" else {"vol_estimator": self.vol_estimator})

    def save(self, path: str | os.PathLike) -> None:
        """Write tokenizer.json atomically (plain JSON: loading it runs no code)."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "OHLCTokenizer":
        """Read a tokenizer.json; a missing, corrupted or incompatible file is a UserError."""
        try:
            with open(path, "r", encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise UserError(
                f"{path}: tokenizer file not found; fit a tokenizer first or point at the run folder's tokenizer.json"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(
                f"{path}: tokenizer file is corrupted or truncated ({e}); re-create it by "
                "fitting on the training data or copy it again"
            ) from None
        except OSError as e:
            raise UserError(f"{path}: cannot read tokenizer file ({e.strerror})") from None
        return cls.from_dict(raw, where=str(path))

    @classmethod
    def from_dict(cls, raw: Any, where: str = "tokenizer") -> "OHLCTokenizer":
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
            raise UserError(f"{where}: not a MarketGPT tokenizer file (format {found!r}, expected {FORMAT_NAME!r})")
        if raw.get("version") != FORMAT_VERSION:
            raise UserError(
                f"{where}: tokenizer format version {raw.get('version')!r} is not supported by "
                f"this code (it reads version {FORMAT_VERSION}); re-fit the tokenizer or use "
                "the code version that wrote it"
            )
        try:
            tok = cls(
                vocab_size=raw["vocab_size"],
                shape_bins=raw["shape_bins"],
                vol_halflife=raw["vol_halflife"],
                vol_warmup=raw["vol_warmup"],
                ret_bins=raw.get("ret_bins"),
                vol_estimator=raw.get("vol_estimator", "close"),  # absent: the squared moves, as before it
            )
            tok.move_binning = QuantileBins.from_dict(raw["move"], tok.ret_bins, "move")
            tok.shape_binning = QuantileBins.from_dict(raw["shape"], tok.shape_bins, "shape")
            tok.fit_stats = dict(raw.get("fit_stats", {}))
        except (KeyError, TypeError, ValueError, UserError) as e:
            what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise UserError(f"{where}: tokenizer file is corrupted ({what}); re-fit the tokenizer") from None
        tok._build_tables()
        return tok

    # ------------------------------------------------------------------ internals

    def _require_fitted(self) -> None:
        self._binnings()

    def _binnings(self) -> tuple[QuantileBins, QuantileBins]:
        """The move and shape binnings (fit and load set both); UserError when not fitted."""
        mb, sb = self.move_binning, self.shape_binning
        if mb is None or sb is None:
            raise UserError(
                "the tokenizer is not fitted: call fit(training frames) or OHLCTokenizer.load('tokenizer.json') first"
            )
        return mb, sb

    def _build_tables(self) -> None:
        # decode is a table lookup: token id -> representative move and shape.
        self._move_table = np.full(self.vocab_size, np.nan)
        self._shape_table = np.full(self.vocab_size, np.nan)
        mb, sb = self._binnings()
        ids = np.arange(NUM_SPECIAL_TOKENS, self.num_used_ids)
        self._move_table[ids] = mb.values[(ids - NUM_SPECIAL_TOKENS) // self.shape_bins]
        self._shape_table[ids] = sb.values[(ids - NUM_SPECIAL_TOKENS) % self.shape_bins]


# ---------------------------------------------------------------------- helpers


def _zero_clip_counts() -> dict:
    return {"move_below": 0, "move_above": 0, "shape_below": 0, "shape_above": 0}
