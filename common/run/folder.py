"""A run folder and its files, read back or made, as one `Run`.

    case_X/checkpoints/<experiment>_YYYYMMDD_HHMMSS/
    config.json          fully resolved config; a resume reads this, not the case file
    tokenizer.json       the tokenizer fitted on the train split
    asset_info.json      symbol -> asset id, category -> category id (the model's embeddings; RunInfo)
    data_info.json       cleaning counts, split cuts, per-asset split sizes, volume edges
    tokens/              every asset's tokens, actual moves and split ranges, memory-mapped
                         (common/tokens/token_set.py; hard links to the shard it was prepared
                         from): a resume and the final evaluation see exactly the data the run
                         started with, even if the candle cache was updated since. Runs made
                         before token folders have tokens.npz, still read
    training_log.json    status, best val loss and epoch, one entry per epoch
    checkpoint_epoch_N.pt, checkpoint_epoch_N_step_S.pt, best_model.pt   (checkpoint.py)
    report.png, test_results.json   the final outputs, written in that order before the
                         log's status says "finished" / "early_stopped"
    tensorboard/

The config identity of a run lives here too: a resumed run may change only HARMLESS_ON_RESUME.
No torch here (checkpoint.py holds it): opening a run costs numpy and pandas, the tokenizer's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from common.atomic import atomic_write_json, check_writable as _check_writable, read_json
from common.config import Config, ConfigError, config_to_dict, load_config, save_config
from common.distributed.scheduler import job_metadata
from common.errors import UserError
from common.run.files import (
    ASSET_INFO_JSON,
    BEST_MODEL_PT,
    CONFIG_JSON,
    DATA_INFO_JSON,
    REPORT_PNG,
    TEST_RESULTS_JSON,
    TOKENIZER_JSON,
    TOKENS_DIR,
    TRAINING_LOG_JSON,
)
from common.run.log import RunLog
from common.tokens.ids import RunInfo
from common.tokens.token_set import TokenSet, token_path
from common.tokens.tokenizer import OHLCTokenizer

__all__ = [
    "HARMLESS_ON_RESUME",
    "RUN_FILES",
    "Run",
    "check_writable",
    "config_differences",
    "has_final_outputs",
]

# Keys a resumed run may change (with --set): they don't touch the model, the data, the
# optimizer or the batch order. Everything else must equal the run's config.json.
HARMLESS_ON_RESUME = (
    "training.epochs",
    "training.early_stopping_patience",
    "training.checkpoint_every_minutes",
    "training.log_every_steps",
    "training.keep_checkpoints",
    "training.eval_max_batches",
    "training.peak_flops",
    "training.device",
    "training.gradient_checkpointing",
    "training.scorecard_origins",
    "training.scorecard_samples",
    "training.scorecard_budget",
    "training.tracker",
    "data.shards",
    "slurm.",
)

# What a finished epoch leaves in a run folder, enough to rebuild its best model (forecasts,
# exports); evaluating the test split also needs the token set (tokens/).
RUN_FILES = (CONFIG_JSON, TOKENIZER_JSON, ASSET_INFO_JSON, BEST_MODEL_PT)


@dataclass
class Run:
    """A run folder's files read back: config.json, tokenizer.json, asset_info.json and, when
    asked for, the token set. best_model.pt and the checkpoints stay on disk (checkpoint.py
    loads them); `best_model`, `log` and `data_info` name or read the rest."""

    path: Path
    cfg: Config
    tokenizer: OHLCTokenizer
    info: RunInfo  # asset_info.json
    tokens: Optional[TokenSet] = None

    @classmethod
    def open(
        cls, path: str | os.PathLike, *, tokens: bool = False, model: bool = True, overrides: Sequence[str] = ()
    ) -> "Run":
        """Check that `path` is a run folder and read its files, or raise a UserError that says
        which file is missing or damaged. tokens: also the token set (evaluation, a resume);
        model: it must have a best_model.pt (forecasting, export); overrides: --set on a resume,
        a ConfigError where one changes a key that is not HARMLESS_ON_RESUME."""
        path = Path(path)
        if not path.is_dir():
            raise UserError(
                f"{path}: no such run folder; pass one like case_c_crypto/checkpoints/<experiment>_YYYYMMDD_HHMMSS"
            )
        names = RUN_FILES[:-1] + ((token_path(path).name,) if tokens else ()) + (RUN_FILES[-1:] if model else ())
        missing = [name for name in names if not (path / name).exists()]
        if BEST_MODEL_PT in missing and (path / "model.onnx").is_file():
            raise UserError(
                f"{path} is an ONNX export folder (`marketgpt export`), not a run folder: forecast it with "
                "--backend onnx, or pass the run folder it came from"
            )
        if missing == [BEST_MODEL_PT]:
            raise UserError(
                f"{path}: no best_model.pt yet (the run has not finished an epoch); use a run "
                "that has, or wait for this one"
            )
        if missing:
            raise UserError(
                f"{path}: missing {', '.join(missing)}; is it a run folder, and did training get past its set-up?"
            )
        return cls(
            path,
            _config(path / CONFIG_JSON, overrides),
            OHLCTokenizer.load(path / TOKENIZER_JSON),
            RunInfo.read(path / ASSET_INFO_JSON),
            TokenSet.load(token_path(path)) if tokens else None,
        )

    @classmethod
    def create(
        cls, path: Path, cfg: Config, tokenizer: OHLCTokenizer, info: RunInfo, tokens: TokenSet, data_info: Mapping
    ) -> "Run":
        """Write a new run's files into its (new, empty) folder: first its training log naming the
        job that owns it, so `--resume auto` elsewhere leaves it alone while it is set up."""
        try:
            RunLog({"status": "running", "epochs": [], **job_metadata()}).write(path / TRAINING_LOG_JSON)
            save_config(cfg, path / CONFIG_JSON)
            tokenizer.save(path / TOKENIZER_JSON)
            atomic_write_json(path / ASSET_INFO_JSON, info.to_json())
            atomic_write_json(path / DATA_INFO_JSON, dict(data_info))
            tokens.save(path / TOKENS_DIR)  # hard links to the shard's files
        except OSError as e:
            raise UserError(f"cannot write to the run folder {path} ({e.strerror or e})") from None
        return cls(path, cfg, tokenizer, info, tokens)

    @property
    def best_model(self) -> Path:
        return self.path / BEST_MODEL_PT

    def log(self) -> RunLog:
        """training_log.json (empty, status None, where there is none yet or it cannot be read)."""
        return RunLog.read(self.path)

    def data_info(self) -> dict:
        """data_info.json ({} for a run made before it existed); a UserError where it is damaged."""
        path = self.path / DATA_INFO_JSON
        if not path.is_file():
            return {}
        try:
            return dict(read_json(path))
        except (ValueError, TypeError) as e:
            raise UserError(f"{path} is not valid JSON ({e}); the run folder is damaged") from None


def _config(path: Path, overrides: Sequence[str]) -> Config:
    """config.json, with the harmless --set overrides of a resume (ConfigError for any other)."""
    cfg = load_config(path, overrides)
    changed = config_differences(load_config(path), cfg) if overrides else []
    if changed:
        raise ConfigError(
            f"--set cannot change {', '.join(c.split(':')[0] for c in changed)} when resuming "
            f"(only {', '.join(h.rstrip('.') for h in HARMLESS_ON_RESUME)}); start a new run "
            "without --resume to change them"
        )
    return cfg


def check_writable(folder: Path) -> None:
    """Create `folder` if needed and prove a file can be written in it, or raise UserError."""
    _check_writable(
        folder,
        "run folder location",
        "fix its permissions or free space, or point --config at a case folder you can write",
    )


def has_final_outputs(run_dir: Path) -> bool:
    """Whether the run's report.png and test_results.json are written (test_results.json comes
    last, and records a report that could not be drawn, so it is not retried forever)."""
    try:
        results = json.loads((run_dir / TEST_RESULTS_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (run_dir / REPORT_PNG).is_file() or (isinstance(results, dict) and "report_error" in results)


def _flatten(cfg: Config | Mapping[str, Any]) -> dict[str, Any]:
    """'section.key' -> value (a config is sections of leaves; a dict value is one leaf)."""
    out = {}
    raw = config_to_dict(cfg) if isinstance(cfg, Config) else cfg
    for name, value in raw.items():
        if isinstance(value, Mapping):
            out.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            out[name] = value
    return out


def config_differences(
    a: Config | Mapping[str, Any], b: Config | Mapping[str, Any], harmless: Sequence[str] = HARMLESS_ON_RESUME
) -> list[str]:
    """Keys (as 'section.key: a_value != b_value') where two configs (or their dicts, as
    stored in a checkpoint) describe different runs. A key one side lacks counts as its default:
    a checkpoint written before a setting existed describes the run the default gives."""
    defaults = _flatten(Config())
    fa, fb = {**defaults, **_flatten(a)}, {**defaults, **_flatten(b)}
    out = []
    for key in sorted(set(fa) | set(fb)):
        if any(key == h or (h.endswith(".") and key.startswith(h)) for h in harmless):
            continue
        if fa.get(key) != fb.get(key):
            out.append(f"{key}: {fa.get(key)!r} != {fb.get(key)!r}")
    return out
