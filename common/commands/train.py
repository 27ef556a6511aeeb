"""`marketgpt train`: parse, build (the run, its data and model), train, finish.

    config -> the run (common/commands/training_run.py: opened, or created from the config's
    token shard) -> model -> Trainer -> on rank 0, the best model on the test split:
    scorecard.json/.png (training.scorecard_*), report.png, test_results.json -> only then the
    log's status says finished.

--resume auto (needs --config): the newest `<experiment>_*` run folder in the case's
checkpoints/, from its newest checkpoint whose CRC32s hold (a corrupted one is skipped with
a warning); a run that trained to the end but lacks a final output resumes with nothing left
to train and only writes the outputs. With no run, a newest run that is done (finished with
its outputs, or failed) or one another live Slurm job trains, a new run starts, so a Slurm
script can always pass it; a newest run killed before its first checkpoint is started over in
its own folder (run.resume.reuse_unstarted_run). A requeued Slurm job continues its own run
(run.resume.auto_resume_run). --resume PATH: a run folder or one checkpoint file; --config
is then optional. Either way the case config (with --set) must describe the same run as the
run folder's config.json, except the keys in run.folder.HARMLESS_ON_RESUME (epochs, patience,
checkpoint timer, logging, eval cap, slurm), which --set may change.

Multi-GPU (one process per GPU, started by srun or torchrun): every rank runs this command.
Rank 0 alone decides the run folder (a new one, or the one --resume picks), prepares it and
tells the others through the job's store; they open the same folder (so it must sit on a
filesystem every node shares) and load the same checkpoint. All ranks train together; rank 0
alone scores the best model on the test split at the end. --num-gpus N must match the job's
processes per node.

Exit codes: 0 done (finished or early-stopped), 2 a user error (one line on stderr, e.g. a
NaN loss: status "failed" in training_log.json, or another rank failed), 75 saved and stopped
on SIGTERM/SIGUSR2 (requeue and run the same command with --resume auto).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence, TextIO

from common.commands.training_run import TrainingRun, build_model, follow_rank0, open_or_create, print_run_plan
from common.config import load_config
from common.distributed.ddp import MultiGPUWrapper, init_distributed, shutdown
from common.distributed.env import DistEnv, check_gpus_usable, check_num_gpus, detect_env
from common.distributed.job_store import failures_reported, share_from_main
from common.distributed.scheduler import job_metadata
from common.errors import UserError
from common.evaluation.evaluate import evaluate_best
from common.evaluation.final_scorecard import end_of_training_reversion, end_of_training_scorecard
from common.evaluation.result_lines import summarize_results
from common.run.files import TRAINING_LOG_JSON
from common.training.finetune import record_lineage
from common.training.trainer import EXIT_REQUEUE, Trainer

__all__ = ["TrainingFailed", "run_training"]


class TrainingFailed(UserError):
    """Training stopped on a non-finite loss; training_log.json has status "failed"."""


def run_training(
    config: Optional[Path],
    overrides: Sequence[str] = (),
    resume: Optional[str] = None,
    *,
    out: Optional[TextIO] = None,
    stop_after_steps: Optional[int] = None,
    num_gpus: Optional[int] = None,
) -> int:
    """The `marketgpt train` command; returns the exit code (UserError for user faults)."""
    out = out or sys.stdout  # looked up now, so a redirected stdout is honoured
    env = detect_env()
    check_num_gpus(num_gpus, env)  # a wrong layout fails at once, alike on every rank
    if config is None and resume in (None, "auto"):
        raise UserError(
            "--config is required (with --resume auto too: it names the case and experiment); "
            "only --resume RUN_FOLDER works without it"
        )
    cfg = load_config(config, overrides) if config is not None else None
    device_setting = cfg.training.device if cfg is not None else "auto"
    check_gpus_usable(env, num_gpus, device_setting)  # never train on the CPU by accident
    env, device = init_distributed(env, device_setting=device_setting)
    with failures_reported():
        if env.is_main:
            try:
                training, ckpt = open_or_create(cfg, config, overrides, resume, device, out)
            except UserError as e:
                share_from_main("run", {"error": str(e)})  # the other ranks stop with the same message
                raise
            share_from_main("run", {"run_dir": str(training.run.path), "checkpoint": str(ckpt) if ckpt else None})
        else:
            training = follow_rank0(share_from_main("run"), overrides, device, env)
        code = _train_and_test(training, out, stop_after_steps, env)
    shutdown()
    return code


def _train_and_test(training: TrainingRun, out: TextIO, stop_after_steps: Optional[int], env: DistEnv) -> int:
    """Build the model (or take the checkpoint's), train it, and on rank 0 write the final outputs."""
    run, windows, state = training.run, training.windows, training.state
    cfg, run_dir, tokens = run.cfg, run.path, run.tokens
    assert tokens is not None  # a training run holds its token set
    model, lineage = build_model(cfg.model, cfg.training, tokens, run.info, state, env)
    device = windows.device
    wrapped = MultiGPUWrapper(model, env=env, device=device)  # DDP when the job has several ranks
    trainer = Trainer(
        cfg.training,
        wrapped,
        windows,
        run,
        device=device,
        rank=env.rank,
        world_size=env.world_size,
        out=out,
        job=job_metadata(),
    )
    if env.is_main:
        print_run_plan(training, trainer, env, out)
    if state is None:
        if lineage is not None and env.is_main:
            record_lineage(run_dir, lineage)
        trainer.start_run(env.launcher, lineage, training.model_size)
    else:
        try:
            trainer.load_state_dict(state)
        except RuntimeError as e:  # state_dict shapes that don't fit the model
            raise UserError(f"the checkpoint does not fit this model ({str(e).splitlines()[0]})") from None

    def final_outputs(status: str) -> None:
        # rank 0 alone scores the best model on the test split, before the log says the run is done;
        # the scorecard first, so test_results.json (with its error, if any) stays the last output
        errors = {
            "reversion_error": end_of_training_reversion(cfg.training, run_dir, device, out=out),
            "scorecard_error": end_of_training_scorecard(cfg.training, run_dir, device, out=out),
        }
        results = evaluate_best(run, device, status=status, extra={k: v for k, v in errors.items() if v} or None)
        print(summarize_results(run_dir, results), file=out, flush=True)

    try:
        status = trainer.train(stop_after_steps=stop_after_steps, final_outputs=final_outputs)
    except OSError as e:
        raise UserError(f"cannot write to the run folder {run_dir} ({e.strerror or e})") from None

    if status == "failed":
        raise TrainingFailed(f"{trainer.log.error} (see {run_dir / TRAINING_LOG_JSON})")
    if status == "interrupted":
        return EXIT_REQUEUE
    return 0
