"""`marketgpt` command line: one entry point, one small handler per subcommand.

Handlers import their heavy modules (torch, pandas, submitit) lazily so `marketgpt --help` stays
instant and a broken optional dependency only breaks the subcommand that needs it. A `UserError`
(bad config, missing file, unreachable source) becomes one line on stderr and exit code 2; a
failed `remote` step (StepFailed) one line naming the step and exit code 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, NoReturn, Sequence

from common.cli import data, evaluate, remote, train
from common.cluster.remote import StepFailed
from common.errors import UserError

__all__ = ["build_parser", "entry", "exit_process", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marketgpt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (train, data, evaluate, remote):  # the subcommands, by concern
        group.add_parsers(sub)
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
    exit_process(main())


def exit_process(code: int) -> NoReturn:
    """Leave with `code`: with os._exit once a torch.distributed process has flushed its output (see entry)."""
    dist_utils = sys.modules.get("common.distributed.ddp")
    if dist_utils is not None and dist_utils.was_distributed():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
