"""`marketgpt` command line: one entry point, one small handler per subcommand.

Handlers import their module lazily so `marketgpt --help` stays instant and a broken optional
dependency only breaks the subcommand that needs it. A `UserError` (bad config, missing file,
unreachable source) becomes one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from common.errors import UserError

__all__ = ["main", "build_parser"]


def _add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", required=required, type=Path, help="case config JSON")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set training.batch_size=16 (repeatable)")


def _cmd_model_info(args: argparse.Namespace) -> int:
    from common.config import load_config

    cfg = load_config(args.config, args.overrides)
    from common.model import describe_model

    print(describe_model(cfg, num_assets=args.num_assets, num_categories=args.num_categories))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marketgpt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("model-info", help="exact parameter count and memory estimate of a case's model")
    _add_config_args(p)
    p.add_argument("--num-assets", type=int, default=None,
                   help="assets in the embedding table (default: the case universe's size)")
    p.add_argument("--num-categories", type=int, default=None)
    p.set_defaults(handler=_cmd_model_info)

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
    except KeyboardInterrupt:
        print(f"marketgpt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
