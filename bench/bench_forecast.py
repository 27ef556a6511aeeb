"""Forecast sampling speed at case C's shape: 20 assets x 256 samples x horizon 64.

Target (issue 13): at least 10x the paths per second of the code before it, in the same run:
`MarketGPT.generate` (re-ran the whole context every step; kept here as `old_generate`) + the
scalar `decode_path` loop per path, against `Forecaster.forecast` (encode, KV-cache sampling of
every asset and sample in one batch, decoding vectorized over paths, the quantile table).

    python bench/bench_forecast.py [--assets 20] [--samples 256] [--horizon 64] [--ref-samples 2]
                                   [--device cpu|cuda] [--json PATH]

The model is case C's (crypto_prototype.json, 5.0M parameters, context 128) with random
weights, the candles are seeded random walks (hourly): speed does not depend on either. The
old path is too slow to run at full size (each of its steps is a whole context's forward per
path), so it samples --ref-samples paths per asset; paths per second is a rate, and its batch
(assets x ref-samples x 128 tokens) is large enough to keep the matmuls efficient.
Also reported: ms per generated token for the whole batch (forecast time / horizon, decoding
and the table included) and peak memory (CPU: the process's peak RSS after the new path, before
the old one runs; CUDA: torch's peak allocated). Always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, bench_args, finish, peak_rss_mb, row, set_threads  # noqa: E402

from common.config import load_config  # noqa: E402
from common.data.universe import Asset  # noqa: E402
from common.forecasting.forecast_io import History  # noqa: E402
from common.forecasting.forecaster import Forecaster  # noqa: E402
from common.model.gpt import MarketGPT  # noqa: E402
from common.special_tokens import BOS_TOKEN, PAD_TOKEN  # noqa: E402
from common.tokens.ids import RunInfo  # noqa: E402
from common.tokens.tokenizer import OHLCTokenizer  # noqa: E402

from bench_tokenizer import make_candles  # noqa: E402

TARGET_SPEEDUP = 10.0


@torch.no_grad()
def old_generate(
    model: MarketGPT,
    idx: torch.Tensor,
    asset_ids: torch.Tensor,
    category_ids: torch.Tensor,
    max_new_tokens: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """MarketGPT.generate as it was before issue 13 (temperature 1): the last context_length
    tokens re-run at every step, PAD and BOS never drawn. (B, T) -> (B, T + max_new_tokens)."""
    never = torch.tensor((PAD_TOKEN, BOS_TOKEN), device=idx.device)
    model.eval()
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -model.config.context_length :], asset_ids, category_ids, last_only=True)
        logits = logits[:, -1, :].float()  # (B, V)
        logits[:, never] = -float("inf")
        next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)  # (B, 1)
        idx = torch.cat((idx, next_id), dim=1)
    return idx


def old_decode_path(
    tok: OHLCTokenizer, tokens: np.ndarray, last_close: float, sigma: float, ewma_weight: float
) -> np.ndarray:
    """decode_path as it was before issue 13: a Python loop over one path's steps."""
    move_z, _ = tok.decode(tokens)
    var, log_close, out = sigma**2, math.log(last_close), np.full(len(move_z), np.nan)
    decay = 1.0 - tok.alpha
    for i, z in enumerate(move_z):
        if math.isnan(z):
            continue
        r = z * max(math.sqrt(var), 1e-8)
        log_close += r
        out[i] = math.exp(log_close)
        ewma_weight = decay * ewma_weight + 1.0
        var += (r * r - var) / ewma_weight
    return out


def setup(assets: int, device: str) -> tuple[Forecaster, list[History]]:
    # the sampler before issue 13 (old_generate) read no candle ids: both paths without the market
    cfg = load_config(REPO / "case_c_crypto" / "configs" / "crypto_prototype.json", ["model.market_context=false"])
    frames = make_candles(assets, 2000)
    for f in frames.values():  # hourly bars, as case C
        f.index = f.index[0] + (f.index - f.index[0]) / 24
    tok = OHLCTokenizer.from_config(cfg.tokenizer, cfg.model.vocab_size).fit(frames)
    info = RunInfo.of_assets([Asset(s, "sample", "crypto", s) for s in frames])
    torch.manual_seed(0)
    model = MarketGPT(cfg.model, num_assets=assets, num_categories=1).to(device)
    return Forecaster(model, tok, info, cfg), [History(s, f) for s, f in frames.items()]


def run(
    assets: int = 20, samples: int = 256, horizon: int = 64, ref_samples: int = 2, device: str = "cpu"
) -> dict[str, Any]:
    fc, histories = setup(assets, device)
    T = fc.cfg.model.context_length
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    # the new path: one call, every asset and sample in one batch
    fc.forecast(histories[:1], horizon=2, samples=2)  # warm-up (allocator, kernels)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    result = fc.forecast(histories, horizon=horizon, samples=samples, seed=0)
    sync()
    t_new = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb()
    n_new = assets * samples
    assert len(result.table) == assets * horizon

    # the old path: generate over the last T tokens of every history, then one decode per path
    contexts = torch.as_tensor(
        np.stack([fc.tokenizer.encode(h.candles)[-T:] for h in histories]).astype(np.int64), device=device
    ).repeat_interleave(ref_samples, dim=0)
    ids = torch.arange(assets, device=device).repeat_interleave(ref_samples)
    states = [fc.tokenizer.vol_state(h.candles) for h in histories]
    sync()
    t0 = time.perf_counter()
    out = old_generate(
        fc.model, contexts, ids, torch.zeros_like(ids), horizon, generator=torch.Generator(device=device).manual_seed(0)
    )
    new_tokens = out[:, T:].cpu().numpy()
    for i, toks in enumerate(new_tokens):
        old_decode_path(fc.tokenizer, toks, *states[i // ref_samples])
    sync()
    t_old = time.perf_counter() - t0
    n_old = assets * ref_samples

    new_rate, old_rate = n_new / t_new, n_old / t_old
    speedup = new_rate / old_rate
    ms_per_token = 1000 * t_new / horizon
    print(
        f"new: {n_new} paths x {horizon} steps in {t_new:.2f} s = {new_rate:,.1f} paths/s, "
        f"{ms_per_token:.1f} ms per generated token for the batch of {n_new}"
    )
    print(
        f"old: {n_old} paths x {horizon} steps in {t_old:.2f} s = {old_rate:,.2f} paths/s "
        f"(generate + scalar decode_path)"
    )
    print(
        f"speedup {speedup:.1f}x (target >= {TARGET_SPEEDUP:g}x); peak memory {peak:,.0f} MB "
        f"({'torch peak allocated' if cuda else 'process peak RSS'})"
    )
    shape = f"{assets} assets x {samples} samples x horizon {horizon}, case C model, {device}"
    return {
        "rows": [
            row(
                "Forecast sampling, case C",
                "KV cache / generate paths/s",
                speedup,
                "x",
                f">= {TARGET_SPEEDUP:g}",
                f"{shape}; {new_rate:,.1f} vs {old_rate:,.2f} paths/s (old path on {ref_samples} samples per asset)",
            ),
            row(
                "Forecast sampling, case C",
                "ms per generated token (whole batch)",
                ms_per_token,
                "ms",
                None,
                f"batch of {n_new} paths; decoding and the table included",
            ),
            row(
                "Forecast sampling, case C",
                "peak memory",
                peak,
                "MB",
                None,
                "torch peak allocated" if cuda else "process peak RSS after the new path",
            ),
        ],
        "figures": {
            "assets": assets,
            "samples": samples,
            "horizon": horizon,
            "ref_samples": ref_samples,
            "device": device,
            "new_seconds": t_new,
            "old_seconds": t_old,
            "new_paths_per_s": new_rate,
            "old_paths_per_s": old_rate,
            "speedup": speedup,
            "ms_per_token": ms_per_token,
            "peak_mb": peak,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--assets", type=int, default=20)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--horizon", type=int, default=64)
    ap.add_argument("--ref-samples", type=int, default=2, help="paths per asset for the old path (slow)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    return finish("forecast", run(args.assets, args.samples, args.horizon, args.ref_samples, args.device), args.json)


if __name__ == "__main__":
    sys.exit(main())
