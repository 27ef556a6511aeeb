"""`marketgpt remote ...`: a cluster or a rented GPU box over ssh, from a workstation (docs/remote.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from common.cluster.remote import Remote
from common.cluster.remote_commands import fetch_run, train_remote, watch_status
from common.cluster.remote_direct import DirectRemote
from common.cluster.remote_settings import load_settings
from common.errors import UserError
from common.paths import REPO_ROOT

__all__ = ["add_parsers"]


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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add `remote` to the `marketgpt` parser."""
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
