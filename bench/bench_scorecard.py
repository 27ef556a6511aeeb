"""Scorecard time on the shipped daily sample, case C's shape, with a baseline as the forecaster.

Target (issue 14): the whole scorecard with the model <= 2 minutes on 2 cores, for all assets,
horizons 1/5/20, 200 samples, every 5th test candle as an origin. By default a baseline stands
in for the model, which measures everything but the model: fitting the baselines (GARCH per
asset on the train split, the HAR family), building the no-look-ahead histories, sampling the baselines,
the metrics, block-bootstrap skill, backtest, and writing scorecard.json + scorecard.png.
With --run RUN_DIR the run's Forecaster is the model (its data and splits are the run's).

    python bench/bench_scorecard.py [--forecaster rw_ewma | --run RUN_DIR [--precision auto|fp32|bf16]]
                                    [--horizons 1,5,20] [--samples 200] [--stride 5] [--out DIR] [--json PATH]

Always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, bench_args, finish, row  # noqa: E402  (puts the repo on sys.path)

__all__ = ["run", "main"]

TARGET_SECONDS = 120.0
CASE_C = REPO / "case_c_crypto" / "configs" / "crypto_prototype.json"


def run(
    forecaster: str = "rw_ewma",
    horizons: tuple[int, ...] = (1, 5, 20),
    samples: int = 200,
    stride: int = 5,
    out: Path | None = None,
    run_dir: Path | None = None,
    precision: str = "auto",
) -> dict[str, Any]:
    from common.config import load_config
    from common.data.loading import load_market_data
    from common.data.prepare import prepare_data
    from common.evaluation.asset_series import fit_price_baselines, series_from_prepared, series_from_run
    from common.evaluation.scorecard import ScorecardSettings, forecaster_fn, make_scorecard, write_scorecard

    t0 = time.perf_counter()
    if run_dir is not None:
        series, interval = series_from_run(run_dir)
    else:
        cfg = load_config(CASE_C, ["data.source=sample", "data.interval=1d"])
        series = series_from_prepared(
            prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, CASE_C.parent.parent))
        )
        interval = cfg.data.interval
    t_data = time.perf_counter() - t0

    t0 = time.perf_counter()
    baselines = fit_price_baselines(series, interval)
    if run_dir is not None:
        from common.forecasting.forecaster import Forecaster

        fc = Forecaster.from_run(run_dir, precision=precision)
        model, forecaster = forecaster_fn(fc), f"run {Path(run_dir).name}, {fc.precision}"
    else:
        model = baselines[forecaster]
    t_fit = time.perf_counter() - t0

    t0 = time.perf_counter()
    card = make_scorecard(
        series,
        model,
        ScorecardSettings(interval=interval, horizons=horizons, stride=stride, n_samples=samples),
        baselines=baselines,
        progress=print,
    )
    t_score = time.perf_counter() - t0

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        write_scorecard(card, out or tmp)
    t_write = time.perf_counter() - t0

    total = t_fit + t_score + t_write
    origins = card["horizons"][str(min(horizons))]["n"]  # forecast once each, at the longest horizon
    with_test = sum(1 for s in series if len(s.test))
    lines = card["headline_lines"] + card["verdicts"] + card["mcs_lines"] + card["pit_lines"]
    print("\n".join(lines + card["cross_section_lines"]))
    print(
        f"data {t_data:.2f} s (not counted: the CLI loads it anyway); baselines fit + model load {t_fit:.2f} s; "
        f"forecasts + metrics {t_score:.2f} s; files {t_write:.2f} s"
    )
    print(
        f"total {total:.2f} s for {origins} origins x {1 + len(baselines)} forecasters x {samples} paths "
        f"of {max(horizons)} steps "
        f"({with_test} of {len(series)} assets have a test split)   target <= {TARGET_SECONDS:.0f} s with the model"
    )
    detail = (
        f"{interval}, {with_test} assets, H={','.join(map(str, horizons))}, {samples} samples, "
        f"stride {stride}, {origins} origins; model: {forecaster}"
    )
    title = "Scorecard" if run_dir is not None else "Scorecard (baseline as model)"
    return {
        "rows": [row(title, "seconds", total, "s", f"<= {TARGET_SECONDS:g}", detail)],
        "figures": {
            "data_s": t_data,
            "fit_s": t_fit,
            "score_s": t_score,
            "write_s": t_write,
            "total_s": total,
            "origins": origins,
            "assets_with_test": with_test,
            "verdicts": card["verdicts"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--forecaster", choices=("rw_ewma", "bootstrap", "garch"), default="rw_ewma")
    ap.add_argument("--horizons", default="1,5,20")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--stride", type=int, default=5)
    ap.add_argument("--run", type=Path, default=None, help="a run folder: its Forecaster is the model")
    ap.add_argument("--precision", default="auto", help="the run's inference precision: auto, fp32 or bf16")
    ap.add_argument("--out", type=Path, default=None, help="keep scorecard.json and scorecard.png here")
    args = ap.parse_args(argv)
    horizons = tuple(int(h) for h in args.horizons.split(","))
    result = run(args.forecaster, horizons, args.samples, args.stride, args.out, args.run, args.precision)
    return finish("scorecard", result, args.json)


if __name__ == "__main__":
    sys.exit(main())
