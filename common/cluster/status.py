"""`marketgpt status`: one table of every run under case_*/checkpoints.

    CASE           RUN                              JOB  SLURM    STATUS   EPOCH  BEST VAL  LAST VAL  SCORE  TOK/S  PEAK MEM   ETA    LAST LOG LINE
    case_c_crypto  crypto_prototype_20250106_091500  812  RUNNING  running  12/50  2.412     2.430     -      41.2k  35.1/34.8G 3h 5m  epoch 13/50 ...

Everything comes from the run folders (training_log.json, config.json, scorecard.json: SCORE is
its headline, the CRPS skill against the best baseline at H=1) and the job's log file; the
Slurm state comes from `squeue`, matched through the job id the run recorded in
training_log.json (`slurm_job_id`). Without Slurm the SLURM column shows "-". A run trained by a
direct launch (`marketgpt remote`, launcher direct; its log file is <prefix>_direct-<ID>.out)
shows the launch id as its JOB, and is "lost" once that launch's supervisor is gone without an
exit code (common.cluster.direct_launch checks its pid and start time), "failed" or "stopped"
once it ended so. A case's jobs that are queued but have no run folder yet get a row of their own.
"""  # noqa: E501 (the example lines are as wide as the table the command prints)

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from common.atomic import read_json_or_empty
from common.cluster.direct_launch import launch_of_log, log_tail, recorded_state
from common.distributed.gpu_health import health_report
from common.distributed.scheduler import ACTIVE_STATES, job_commands, job_states, slurm_available
from common.evaluation.result_lines import BASELINE_NAMES
from common.paths import CASES, REPO_ROOT, case_dir
from common.run.files import CONFIG_JSON, SCORECARD_JSON, TRAINING_LOG_JSON
from common.run.log import RunLog, format_duration

__all__ = ["RunRow", "collect_rows", "last_line", "status_json", "status_table", "sweep_lines"]

_LINE_WIDTH = 80


@dataclass
class RunRow:
    case: str
    run: str
    job: str = "-"
    slurm: str = "-"
    status: str = "-"
    epoch: str = "-"
    best_val: str = "-"
    last_val: str = "-"
    score: str = "-"  # scorecard.json's headline, e.g. "-0.4% GARCH"
    tokens_per_sec: str = "-"
    peak_mem: str = "-"  # each GPU's peak memory in the last epoch ("-" on the CPU)
    eta: str = "-"
    last_log_line: str = ""
    numbers: dict = field(default_factory=dict)  # the same, unformatted: `status --json` (not a column)


_HEADERS = (
    "CASE",
    "RUN",
    "JOB",
    "SLURM",
    "STATUS",
    "EPOCH",
    "BEST VAL",
    "LAST VAL",
    "SCORE",
    "TOK/S",
    "PEAK MEM",
    "ETA",
    "LAST LOG LINE",
)


def last_line(path: Optional[Path], width: int = _LINE_WIDTH) -> str:
    """The last non-empty line of a (possibly large, growing) log file, shortened to `width`."""
    if path is None:
        return ""
    # submitit's own INFO/WARNING lines say little about the training: show the trainer's
    lines = [line.strip() for line in log_tail(path, 8192) if not line.startswith("submitit ")]
    if not lines:
        return ""
    text = lines[-1]
    return text if len(text) <= width else text[: width - 3] + "..."


def _num(value: Any, fmt: str = "{:.3f}") -> str:
    return "-" if not isinstance(value, (int, float)) else fmt.format(value)


def _tokens(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value / 1e6:.1f}M" if value >= 1e6 else f"{value / 1e3:.1f}k" if value >= 1e3 else f"{value:.0f}"


def _peak_memory(gpus: Any) -> str:
    """'35.1G' for one GPU, '35.1/34.8G' per GPU for a few, 'max 35.1G x16' for many."""
    found = [g.get("mem_peak_gb") for g in gpus or [] if isinstance(g, dict)]
    peaks = [p for p in found if isinstance(p, (int, float))]
    if not peaks:
        return "-"
    if len(peaks) > 4:
        return f"max {max(peaks):.1f}G x{len(peaks)}"
    return "/".join(f"{p:.1f}" for p in peaks) + "G"


def _score(headline: Any) -> str:
    """'+2.1% GARCH': the headline CRPS skill and the baseline it is measured against."""
    if not isinstance(headline, dict) or not isinstance(headline.get("value"), (int, float)):
        return "-"
    name = str(headline.get("baseline"))
    return f"{100 * headline['value']:+.1f}% {BASELINE_NAMES.get(name, name)}"


def _log_file(case: Path, run_cfg: dict, log: RunLog) -> Optional[Path]:
    if log.log_file:
        return Path(log.log_file)
    job = log.slurm_job_id
    prefix = run_cfg.get("slurm", {}).get("log_prefix")
    if job and prefix:
        return case / "logs" / f"{prefix}_{job}.out"
    return None


def _run_row(case: Path, run_dir: Path, states: dict[str, str], slurm_on: bool) -> RunRow:
    log = RunLog.read(run_dir)
    run_cfg = read_json_or_empty(run_dir / CONFIG_JSON)
    row = RunRow(case=case.name, run=run_dir.name)
    job = log.slurm_job_id
    state = states.get(str(job)) if job else None
    alive = state in ACTIVE_STATES
    if job:
        row.job, row.slurm = str(job), state or "-"
    status = log.status
    launch = None if job else launch_of_log(log.log_file or "")
    if launch:
        row.job = launch
    if status is None:
        row.status = "starting" if alive else "no log"
    elif status == "running" and slurm_on and job and not alive:
        # its job is gone: the run stopped at its last checkpoint (a resubmit continues it)
        row.status = "interrupted" if log.interrupted else "stopped"
    elif status == "running" and launch:
        row.status = _direct_status(case, launch, log)
    else:
        row.status = status
    epochs = log.epochs
    total = run_cfg.get("training", {}).get("epochs")
    done = epochs[-1].get("epoch", len(epochs)) if epochs else 0
    row.epoch = f"{done}/{total}" if total else str(done)
    row.best_val = _num(log.best_val_loss)
    if epochs:
        last = epochs[-1]
        row.last_val = _num(last.get("val_loss"))
        row.tokens_per_sec = _tokens(last.get("tokens_per_sec"))
        row.peak_mem = _peak_memory(last.get("gpus"))
        if row.status == "running" and isinstance(last.get("eta_s"), (int, float)):
            row.eta = format_duration(last["eta_s"])
    headline = read_json_or_empty(run_dir / SCORECARD_JSON).get("headline")
    row.score = _score(headline)
    row.last_log_line = last_line(_log_file(case, run_cfg, log))
    last = epochs[-1] if epochs else {}
    row.numbers = {
        "epoch": done,
        "epochs": total,
        "step": last.get("step"),
        "best_val_loss": log.best_val_loss,
        "val_loss": last.get("val_loss"),
        "tokens_per_sec": last.get("tokens_per_sec"),
        "eta_s": last.get("eta_s") if row.status == "running" else None,
        "gpus": last.get("gpus"),
        "scorecard_headline": headline,
    }
    return row


def _direct_status(case: Path, launch: str, log: RunLog) -> str:
    """A "running" run of a direct launch, as that launch stands: still running, or "lost" (its
    supervisor is gone without an exit code), "failed", or stopped at its last checkpoint."""
    state = recorded_state(str(case), launch)
    if state in (None, "RUNNING"):  # None: no record of the launch here (a run fetched from the box)
        return "running"
    if state in ("LOST", "FAILED"):
        return state.lower()
    return "interrupted" if log.interrupted else "stopped"


def _queued_without_run(case: Path, commands: dict[str, str], states: dict[str, str], seen: set[str]) -> list[RunRow]:
    """This case's active jobs (their batch script lies in the case folder: slurm_scripts/, or
    logs/submitit/ for `marketgpt submit`) that no run records yet."""
    rows = []
    for job, command in sorted(commands.items(), key=lambda kv: kv[0].zfill(20)):
        if command.startswith(f"{case}/") and job not in seen and states.get(job) in ACTIVE_STATES:
            rows.append(
                RunRow(
                    case=case.name,
                    run="(no run folder yet)",
                    job=job,
                    slurm=states[job],
                    status="queued" if states[job] == "PENDING" else "starting",
                )
            )
    return rows


def collect_rows(case: Optional[str] = None, root: Optional[Path] = None) -> list[RunRow]:
    root = root or REPO_ROOT
    cases = [case_dir(case, root)] if case else [root / c for c in CASES if (root / c).is_dir()]
    states: dict[str, str] = {}
    commands: dict[str, str] = {}
    runs = {
        folder: sorted(
            p
            for p in (folder / "checkpoints").glob("*")
            if p.is_dir() and ((p / CONFIG_JSON).is_file() or (p / TRAINING_LOG_JSON).is_file())
        )
        for folder in cases
    }
    slurm_on = slurm_available()
    if slurm_on:  # ask only about this user's jobs and the jobs the runs recorded
        commands = job_commands()
        recorded = {str(RunLog.read(r).slurm_job_id) for rs in runs.values() for r in rs}
        states = job_states(sorted((recorded - {"None"}) | set(commands)))
    rows = []
    for folder in cases:
        case_rows = [_run_row(folder, run, states, slurm_on) for run in runs[folder]]
        seen = {r.job for r in case_rows}
        rows += case_rows + _queued_without_run(folder.resolve(), commands, states, seen)
    return rows


def sweep_lines(case: Optional[str] = None, root: Optional[Path] = None) -> list[str]:
    """Each sweep under case_*/sweeps (`marketgpt sweep`): its points, finished or not. A point's
    file appears when it finishes, so this is current while the sweep.json a task writes may lag
    (the fit of `plan --fit` and model.size_fit is likewise rebuilt from the point files)."""
    root = root or REPO_ROOT
    cases = [case_dir(case, root)] if case else [root / c for c in CASES if (root / c).is_dir()]
    lines = []
    for folder in cases:
        for doc_path in sorted((folder / "sweeps").glob("*/sweep.json")):
            doc = read_json_or_empty(doc_path)
            grid = doc.get("grid") or []
            done = {p.stem: read_json_or_empty(p) for p in (doc_path.parent / "points").glob("*.json")}
            finished = len(set(grid) & set(done))
            lines.append(f"sweep {doc_path.parent.name} ({folder.name}): {finished} of {len(grid)} points finished")
            for name in grid:
                r = done.get(name)
                lines.append(
                    f"  {name:<16} "
                    + (
                        f"val loss {_num(r.get('best_val_loss'))} (fitted), test loss {_num(r.get('test_loss'))}, "
                        f"{r.get('train_tokens', 0):,} tokens, "
                        f"{r.get('parameters', 0):,} params"
                        + (" (still improving)" if r.get("still_improving") else "")
                        if r is not None
                        else "not finished"
                    )
                )
    return lines


def status_json(case: Optional[str] = None, root: Optional[Path] = None) -> dict[str, Any]:
    """`marketgpt status --json`: this machine's GPUs (common.distributed.gpu_health) and every run,
    its Slurm job and state with the numbers of its last epoch, unformatted."""
    runs = [
        {
            "case": r.case,
            "run": r.run,
            "job": None if r.job == "-" else r.job,
            "slurm_state": None if r.slurm == "-" else r.slurm,
            "status": r.status,
            **r.numbers,
            "last_log_line": r.last_log_line,
        }
        for r in collect_rows(case, root)
    ]
    return health_report(runs=runs)


def status_table(case: Optional[str] = None, root: Optional[Path] = None) -> str:
    sweeps = sweep_lines(case, root)
    rows = collect_rows(case, root)
    if not rows:
        where = case_dir(case, root or REPO_ROOT) if case else "case_*"
        return "\n".join(
            [f"No runs under {where}/checkpoints yet (start one: sbatch case_X/slurm_scripts/train_*_a100.sh)", *sweeps]
        )
    columns = [f.name for f in fields(RunRow)][: len(_HEADERS)]
    cells = [list(_HEADERS)] + [[str(getattr(r, name)) for name in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_HEADERS) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in cells]
    return "\n".join([*(line.rstrip() for line in lines), *sweeps])
