"""The config's value checks, one function per section: impossible values, each reported with its key.

Every check calls `need(ok, key, why)`, which common.config.validate makes raise a ConfigError
"<file>: '<key>' <why>" (kept out of this module so it needs nothing from common.config at run
time). Types and unknown keys are checked earlier, while the JSON is read (common.config).
"""

from __future__ import annotations

import math
import re
from datetime import date
from typing import TYPE_CHECKING, Callable

from common.config.synthetic import SyntheticSpecError, spec_from_dict
from common.markets import CATEGORIES
from common.special_tokens import NUM_SPECIAL_TOKENS

if TYPE_CHECKING:
    from common.config import DataConfig, ModelConfig, SlurmConfig, TokenizerConfig, TrainingConfig

__all__ = ["START_MAX", "Need", "check_data", "check_model", "check_slurm", "check_tokenizer", "check_training"]

# data.start_date = "max": each asset's whole history (ccxt: since the listing; Yahoo: since the first
# trade for daily bars, as far back as Yahoo keeps intraday ones); no lower bound when loading.
START_MAX = "max"

Need = Callable[[bool, str, str], None]  # need(ok, key, why): raises when not ok


def check_model(m: ModelConfig, tok: TokenizerConfig, need: Need) -> None:
    for key in (
        "vocab_size",
        "context_length",
        "d_model",
        "num_layers",
        "num_heads",
        "d_ff",
        "asset_embed_dim",
        "category_embed_dim",
    ):
        need(getattr(m, key) > 0, f"model.{key}", f"must be positive, got {getattr(m, key)}")
    need(
        m.d_model % m.num_heads == 0,
        "model.d_model",
        f"({m.d_model}) must be divisible by model.num_heads ({m.num_heads})",
    )
    need(
        m.positional != "rope" or (m.d_model // m.num_heads) % 2 == 0,
        "model.positional",
        "'rope' needs an even head size (d_model / num_heads)",
    )
    need(0.0 <= m.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {m.dropout}")
    need(0.0 <= m.market_mask <= 1.0, "model.market_mask", f"must be in [0, 1], got {m.market_mask}")
    need(
        m.market_mask == 0.0 or m.market_context,
        "model.market_mask",
        "hides market ids: it needs model.market_context = true",
    )
    min_vocab = NUM_SPECIAL_TOKENS + 2 * tok.shape_bins
    need(
        m.vocab_size >= min_vocab,
        "model.vocab_size",
        f"({m.vocab_size}) is too small: the tokenizer needs {NUM_SPECIAL_TOKENS} special tokens plus "
        f"at least 2 return bins x {tok.shape_bins} shape bins = {min_vocab}",
    )
    need(
        m.vocab_size <= 2**15,
        "model.vocab_size",
        f"({m.vocab_size}) is too large: token folders store int16 ids, so at most {2**15}",
    )


def check_training(t: TrainingConfig, m: ModelConfig, need: Need) -> None:
    for key in ("batch_size", "epochs", "grad_accum_steps", "keep_checkpoints", "log_every_steps"):
        need(getattr(t, key) > 0, f"training.{key}", f"must be positive, got {getattr(t, key)}")
    need(
        t.learning_rate > 0 and math.isfinite(t.learning_rate),
        "training.learning_rate",
        f"must be positive, got {t.learning_rate}",
    )
    need(t.muon_lr > 0 and math.isfinite(t.muon_lr), "training.muon_lr", f"must be positive, got {t.muon_lr}")
    for key in ("early_stopping_patience", "gradient_clip", "weight_decay", "warmup_steps"):
        need(getattr(t, key) >= 0, f"training.{key}", f"must be zero or positive, got {getattr(t, key)}")
    need(0.0 <= t.min_lr_ratio <= 1.0, "training.min_lr_ratio", f"must be in [0, 1], got {t.min_lr_ratio}")
    for key in ("beta1", "beta2"):
        need(0.0 <= getattr(t, key) < 1.0, f"training.{key}", f"must be in [0, 1), got {getattr(t, key)}")
    need(
        t.checkpoint_every_minutes > 0,
        "training.checkpoint_every_minutes",
        f"must be positive, got {t.checkpoint_every_minutes}",
    )
    need(
        t.peak_flops is None or (t.peak_flops > 0 and math.isfinite(t.peak_flops)),
        "training.peak_flops",
        f"must be positive (FLOP/s of one device, e.g. 312e12) or null, got {t.peak_flops}",
    )
    need(
        t.scorecard_origins >= 0,
        "training.scorecard_origins",
        f"must be zero (off) or positive, got {t.scorecard_origins}",
    )
    need(t.scorecard_samples >= 2, "training.scorecard_samples", f"must be at least 2, got {t.scorecard_samples}")
    need(
        t.scorecard_budget >= 1,
        "training.scorecard_budget",
        f"must be at least 1 (asset, origin) forecast, got {t.scorecard_budget}",
    )
    freeze = re.fullmatch(r"all_but_last_(\d+)", t.freeze)
    need(
        t.freeze in ("none", "embeddings") or freeze is not None,
        "training.freeze",
        f"= {t.freeze!r} is not one of 'none', 'embeddings', 'all_but_last_N' (e.g. all_but_last_2)",
    )
    need(
        freeze is None or 1 <= int(freeze.group(1)) <= m.num_layers,
        "training.freeze",
        f"= {t.freeze!r}: N must be from 1 to model.num_layers ({m.num_layers})",
    )
    need(
        m.size is None or not t.init_from,
        "model.size",
        "= 'auto' cannot pick a shape for a fine-tuning run (training.init_from): it keeps its parent's; "
        "set model.size=null",
    )
    for key in ("max_steps_per_epoch", "eval_max_batches"):
        v = getattr(t, key)
        need(v is None or v > 0, f"training.{key}", f"must be positive or null, got {v}")


def check_data(d: DataConfig, m: ModelConfig, need: Need) -> None:
    _check_splits(d, m, need)
    _check_intervals(d, need)
    _check_windows_and_dates(d, need)
    _check_sources(d, need)
    _check_synthetic(d, need)
    _check_exchange_universe(d, need)


def _check_splits(d: DataConfig, m: ModelConfig, need: Need) -> None:
    for key in ("train_ratio", "val_ratio", "test_ratio"):
        v = getattr(d, key)
        need(0.0 < v < 1.0, f"data.{key}", f"must be between 0 and 1, got {v}")
    need(0.0 < d.train_fraction <= 1.0, "data.train_fraction", f"must be > 0 and <= 1, got {d.train_fraction}")
    total = d.train_ratio + d.val_ratio + d.test_ratio
    need(
        abs(total - 1.0) < 1e-6, "data.train_ratio", f"+ data.val_ratio + data.test_ratio must sum to 1, got {total:g}"
    )
    need(
        d.purge_gap is None or d.purge_gap >= m.context_length,
        "data.purge_gap",
        f"({d.purge_gap}) must be at least model.context_length ({m.context_length}) so no training "
        "window overlaps a val or test window",
    )


def _check_intervals(d: DataConfig, need: Need) -> None:
    if d.intervals:
        need(
            len(d.intervals) >= 2 and len(set(d.intervals)) == len(d.intervals),
            "data.intervals",
            f"must list at least two different intervals, got {d.intervals} (one interval: set data.interval "
            "and leave data.intervals empty)",
        )
        need(
            d.interval == d.intervals[0],
            "data.interval",
            f"({d.interval!r}) must be data.intervals' first entry ({d.intervals[0]!r}): the run's default "
            "interval for forecast, scorecard and export",
        )
        need(
            d.source != "files",
            "data.intervals",
            "works with data.source 'sample', 'download' or 'synthetic'; "
            "your own files hold one interval: train one run per interval, or leave data.intervals empty",
        )
    need(
        bool(d.intervals) or d.interval_split == "pooled",
        "data.interval_split",
        "is read only with data.intervals (several intervals in one model): remove it",
    )


def _check_windows_and_dates(d: DataConfig, need: Need) -> None:
    need(d.window_stride > 0, "data.window_stride", f"must be positive, got {d.window_stride}")
    need(d.epoch_stride > 0, "data.epoch_stride", f"must be positive, got {d.epoch_stride}")
    need(
        d.start_date == START_MAX or _is_date(d.start_date),
        "data.start_date",
        f'= {d.start_date!r} is not a date like 2015-01-31 (or "{START_MAX}": each asset\'s whole history)',
    )
    if d.end_date is not None:
        need(_is_date(d.end_date), "data.end_date", f"= {d.end_date!r} is not a date like 2015-01-31")
    need(
        d.end_date is None or d.start_date == START_MAX or d.end_date > d.start_date,
        "data.end_date",
        "must come after data.start_date",
    )


def _check_sources(d: DataConfig, need: Need) -> None:
    need(bool(d.universe), "data.universe", "must name the universe file")
    need(
        d.source != "files" or bool(d.files_dir),
        "data.files_dir",
        "must name a folder of candle files (or one file with a symbol column) when data.source = 'files'",
    )

    if d.universe == "files":
        need(d.source == "files", "data.universe", "= 'files' needs data.source = 'files'")
        need(
            d.default_category in CATEGORIES,
            "data.default_category",
            f"= {d.default_category!r} must be one of {', '.join(CATEGORIES)} when data.universe = 'files' "
            "(every file becomes an asset of that category)",
        )
    need(
        d.quote_currency is None or _is_code(d.quote_currency),
        "data.quote_currency",
        f"= {d.quote_currency!r} is not a currency code like USD or USDT (or null)",
    )
    for cat, n in d.universe_counts.items():
        need(n > 0, f"data.universe_counts.{cat}", f"must be positive, got {n}")
    for cat in d.categories:
        need(
            cat in CATEGORIES,
            "data.categories",
            f"names unknown category {cat!r}; expected some of {', '.join(CATEGORIES)}",
        )


def _is_code(text: str) -> bool:
    """A currency or coin code as exchanges write it: USD, USDT, 1INCH."""
    return text.isalnum() and text.isupper() and 2 <= len(text) <= 10


def _check_exchange_universe(d: DataConfig, need: Need) -> None:
    """data.universe = "exchange" and its filters, data.exchange_universe (read only then)."""
    f, key = d.exchange_universe, "data.exchange_universe"
    if d.universe != "exchange":  # the filters would be silently ignored
        need(
            f == type(f)(),
            key,
            f"is read only with data.universe = 'exchange' (here {d.universe!r}): "
            "remove it, or set data.universe to 'exchange'",
        )
        return
    need(
        d.source == "download",
        "data.universe",
        f"= 'exchange' needs data.source = 'download' "
        f"(here {d.source!r}): the pairs are resolved and fetched by `marketgpt data download`",
    )
    need(
        not d.universe_counts,
        "data.universe_counts",
        "must be {} with data.universe = 'exchange': "
        "the number of pairs is what the filters leave (cap it with data.exchange_universe.max_count)",
    )
    need(
        d.quote_currency is None or d.quote_currency == f.quote,
        "data.quote_currency",
        f"= {d.quote_currency!r} differs from {key}.quote ({f.quote!r}); leave it null: the resolved pairs "
        "are fetched as they are listed",
    )
    need(_is_code(f.quote), f"{key}.quote", f"= {f.quote!r} is not a currency code like USDT or USD")
    need(
        math.isfinite(f.min_quote_volume) and f.min_quote_volume >= 0,
        f"{key}.min_quote_volume",
        f"must be zero or positive (average daily volume in {f.quote}, e.g. 1e6), got {f.min_quote_volume}",
    )
    need(
        1 <= f.volume_days <= 365,
        f"{key}.volume_days",
        f"must be from 1 to 365 (days of daily candles the volume is averaged over), got {f.volume_days}",
    )
    need(
        f.max_count is None or f.max_count >= 1,
        f"{key}.max_count",
        f"must be at least 1, or null for every pair that passes, got {f.max_count}",
    )
    need(
        f.spot_only,
        f"{key}.spot_only",
        "must be true: the download loads an exchange's spot markets only "
        "(common/data/crypto.py), so futures and swaps can't be fetched",
    )
    for base in f.exclude_bases:
        need(_is_code(base), f"{key}.exclude_bases", f"lists {base!r}, which is not a coin code like USDC")


def _check_synthetic(d: DataConfig, need: Need) -> None:
    """data.synthetic: the spec's own checks with data.source = "synthetic", nothing otherwise."""
    if d.source != "synthetic":  # it would be silently ignored
        need(
            not d.synthetic,
            "data.synthetic",
            f"is read only with data.source = 'synthetic' (here {d.source!r}): "
            "remove it, or --set data.source=synthetic",
        )
        return
    need(
        d.start_date != START_MAX,
        "data.start_date",
        f"= {START_MAX!r} has no first slot for the synthetic market: "
        "set a date like 2020-01-01 with data.source = 'synthetic'",
    )
    for key, instead in (("interval", "data.interval"), ("start", "data.start_date")):
        need(
            key not in d.synthetic,
            f"data.synthetic.{key}",
            f"is not read: the synthetic market's {key} is {instead}; set that instead",
        )
    try:
        spec_from_dict(d.synthetic, {"interval": d.interval, "start": d.start_date})
    except SyntheticSpecError as e:
        need(False, f"data.synthetic.{e.key}", e.why)


def _is_date(value: str) -> bool:
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


def check_tokenizer(tok: TokenizerConfig, m: ModelConfig, need: Need) -> None:
    """Also fills in model.move_bins and model.shape_bins for the factorized head when null."""
    need(tok.shape_bins >= 1, "tokenizer.shape_bins", f"must be at least 1, got {tok.shape_bins}")
    most = (m.vocab_size - NUM_SPECIAL_TOKENS) // tok.shape_bins
    need(
        tok.ret_bins is None or 2 <= tok.ret_bins <= most,
        "tokenizer.ret_bins",
        f"must be null or from 2 to {most} (what model.vocab_size {m.vocab_size} holds with "
        f"{tok.shape_bins} shape bins), got {tok.ret_bins}",
    )
    if m.head == "factorized":  # the head reads the tokenizer's grid: recorded in config.json
        ret_bins = tok.ret_bins or most
        if m.move_bins is None and m.shape_bins is None:
            m.move_bins, m.shape_bins = ret_bins, tok.shape_bins
        need(
            (m.move_bins, m.shape_bins) == (ret_bins, tok.shape_bins),
            "model.move_bins",
            f"and model.shape_bins ({m.move_bins}, {m.shape_bins}) must match the tokenizer's "
            f"({ret_bins}, {tok.shape_bins}); leave them null",
        )
    need(tok.vol_halflife > 0, "tokenizer.vol_halflife", f"must be positive, got {tok.vol_halflife}")
    need(tok.vol_warmup >= 1, "tokenizer.vol_warmup", f"must be at least 1, got {tok.vol_warmup}")


def check_slurm(s: SlurmConfig, need: Need) -> None:
    for key in ("nodes", "gpus_per_node", "cpus_per_task", "mem_gb"):
        need(getattr(s, key) > 0, f"slurm.{key}", f"must be positive, got {getattr(s, key)}")
    need(bool(s.partition), "slurm.partition", "must name a partition")
    need(s.signal_minutes_before_limit >= 0, "slurm.signal_minutes_before_limit", "must be zero or positive")
