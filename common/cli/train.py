"""`marketgpt model-info, plan, sweep, train, submit, doctor, status`: sizing, training and its jobs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.cli.args import add_config_args
from common.cluster.status import status_json, status_table
from common.config import load_config
from common.distributed.requeue import EXIT_REQUEUE

__all__ = ["add_parsers"]


def _cmd_model_info(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)  # a bad config fails before torch loads
    from common.model.sizing import describe_model  # lazy: torch

    print(describe_model(cfg, num_assets=args.num_assets, num_categories=args.num_categories))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from common.commands.plan import run_plan  # lazy: torch (the model's size)

    return run_plan(args.config, args.overrides, fit=args.fit)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from common.commands.sweep import plan_sweep, run_local  # lazy: torch (training the points)

    sweep = plan_sweep(args.config, args.overrides, args.sizes, args.fractions, args.by, args.name, args.learning_rates)
    if args.local:
        return run_local(sweep, args.jobs)
    from common.slurm.sweep_jobs import submit_sweep  # lazy: submitit

    submit_sweep(sweep)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from common.commands.train import run_training  # lazy: torch

    overrides = list(args.overrides)
    if args.init_from is not None:  # the same as --set training.init_from=..., made absolute for jobs
        overrides.append(f"training.init_from={args.init_from.expanduser().resolve()}")
    return run_training(args.config, overrides, args.resume, num_gpus=args.num_gpus)


def _cmd_submit(args: argparse.Namespace) -> int:
    from common.slurm.submit import submit, wait_local  # lazy: submitit is slow to import

    jobs = submit(args.case, args.config, args.overrides, array=args.array, local=args.local, dry_run=args.dry_run)
    return wait_local(jobs) if args.local else 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from common.commands.doctor import run_doctor, run_doctor_json  # lazy: torch

    return run_doctor_json(sys.stdout) if args.json else run_doctor(sys.stdout)


def _cmd_status(args: argparse.Namespace) -> int:
    print(json.dumps(status_json(case=args.case), indent=2) if args.json else status_table(case=args.case))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add `model-info`, `plan`, `sweep`, `train`, `submit`, `doctor`, `status` to the `marketgpt` parser."""
    p = sub.add_parser("model-info", help="exact parameter count and memory estimate of a case's model")
    add_config_args(p)
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
    add_config_args(p)
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
    add_config_args(p)
    p.add_argument("--sizes", default="64x2,128x4,256x6", help="model shapes D_MODELxLAYERS, comma-separated")
    p.add_argument("--fractions", default="0.25,0.5,1", help="shares of the training split, each in (0, 1]")
    p.add_argument("--by", choices=("assets", "time"), default="assets", help="a fraction keeps whole assets or time")
    p.add_argument(
        "--learning-rates",
        default=None,
        metavar="LR1,LR2",
        help="also an axis of learning rates; the fit takes each shape and fraction at the rate with the "
        "lowest validation loss (default: the config's rate)",
    )
    p.add_argument("--name", default=None, help="the sweep's folder name (default: sweep_<experiment>)")
    p.add_argument("--local", action="store_true", help="run the points here instead of as a Slurm job array")
    p.add_argument("--jobs", type=int, default=1, help="with --local: points trained at once")
    p.set_defaults(handler=_cmd_sweep)

    p = sub.add_parser(
        "train",
        help="train a case's model: a new run, or --resume one "
        f"(exit {EXIT_REQUEUE}: stopped on SIGTERM/SIGUSR2 after a checkpoint, requeue with --resume auto)",
    )
    add_config_args(p, required=False)
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

    p = sub.add_parser(
        "submit",
        help="submit a case's training to Slurm with submitit (requeues itself "
        "before the time limit), as a job array with --array, or run it here with --local",
    )
    p.add_argument("--case", required=True, help="case folder or name: case_c_crypto, c, or a path")
    add_config_args(p, required=False)  # --config defaults to the case's configs/*.json
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
