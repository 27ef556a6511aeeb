"""`marketgpt evaluate, forecast, calibrate, scorecard, benchmark, export`: what a trained run is worth."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli.args import add_interval_arg, add_precision_arg, names
from common.run.files import REPORT_PNG, TEST_RESULTS_JSON

__all__ = ["add_parsers"]


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from common.evaluation.evaluate import evaluate_run_dir  # lazy: torch
    from common.evaluation.result_lines import summarize_results

    results = evaluate_run_dir(args.run_dir)
    print(summarize_results(args.run_dir, results))
    print(f"Wrote {args.run_dir / TEST_RESULTS_JSON} and {args.run_dir / REPORT_PNG}")
    return 0


def _cmd_forecast(args: argparse.Namespace) -> int:
    from common.commands.forecast import ForecastRequest, run_forecast_command  # lazy: pandas (torch later)

    symbols = None if args.all or not args.symbols else names(args.symbols)
    return run_forecast_command(
        ForecastRequest(
            run_dirs=tuple(args.run_dir),
            symbols=symbols,
            horizon=args.horizon,
            samples=args.samples,
            as_of=args.as_of,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            out=args.out,
            save_paths=args.save_paths,
            device=args.device,
            precision=args.precision,
            backend=args.backend,
            calibrated=args.calibrated,
            barrier=args.barrier,
            drawdown=args.drawdown,
            interval=args.interval,
        )
    )


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from common.commands.calibrate import CalibrateRequest, run_calibrate_command  # lazy: torch

    return run_calibrate_command(
        CalibrateRequest(
            run_dir=args.run_dir,
            horizon=args.horizon,
            stride=args.stride,
            origins=args.origins,
            samples=args.samples,
            seed=args.seed,
            device=args.device,
            precision=args.precision,
            reversion=args.reversion,
        )
    )


def _cmd_scorecard(args: argparse.Namespace) -> int:
    from common.commands.scorecard import ScorecardRequest, parse_horizons, run_scorecard_command  # lazy: torch

    return run_scorecard_command(
        ScorecardRequest(
            run_dirs=tuple(args.run_dir),
            horizons=parse_horizons(args.horizons),
            stride=args.stride,
            origins=args.origins,
            samples=args.samples,
            assets=names(args.assets) if args.assets else None,
            seed=args.seed,
            cost_bp=args.cost_bp,
            device=args.device,
            precision=args.precision,
            barrier=args.barrier,
            interval=args.interval,
            baselines=tuple(args.baseline),
        )
    )


def _cmd_benchmark(args: argparse.Namespace) -> int:
    from common.commands.benchmark import BenchmarkRequest, run_benchmark_command  # lazy: torch

    return run_benchmark_command(
        BenchmarkRequest(
            model_dir=args.model_dir,
            tasks=names(args.tasks) if args.tasks else None,
            samples=args.samples,
            seed=args.seed,
            device=args.device,
            precision=args.precision,
            as_json=args.json,
            leaderboard=args.leaderboard,
            append=not args.no_leaderboard,
            after_cutoff=args.after_cutoff,
            budget=args.budget,
            interval=args.interval,
        )
    )


def _cmd_export(args: argparse.Namespace) -> int:
    from common.forecasting.export import export_run  # lazy: torch

    out = export_run(args.run_dir, args.format, args.out, interval=args.interval)
    print(f"Exported {args.run_dir} ({args.format}) to {out}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add `evaluate`, `forecast`, `calibrate`, `scorecard`, `benchmark`, `export` to the `marketgpt` parser."""
    p = sub.add_parser("evaluate", help="recompute a run's test_results.json and report.png from its best model")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder, case_X/checkpoints/<experiment>_<time>")
    p.set_defaults(handler=_cmd_evaluate)

    p = sub.add_parser(
        "forecast", help="sampled price paths of a trained run: quantiles, P(up), fan charts (docs/forecasting.md)"
    )
    p.add_argument(
        "run_dir",
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        help="a run folder with best_model.pt; several (seeds on the same data and tokenizer): "
        "their equal-weight ensemble, samples pooled",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--symbols", default=None, help="comma-separated assets of the run, e.g. BTC/USDT,ETH/USDT")
    which.add_argument("--all", action="store_true", help="every asset of the run (the default)")
    p.add_argument("--horizon", type=int, default=24, help="candles ahead (default 24)")
    p.add_argument("--samples", type=int, default=256, help="sampled paths per asset (default 256)")
    p.add_argument(
        "--as-of",
        default=None,
        metavar="TIME",
        help="forecast from the candles up to this UTC time "
        "(default: each asset's last candle in the run's data source)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="1 = the model's own distribution (default)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens (narrows the bands)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling (narrows the bands)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/forecasts/<as-of>/)")
    p.add_argument("--save-paths", action="store_true", help="also write the sampled paths (paths.npz)")
    p.add_argument(
        "--device", default="cpu", help="cpu (default: byte-reproducible on one machine and precision) or cuda"
    )
    add_precision_arg(p)
    p.add_argument(
        "--backend",
        choices=("torch", "onnx"),
        default="torch",
        help="onnx: RUN_DIR is a `marketgpt export --format onnx` folder, run with onnxruntime "
        "(no torch needed; docs/remote.md)",
    )
    p.add_argument(
        "--calibrated",
        action="store_true",
        help="move the quantile columns by RUN_DIR/calibration.json "
        "(fitted on the validation split by `marketgpt calibrate`; docs/forecasting.md)",
    )
    p.add_argument(
        "--barrier",
        default=None,
        metavar="UP,DOWN",
        help="e.g. +5%%,-3%%: per asset P(upper first), P(lower first), P(neither) within the horizon, "
        "from the sampled paths (barrier.csv; docs/forecasting.md#path-questions)",
    )
    p.add_argument(
        "--drawdown",
        action="store_true",
        help="per asset the distribution of the maximum drawdown over the horizon (drawdown.csv)",
    )
    add_interval_arg(p)
    p.set_defaults(handler=_cmd_forecast)

    p = sub.add_parser(
        "calibrate",
        help="fit split-conformal interval calibration on a run's validation split: "
        "calibration.json, for forecast --calibrated and the scorecard (docs/scorecard.md)",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder with best_model.pt")
    p.add_argument("--horizon", type=int, default=24, help="calibrate steps 1..H (default 24, as forecast)")
    p.add_argument(
        "--stride", type=int, default=None, metavar="K", help="every K-th validation candle is an origin (default 5)"
    )
    p.add_argument("--origins", type=int, default=None, metavar="N", help="or N origin dates, evenly spaced")
    p.add_argument("--samples", type=int, default=200, help="sampled paths per origin (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--reversion",
        action="store_true",
        help="fit the volatility reversion instead (reversion.json, as the end of training does; "
        "docs/forecasting.md): --samples and --seed apply",
    )
    add_precision_arg(p)
    p.set_defaults(handler=_cmd_calibrate)

    p = sub.add_parser(
        "scorecard",
        help="is the model any good? walk-forward forecasts over the test split "
        "against random walk, bootstrap and GARCH, with intervals and a backtest (docs/scorecard.md)",
    )
    p.add_argument(
        "run_dir",
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        help="a run folder with best_model.pt; several (seeds on the same data and tokenizer): "
        "their equal-weight ensemble, written to FIRST_RUN/ensemble_N/",
    )
    p.add_argument("--horizons", default="1,5,20", help="candles ahead, comma-separated (default 1,5,20)")
    p.add_argument(
        "--stride", type=int, default=None, metavar="K", help="every K-th test candle is an origin (default 5)"
    )
    p.add_argument("--origins", type=int, default=None, metavar="N", help="or N origin dates, evenly spaced")
    p.add_argument("--samples", type=int, default=200, help="sampled paths per origin (default 200)")
    p.add_argument("--assets", default=None, help="comma-separated assets of the run (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cost-bp", type=float, default=10.0, help="backtest costs, basis points per side (default 10)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    add_precision_arg(p)
    p.add_argument(
        "--barrier",
        default=None,
        metavar="UP,DOWN",
        help="e.g. +5%%,-3%%: also the Brier score of P(upper first), P(lower first), P(neither) "
        "beside the baselines' (docs/scorecard.md#barrier-probabilities)",
    )
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="KIND:ID_OR_PATH",
        help="also a foundation model, zero-shot: chronos:ID_OR_PATH or timesfm:ID_OR_PATH, a folder or a "
        "Hugging Face id already cached (repeatable; pip install -e '.[foundation]'; docs/foundation-baselines.md)",
    )
    add_interval_arg(p)
    p.set_defaults(handler=_cmd_scorecard)

    p = sub.add_parser(
        "benchmark",
        help="the fixed benchmark tasks on the shipped sample's real series, scored "
        "like the scorecard; a table, MODEL/benchmark.json and a leaderboard line (docs/scorecard.md)",
    )
    p.add_argument(
        "model_dir", type=Path, metavar="MODEL", help="a run folder or a `marketgpt export --format hf` folder"
    )
    p.add_argument("--tasks", default=None, help="comma-separated task names (default: all of the version)")
    p.add_argument(
        "--after-cutoff",
        action="store_true",
        help="instead of the fixed tasks: one task of their scheme on the run's own candles after its "
        "data cut-off (MODEL/benchmark_after_cutoff.json; not comparable across models, so no "
        "leaderboard line)",
    )
    p.add_argument(
        "--budget",
        type=int,
        default=None,
        metavar="N",
        help="with --after-cutoff: at most N (asset, origin) forecasts, assets drawn at random on each "
        "origin date (default 2000)",
    )
    p.add_argument("--samples", type=int, default=100, help="sampled paths per origin (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    add_precision_arg(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON (the same as MODEL/benchmark.json)")
    p.add_argument(
        "--leaderboard",
        type=Path,
        default=None,
        metavar="PATH",
        help="append one JSON line here (default: benchmark_leaderboard.jsonl in the repo root)",
    )
    p.add_argument("--no-leaderboard", action="store_true", help="do not append to the leaderboard")
    p.add_argument(
        "--interval",
        default=None,
        metavar="INTERVAL",
        help="a run of several intervals (data.intervals): score only this one (default: each task at its "
        "own interval, every interval of the run; --after-cutoff: the run's first)",
    )
    p.set_defaults(handler=_cmd_benchmark)

    p = sub.add_parser(
        "export",
        help="the best model for use elsewhere: its next-token forward as ONNX "
        "(inference without torch) or a torch.export program, or a shareable model folder "
        "(safetensors, README model card), with its tokenizer and asset ids (docs/remote.md)",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder with best_model.pt")
    p.add_argument(
        "--format",
        default="onnx",
        help="onnx (default; onnxruntime), pt2 (torch.export; replaces "
        "the deprecated torchscript) or hf (model.safetensors + config, tokenizer, README model card: "
        "Forecaster.from_pretrained)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default <case>/exports/<run name>, "
        "<run name>_<interval> for another interval than a run's first)",
    )
    add_interval_arg(p)
    p.set_defaults(handler=_cmd_export)
