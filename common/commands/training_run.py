"""The run every rank of `marketgpt train` trains, made ready: opened or created, its windows
over the tokens, the checkpoint it continues from, and its model before training.

    new run:  the config's token shard (common/tokens/shards.py: reused when an earlier run or
              job prepared the same data, else prepared now: clean, split by time, tokenizer
              fit on TRAIN candles, encode each asset's whole cleaned series; tokens are causal,
              so slicing them by the split ranges is leak-free) -> a run folder with
              config.json, tokenizer.json, asset_info.json, data_info.json and tokens/ (hard
              links to the shard)
    resume:   the run folder's config.json, tokenizer.json, asset_info.json and tokens/, plus
              the checkpoint; nothing is re-read from the candle cache.

Rank 0 decides (`open_or_create`) and tells the others through the job's store; they open the
same folder (`follow_rank0`), which must sit on a filesystem every node shares.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, TextIO

import torch

from common.commands.plan import plan_of_run
from common.commands.run_size import auto_size, train_token_counts, vocabulary_line
from common.config import Config, DataConfig, ModelConfig, TrainingConfig, config_to_dict
from common.data.check import print_left_out
from common.distributed.env import DistEnv
from common.errors import UserError
from common.model.gpt import MarketGPT
from common.paths import case_dir_of_config
from common.run.checkpoint import load_checkpoint
from common.run.files import CONFIG_JSON, TOKENIZER_JSON
from common.run.folder import Run, check_writable, config_differences
from common.run.resume import new_run_dir, resolve_resume, reuse_unstarted_run
from common.tokens.corpus import Prepared, prepare_in_memory
from common.tokens.fractions import trim_train
from common.tokens.ids import RunInfo
from common.tokens.shards import prepare_shards
from common.tokens.token_set import TokenSet
from common.training.batches import TokenWindows, build_windows
from common.training.finetune import apply_freeze, check_parent_fits, init_from_parent, resolve_parent
from common.training.rng import seed_everything
from common.training.trainer import Trainer

__all__ = ["TrainingRun", "build_model", "follow_rank0", "open_or_create", "print_run_plan"]


@dataclass
class TrainingRun:
    """A run as every rank trains it: the run (its folder and the files in it, read back or just
    made), the windows over its tokens and, when it continues, the checkpoint's state."""

    run: Run
    windows: TokenWindows
    state: Optional[dict] = None  # the checkpoint resumed from; None for a new run
    model_size: Optional[dict] = None  # what model.size = "auto" chose, and why (a new run)


def open_or_create(
    cfg: Optional[Config],
    config: Optional[Path],
    overrides: Sequence[str],
    resume: Optional[str],
    device: torch.device,
    out: TextIO,
) -> tuple[TrainingRun, Optional[Path]]:
    """Rank 0's part: the run to resume and its checkpoint, or a new, prepared run folder and None."""
    run_dir = ckpt = None
    if resume is not None:
        checkpoints = case_dir_of_config(config) / "checkpoints" if config is not None else None
        run_dir, ckpt = resolve_resume(resume, checkpoints, cfg.experiment if cfg else None)
        if run_dir is None:  # only --resume auto, which needs --config
            assert cfg is not None
            print(
                f"No run of {cfg.experiment} to continue in {checkpoints} (none yet, or the newest is done "
                "or trained by another job): starting a new run",
                file=out,
            )

    if ckpt is not None:
        assert run_dir is not None  # resolve_resume returns a checkpoint with its run folder
        training = _open_run(run_dir, config, cfg, overrides, device)
        training.state = load_checkpoint(ckpt)
        if training.state.get("format") != "marketgpt-checkpoint":
            raise UserError(f"{ckpt}: not a MarketGPT training checkpoint")
        diff = config_differences(training.run.cfg, training.state["config"])
        if diff:
            raise UserError(f"{ckpt} belongs to a different config ({'; '.join(diff[:3])})")
        print(f"Resuming {run_dir} from {ckpt.name}", file=out)
        return training, ckpt

    # a new run: --config is given (a --resume RUN_FOLDER without it always has a checkpoint)
    assert cfg is not None and config is not None
    check_writable(case_dir_of_config(config) / "checkpoints")
    p = _prepare_new(cfg, case_dir_of_config(config), out)
    print_left_out(p.data_info, out)  # assets, categories or intervals the run goes without
    model_size = auto_size(cfg.model, cfg.data, p.tokens, p.info, out)  # before the model and config.json
    windows = _windows(cfg.data, cfg.model.context_length, p.tokens, p.info, device)  # before the folder: may raise
    if run_dir is not None and reuse_unstarted_run(run_dir):  # killed before its first checkpoint
        print(
            f"Nothing to resume in {run_dir} (killed before its first checkpoint): starting the run again in it",
            file=out,
        )
    else:
        if run_dir is not None:
            print(f"Nothing to resume in {run_dir} (no complete checkpoint): starting a new run", file=out)
        run_dir = new_run_dir(case_dir_of_config(config) / "checkpoints", cfg.experiment)
    run = Run.create(run_dir, cfg, p.tokenizer, p.info, p.tokens, p.data_info)
    print(f"Run folder: {run_dir}", file=out)
    return TrainingRun(run, windows, model_size=model_size), None


def follow_rank0(decision: dict, overrides: Sequence[str], device: torch.device, env: DistEnv) -> TrainingRun:
    """The other ranks' part: open the run folder rank 0 chose and load the same checkpoint."""
    if "error" in decision:
        raise UserError(decision["error"])
    run_dir = Path(decision["run_dir"])
    if not (run_dir / CONFIG_JSON).is_file():
        raise UserError(
            f"rank {env.rank} on {socket.gethostname()} cannot see the run folder {run_dir} that rank 0 "
            "made: the case folder must be on a filesystem every node of the job shares"
        )
    training = _open_run(run_dir, None, None, overrides, device)
    training.state = load_checkpoint(decision["checkpoint"]) if decision["checkpoint"] else None
    return training


def _prepare_new(cfg: Config, case: Path, out: Optional[TextIO] = None) -> Prepared:
    """The corpus of a new run: the config's token shard (prepared now, or reused), or with
    data.shards = false prepared in memory for this run alone."""

    parent = None
    if cfg.training.init_from:  # fine-tuning: checked before the data is read, so a misfit fails at once
        parent = resolve_parent(cfg.training.init_from)
        check_parent_fits(config_to_dict(cfg), parent)
    # fine-tuning: the parent's token ids, which its weights were trained on
    parent_tokenizer = parent.run_dir / TOKENIZER_JSON if parent is not None else None
    prepare = prepare_shards if cfg.data.shards else prepare_in_memory
    p = prepare(cfg, case, parent_tokenizer, out=out)
    p.tokens.ranges = trim_train(p.tokens.ranges, cfg.data.train_fraction, cfg.data.fraction_by)
    return p


def _open_run(
    run_dir: Path, config: Optional[Path], case_cfg: Optional[Config], overrides: Sequence[str], device: torch.device
) -> TrainingRun:
    """The run's own config (plus harmless --set overrides), token set and windows, tokenizer and
    asset ids; its checkpoint is the caller's to load."""

    run = Run.open(run_dir, tokens=True, model=False, overrides=overrides)
    if case_cfg is not None:
        diff = config_differences(run.cfg, case_cfg)
        if diff:
            raise UserError(
                f"{run_dir} belongs to a different config than {config} ({'; '.join(diff[:3])}); "
                "resume with the config it was started with, or start a new run without --resume"
            )
    check_writable(run_dir)
    assert run.tokens is not None  # tokens=True
    run.tokens.ranges = trim_train(run.tokens.ranges, run.cfg.data.train_fraction, run.cfg.data.fraction_by)
    return TrainingRun(run, _windows(run.cfg.data, run.cfg.model.context_length, run.tokens, run.info, device))


def _windows(d: DataConfig, T: int, tokens: TokenSet, info: RunInfo, device: torch.device) -> TokenWindows:
    """The run's windows of T (model.context_length) tokens over its token set."""
    ids, cats, intervals = info.series_ids()
    # val/test windows don't overlap (stride = context): each target is scored once, T times cheaper
    return build_windows(
        tokens.tokens,
        tokens.ranges,
        ids,
        cats,
        T,
        strides={"train": d.window_stride, "val": T, "test": T},
        device=device,
        epoch_stride=d.epoch_stride,
        features=tokens.features,
        flat=tokens.flat(),
        interval_ids=intervals if info.intervals else None,
    )


def print_run_plan(training: TrainingRun, trainer: Trainer, env: DistEnv, out: TextIO) -> None:
    """The vocabulary line and the plan of the run (windows, parameters, steps) before training starts."""
    cfg, tokens, windows = training.run.cfg, training.run.tokens, training.windows
    assert tokens is not None  # a training run holds its token set
    print(vocabulary_line(training.run.tokenizer, tokens), file=out, flush=True)
    print(
        plan_of_run(
            cfg,
            tokens.ranges,
            train_windows=windows.num_windows("train"),
            epoch_windows=windows.epoch_windows("train"),
            parameters=trainer.model.num_parameters(),
            flops_per_token=trainer.model.flops_per_token(windows.context_length),
            steps=trainer.steps_per_epoch,
            world_size=env.world_size,
        ),
        file=out,
        flush=True,
    )


def build_model(
    m: ModelConfig, t: TrainingConfig, tokens: TokenSet, info: RunInfo, state: Optional[dict], env: DistEnv
) -> tuple[MarketGPT, Optional[dict]]:
    """The model before training, and a new run's lineage (its parent, when fine-tuned, and what
    training.freeze froze; None for neither, or a resume). The RNG draws here (initial weights,
    then each rank's dropout seed) are part of what makes a run reproducible: keep their order."""
    if state is None:
        seed_everything(t.seed)  # the initial weights depend on the seed alone
    model = MarketGPT.for_run(m, info)
    lineage = None
    if state is None and t.init_from:  # a new fine-tuning run (a resume has its own weights)
        lineage = init_from_parent(model, resolve_parent(t.init_from), info)
    frozen = apply_freeze(model, t.freeze)  # before the optimizer: it takes trainable ones only
    if state is None and env.rank > 0:
        seed_everything(t.seed + 7919 * env.rank)  # each rank draws its own dropout masks
    if state is None and lineage is None and model.head is not None:
        # a new factorized head starts at the train split's unigram (a fine-tuned one keeps its parent's)
        model.head.start_at_unigram(train_token_counts(tokens, m.vocab_size))
    if state is not None or (lineage is None and not frozen):
        return model, None
    return model, dict(lineage or {}, freeze=t.freeze, frozen_parameters=frozen)
