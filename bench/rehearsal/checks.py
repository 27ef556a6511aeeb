"""The rehearsal's checks, each a pure function of the figures a stage gathered: a check's result
is {"check": name, "ok": bool, "detail": what was seen, ...its numbers}. The stages call them on
what they measured; tests/test_rehearsal_checks.py feeds each one the figures of a broken run
(the fault not injected, the fix reverted, the file left behind) and asserts that it fails."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional, Sequence

Check = dict[str, Any]

WEIGHT_ATOL = 2e-5  # tests/ddp_helpers.assert_same_run's tolerance
ARRAY_PUBLISHERS = ("array, first submission", "array, second submission", "array, resubmission")


def result(name: str, ok: bool, detail: str, **numbers: Any) -> Check:
    return {"check": name, "ok": bool(ok), "detail": detail, **numbers}


def stage_runs(stage: str, figures: Mapping[str, Any]) -> Check:
    """A stage that raised is a failed check (its later checks may never have run)."""
    error = figures.get("error")
    return result(f"the {stage} stage runs", error is None, str(error)[:500] if error else "no error")


def plan_and_check_run(plan_exit: int, check_exit: int, head: str) -> Check:
    return result(
        "plan and data check run",
        plan_exit == 0 and check_exit == 0,
        f"plan exit {plan_exit}, data check exit {check_exit}; {head}",
    )


def shard_published(shard: str, manifest: bool, leftovers: Sequence[str], resubmissions: int) -> Check:
    """The shard is there, and nothing of its preparation beside it: no `<key>.work` (a straggling
    task's cleaned candles), no `.<key>.*.publish` (a finisher's private folder)."""
    return result(
        "the array preparation ends with a shard and nothing left beside it",
        manifest and not leftovers,
        f"{shard}: manifest.json {'there' if manifest else 'missing'} after {resubmissions} resubmission(s); "
        f"left beside it: {list(leftovers) or 'nothing'}",
        leftovers=list(leftovers),
    )


def encode_task_killed(kill: Mapping[str, Any], states: Mapping[str, str]) -> Check:
    """The fault was injected: one encode task's process SIGKILLed mid-encode, gone after it, and
    the task ended FAILED (its assets then encoded by the second submission)."""
    task = kill.get("killed")
    state = states.get(task) if task else None
    ok = bool(task) and bool(kill.get("pids")) and kill.get("gone") is True and state == "FAILED"
    detail = (
        f"task {task} (pids {kill.get('pids')}) SIGKILLed after its log said {kill.get('encoded', '?')!r}; "
        f"gone after the kill: {kill.get('gone')}; the task ended {state}"
        if task
        else f"no task killed: {kill.get('why', 'no reason recorded')}"
    )
    return result("an encode task was SIGKILLed mid-encode and ended FAILED", ok, detail, killed=task, state=state)


def publisher_of(
    prepared_by: Optional[Mapping[str, Any]], submissions: Mapping[str, Sequence[str]], train_pid: int
) -> str:
    """Who published a shard, from its manifest's prepared_by: the finish job of which submission
    (their ids by name: "first", "second", "resubmission"), or the training started meanwhile."""
    if not prepared_by:
        return "unknown (no prepared_by in manifest.json)"
    job = prepared_by.get("slurm_job")
    for name, finish_jobs in submissions.items():
        if job and (job in finish_jobs or job.split("_")[0] in finish_jobs):  # a finish job of one task: ID_0
            return f"array, {name} submission" if name != "resubmission" else "array, resubmission"
    if not job and prepared_by.get("pid") == train_pid:
        return "the training started meanwhile"
    return f"unknown ({dict(prepared_by)})"


def array_published(publishers: Mapping[str, str]) -> Check:
    """The faulted path (the array with its killed task) published at least one of the shards the
    stage prepared, so the comparison with a one-process preparation tests the array's work."""
    ok = any(p in ARRAY_PUBLISHERS for p in publishers.values())
    return result(
        "the faulted array published a shard at least once",
        ok,
        "; ".join(f"{round_} round: {who}" for round_, who in publishers.items()) or "no shard published",
        publishers=dict(publishers),
    )


def train_during_prepare(returncode: Optional[int], output: str) -> Check:
    last = output.strip().splitlines()[-1] if output.strip() else ""
    return result("a training started during the preparation finishes", returncode == 0, f"exit {returncode}: {last}")


def shard_equals_single(
    exit_code: int, array: Mapping[str, str], single: Mapping[str, str], publisher: str, faulted: bool = True
) -> Check:
    """The shard the faulted array published (`faulted`; else the one the training started
    meanwhile published) holds the files of a one-process preparation, byte for byte (sha256;
    manifest.json names its own folder and inputs: compared apart)."""
    differ = sorted(k for k in set(array) | set(single) if k != "manifest.json" and array.get(k) != single.get(k))
    ok = exit_code == 0 and bool(single) and not differ and (publisher in ARRAY_PUBLISHERS or not faulted)
    return result(
        "the array's shard equals a one-process preparation"
        if faulted
        else "the shard the raced training published equals a one-process preparation",
        ok,
        f"the shard published by {publisher}: {len(single)} files by sha256, {len(differ)} differ"
        + (f": {differ[:8]}" if differ else "")
        + (f"; the one-process preparation exit {exit_code}" if exit_code else ""),
        files=len(single),
        differ=differ,
        publisher=publisher,
    )


def requeued_twice(
    state: Optional[str], exit_code: Optional[str], restarts: Optional[str], lines: Mapping[str, int], signalled: list
) -> Check:
    want = {"DDP starts": 3, "batch lines": 3, "requeues": 2, "resumes": 2, "last epoch lines": 1}
    return result(
        "the case script's job requeues twice, then finishes",
        (state, exit_code, restarts) == ("COMPLETED", "0:0", "2") and dict(lines) == want,
        f"state {state}, exit {exit_code}, restarts {restarts}, signalled at {signalled}; the log's {dict(lines)}",
    )


def weights_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> Check:
    """The requeued job's final weights against the uninterrupted run's (tensors by name)."""
    if a.keys() != b.keys() or not a:
        diff = math.inf
    else:
        diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    return result(
        "the requeued weights equal an uninterrupted run",
        diff < WEIGHT_ATOL,
        f"largest weight difference {diff:.3g} (tolerance {WEIGHT_ATOL})",
        max_weight_difference=diff,
    )


def losses_equal(mine: Sequence[Mapping[str, float]], theirs: Sequence[Mapping[str, float]]) -> Check:
    """The logged epochs of both runs: losses within 1e-5 relative, accuracies within 1e-3."""
    worst = 0.0
    for a, b in zip(mine, theirs):
        for key in ("train_loss", "val_loss"):
            worst = max(worst, abs(a[key] - b[key]) / (1e-5 * abs(b[key])))
        for key in ("train_acc", "val_acc"):
            worst = max(worst, abs(a[key] - b[key]) / 1e-3)
    epochs = ([e["epoch"] for e in mine], [e["epoch"] for e in theirs])
    return result(
        "the requeued job logged the losses of an uninterrupted run",
        bool(mine) and epochs[0] == epochs[1] and worst <= 1.0,
        f"epochs {epochs[0]} vs {epochs[1]}; largest difference {worst:.3g} of its tolerance "
        "(losses 1e-5 relative, accuracies 1e-3)",
    )


def counts_match_plan(what: str, names: Sequence[str], plan: Mapping[str, Any], seen: Mapping[str, Any]) -> Check:
    """Every interval (or category) in data_info.json with the series, candles and training
    tokens `plan` printed."""
    wrong = {n: {"plan": plan.get(n), "data_info": seen.get(n)} for n in names if plan.get(n) != seen.get(n)}
    return result(
        f"every {what} in data_info.json with plan's token counts",
        bool(plan) and bool(names) and not wrong,
        f"{len(names) - len(wrong)} of {len(names)} match" + (f"; differ: {wrong}" if wrong else ""),
    )


def tested_every(what: str, tested: Mapping[str, int], expected: Mapping[str, int], capped: bool) -> Check:
    """Every interval (or category) in test_results.json with test tokens: all of them (every
    test token but each series' first) unless the evaluation is capped."""
    wrong = [n for n in expected if not tested.get(n) or (not capped and tested.get(n) != expected[n])]
    return result(
        f"every {what} in test_results.json",
        bool(expected) and not wrong,
        f"test tokens {dict(tested)}"
        + (" (evaluation capped)" if capped else f", data_info's test candles less one a series {dict(expected)}")
        + (f"; wrong: {wrong}" if wrong else ""),
    )


def scorecard_within_budget(card: Optional[Mapping[str, Any]], error: str) -> Check:
    origins = (card or {}).get("origins", {})
    drawn = origins.get("drawn", "")
    counted = re.search(r"(\d[\d,]*) drawn", drawn)
    forecasts = int(counted.group(1).replace(",", "")) if counted else None
    return result(
        "training wrote its scorecard, within its budget",
        card is not None and forecasts is not None and forecasts <= origins.get("budget", 0),
        f"{drawn} (budget {origins.get('budget')})" if card is not None else f"no scorecard.json: {error}",
    )


def benchmark_refuses(exit_code: int, said: str) -> Check:
    """Every fixed task precedes the run's cut-off: exit 2 and one error line naming
    --after-cutoff (a model of several intervals says first, on a line of its own, that each task
    is scored at its own interval), no traceback."""
    errors = [line for line in said.splitlines() if line.startswith("marketgpt benchmark: error:")]
    return result(
        "marketgpt benchmark says the fixed tasks precede the cut-off",
        exit_code == 2 and len(errors) == 1 and "--after-cutoff" in errors[0] and "Traceback" not in said,
        f"exit {exit_code}: {(errors[0] if len(errors) == 1 else said)[:400]}",
    )


def benchmark_answers_after(
    exit_code: int, aggregate: Optional[float], excluded: Mapping[str, str], before: list, after: list, said: str
) -> Check:
    """Some fixed tasks start after the cut-off: those answered, the others left out as leaked."""
    return result(
        "marketgpt benchmark answers the fixed tasks after the cut-off, leaves out those before",
        exit_code == 0 and aggregate is not None and set(before) <= set(excluded) and not set(after) & set(excluded),
        f"exit {exit_code}, aggregate skill {aggregate}; after the cut-off {after}, before it {before}; "
        f"left out: {dict(excluded)}" + (f"; {said[-300:]}" if exit_code else ""),
    )


def benchmark_after_cutoff(exit_code: int, aggregate: Optional[float], excluded: Mapping[str, str], said: str) -> Check:
    return result(
        "marketgpt benchmark --after-cutoff answers (not n/a)",
        exit_code == 0 and aggregate is not None,
        f"exit {exit_code}, aggregate skill {aggregate}; tasks left out: {dict(excluded)}"
        + (f"; {said[-400:]}" if exit_code else ""),
    )


def status_lists(exit_code: int, stdout: str, run: str) -> Check:
    return result("marketgpt status lists the run", exit_code == 0 and bool(run) and run in stdout, f"exit {exit_code}")


def prepare_jobs_fit(records: Sequence[Mapping[str, Any]], request_mb: float) -> Check:
    """The array preparation's Slurm jobs stay within the memory they ask for: a cluster that
    enforces it (cgroups) kills a job over it; the local cluster does not, so it is checked here
    from each job's peak private memory (peak RSS where that was not sampled)."""
    jobs = [p for p in records if p.get("job") and any("submitit" in a for a in p.get("argv", []))]
    peaks = [(p.get("max_anon_mb") or p["max_rss_mb"], p) for p in jobs]
    peak, top = max(peaks, key=lambda x: x[0]) if peaks else (None, None)
    return result(
        "the preparation's Slurm jobs stay within their memory request",
        peak is not None and peak <= request_mb,
        f"{len(jobs)} job processes, the largest {peak:,.0f} MB (job {top['job']}"
        + (f"_{top['task']}" if top["task"] is not None else "")
        + f") against {request_mb:,.0f} MB asked"
        if top is not None
        else "no preparation job's record",
        peak_mb=peak,
        request_mb=request_mb,
    )
