"""The flags several subcommands share."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_config_args", "add_interval_arg", "add_precision_arg", "names"]


def add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", required=required, type=Path, help="case config JSON")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set training.batch_size=16 (repeatable)",
    )


def add_precision_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--precision",
        default="auto",
        metavar="auto|fp32|bf16",
        help="auto (default): bf16 autocast for a run trained in bf16, on a GPU or CPU with bf16 in "
        "hardware (about 2x faster); fp32 otherwise (docs/forecasting.md#precision)",
    )


def add_interval_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interval",
        default=None,
        metavar="INTERVAL",
        help="a run of several intervals (data.intervals): which one (default: the run's first)",
    )


def names(text: str) -> list[str]:
    """'BTC/USDT, ETH/USDT' -> ['BTC/USDT', 'ETH/USDT'] (a comma-separated flag)."""
    return [name.strip() for name in text.split(",") if name.strip()]
