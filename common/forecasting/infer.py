"""Forecasting from an exported model (`marketgpt export`) with onnxruntime, without torch.

    fc = ExportedForecaster.from_export("case_c_crypto/exports/crypto_prototype_20240601_120000")
    result = fc.forecast(fc.load_history(["BTC/USDT"]), horizon=24, samples=256, seed=0)

`pip install -e '.[infer]'` (numpy, pandas, pyarrow, onnxruntime) is all this needs: nothing
here or in what it imports loads torch. It is the torch Forecaster's path (common.forecasting.core) with
another sampler: the same tokenizer, history checks, decoding and output table, while the
next-token logits come from a pluggable backend, `logits(tokens, asset_ids, category_ids)`,
here an onnxruntime session over model.onnx.

Sampling is common.model.sampling's, in numpy: model.onnx prefills each context once and returns its
keys and values, model_step.onnx then feeds one token per path per step (a KV cache, as the
torch sampler). As there, a context's samples share its prefilled keys and values (one copy per
context, one matrix product per context and step), and each path's own tokens' keys and values
go to a preallocated time-major buffer whose first L steps are a contiguous slice: nothing is
concatenated or copied per step on the numpy side. The window is the same (the last
max(T - horizon, T // 2) context tokens, rebuilt from the last T // 2 when it reaches T; each
row is then its own prefix), so each step's logits are the torch sampler's up to float rounding
(tested: greedy paths are equal). A logits function without a cache (any
callable) re-runs the window every step instead. The draws use numpy's generator: paths are
reproducible by seed, but not the torch backend's paths.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Union, cast

import numpy as np

from common.config import load_config
from common.errors import UserError
from common.forecasting.core import ForecasterCore
from common.model.sampling_settings import SamplingSettings
from common.model.windows import (
    chunk_features,
    chunk_rows,
    context_chunks,
    prefill_length as window_start,  # this module's name for it
)
from common.run.files import ASSET_INFO_JSON, CONFIG_JSON, TOKENIZER_JSON
from common.tokens.ids import RunInfo
from common.tokens.tokenizer import OHLCTokenizer

__all__ = [
    "EXPORT_FILES",
    "ExportedForecaster",
    "LogitsFn",
    "OnnxBackend",
    "draw_tokens_np",
    "sample_paths_np",
    "window_start",
]

# what `marketgpt export --format onnx` writes (--format pt2: model.pt2; hf: model.safetensors and README.md)
EXPORT_FILES = ("model.onnx", CONFIG_JSON, TOKENIZER_JSON, ASSET_INFO_JSON, "model_card.json")
ROWS_PER_CALL = 4096  # sampled paths per call without a cache: bounds the activations' memory
CACHE_BUDGET_BYTES = 1 << 30  # KV cache of one chunk of rows (1 GiB), as common.model.sampling
STEP_FILE = "model_step.onnx"  # ONNX only: one decoding step with the KV cache

# tokens (B, L) int64, asset_ids (B,), category_ids (B,)[, features (B, L, F) int64] -> last
# position's logits (B, V) float32
LogitsFn = Callable[..., np.ndarray]


class OnnxBackend:
    """Next-token logits from model.onnx with onnxruntime on the CPU; with model_step.onnx beside
    it, also prefill() and step(): sampling with a KV cache."""

    def __init__(self, path: Union[str, os.PathLike], context_length: int, threads: Optional[int] = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise UserError("--backend onnx needs onnxruntime: pip install onnxruntime (see docs/remote.md)") from None
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        path = Path(path)
        step = path.parent / STEP_FILE
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            self.step_session = (
                ort.InferenceSession(str(step), options, providers=["CPUExecutionProvider"]) if step.is_file() else None
            )
        except Exception as e:  # onnxruntime raises its own exception types for a bad file
            raise UserError(
                f"{path.parent}: onnxruntime cannot load the model ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); export the run again"
            ) from None
        if self.step_session is not None and "prefix_k" not in {x.name for x in self.step_session.get_inputs()}:
            # before 2026-11-26 the step graph took a per-row cache (past_k, past_v): about 4x slower
            raise UserError(
                f"{step}: an older export's step graph (a per-row KV cache); export the run again "
                "(`marketgpt export RUN_DIR --format onnx`)"
            )
        self.context_length = context_length

    def __call__(
        self, tokens: np.ndarray, asset_ids: np.ndarray, category_ids: np.ndarray, *features: np.ndarray
    ) -> np.ndarray:
        return self.prefill(tokens, asset_ids, category_ids, *features, outputs=("logits",))[0]

    def prefill(
        self,
        tokens: np.ndarray,
        asset_ids: np.ndarray,
        category_ids: np.ndarray,
        *features: np.ndarray,
        outputs: tuple[str, ...] = ("logits", "present_k", "present_v"),
    ) -> list[np.ndarray]:
        """logits (B, V) after the last token, and the keys and values of every token. features:
        (B, L, F) candle ids, for a model that reads them."""
        if tokens.shape[1] > self.context_length:
            raise ValueError(f"{tokens.shape[1]} tokens: the model takes at most {self.context_length}")
        feed = {
            "tokens": np.ascontiguousarray(tokens, dtype=np.int64),
            "asset_ids": np.asarray(asset_ids, dtype=np.int64),
            "category_ids": np.asarray(category_ids, dtype=np.int64),
        }
        if features:
            feed["features"] = np.ascontiguousarray(features[0], dtype=np.int64)
        return self.session.run(list(outputs), feed)

    def step(
        self,
        token: np.ndarray,
        asset_ids: np.ndarray,
        category_ids: np.ndarray,
        prefix_k: np.ndarray,
        prefix_v: np.ndarray,
        own_k: Optional[np.ndarray] = None,
        own_v: Optional[np.ndarray] = None,
        features: Optional[np.ndarray] = None,
    ) -> list[np.ndarray]:
        """One more token per row (B, 1): logits (B, V) and the token's keys and values, new_k and
        new_v (layers, B, heads, head size). prefix_k, prefix_v (layers, n, heads, P, head size):
        prefill()'s keys and values of n contexts, shared by their B / n rows (context-major);
        own_k, own_v (layers, L, B, heads, head size): each row's L tokens since (None: none).
        features (B, 1, F): the step token's candle ids, for a model that reads them."""
        layers, _, heads, _, size = prefix_k.shape
        if own_k is None:
            own_k = own_v = np.empty((layers, 0, len(token), heads, size), dtype=np.float32)
        assert own_v is not None  # given with own_k
        assert self.step_session is not None  # step() runs only with the step graph
        feed = {
            "token": np.ascontiguousarray(token, dtype=np.int64),
            "asset_ids": np.asarray(asset_ids, dtype=np.int64),
            "category_ids": np.asarray(category_ids, dtype=np.int64),
            "prefix_k": np.ascontiguousarray(prefix_k),
            "prefix_v": np.ascontiguousarray(prefix_v),
        }
        if features is not None:
            feed["features"] = np.ascontiguousarray(features, dtype=np.int64)
        for i in range(layers):  # one input per layer: own_k[i] is a contiguous slice of the sampler's buffer
            feed[f"own_k_{i}"], feed[f"own_v_{i}"] = np.ascontiguousarray(own_k[i]), np.ascontiguousarray(own_v[i])
        return self.step_session.run(None, feed)


def draw_tokens_np(
    logits: np.ndarray,
    temperature: float,
    top_k: Optional[int],
    top_p: Optional[float],
    banned: np.ndarray,
    rng: np.random.Generator,
    u: Optional[np.ndarray] = None,
) -> np.ndarray:
    """One id per row of logits (B, V) from softmax(logits / temperature) (greedy at 0), as
    common.model.sampling.draw_tokens does: banned ids never, top_k / top_p narrow, then the inverse CDF
    of one uniform per row (u (B, 1), given by the caller, or drawn from rng)."""
    logits = np.where(banned, -np.inf, logits.astype(np.float64))
    if temperature == 0:
        return logits.argmax(axis=1)
    logits = logits / temperature
    if top_k is not None:
        kth = -np.sort(-logits, axis=1)[:, min(top_k, logits.shape[1]) - 1 : min(top_k, logits.shape[1])]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    if top_p is not None:
        order = np.argsort(-probs, axis=1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=1)
        drop_sorted = (np.cumsum(sorted_p, axis=1) - sorted_p) >= top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=1)
        probs = np.where(drop, 0.0, probs)
    cdf = np.cumsum(probs, axis=1)
    u = (rng.random((len(cdf), 1)) if u is None else np.asarray(u, np.float64)) * cdf[:, -1:]
    ids = (cdf <= u).sum(axis=1)  # the first id whose cumulative probability exceeds u
    last = probs.shape[1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=1)  # u * total rounding up to the total
    return np.minimum(ids, last)


def sample_paths_np(
    backend: LogitsFn,
    contexts: np.ndarray,
    asset_ids: np.ndarray,
    category_ids: np.ndarray,
    context_length: int,
    settings: SamplingSettings,
    *,
    banned: Optional[np.ndarray] = None,
    features: Optional[np.ndarray] = None,
    path_features: Optional[np.ndarray] = None,
    uniforms: Optional[np.ndarray] = None,
) -> np.ndarray:
    """(N, samples, horizon) sampled ids continuing each context (N, L). features: (N, L + horizon,
    F) candle ids of the context's candles and then the future steps', for a model that reads them;
    path_features (N, samples, horizon, k): each sample's own future in their last k columns;
    uniforms (N, samples, horizon): each draw's uniform (None: from settings.seed's generator).

    A backend with prefill() and step() (an ONNX export with model_step.onnx) samples with a KV
    cache; any other logits function re-runs the window every step. Either way the window is
    common.model.sampling's: the same logits up to float rounding. The draws use numpy's generator
    seeded with settings.seed (None: fresh entropy).
    """
    N, L = contexts.shape
    horizon, samples, max_batch = settings.horizon, settings.samples, settings.max_batch
    T = context_length
    P = window_start(T, horizon, L)
    rng = np.random.default_rng(None if settings.seed is None else int(settings.seed))
    cached = getattr(backend, "step_session", None) is not None
    onnx = cast(OnnxBackend, backend)  # used only when cached: an OnnxBackend with its step graph
    feats = None if features is None else features[:, L - P :]  # aligned with seq below: (N, P + H, F)
    head = () if feats is None else (feats[:, :P],)
    if cached:
        first, prefix_k, prefix_v = onnx.prefill(contexts[:, L - P :], asset_ids, category_ids, *head)
    else:
        first = backend(
            contexts[:, L - P :], asset_ids, category_ids, *head
        )  # (N, V): the first step, once per context
    if banned is None:
        banned = np.zeros(first.shape[1], dtype=bool)
    if max_batch is None:  # as the torch sampler: rows whose full cache (T tokens) fits the budget
        per_row = 2 * prefix_k[:, :1].nbytes * T // max(1, P) if cached else 0
        max_batch = max(1, CACHE_BUDGET_BYTES // per_row) if per_row else ROWS_PER_CALL
    draw = partial(
        draw_tokens_np,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        banned=banned,
        rng=rng,
    )
    decoding = _Decoding(backend, T, draw)
    out = np.empty((N * samples, horizon), dtype=np.int64)
    for c0, c1, group, lo in context_chunks(N, samples, max_batch):
        r = np.repeat(np.arange(c0, c1), group)  # row -> its context; a context's samples share its prefix
        seq = np.concatenate([contexts[r, L - P :], np.zeros((len(r), horizon), dtype=np.int64)], axis=1)
        prefix = (prefix_k[:, c0:c1], prefix_v[:, c0:c1]) if cached else None
        rows = chunk_features(feats, r, lo, P, path_features)
        u = chunk_rows(uniforms, lo, len(r))
        _continue_chunk(decoding, seq, asset_ids[r], category_ids[r], first[r], prefix, P, rows, u)
        out[lo : lo + len(r)] = seq[:, P:]
    return out.reshape(N, samples, horizon)


@dataclass(frozen=True)
class _Decoding:
    """What every chunk of one sample_paths_np call decodes with: the logits backend, the model's
    context length (the window's limit) and the draw (sampling settings and generator bound)."""

    backend: LogitsFn
    context_length: int
    draw: Callable[..., np.ndarray]  # draw(logits, u=None)


def _continue_chunk(
    decoding: _Decoding,
    seq: np.ndarray,
    a: np.ndarray,
    c: np.ndarray,
    logits: np.ndarray,
    prefix: Optional[tuple[np.ndarray, np.ndarray]],
    P: int,
    features: Optional[np.ndarray] = None,
    uniforms: Optional[np.ndarray] = None,
) -> None:
    """Fill seq[:, P:] (rows of one chunk: their last P context tokens, then zeros) with sampled ids, the
    first drawn from `logits`. prefix: the chunk's contexts' cached keys and values (backend an OnnxBackend
    with its step graph), or None to re-run the window every step. A full window restarts from its last
    T // 2 tokens. features: the rows' candle ids aligned with seq (B, P + H, F), or None; uniforms (B, H):
    the rows' draws' uniforms, or None."""
    backend, T, draw = decoding.backend, decoding.context_length, decoding.draw
    horizon, keep = seq.shape[1] - P, max(1, T // 2)
    onnx = cast(OnnxBackend, backend)  # used only when cached: an OnnxBackend with its step graph
    cached = prefix is not None
    start = 0  # seq[start:end] is the window the logits came from
    if prefix is not None:
        pk, pv = np.ascontiguousarray(prefix[0]), np.ascontiguousarray(prefix[1])
        layers, _, heads, _, size = pk.shape
        # each row's own tokens' keys and values, time-major: [:, :n] is what step() takes
        own_k, own_v = (np.empty((layers, max(1, horizon - 1), len(seq), heads, size), np.float32) for _ in "kv")
        n = 0
    for step in range(horizon):
        end = P + step
        seq[:, end] = draw(logits, u=None if uniforms is None else uniforms[:, step : step + 1])
        if step == horizon - 1:
            break
        if end - start == T:  # the window is full: start again from its last `keep` tokens
            start = end + 1 - keep
            if cached:  # each row its own prefix now (a group of one)
                logits, pk, pv = onnx.prefill(seq[:, start : end + 1], a, c, *_ids(features, start, end + 1))
                n = 0
                continue
        if cached:
            here = _ids(features, end, end + 1)
            logits, own_k[:, n], own_v[:, n] = onnx.step(
                seq[:, end : end + 1], a, c, pk, pv, own_k[:, :n], own_v[:, :n], *here
            )
            n += 1
        else:
            logits = backend(seq[:, start : end + 1], a, c, *_ids(features, start, end + 1))


def _ids(features: Optional[np.ndarray], start: int, end: int) -> tuple[np.ndarray, ...]:
    """(the candle ids of seq[:, start:end],), or () for a model that reads none."""
    return () if features is None else (features[:, start:end],)


def read_model_card(export_dir: Path) -> dict:
    """model_card.json of an export folder, or a UserError saying what the folder lacks."""
    export_dir = Path(export_dir)
    missing = [name for name in EXPORT_FILES if not (export_dir / name).is_file()]
    if missing:
        hint = next(
            (
                f" (it holds {name}: {what}; --backend onnx needs `marketgpt export --format onnx`)"
                for name, what in (
                    ("model.pt2", "a torch.export program"),
                    ("model.safetensors", "an hf model folder, which the torch backend forecasts"),
                    ("model.pt", "an old TorchScript export"),
                )
                if (export_dir / name).is_file()
            ),
            "",
        )
        raise UserError(
            f"{export_dir}: missing {', '.join(missing)}; is it a `marketgpt export --format onnx` folder?{hint}"
        )
    try:
        return json.loads((export_dir / "model_card.json").read_text())
    except ValueError as e:
        raise UserError(f"{export_dir / 'model_card.json'} is not valid JSON ({e}); export the run again") from None


class ExportedForecaster(ForecasterCore):
    """Forecaster over an export folder: next-token logits from a backend (onnxruntime), no torch.

    run_dir is the export folder: a model trained on the case's downloaded candles finds them
    as a run does, two folders up (<case>/exports/<run>, the default `marketgpt export --out`).
    """

    def __init__(
        self,
        backend: LogitsFn,
        tokenizer: Any,
        info: RunInfo,
        cfg: Any,
        export_dir: Optional[Path] = None,
        card: Optional[dict] = None,
    ) -> None:
        self.card = card or {}
        super().__init__(
            tokenizer,
            info,
            cfg,
            run_dir=export_dir,
            checkpoint_sha256=self.card.get("checkpoint_sha256"),
            volume_edges=self.card.get("volume_edges"),  # a model with candle ids: its volume bins
        )
        self.interval = self.card.get("interval") or cfg.data.interval  # an export forecasts one interval
        self.backend = backend  # stands in for the torch model
        self.precision = "fp32"  # onnxruntime computes in float32

    @classmethod
    def from_export(cls, export_dir: Union[str, os.PathLike], threads: Optional[int] = None) -> "ExportedForecaster":
        export_dir = Path(export_dir)
        if not export_dir.is_dir():
            raise UserError(f"{export_dir}: no such folder; pass a `marketgpt export --format onnx` folder")
        card = read_model_card(export_dir)
        cfg = load_config(export_dir / CONFIG_JSON)
        info = RunInfo.read(export_dir / ASSET_INFO_JSON, fix="export the run again")
        backend = OnnxBackend(export_dir / "model.onnx", cfg.model.context_length, threads)
        return cls(backend, OHLCTokenizer.load(export_dir / TOKENIZER_JSON), info, cfg, export_dir, card)

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
        return sample_paths_np(
            self.backend,
            contexts,
            asset_ids,
            category_ids,
            self.cfg.model.context_length,
            settings,
            banned=self.banned_ids(),
            features=features,
            path_features=path_features,
            uniforms=uniforms,
        )
