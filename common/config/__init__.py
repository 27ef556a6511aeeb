"""Case configs: typed dataclasses loaded from JSON with strict checking.

A case file holds the sections `model`, `training`, `data` (values as in the seed guide) and
the sections the code needs (`tokenizer`, `slurm`), plus `experiment`. Anything missing takes
the default below; anything unknown, mistyped or impossible is a `ConfigError` that names the
file and the key. Command-line overrides (`--set training.batch_size=16`) are parsed to the
field's type with `json.loads` (never eval) and checked the same way (common.config.typed_json).

The package: this file (the dataclasses, `load_config`, `save_config`), checks.py (the value
checks), synthetic.py (the synthetic market's settings, data.synthetic), typed_json.py (JSON to
typed dataclasses, `--set`), reference.py (docs/config_reference.md,
rendered from the dataclasses below and their comments).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence, cast

from common.atomic import atomic_write_json
from common.config.checks import check_data, check_model, check_slurm, check_tokenizer, check_training
from common.config.typed_json import ConfigError, apply_overrides, build_dataclass, parse_overrides

__all__ = [
    "Config",
    "ConfigError",
    "DataConfig",
    "ExchangeUniverseConfig",
    "ModelConfig",
    "SlurmConfig",
    "TokenizerConfig",
    "TrainingConfig",
    "at_interval",
    "build_dataclass",
    "config_to_dict",
    "load_config",
    "parse_overrides",
    "save_config",
]


@dataclass
class ModelConfig:
    vocab_size: int = 1024  # token ids, special tokens included
    context_length: int = 128  # candles (tokens) a window holds
    d_model: int = 256  # width of the residual stream
    num_layers: int = 6  # transformer blocks
    num_heads: int = 8  # attention heads; d_model must be divisible by it
    d_ff: int = 1024  # hidden width of each block's MLP
    dropout: float = 0.1  # dropout on the embeddings and each residual branch's output (none in attention)
    asset_embed_dim: int = 32  # size of the per-asset embedding that conditions the model
    category_embed_dim: int = 16  # size of the per-category embedding (stocks, crypto, ...)
    # "learned" absolute positions (GPT-2) or "rope" rotary embeddings in attention; the case configs
    # set "rope" (it pays at 10^6 training tokens), the default keeps old runs loading as they trained
    positional: Literal["learned", "rope"] = "learned"
    bias: bool = False  # biases in the linear layers and LayerNorms
    # the recipe's options (bench/bench_recipe.py measures each against the defaults):
    # "layer" LayerNorm (GPT-2) or "rms" RMSNorm (no mean subtraction, no bias), in every block and at the end
    norm: Literal["layer", "rms"] = "layer"
    # RMS-normalize each head's queries and keys before attention (QK-norm): bounded attention logits
    qk_norm: bool = False
    # "gelu": d_model -> d_ff -> d_model; "swiglu": gated, its hidden width 2/3 of d_ff rounded up to a
    # multiple of 8 (three matrices of that width hold about the parameters of gelu's two)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    # add the candle's own time to the token embedding (common/tokens/features.py): hour + weekday
    # intraday, month + weekday daily; off in the case configs
    time_features: bool = False
    # add the candle's volume bin to the token embedding (common/tokens/features.py): volume / its
    # EWMA, quantile edges fitted on train; off in the case configs
    volume_input: bool = False
    # add the candle's volatility level to the token embedding (common/tokens/features.py):
    # log(tokenizer sigma / its slow EWMA), fixed bins; off in the case configs
    vol_level_input: bool = False
    # add what the rest of the market did to the token embedding (common/tokens/market_context.py):
    # the mean move, dispersion and volatility level of every series of the interval, as of the
    # candle's close; forecasts need the other assets' candles too. On in the case configs (it pays at
    # 10^6 training tokens), off in the quickstart and by default (old runs load as they trained)
    market_context: bool = False
    # with market_context (not read without it), also the last move of the asset's peer: the other
    # series of its interval whose last move best predicts its next on the training candles
    # (common/tokens/market_context.py, fitted when the shard is prepared, kept in asset_info.json);
    # the pairwise lead-lag a summary misses. On in the case configs (it pays at 10^6 training tokens)
    market_peer: bool = False
    # with market_context, the share of training windows whose last 1 to 20 (gpt.MARKET_MASK_SPAN)
    # positions have their market ids hidden (id 0, "unknown"), so the model also learns to forecast
    # with the future market unknown, as a sampled path's is (a forecast's market_future = "unknown");
    # 0: every position reads its market
    market_mask: float = 0.0
    # output head (common/model/heads.py): "flat" softmax over the vocabulary, or "factorized"
    # p(move bin) * p(shape bin | move bin). Both give a distribution over all vocab_size ids.
    head: Literal["flat", "factorized"] = "flat"
    # move bins of the token grid the factorized head reads; null: filled in from the tokenizer section
    move_bins: Optional[int] = None
    shape_bins: Optional[int] = None  # shape bins of that grid; null: tokenizer.shape_bins
    # "auto": d_model, num_layers, num_heads and d_ff chosen when a new run starts, for its training
    # candles, by the scaling fit of model.size_fit (common/model/scaling_fit.py; docs/scaling.md) and
    # recorded in training_log.json (model_size); null: the shape as written
    size: Optional[Literal["auto"]] = None
    # the fit model.size = "auto" reads: a sweep.json of `marketgpt sweep` on this corpus (same
    # vocabulary and interval), relative to the working directory; null: none (auto is refused)
    size_fit: Optional[str] = None

    @property
    def reads_features(self) -> bool:
        """Whether the model reads per-candle ids besides its tokens (common/tokens/features.py)."""
        return self.time_features or self.volume_input or self.vol_level_input or self.market_context

    @property
    def reads_peer(self) -> bool:
        """Whether the model reads its asset's peer (model.market_peer, a part of the market context)."""
        return self.market_context and self.market_peer


@dataclass
class TrainingConfig:
    batch_size: int = 32  # windows per batch, per GPU (per process)
    learning_rate: float = 3e-4  # peak AdamW learning rate, reached after warmup_steps
    epochs: int = 100  # the most epochs a run trains
    early_stopping_patience: int = 10  # epochs without a better val loss; 0 turns it off
    gradient_clip: float = 1.0  # max global grad norm; 0 turns clipping off
    weight_decay: float = 0.1  # AdamW weight decay, on matrices and embeddings only
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    warmup_steps: int = 500  # optimizer steps of linear warmup before the cosine decay
    min_lr_ratio: float = 0.1  # cosine decays to learning_rate * min_lr_ratio
    # "adamw", or "muon": the blocks' weight matrices step by Muon (orthogonalized momentum) at
    # muon_lr, scheduled alike, the rest by AdamW (common/training/muon.py; bench/bench_recipe.py)
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_lr: float = 0.02  # Muon's peak learning rate (training.optimizer = "muon" only)
    grad_accum_steps: int = 1  # batches whose gradients add up to one optimizer step
    compile: bool = False  # torch.compile, CUDA only
    # torch.compile's mode: "auto" replays CUDA graphs ("reduce-overhead") on one GPU and uses
    # "default" under DDP or gradient checkpointing (common.distributed.precision.choose_compile_mode)
    compile_mode: Literal["auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "auto"
    # on a GPU, read each step's loss sums while the next step runs (no host wait in the step; a
    # signal or a non-finite loss is then served one step later); false reads each step at once
    overlap_host: bool = True
    # "auto": the GPU when the job has one (a job given GPUs that torch cannot use stops with
    # the cause), else the CPU; "cuda": a GPU or stop; "cpu": the CPU even where GPUs are
    device: Literal["auto", "cuda", "cpu"] = "auto"
    # "auto": bf16 autocast on GPUs that support it (Ampere+), fp16 + GradScaler on older ones
    # (V100, T4), fp32 on the CPU; "fp32" uses TF32 matmuls on Ampere+. Weights stay fp32.
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    gradient_checkpointing: bool = False  # recompute each block in backward: less activation memory
    seed: int = 42  # random seed of the run: initial weights, window order, dropout
    keep_checkpoints: int = 3  # checkpoint_epoch_N.pt files kept
    checkpoint_every_minutes: float = 30.0  # timer checkpoint inside long epochs
    max_steps_per_epoch: Optional[int] = None  # cap an epoch (quick runs, tests)
    eval_max_batches: Optional[int] = None  # cap val/test batches (quick runs, tests)
    log_every_steps: int = 50  # plain progress line in batch logs
    # fit the volatility reversion on the validation split at the end of training (reversion.json:
    # every forecast of the run pulls its spread toward the asset's long-run level, tau chosen by
    # CRPS; common.forecasting.reversion); false: the paths as sampled
    vol_reversion: bool = True
    # end-of-training scorecard (common.evaluation.final_scorecard), horizons 1, 5, 20: origin dates evenly
    # spaced over the test split; 0 turns it off
    scorecard_origins: int = 20
    scorecard_samples: int = 100  # sampled paths per origin of the end-of-training scorecard
    # at most this many (asset, origin) forecasts: a larger universe draws assets per origin date
    # (docs/scorecard.md#the-end-of-training-scorecard), so the cost does not grow with it
    scorecard_budget: int = 400
    # fine-tuning (common/training/finetune.py): a parent run folder or checkpoint whose weights and
    # tokenizer a new run starts from (`--init-from`); null: train from scratch
    init_from: Optional[str] = None
    # "none" | "embeddings" | "all_but_last_N": parameters that get no gradient (nor weight decay)
    freeze: str = "none"
    # peak FLOP/s of one device, for the MFU in training_log.json; null: the card's bf16 peak
    # when it is known (A100: 312e12), else no MFU (on a CPU, state the peak you measured)
    peak_flops: Optional[float] = None
    # where the scalars go (common/training/trackers.py): "tensorboard" (run_dir/tensorboard), or the
    # optional "wandb" (offline, run_dir/wandb) or "mlflow" (file store run_dir/mlruns); none uses a network
    tracker: Literal["tensorboard", "wandb", "mlflow"] = "tensorboard"


@dataclass
class ExchangeUniverseConfig:
    """The filters of data.universe = "exchange" (common/data/exchange_universe.py): which of
    data.exchange's pairs `marketgpt data download` writes to a dated universe file."""

    quote: str = "USDT"  # pairs quoted in this currency
    # average daily quote volume (in `quote`) over the volume_days complete days before the download
    min_quote_volume: float = 1e6
    volume_days: int = 30  # complete days before the download that min_quote_volume averages over
    max_count: Optional[int] = 200  # the most liquid pairs kept; null: all that pass
    spot_only: bool = True  # the download loads spot markets only, so this must stay true
    active_only: bool = True  # leave out pairs the exchange lists as halted or delisted
    exclude_bases: List[str] = field(default_factory=list)  # base currencies left out, e.g. ["USDC", "FDUSD"]


Interval = Literal["1m", "5m", "15m", "30m", "1h", "4h", "1d"]  # the keys of common.markets.INTERVAL_SECONDS


@dataclass
class DataConfig:
    # share of the candles in the training split; the split is by time, its cut dates shared by all assets
    train_ratio: float = 0.70
    val_ratio: float = 0.15  # share in the validation split, after the training split
    test_ratio: float = 0.15  # share in the test split, the last; the three ratios sum to 1
    # "sample": the real OHLCV sample shipped in the package (no network);
    # "download": the case universe fetched by `marketgpt data download` into the cache;
    # "files": your own CSV or parquet candles in data.files_dir (common/data/files.py);
    # "synthetic": the synthetic market of data.synthetic (common/data/synthetic.py), made as it is read.
    source: Literal["sample", "download", "files", "synthetic"] = "download"
    # the universe file, relative to the case folder; "files" (with data.source = "files"): every file is an asset;
    # "exchange": data.exchange's pairs that pass data.exchange_universe, resolved by `marketgpt data
    # download` into a dated file universe_exchange_<exchange>_<YYYY-MM-DD>.csv (the newest is used)
    universe: str = "universe.csv"
    # data.source = "files": a folder of per-symbol files or one long file; case-relative
    files_dir: Optional[str] = None
    default_category: Optional[str] = None  # category of every asset when data.universe = "files"
    interval: Interval = "1d"  # the candles' length
    # several intervals in one model, e.g. ["1h", "1d"]: each asset is a series per interval, windows
    # never mix them and an interval embedding tells the model which one it reads; the first is
    # data.interval (the default of forecast, scorecard and export --interval). []: data.interval alone
    intervals: List[Interval] = field(default_factory=list)
    # with data.intervals: "pooled" splits every series at the same instants (no interval's training
    # candles overlap another's test period); "per_interval" splits each interval's series on their
    # own dates, as a one-interval run would (the same test splits; an asset's coarse training
    # candles may then cover its fine test period: docs/data.md#several-intervals). A split that
    # leaves an interval without training, validation or test windows is refused (common.data.prepare)
    interval_split: Literal["pooled", "per_interval"] = "pooled"
    start_date: str = "2005-01-01"  # first date, or "max": each asset's whole history (config.checks.START_MAX)
    end_date: Optional[str] = None  # last date; null: up to now
    exchange: str = "binance"  # ccxt exchange for crypto assets
    # quote currency to fetch on that exchange in place of the universe's (BTC/USDT -> BTC/USD on
    # bitstamp or coinbase); null: the universe symbols as written
    quote_currency: Optional[str] = None
    cache_dir: str = "data"  # the candle cache, relative to the case folder
    purge_gap: Optional[int] = None  # candles between splits; null: model.context_length
    window_stride: int = 1  # start-to-start distance of training windows
    # a training epoch takes every k-th window of each asset from a random offset per epoch
    # (common/training/batches.py): with stride-1 windows an epoch otherwise shows each candle
    # context_length times; 1 keeps every window in every epoch
    epoch_stride: int = 1
    # train on this share of the training split (0 < f <= 1), on the same token shard; validation and
    # test keep every asset. `marketgpt sweep` sets it per point (common/tokens/fractions.py)
    train_fraction: float = 1.0
    # how data.train_fraction cuts: the first assets in symbol order ("assets") or the latest
    # candles of each asset ("time")
    fraction_by: Literal["assets", "time"] = "assets"
    # assets per category the universe file must hold, e.g. {"crypto": 20}; {} skips the check
    universe_counts: Dict[str, int] = field(default_factory=dict)
    # prepare the corpus once into memory-mapped token shards in data.cache_dir/shards/, reused by
    # every run, rank and resumed job with the same data (common/tokens/shards.py); false: in memory
    # for each run (a read-only data cache), written to the run folder alone
    shards: bool = True
    # train on these categories of the universe only, e.g. ["crypto"] (--set data.categories=crypto);
    # [] keeps every category
    categories: List[str] = field(default_factory=list)
    # data.source = "synthetic": common.config.synthetic.SyntheticSpec's settings but interval and start
    # (data.interval, data.start_date), e.g. {"assets": 50, "candles": 20000, "categories": ["crypto"]};
    # {} takes the spec's defaults
    synthetic: Dict[str, Any] = field(default_factory=dict)
    # the filters that pick data.exchange's pairs when data.universe = "exchange" (read only then)
    exchange_universe: ExchangeUniverseConfig = field(default_factory=ExchangeUniverseConfig)

    def run_intervals(self) -> list[str]:
        """The intervals the run trains on, the first being its default: data.intervals or [data.interval]."""
        return list(self.intervals) or [self.interval]


VolEstimator = Literal["close", "range"]  # what the tokenizer's volatility EWMA averages


@dataclass
class TokenizerConfig:
    shape_bins: int = 8  # candle-shape bins; return bins fill the rest of the vocabulary
    # move (return) bins; null: as many as fill the vocabulary. Fewer bins for small data sets:
    # the vocabulary keeps its size and the ids past the last bin are never emitted.
    ret_bins: Optional[int] = None
    vol_halflife: float = 20.0  # EWMA half-life (candles) of the volatility that scales moves
    vol_warmup: int = 20  # candles before the volatility estimate counts as warm
    # what that EWMA averages: "close" the squared log-close moves, "range" each candle's
    # Parkinson variance of its true range (common/tokens/volatility.py)
    vol_estimator: VolEstimator = "close"


@dataclass
class SlurmConfig:
    partition: str = "long"  # Slurm partition the job is submitted to
    nodes: int = 1  # nodes of the job
    gpus_per_node: int = 2  # GPUs per node, one task (DDP rank) each
    gpu_type: str = "a100"  # GPU type in the job's --gres=gpu:<type>:<n>
    cpus_per_task: int = 32  # CPU cores per task
    mem_gb: int = 128  # memory per node, in GB
    time: str = "7-00:00:00"  # the job's time limit, as Slurm writes it (D-HH:MM:SS)
    job_name: str = "marketgpt"  # Slurm job name
    log_prefix: str = "marketgpt"  # the job's log is logs/<log_prefix>_<JOBID>.out
    signal_minutes_before_limit: int = 10  # USR2 this long before the time limit: checkpoint and requeue


@dataclass
class Config:
    experiment: str = "marketgpt"  # the run-folder prefix: run folders are <experiment>_YYYYMMDD_HHMMSS
    model: ModelConfig = field(default_factory=ModelConfig)  # the transformer's shape and inputs
    training: TrainingConfig = field(default_factory=TrainingConfig)  # optimizer, schedule, checkpoints, scorecard
    data: DataConfig = field(default_factory=DataConfig)  # which candles, from where, and how they split
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)  # how candles become tokens
    slurm: SlurmConfig = field(default_factory=SlurmConfig)  # the job `marketgpt submit` asks Slurm for


# --------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Load a case config, apply `key=value` overrides, and check everything."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read config ({e.strerror})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a JSON object")
    cfg = build_dataclass(Config, raw, where, prefix="")
    apply_overrides(cfg, overrides, where)
    validate(cfg, where)
    return cfg


# --------------------------------------------------------------------------- checks


def validate(cfg: Config, where: str) -> None:
    """Impossible values, each reported with its key and the reason (common/config/checks.py)."""

    def need(ok: bool, key: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: '{key}' {why}")

    check_model(cfg.model, cfg.tokenizer, need)
    check_training(cfg.training, cfg.model, need)
    check_data(cfg.data, cfg.model, need)
    check_tokenizer(cfg.tokenizer, cfg.model, need)
    check_slurm(cfg.slurm, need)
    need(
        bool(cfg.experiment) and "/" not in cfg.experiment,
        "experiment",
        f"must be a non-empty name without '/', got {cfg.experiment!r}",
    )


def at_interval(d: DataConfig, interval: str) -> DataConfig:
    """The one-interval view of a run's data at one of its intervals (data.interval = interval, no
    data.intervals): what reads that interval's candles (download, plan, one series' load)."""
    view = copy.deepcopy(d)
    view.interval, view.intervals = cast(Interval, interval), []  # one of the run's intervals
    return view


# --------------------------------------------------------------------------- saving


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the fully resolved config (every default filled in), atomically."""
    atomic_write_json(path, config_to_dict(cfg))
