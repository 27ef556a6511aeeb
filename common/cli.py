"""`marketgpt` command line: one entry point, one small handler per subcommand.

Handlers import their heavy modules (torch, pandas, submitit) lazily so `marketgpt --help` stays
instant and a broken optional dependency only breaks the subcommand that needs it. A `UserError`
(bad config, missing file, unreachable source) becomes one line on stderr and exit code 2; a
failed `remote` step (StepFailed) one line naming the step and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from common.cluster.remote import Remote, StepFailed, load_settings
from common.cluster.remote_commands import fetch_run, train_remote, watch_status
from common.cluster.remote_direct import DirectRemote
from common.cluster.status import status_json, status_table
from common.config import Config, at_interval, load_config
from common.distributed.requeue import EXIT_REQUEUE
from common.errors import UserError
from common.paths import REPO_ROOT, case_config, case_dir, case_dir_of_config

__all__ = ["main", "build_parser"]


def _add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", required=required, type=Path, help="case config JSON")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set training.batch_size=16 (repeatable)",
    )


def _add_precision_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--precision",
        default="auto",
        metavar="auto|fp32|bf16",
        help="auto (default): bf16 autocast for a run trained in bf16, on a GPU or CPU with bf16 in "
        "hardware (about 2x faster); fp32 otherwise (docs/forecasting.md#precision)",
    )


def _names(text: str) -> list[str]:
    """'BTC/USDT, ETH/USDT' -> ['BTC/USDT', 'ETH/USDT'] (a comma-separated flag)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _cmd_model_info(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)  # a bad config fails before torch loads
    from common.model.sizing import describe_model  # lazy: torch

    print(describe_model(cfg, num_assets=args.num_assets, num_categories=args.num_categories))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from common.commands.plan import run_plan  # lazy: torch (the model's size)

    return run_plan(args.config, args.overrides, fit=args.fit)


def _cmd_train(args: argparse.Namespace) -> int:
    from common.commands.train import run_training  # lazy: torch

    overrides = list(args.overrides)
    if args.init_from is not None:  # the same as --set training.init_from=..., made absolute for jobs
        overrides.append(f"training.init_from={args.init_from.expanduser().resolve()}")
    return run_training(args.config, overrides, args.resume, num_gpus=args.num_gpus)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from common.evaluation.evaluate import evaluate_run_dir, summarize_results  # lazy: torch

    results = evaluate_run_dir(args.run_dir)
    print(summarize_results(args.run_dir, results))
    print(f"Wrote {args.run_dir / 'test_results.json'} and {args.run_dir / 'report.png'}")
    return 0


def _cmd_forecast(args: argparse.Namespace) -> int:
    from common.commands.forecast import ForecastRequest, run_forecast_command  # lazy: pandas (torch later)

    symbols = None if args.all or not args.symbols else _names(args.symbols)
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
            assets=_names(args.assets) if args.assets else None,
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
            tasks=_names(args.tasks) if args.tasks else None,
            samples=args.samples,
            seed=args.seed,
            device=args.device,
            precision=args.precision,
            as_json=args.json,
            leaderboard=args.leaderboard,
            append=not args.no_leaderboard,
            after_cutoff=args.after_cutoff,
            budget=args.budget,
        )
    )


def _cmd_data_download(args: argparse.Namespace) -> int:
    from common.data.download import download_case  # lazy: pandas

    case = case_dir(args.case)
    cfg = load_config(args.config or case_config(case), args.overrides)
    # raises SourceUnavailable (exit 2) if a source is down; data.intervals: each interval into its own cache
    codes = [download_case(at_interval(cfg, interval), case).exit_code for interval in cfg.data.run_intervals()]
    return max(codes)  # 1: some assets failed, are inactive or unreachable (listed in the summary)


def _cmd_data_check(args: argparse.Namespace) -> int:
    from common.data.check import check_usable  # lazy: pandas

    case = case_dir(args.case)
    cfg = load_config(args.config or case_config(case), args.overrides)
    usable = check_usable(cfg, case)
    print(usable.format())
    if not usable.usable:
        return 2
    if cfg.data.shards:
        _check_shard(cfg, case)
    return 1 if usable.unusable else 0


def _check_shard(cfg: Config, case: Path) -> None:
    """Every byte of the config's token shard against its manifest (a UserError if damaged)."""
    from common.tokens.shard_manifest import verify_shard  # lazy: with the shards below
    from common.tokens.shard_paths import published, shard_folder  # lazy: pandas

    folder, _ = shard_folder(cfg, case)
    if not published(folder):
        print(f"Token shard: {folder} is not prepared yet (`marketgpt data prepare` or the first run makes it)")
        return
    files = verify_shard(folder, full=True).get("files")
    print(
        f"Token shard: {folder}: "
        + (
            f"{len(files)} files match their sha256 in manifest.json"
            if files
            else "published before checksums; sizes only (prepare it anew to add them)"
        )
    )


def _cmd_data_prepare(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    if args.array is not None and args.array != 1:
        from common.cluster.prepare_jobs import submit_preparation  # lazy: submitit and pandas

        if cfg.training.init_from:
            raise UserError(
                "--array does not prepare a fine-tuning config (training.init_from) yet: run "
                "`marketgpt data prepare` without --array, or let training prepare it"
            )
        if args.rebuild and not args.dry_run:
            from common.tokens.shard_paths import rebuild, shard_folder  # lazy: pandas

            rebuild(shard_folder(cfg, case_dir_of_config(args.config))[0])
        submit_preparation(args.config, args.overrides, args.array, dry_run=args.dry_run)
        return 0
    from common.tokens.shard_paths import rebuild, shard_folder  # lazy: pandas
    from common.tokens.shards import prepare_shards  # lazy: pandas
    from common.training.finetune import resolve_parent  # lazy: torch

    if not cfg.data.shards:
        raise UserError(
            "data.shards is false: each run prepares its data in memory, so there is nothing to "
            "prepare ahead (drop --set data.shards=false, or set it true in the config)"
        )
    # fine-tuning: the corpus in the parent's token ids, the shard training will look for
    parent = resolve_parent(cfg.training.init_from).run_dir / "tokenizer.json" if cfg.training.init_from else None
    case = case_dir_of_config(args.config)
    if args.dry_run:
        print(
            f"Dry run: would {'rebuild' if args.rebuild else 'prepare (or reuse)'} "
            f"{shard_folder(cfg, case, parent)[0]} in this process; nothing done."
        )
        return 0
    if args.rebuild:
        rebuild(shard_folder(cfg, case, parent)[0])
    prepare_shards(cfg, case, parent)
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    from common.cluster.submit import submit, wait_local  # lazy: submitit is slow to import

    jobs = submit(args.case, args.config, args.overrides, array=args.array, local=args.local, dry_run=args.dry_run)
    return wait_local(jobs) if args.local else 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from common.commands.doctor import run_doctor, run_doctor_json  # lazy: torch

    return run_doctor_json(sys.stdout) if args.json else run_doctor(sys.stdout)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from common.commands.sweep import plan_sweep, run_local  # lazy: torch (training the points)

    sweep = plan_sweep(args.config, args.overrides, args.sizes, args.fractions, args.by, args.name)
    if args.local:
        return run_local(sweep, args.jobs)
    from common.cluster.sweep_jobs import submit_sweep  # lazy: submitit

    submit_sweep(sweep)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    print(json.dumps(status_json(case=args.case), indent=2) if args.json else status_table(case=args.case))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from common.forecasting.export import export_run  # lazy: torch

    out = export_run(args.run_dir, args.format, args.out, interval=args.interval)
    print(f"Exported {args.run_dir} ({args.format}) to {out}")
    return 0


def _add_interval_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interval",
        default=None,
        metavar="INTERVAL",
        help="a run of several intervals (data.intervals): which one (default: the run's first)",
    )


def _remote(args: argparse.Namespace) -> Remote:
    """The remote repo that remote.json and the --host/--path/--python/--env flags name."""
    repo = args.repo.resolve()
    settings = load_settings(repo, host=args.host, path=args.path, python=args.python, env=args.env)
    kind = DirectRemote if settings.launcher == "direct" else Remote
    return kind(settings, repo, dry_run=args.dry_run)


def _direct_remote(args: argparse.Namespace) -> DirectRemote:
    remote = _remote(args)
    if not isinstance(remote, DirectRemote):
        raise UserError(
            f'`remote {args.remote_command}` is for "launcher": "direct" (a box without Slurm); '
            "on a Slurm cluster use `marketgpt remote submit` and scancel there"
        )
    return remote


def _cmd_remote_setup(args: argparse.Namespace) -> int:
    _direct_remote(args).setup(cpu_ok=args.cpu_ok)
    return 0


def _cmd_remote_stop(args: argparse.Namespace) -> int:
    _direct_remote(args).stop(args.case, timeout_s=args.timeout)
    return 0


def _cmd_remote_sync(args: argparse.Namespace) -> int:
    _remote(args).sync()
    return 0


def _cmd_remote_submit(args: argparse.Namespace) -> int:
    _remote(args).submit(args.case, args.overrides, args.sbatch_args)
    return 0


def _cmd_remote_status(args: argparse.Namespace) -> int:
    watch_status(_remote(args), args.case, every_s=args.watch, as_json=args.json)
    return 0


def _cmd_remote_logs(args: argparse.Namespace) -> int:
    _remote(args).logs(args.job_id, args.follow, args.lines)
    return 0


def _cmd_remote_fetch(args: argparse.Namespace) -> int:
    fetch_run(_remote(args), args.run, latest=args.latest, case=args.case, all_checkpoints=args.all_checkpoints)
    return 0


def _cmd_remote_train(args: argparse.Namespace) -> int:
    train_remote(
        _remote(args),
        args.case,
        args.overrides,
        args.sbatch_args,
        poll_s=args.poll,
        timeout_s=args.timeout,
        all_checkpoints=args.all_checkpoints,
    )
    return 0


def _add_remote_action(
    actions: argparse._SubParsersAction, name: str, help_text: str, handler: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """One `marketgpt remote ACTION`, with the flags every action takes."""
    a = actions.add_parser(name, help=help_text)
    a.add_argument("--host", default=None, help="ssh host or ~/.ssh/config alias (default: remote.json)")
    a.add_argument("--path", default=None, help="the repo's folder there (default: remote.json)")
    a.add_argument("--python", default=None, help="the python there (default: remote.json, else python3)")
    a.add_argument("--env", default=None, help="shell line run first there, e.g. 'module load python/3.11'")
    a.add_argument(
        "--repo", type=Path, default=REPO_ROOT, help="the local repo to sync from and fetch into (default: this one)"
    )
    a.add_argument("--dry-run", action="store_true", help="print the exact commands; run nothing")
    a.set_defaults(handler=handler)
    return a


def _add_remote_submit_args(a: argparse.ArgumentParser) -> None:
    a.add_argument("--case", required=True, help="case folder or name: case_c_crypto, c")
    a.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override passed to the job (repeatable)",
    )
    a.add_argument(
        "--sbatch-args",
        default="",
        help="extra sbatch options, written with = (they start with -): "
        '--sbatch-args="--partition=medium --time=2:00:00"',
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marketgpt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("model-info", help="exact parameter count and memory estimate of a case's model")
    _add_config_args(p)
    p.add_argument(
        "--num-assets", type=int, default=None, help="assets in the embedding table (default: the case universe's size)"
    )
    p.add_argument("--num-categories", type=int, default=None)
    p.set_defaults(handler=_cmd_model_info)

    p = sub.add_parser(
        "plan",
        help="before a GPU job: tokens per split, tokens per parameter, steps and time per "
        "epoch on the job's GPUs, memory, and warnings (no network)",
    )
    _add_config_args(p)
    p.add_argument(
        "--fit",
        type=Path,
        default=None,
        help="the sweep.json of `marketgpt sweep` on this corpus: its model size advice",
    )
    p.set_defaults(handler=_cmd_plan)

    p = sub.add_parser(
        "sweep",
        help="which model size pays on this corpus: a grid of shapes x training-data fractions, one Slurm "
        "job array (or --local), written to <case>/sweeps/NAME/sweep.json with a scaling fit (docs/scaling.md)",
    )
    _add_config_args(p)
    p.add_argument("--sizes", default="64x2,128x4,256x6", help="model shapes D_MODELxLAYERS, comma-separated")
    p.add_argument("--fractions", default="0.25,0.5,1", help="shares of the training split, each in (0, 1]")
    p.add_argument("--by", choices=("assets", "time"), default="assets", help="a fraction keeps whole assets or time")
    p.add_argument("--name", default=None, help="the sweep's folder name (default: sweep_<experiment>)")
    p.add_argument("--local", action="store_true", help="run the points here instead of as a Slurm job array")
    p.add_argument("--jobs", type=int, default=1, help="with --local: points trained at once")
    p.set_defaults(handler=_cmd_sweep)

    p = sub.add_parser("data", help="market data: download a case's universe into its parquet cache")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = data_sub.add_parser(
        "download",
        help="fetch (or update) the case's candles from Yahoo and ccxt; "
        "exit 1 if assets failed, 2 if a source is unreachable",
    )
    p.add_argument("--case", required=True, help="case folder or name: case_c_crypto, c, or a path")
    _add_config_args(p, required=False)  # --config defaults to the case's configs/*.json
    p.set_defaults(handler=_cmd_data_download)
    p = data_sub.add_parser(
        "check",
        help="which cached assets training would use under the case config, "
        "and why the others not (no network); exit 1 if some are not usable, 2 if none",
    )
    p.add_argument("--case", required=True, help="case folder or name: case_c_crypto, c, or a path")
    _add_config_args(p, required=False)
    p.set_defaults(handler=_cmd_data_check)
    p = data_sub.add_parser(
        "prepare",
        help="prepare the config's token shard in the case's data cache now "
        "(e.g. in a CPU job before the GPU job); training reuses it (docs/data.md)",
    )
    _add_config_args(p)
    p.add_argument(
        "--array",
        type=int,
        default=None,
        metavar="N",
        help="submit it to Slurm instead: 4 dependent CPU jobs (clean: an array of N tasks, fit, "
        "encode: N tasks, finish), partition from the config's slurm section",
    )
    p.add_argument("--dry-run", action="store_true", help="check everything and show the jobs; submit nothing")
    p.add_argument(
        "--rebuild", action="store_true", help="move a damaged shard aside (<key>.damaged-<time>) and prepare it anew"
    )
    p.set_defaults(handler=_cmd_data_prepare)

    p = sub.add_parser(
        "train",
        help="train a case's model: a new run, or --resume one "
        f"(exit {EXIT_REQUEUE}: stopped on SIGTERM/SIGUSR2 after a checkpoint, requeue with --resume auto)",
    )
    _add_config_args(p, required=False)
    p.add_argument(
        "--resume",
        metavar="auto|PATH",
        default=None,
        help="auto: the newest checkpoint of this experiment's newest run (a new run if there "
        "is none or it is done; a requeued Slurm job continues its own run); PATH: a run "
        "folder or a checkpoint_epoch_*.pt file",
    )
    p.add_argument(
        "--num-gpus",
        type=int,
        default=None,
        metavar="N",
        help="GPUs (= processes) per node this job uses; checked against how srun or torchrun "
        "started it (one process per GPU), e.g. --num-gpus 1 to test on a single GPU",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        metavar="RUN_DIR|CHECKPOINT",
        help="fine-tune: start a new run from a trained run's weights and tokenizer "
        "(= --set training.init_from=...; see docs/training.md)",
    )
    p.set_defaults(handler=_cmd_train)

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
    _add_precision_arg(p)
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
    _add_interval_arg(p)
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
    _add_precision_arg(p)
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
    _add_precision_arg(p)
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
    _add_interval_arg(p)
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
    _add_precision_arg(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON (the same as MODEL/benchmark.json)")
    p.add_argument(
        "--leaderboard",
        type=Path,
        default=None,
        metavar="PATH",
        help="append one JSON line here (default: benchmark_leaderboard.jsonl in the repo root)",
    )
    p.add_argument("--no-leaderboard", action="store_true", help="do not append to the leaderboard")
    p.set_defaults(handler=_cmd_benchmark)

    p = sub.add_parser(
        "submit",
        help="submit a case's training to Slurm with submitit (requeues itself "
        "before the time limit), as a job array with --array, or run it here with --local",
    )
    p.add_argument("--case", required=True, help="case folder or name: case_c_crypto, c, or a path")
    _add_config_args(p, required=False)  # --config defaults to the case's configs/*.json
    p.add_argument(
        "--array",
        metavar="KEY=V1,V2",
        default=None,
        help="one job per value, each its own experiment: seeds=1,2,3 or e.g. training.learning_rate=1e-4,3e-4",
    )
    p.add_argument("--local", action="store_true", help="run the same job on this machine (no Slurm) and wait")
    p.add_argument("--dry-run", action="store_true", help="check everything and show the job(s); submit nothing")
    p.set_defaults(handler=_cmd_submit)

    p = sub.add_parser(
        "doctor",
        help="run first on a new node: torch/CUDA/NCCL/driver versions, the GPUs, Slurm "
        "variables, whether the cases fit; exit 1 if training would fall back to the CPU",
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object: the GPUs (NVML) and the verdict (docs/slurm.md)"
    )
    p.set_defaults(handler=_cmd_doctor)

    p = sub.add_parser(
        "status",
        help="one table of all runs under case_*/checkpoints: Slurm state, epoch, losses, tokens/s, ETA, last log line",
    )
    p.add_argument("--case", default=None, help="only this case (default: all)")
    p.add_argument("--json", action="store_true", help="one JSON object: the GPUs (NVML) and every run (docs/slurm.md)")
    p.set_defaults(handler=_cmd_status)

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
    _add_interval_arg(p)
    p.set_defaults(handler=_cmd_export)

    p = sub.add_parser(
        "remote",
        help="from a workstation: sync the repo to a cluster over ssh, submit, follow, "
        "fetch runs back (settings: remote.json; docs/remote.md)",
    )
    actions = p.add_subparsers(dest="remote_command", required=True, metavar="ACTION")
    a = _add_remote_action(
        actions,
        "setup",
        "launcher direct: sync, create the venv there, install, run `marketgpt doctor` there",
        _cmd_remote_setup,
    )
    a.add_argument("--cpu-ok", action="store_true", help="a box without a GPU is fine: train on its CPU")
    a = _add_remote_action(
        actions, "stop", "launcher direct: SIGTERM to the training there (it checkpoints first)", _cmd_remote_stop
    )
    a.add_argument("--case", required=True, help="case folder or name: case_c_crypto, c")
    a.add_argument("--timeout", type=float, default=600.0, metavar="S", help="wait up to S seconds for it to stop")
    _add_remote_action(
        actions,
        "sync",
        "rsync the repo there (without .git, .venv, caches, case data, checkpoints and logs)",
        _cmd_remote_sync,
    )
    a = _add_remote_action(
        actions, "submit", "sbatch the case's script there; prints the job id and how to follow it", _cmd_remote_submit
    )
    _add_remote_submit_args(a)
    a = _add_remote_action(actions, "status", "`marketgpt status` run there", _cmd_remote_status)
    a.add_argument("--case", default=None)
    a.add_argument("--watch", type=float, default=None, metavar="N", help="refresh every N seconds")
    a.add_argument("--json", action="store_true", help="`marketgpt status --json` there (docs/slurm.md)")
    a = _add_remote_action(actions, "logs", "show (-f: follow) a job's log there", _cmd_remote_logs)
    a.add_argument("job_id", metavar="JOBID")
    a.add_argument("-f", "--follow", action="store_true")
    a.add_argument("-n", "--lines", type=int, default=50)
    a = _add_remote_action(
        actions,
        "fetch",
        "copy a run back into case_*/checkpoints/ here, check it, then move it into place",
        _cmd_remote_fetch,
    )
    a.add_argument("run", nargs="?", default=None, metavar="RUN", help="run folder name, or case_X/checkpoints/NAME")
    a.add_argument("--latest", action="store_true", help="the newest run (of --case, or of any case)")
    a.add_argument("--case", default=None)
    a.add_argument("--all-checkpoints", action="store_true", help="also the checkpoint_epoch_*.pt files")
    a = _add_remote_action(
        actions,
        "train",
        "sync, submit, follow the job (across requeues), fetch, check, print the results",
        _cmd_remote_train,
    )
    _add_remote_submit_args(a)
    a.add_argument("--poll", type=float, default=10.0, metavar="S", help="seconds between queue checks (default 10)")
    a.add_argument("--timeout", type=float, default=None, metavar="S", help="stop waiting after S seconds")
    a.add_argument("--all-checkpoints", action="store_true")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except UserError as e:
        print(f"marketgpt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except StepFailed as e:  # a `remote` step (ssh, rsync, sbatch) failed: it names the step
        print(f"marketgpt remote {args.remote_command}: step '{e.step}' failed: {e.reason}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"marketgpt {args.command}: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The `marketgpt` / `python -m common.cli` process entry point.

    A process that ran torch.distributed leaves with os._exit once its output is flushed:
    gloo's and the TCP store's C++ threads can abort the interpreter's teardown ("terminate
    called without an active exception") after the work is done, turning a good exit code
    into 134. In-process callers (tests, submitit jobs) call main() and are not affected.
    """
    code = main()
    dist_utils = sys.modules.get("common.distributed.ddp")
    if dist_utils is not None and dist_utils.was_distributed():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
