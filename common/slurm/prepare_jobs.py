"""`marketgpt data prepare --array N`: a config's token shard prepared by four dependent Slurm jobs.

    marketgpt data prepare --config CFG [--set k=v ...] --array N [--dry-run]

The four stages of common/tokens/shard_stages.py, each a CPU job (no GPU) queued through submitit,
each starting only after the one before succeeded (`--dependency=afterok:<id>`):

    1. clean    a job array of N tasks: task i reads, cleans and gap-fills the assets i, i+N, ...
    2. fit      one job: the split from the timestamps, the tokenizer fitted on the train ranges
    3. encode   a job array of N tasks: task i encodes the assets i, i+N, ... into the token arrays
    4. finish   one job: the token folder and manifest.json published by one rename, <key>.work/ removed

A failed job cancels the ones after it (`--kill-on-invalid-dep=yes`); every stage skips what an
earlier try finished, so submitting again continues. The shard is the one `marketgpt train`
with the same config and --set reuses. Without --array (or with --array 1) `data prepare` runs
the stages in this process (common/cli/). torch stays out of this module: it is a login-node
command, and the jobs only read candles and write tokens.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, TextIO

import submitit

from common.atomic import read_json
from common.config import Config, SlurmConfig, load_config
from common.data.check import print_left_out
from common.data.loading import load_market_data
from common.distributed.scheduler import check_partition, parse_slurm_time, slurm_available
from common.errors import UserError
from common.paths import case_dir_of_config
from common.run.files import DATA_INFO_JSON
from common.slurm.submit import CLUSTER_ENV, job_environment, rel_path
from common.tokens.shard_paths import published, shard_folder, work_folder
from common.tokens.shard_stages import STAGES, prepare_stage

__all__ = ["PrepareJob", "PreparePlan", "plan_preparation", "prepare_parameters", "submit_preparation"]

# What the four jobs ask for. Preparation is single-threaded numpy/pandas work, so 2 CPUs (one
# for Python, one for parquet and numpy threads) are plenty.
PREP_CPUS = 2
# It holds one asset's candles at a time; the most any stage holds is the fit's 8 bytes a candle
# of timestamps plus 16 a train candle for the tokenizer, or with model.market_context the finish
# stage's 30 (each candle's close, move and volatility level, and its three ids): 8 GB covers some
# 200M candles with room for pandas, beyond the shipped cases (case A: 115M, 3.3 GB;
# bench/results/2026-12-05-market-memory), and still schedules on any CPU node.
PREP_MEM_GB = 8
# slurm.time, but at most a day: the training's 7 days would wait longer for a slot, and a stage
# that runs out of time keeps what it finished (submit again, or let the training job finish it).
PREP_MAX_MINUTES = 24 * 60

STAGE_WORK = {
    "clean": "read, clean and gap-fill the assets (task i takes assets i, i+N, ...)",
    "fit": "split by time, fit the tokenizer on the train split, lay out the token arrays",
    "encode": "encode the assets into the token arrays (task i takes assets i, i+N, ...)",
    "finish": "publish the shard: the token folder, the run files, manifest.json",
}


class PrepareJob:
    """What one task of one stage runs: prepare_stage for one config (picklable: only paths,
    strings and ints). `key` is the shard the submission planned; a job finding another (the
    cache or the config changed in between) stops rather than prepare half of a different one."""

    def __init__(self, config: str, overrides: Sequence[str], stage: str, task: int, tasks: int, key: str) -> None:
        self.config, self.overrides, self.stage = config, list(overrides), stage
        self.task, self.tasks, self.key = task, tasks, key

    def __repr__(self) -> str:
        return f"PrepareJob({self.stage} task {self.task} of {self.tasks}, shard {self.key})"

    def __call__(self) -> None:
        try:
            self.run()
        except UserError as e:  # as `marketgpt data prepare` reports it, then the job fails
            print(f"marketgpt data prepare: error: {e}", file=sys.stderr, flush=True)
            raise

    def run(self) -> None:
        cfg = load_config(self.config, self.overrides)
        case = case_dir_of_config(self.config)
        folder, _ = shard_folder(cfg, case)
        if folder.name != self.key:
            raise UserError(
                f"the shard's inputs changed since it was submitted (key {self.key}, now {folder.name}: "
                "a new download, or an edited config?); run `marketgpt data prepare --array N` again"
            )
        if published(folder):
            print(f"Token shards: {folder} is already prepared; nothing to do for the {self.stage} stage", flush=True)
            return
        print(f"Token shards: the {self.stage} stage, task {self.task} of {self.tasks}, for {folder}", flush=True)
        prepare_stage(cfg, case, self.stage, task=self.task, tasks=self.tasks)
        if self.stage == STAGES[-1] and published(folder):  # what the runs of this shard go without
            print_left_out(read_json(folder / DATA_INFO_JSON))


@dataclass
class PreparePlan:
    """The four jobs of a submission, checked without Slurm."""

    config: Path
    overrides: list[str]
    cfg: Config
    case: Path
    shard: Path
    tasks: int
    stages: dict[str, list[PrepareJob]] = field(default_factory=dict)  # in STAGES order

    @property
    def done(self) -> bool:
        return published(self.shard)

    @property
    def log_folder(self) -> Path:
        return self.case / "logs" / f"prepare_{self.shard.name}"


def plan_preparation(config: Path, overrides: Sequence[str] = (), tasks: int = 2) -> PreparePlan:
    """Check the config and the task count; the jobs of each stage (N for clean and encode)."""
    if tasks < 1:
        raise UserError(f"--array {tasks}: the number of tasks must be 1 or more (e.g. --array 8)")
    config = Path(config).resolve()
    cfg = load_config(config, overrides)  # missing file, unknown key, bad value: ConfigError
    if not cfg.data.shards:
        raise UserError(
            "data.shards is false: each run prepares its data in memory, so there is nothing to "
            "prepare ahead (drop --set data.shards=false, or set it true in the config)"
        )
    parse_slurm_time(cfg.slurm.time)
    case = case_dir_of_config(config)
    series = len(load_market_data(cfg.data, case).assets)  # the universe only: candles are read lazily
    if tasks > series:
        raise UserError(
            f"--array {tasks}: more tasks than the {series} series to prepare (task i takes series i, "
            f"i+N, ...; a task beyond the last would have nothing to do): use --array {series} or fewer"
        )
    shard, _ = shard_folder(cfg, case)
    plan = PreparePlan(config, list(overrides), cfg, case, shard, tasks)
    for stage in STAGES:
        n = tasks if stage in ("clean", "encode") else 1
        plan.stages[stage] = [PrepareJob(str(config), overrides, stage, i, n, shard.name) for i in range(n)]
    return plan


def prepare_parameters(s: SlurmConfig) -> dict:
    """submitit SlurmExecutor parameters of a preparation job: the config's partition, CPUs only."""
    return {
        "partition": s.partition,
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": PREP_CPUS,
        "mem": f"{PREP_MEM_GB}GB",
        "time": min(parse_slurm_time(s.time), PREP_MAX_MINUTES),
        # srun 22.05+ doesn't inherit --cpus-per-task from the allocation
        "srun_args": [f"--cpus-per-task={PREP_CPUS}"],
        # the cluster environment (module load, conda activate), as for every marketgpt job
        "setup": [
            f"source {shlex.quote(str(CLUSTER_ENV))} || exit 1",
            f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{PREP_CPUS}}}",
        ],
        # a failed stage cancels the stages after it rather than leave them pending forever
        "additional_parameters": {"kill_on_invalid_dep": "yes"},
    }


def _array_id(jobs: list) -> str:
    """The id a dependency names: an array's own id (`123` of `123_0`), or the job's."""
    return str(jobs[0].job_id).split("_")[0]


def submit_preparation(
    config: Path, overrides: Sequence[str] = (), tasks: int = 2, *, dry_run: bool = False, out: Optional[TextIO] = None
) -> dict[str, list]:
    """Submit the four stages as dependent Slurm jobs; returns stage -> its submitit jobs (one per
    task), empty when the shard exists already or for a dry run."""
    out = out or sys.stdout
    plan = plan_preparation(config, overrides, tasks)
    if plan.done:
        print(
            f"Token shards: {rel_path(plan.shard)} is already prepared; nothing to submit "
            "(`marketgpt train` with this config reuses it)",
            file=out,
            flush=True,
        )
        return {}
    if not slurm_available():
        raise UserError(
            "Slurm does not answer here (no squeue/sinfo, or slurmctld is down); run it on the "
            "cluster's login node, or prepare in this process without --array"
        )
    s = plan.cfg.slurm
    check_partition(s.partition)
    params = prepare_parameters(s)
    _print_stages(plan, params, out)
    if dry_run:
        print("Dry run: nothing submitted.", file=out, flush=True)
        return {}

    submitted = _submit_stages(plan, params)
    _print_submitted(plan, submitted, out)
    return submitted


def _print_stages(plan: PreparePlan, params: dict, out: TextIO) -> None:
    """What is about to be submitted: the shard, the resources, and each stage with what it waits for."""
    s = plan.cfg.slurm
    unfinished = work_folder(plan.shard).is_dir()
    print(
        f"{plan.case.name}: token shard {rel_path(plan.shard)} by 4 jobs to partition {s.partition}, CPU only "
        f"({PREP_CPUS} CPUs, {params['mem']}, time {params['time']} min each)"
        + ("; continuing an unfinished preparation" if unfinished else ""),
        file=out,
    )
    for n, (stage, jobs) in enumerate(plan.stages.items(), 1):
        size = f"array of {len(jobs)}" if len(jobs) > 1 else "1 job"
        after = f"after {n - 1} succeeds" if n > 1 else ""
        print(f"  {n}. {stage:<7} {size:<12} {after:<17} {STAGE_WORK[stage]}", file=out)


def _submit_stages(plan: PreparePlan, params: dict) -> dict[str, list]:
    """Submit the stages in order, each one depending on the one before it succeeding."""
    s = plan.cfg.slurm
    executor = submitit.SlurmExecutor(folder=plan.log_folder)
    submitted: dict[str, list] = {}
    previous: Optional[str] = None
    with job_environment():
        for stage, fns in plan.stages.items():
            executor.update_parameters(
                **params,
                job_name=f"{s.job_name}-{stage}",
                **({"dependency": f"afterok:{previous}"} if previous else {}),
            )
            submitted[stage] = executor.submit_array(fns) if len(fns) > 1 else [executor.submit(fns[0])]
            previous = _array_id(submitted[stage])
    return submitted


def _print_submitted(plan: PreparePlan, submitted: dict[str, list], out: TextIO) -> None:
    """Each stage's job id, the commands to follow and cancel them, and the training that reuses the shard."""
    ids = [_array_id(jobs) for jobs in submitted.values()]
    for n, (stage, jobs) in enumerate(submitted.items(), 1):
        tasks_text = f" ({len(jobs)} tasks, {ids[n - 1]}_0 ... {ids[n - 1]}_{len(jobs) - 1})" if len(jobs) > 1 else ""
        print(
            f"Submitted job {ids[n - 1]}{tasks_text}: {stage}" + (f", after job {ids[n - 2]}" if n > 1 else ""),
            file=out,
        )
    cmd = shlex.join(
        ["marketgpt", "train", "--config", rel_path(plan.config), *(a for kv in plan.overrides for a in ("--set", kv))]
    )
    print(
        f"  state:   squeue -j {','.join(ids)}\n"
        f"  logs:    {rel_path(plan.log_folder)}/<JOBID>[_<TASK>]_0_log.out (and .err)\n"
        f"  cancel:  scancel {' '.join(ids)}\n"
        f"A failed job cancels the jobs after it; submitting again continues from what is finished.\n"
        f"Once job {ids[-1]} has finished, `{cmd}` reuses the shard (a training job queued now can "
        f"wait for it: sbatch --dependency=afterok:{ids[-1]} <the case's script>).",
        file=out,
        flush=True,
    )
