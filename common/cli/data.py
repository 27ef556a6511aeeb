"""`marketgpt data download, check, prepare`: a case's candles and its token shard."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from common.cli.args import add_config_args
from common.config import at_interval, load_config
from common.errors import UserError
from common.paths import case_config, case_dir, case_dir_of_config
from common.run.files import TOKENIZER_JSON

__all__ = ["add_parsers"]


def _cmd_data_download(args: argparse.Namespace) -> int:
    from common.data.download import download_case  # lazy: pandas

    case = case_dir(args.case)
    cfg = load_config(args.config or case_config(case), args.overrides)
    # raises SourceUnavailable (exit 2) if a source is down; data.intervals: each interval into its own cache
    codes = [
        download_case(dataclasses.replace(cfg, data=at_interval(cfg.data, interval)), case).exit_code
        for interval in cfg.data.run_intervals()
    ]
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
        from common.tokens.shard_paths import shard_folder  # lazy: pandas

        _check_shard(shard_folder(cfg, case)[0])
    return 1 if usable.unusable else 0


def _check_shard(folder: Path) -> None:
    """Every byte of a token shard against its manifest (a UserError if damaged)."""
    from common.tokens.shard_manifest import verify_shard  # lazy: with the shards below
    from common.tokens.shard_paths import published  # lazy: pandas

    if not published(folder):
        print(f"Token shard: {folder} is not prepared yet (`marketgpt data prepare` or the first run makes it)")
        return
    files = verify_shard(folder).get("files")
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
        from common.slurm.prepare_jobs import submit_preparation  # lazy: submitit and pandas

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
    from common.data.check import print_left_out  # lazy: pandas
    from common.tokens.shard_paths import rebuild, shard_folder  # lazy: pandas
    from common.tokens.shards import prepare_shards  # lazy: pandas
    from common.training.finetune import resolve_parent  # lazy: torch

    if not cfg.data.shards:
        raise UserError(
            "data.shards is false: each run prepares its data in memory, so there is nothing to "
            "prepare ahead (drop --set data.shards=false, or set it true in the config)"
        )
    # fine-tuning: the corpus in the parent's token ids, the shard training will look for
    parent = resolve_parent(cfg.training.init_from).run_dir / TOKENIZER_JSON if cfg.training.init_from else None
    case = case_dir_of_config(args.config)
    if args.dry_run:
        print(
            f"Dry run: would {'rebuild' if args.rebuild else 'prepare (or reuse)'} "
            f"{shard_folder(cfg, case, parent)[0]} in this process; nothing done."
        )
        return 0
    if args.rebuild:
        rebuild(shard_folder(cfg, case, parent)[0])
    # what the runs of this shard go without, in the words of `plan` and `train`
    print_left_out(prepare_shards(cfg, case, parent).data_info)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add `data` to the `marketgpt` parser."""
    p = sub.add_parser("data", help="market data: download a case's universe into its parquet cache")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = data_sub.add_parser(
        "download",
        help="fetch (or update) the case's candles from Yahoo and ccxt; "
        "exit 1 if assets failed, 2 if a source is unreachable",
    )
    p.add_argument("--case", required=True, help="case folder or name: case_c_crypto, c, or a path")
    add_config_args(p, required=False)  # --config defaults to the case's configs/*.json
    p.set_defaults(handler=_cmd_data_download)
    p = data_sub.add_parser(
        "check",
        help="which cached assets training would use under the case config, "
        "and why the others not (no network); exit 1 if some are not usable, 2 if none",
    )
    p.add_argument("--case", required=True, help="case folder or name: case_c_crypto, c, or a path")
    add_config_args(p, required=False)
    p.set_defaults(handler=_cmd_data_check)
    p = data_sub.add_parser(
        "prepare",
        help="prepare the config's token shard in the case's data cache now "
        "(e.g. in a CPU job before the GPU job); training reuses it (docs/data.md)",
    )
    add_config_args(p)
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
