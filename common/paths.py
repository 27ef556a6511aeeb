"""Where things are: the repo root, the case folders and their standard sub-folders."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from common.errors import UserError

__all__ = [
    "REPO_ROOT",
    "CASES",
    "SEED_CONFIGS",
    "case_dir",
    "case_config",
    "case_dir_of_config",
    "case_script",
    "script_config",
]

# common/ sits at the top of the repo; the case folders are its siblings.
REPO_ROOT = Path(__file__).resolve().parent.parent
CASES = ("case_a_full_market", "case_b_reduced", "case_c_crypto")
_SHORT = {"a": "case_a_full_market", "b": "case_b_reduced", "c": "case_c_crypto"}


def case_dir(name: str | os.PathLike, root: Path | None = None) -> Path:
    """Resolve `case_c_crypto`, `c`, or a path to a case folder; a typo gets a suggestion."""
    root = root or REPO_ROOT
    text = str(name).rstrip("/")
    path = Path(text)
    if path.is_dir() and (path / "configs").is_dir():
        return path.resolve()
    base = _SHORT.get(text.lower(), path.name)
    if (root / base / "configs").is_dir():
        return root / base
    close = difflib.get_close_matches(base, CASES, n=1, cutoff=0.4)
    hint = f"; did you mean '{close[0]}'?" if close else f"; cases are {', '.join(CASES)}"
    raise UserError(f"unknown case '{text}'{hint}")


# Each case's seed-guide config: the default when its configs/ also holds example configs.
SEED_CONFIGS = {
    "case_a_full_market": "full_market_config.json",
    "case_b_reduced": "reduced_config.json",
    "case_c_crypto": "crypto_prototype.json",
}


def case_config(case: Path) -> Path:
    """The case's config: the single JSON file in its configs/ folder, or the seed guide's among several."""
    found = sorted((case / "configs").glob("*.json"))
    seed = case / "configs" / SEED_CONFIGS.get(Path(case).name, "-")
    if len(found) == 1:
        return found[0]
    if seed in found:
        return seed
    raise UserError(f"{case / 'configs'}: expected one config file, found {len(found)}; pass --config explicitly")


def case_dir_of_config(config_path: str | os.PathLike) -> Path:
    """configs/*.json lives in the case folder; a config elsewhere resolves relative to itself."""
    config_path = Path(config_path).resolve()
    if config_path.parent.name == "configs":
        return config_path.parent.parent
    return config_path.parent


def case_script(case_path: Path) -> Path:
    """The case's sbatch script: the one file in its slurm_scripts/."""
    scripts = sorted((case_path / "slurm_scripts").glob("*.sh"))
    if len(scripts) != 1:
        raise UserError(f"{case_path / 'slurm_scripts'}: expected one sbatch script, found {len(scripts)}")
    return scripts[0]


def script_config(script: Path) -> str | None:
    """The config a case's sbatch script trains, relative to the case folder (its CONFIG= line)."""
    m = re.search(r"^CONFIG=(\S+)$", script.read_text(), flags=re.M)
    return m.group(1) if m else None
