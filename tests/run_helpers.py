"""A Trainer's run without data: the folder, the config and some assets (the tests feed their own windows)."""

from __future__ import annotations

from pathlib import Path

from common.config import Config
from common.data.universe import Asset
from common.run.folder import Run
from common.tokens.ids import RunInfo
from common.tokens.tokenizer import OHLCTokenizer


def run_of(path: Path, cfg: Config, num_assets: int = 2) -> Run:
    """The run `cfg` trains in the folder `path`, on `num_assets` crypto assets S0, S1, ..."""
    assets = [Asset(f"S{i}", "sample", "crypto", f"S{i}") for i in range(num_assets)]
    return Run(Path(path), cfg, OHLCTokenizer(), RunInfo.of_assets(assets))
