"""The `marketgpt remote` actions that are more than one Remote step: status --watch, fetch, and
train (sync, submit, follow the job across requeues, fetch, check, print the results).

Each raises StepFailed naming the step that failed (common.cli prints it, exit 1).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from common.cluster.remote import Remote, StepFailed
from common.errors import UserError
from common.evaluation.result_lines import BASELINE_NAMES, format_verdict, summarize_results
from common.run.files import SCORECARD_JSON, TEST_RESULTS_JSON

__all__ = ["fetch_run", "print_results", "train_remote", "watch_status"]


def watch_status(remote: Remote, case: Optional[str], every_s: Optional[float], as_json: bool = False) -> None:
    """`marketgpt status` there (`--json`: its JSON object); with `every_s`, again every so many
    seconds until interrupted."""
    while True:
        print(remote.status(case, as_json), end="")
        if every_s is None or remote.dry_run:
            break
        time.sleep(every_s)


def fetch_run(remote: Remote, run: Optional[str], latest: bool, case: Optional[str], all_checkpoints: bool) -> None:
    """Fetch RUN (a folder name or case_X/checkpoints/NAME), or with `latest` the newest run."""
    if (run is None) == (not latest):
        raise UserError("give a RUN or --latest (not both)")
    local = remote.fetch(remote.resolve_run(run, case), all_checkpoints)
    if not remote.dry_run:
        print(f"Fetched and checked {local}")


def train_remote(
    remote: Remote,
    case: str,
    overrides: Sequence[str],
    sbatch_args: str,
    *,
    poll_s: float,
    timeout_s: Optional[float],
    all_checkpoints: bool,
) -> None:
    """Sync, submit, follow the job until it ends, fetch and check its run, print its results;
    StepFailed when the job ended other than COMPLETED (after fetching what it left)."""
    remote.sync()
    job_id, log = remote.submit(case, overrides, sbatch_args)
    if remote.dry_run:
        remote.out(
            f"(then poll the job's state (squeue, or the direct launcher's state file) and print {log} "
            "as it grows, until the job ends; then fetch its run folder)"
        )
        remote.fetch(remote.run_of_job(job_id), all_checkpoints)
        return
    state = remote.wait(job_id, log, poll_s=poll_s, timeout_s=timeout_s)
    run_rel = remote.run_of_job(job_id)
    local = remote.fetch(run_rel, all_checkpoints)
    print(f"Fetched and checked {local}")
    print_results(local)
    if state == "STOPPED":  # launcher direct: SIGTERM (`remote stop`, a preempted box) after a checkpoint
        raise StepFailed("wait", f"{job_id} stopped with a checkpoint; the same `marketgpt remote train` resumes it")
    if state not in (None, "COMPLETED"):
        raise StepFailed("wait", f"job {job_id} ended {state}; see {log} there (`marketgpt remote logs {job_id}`)")


def print_results(run_dir: Path, out: Callable[[str], None] = print) -> None:
    """The run's test results and, when it has a scorecard, its headline and verdicts."""
    results = run_dir / TEST_RESULTS_JSON
    if results.is_file():
        out(summarize_results(run_dir, json.loads(results.read_text())))
    else:
        out(f"{run_dir}: no test_results.json (the run did not finish its final evaluation)")
    card_path = run_dir / SCORECARD_JSON
    if card_path.is_file():
        card = json.loads(card_path.read_text())
        head = card.get("headline")
        if head:
            name = BASELINE_NAMES.get(head["baseline"], head["baseline"])
            out(f"Scorecard headline: {format_verdict(head['horizon'], 'CRPS', name, head)}")
        for line in card.get("verdicts", []):
            out(f"  {line}")
