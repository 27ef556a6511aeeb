"""ms per forecast on the CPU: an ONNX export under onnxruntime against the torch Forecaster.

    python bench/bench_export.py [--assets 20] [--samples 100] [--horizon 24] [--rounds 3] [--json PATH]

One forecast = `forecast(histories, horizon, samples)` for every asset: encode, sample every
asset x sample path (both with a KV cache whose context prefix the samples share: torch's
common.model.sampling; ONNX's model.onnx prefill then model_step.onnx per step,
common.forecasting.infer), decode, the quantile table. The model is case C's
(crypto_prototype.json, context 128) with random weights, the candles seeded random walks:
speed depends on neither. The two run in alternating rounds on the same threads (onnxruntime's
intra_op_num_threads = torch's, --threads); each side's fastest round is reported
(bench/_common.py), and the ratio both of the fastest rounds and the median of each round's
pair. Always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import alternate, bench_args, finish, machine_info, row, set_threads  # noqa: E402

from common.forecasting.export import export_onnx  # noqa: E402
from common.forecasting.export_graphs import random_inputs  # noqa: E402
from common.forecasting.infer import ExportedForecaster, OnnxBackend  # noqa: E402

from bench_forecast import setup  # noqa: E402


def run(assets: int = 20, samples: int = 100, horizon: int = 24, rounds: int = 3) -> dict[str, Any]:
    fc, histories = setup(assets, "cpu")
    cfg = fc.cfg
    folder = Path(tempfile.mkdtemp(prefix="bench_export_"))
    example = random_inputs(2, cfg.model.context_length, cfg.model.vocab_size, assets, 1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx(fc.model, example, folder)
    info = fc.info
    onnx = ExportedForecaster(
        OnnxBackend(folder / "model.onnx", cfg.model.context_length, torch.get_num_threads()), fc.tokenizer, info, cfg
    )
    for f in (fc, onnx):  # warm-up: allocator, kernels, onnxruntime's first-run planning
        f.forecast(histories[:1], horizon=2, samples=2)

    def timed(f: Any) -> float:
        t0 = time.perf_counter()
        f.forecast(histories, horizon=horizon, samples=samples, seed=0)
        return time.perf_counter() - t0

    times = alternate({"torch": lambda: timed(fc), "onnxruntime": lambda: timed(onnx)}, rounds)
    shutil.rmtree(folder, ignore_errors=True)
    ms = {k: 1000 * min(v) for k, v in times.items()}
    shape = (
        f"{assets} assets x {samples} samples x {horizon} steps, case C model, CPU, {torch.get_num_threads()} threads"
    )
    for k, v in ms.items():
        print(
            f"{k}: {v:,.0f} ms per forecast (best of {rounds}; all: {', '.join(f'{1000 * t:,.0f}' for t in times[k])})"
        )
    # each round's pair ran back to back, under about the same load: their ratio's median is the other view
    paired = sorted(o / t for o, t in zip(times["onnxruntime"], times["torch"]))
    median = statistics.median(paired)
    print(
        f"onnxruntime / torch: {ms['onnxruntime'] / ms['torch']:.2f}x (best rounds), {median:.2f}x (median of "
        f"the rounds' pairs: {', '.join(f'{r:.2f}' for r in paired)})"
    )
    return {
        "rows": [
            row("Forecast from an export", "torch ms per forecast", ms["torch"], "ms", None, shape),
            row("Forecast from an export", "onnxruntime ms per forecast", ms["onnxruntime"], "ms", None, shape),
            row(
                "Forecast from an export",
                "onnxruntime / torch time",
                ms["onnxruntime"] / ms["torch"],
                "x",
                "<= 1.2",
                "best rounds; both with a KV cache, shared prefix; below 1 = onnxruntime faster",
            ),
            row(
                "Forecast from an export",
                "onnxruntime / torch time, median pair",
                median,
                "x",
                "<= 1.2",
                "median of each round's onnxruntime / torch",
            ),
        ],
        "figures": {
            "assets": assets,
            "samples": samples,
            "horizon": horizon,
            "rounds": rounds,
            "threads": torch.get_num_threads(),
            "seconds": times,
            "ms_per_forecast": ms,
            "ratio_best": ms["onnxruntime"] / ms["torch"],
            "ratio_median_pair": median,
            "onnxruntime": onnxruntime.__version__,
            "machine": machine_info(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--assets", type=int, default=20)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--horizon", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    set_threads(args.threads)
    return finish("export", run(args.assets, args.samples, args.horizon, args.rounds), args.json)


if __name__ == "__main__":
    sys.exit(main())
