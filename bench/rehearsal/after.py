"""Stage 5, the run's outputs: data_info.json with plan's counts, test_results.json for every
interval and category, the scorecard training wrote, `marketgpt benchmark RUN` (refused where the
fixed tasks precede the cut-off, else the tasks after it answered), then with `--after-cutoff`,
and `marketgpt status`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from rehearsal import checks
from rehearsal.base import CASE, INTERVALS, Rehearsal, run_dirs


def _counts_by(data_info: dict, key: Callable[[str, dict], str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, a in data_info.get("assets", {}).items():
        c = out.setdefault(key(name, a), {"series": 0, "candles": 0, "train": 0, "test": 0, "test_series": 0})
        c["series"] += 1
        c["candles"] += a.get("train", 0) + a.get("val", 0) + a.get("test", 0)
        c["train"] += a.get("train", 0)
        c["test"] += a.get("test", 0)
        c["test_series"] += a.get("test", 0) > 0
    return out


_PLAN_KEYS = ("series", "candles", "train")


def check_outputs(r: Rehearsal) -> dict[str, Any]:
    """Every interval and category in data_info.json (with plan's counts) and in test_results.json
    (with test tokens); the scorecard training wrote; benchmark and status on the run."""
    (run_dir,) = run_dirs(r, "ddp")
    info = json.loads((run_dir / "data_info.json").read_text())
    results = json.loads((run_dir / "test_results.json").read_text())
    plan = r.plan
    seen = {
        "interval": _counts_by(info, lambda name, a: name.rpartition("@")[2]),
        "category": _counts_by(info, lambda name, a: a.get("category", "?")),
    }
    for what, table in (("interval", "per_interval"), ("category", "per_category")):
        want = plan.get(what, {})
        names = INTERVALS if what == "interval" else sorted(want) or r.stages["corpus"].get("categories", [])
        got = {n: {k: c[k] for k in _PLAN_KEYS} for n, c in seen[what].items()}
        r.check(checks.counts_match_plan(what, names, want, got))
        # every test token but each series' first is scored, when nothing caps the evaluation
        tested = {n: _tested(results, table, n) for n in names}
        expected = {
            n: seen[what].get(n, {}).get("test", 0) - seen[what].get(n, {}).get("test_series", 0) for n in names
        }
        r.check(checks.tested_every(what, tested, expected, r.size.eval_batches is not None))
    card = run_dir / "scorecard.json"
    r.check(
        checks.scorecard_within_budget(
            json.loads(card.read_text()) if card.is_file() else None,
            results.get("scorecard_error", "no error recorded"),
        )
    )
    # where the run's cut-off (its test start) is after every fixed task's start: one line and a
    # non-zero exit, then the way out it names, a task of the same scheme on the run's own candles
    # after the cut-off; where some task starts after it (the full size's data since 2005), those
    # are answered and the others left out as leaked
    fixed = r.cli("after", "benchmark", str(run_dir), "--samples", "20", "--no-leaderboard", "--json")
    said = fixed.stderr.strip()
    before, after = _fixed_tasks_around(run_dir)
    if not after:
        r.check(checks.benchmark_refuses(fixed.returncode, said))
    else:
        aggregate, excluded = _benchmark_answer(fixed.stdout)
        r.check(checks.benchmark_answers_after(fixed.returncode, aggregate, excluded, before, after, said))
    budget = str(r.size.benchmark_budget)
    bench = r.cli("after", "benchmark", str(run_dir), "--after-cutoff", "--samples", "20", "--budget", budget, "--json")
    aggregate, excluded = _benchmark_answer(bench.stdout)
    r.check(checks.benchmark_after_cutoff(bench.returncode, aggregate, excluded, bench.stderr.strip()))
    status = r.cli("after", "status", "--case", CASE)
    r.check(checks.status_lists(status.returncode, status.stdout, run_dir.name))
    return {"run": run_dir.name, "benchmark_exit": bench.returncode, "status_exit": status.returncode}


def _fixed_tasks_around(run_dir: Path) -> tuple[list[str], list[str]]:
    """The fixed benchmark tasks at the run's intervals that start before its data cut-off, and
    those that start at or after it."""
    import pandas as pd

    from common.evaluation.benchmark_tasks import choose_tasks, data_cutoff

    cutoff = data_cutoff(run_dir)
    tasks = [t for t in choose_tasks(None) if t.interval in INTERVALS]  # each scored at its own interval
    start = lambda t: pd.Timestamp(t.start, tz="UTC")  # noqa: E731
    return (
        [t.name for t in tasks if cutoff is None or start(t) < cutoff],
        [t.name for t in tasks if cutoff is not None and start(t) >= cutoff],
    )


def _tested(results: dict, table: str, name: str) -> int:
    """Test tokens of one interval, or of one category over every interval, in test_results.json."""
    intervals = results.get("per_interval") or {}
    if table == "per_interval":
        return intervals.get(name, {}).get("num_tokens", 0)
    return sum(
        (r.get("per_category") or {}).get(name, {}).get("num_tokens", 0) for r in (intervals or {"": results}).values()
    )


def _benchmark_answer(text: str) -> tuple[Optional[float], dict[str, str]]:
    """The benchmark's aggregate skill (None: n/a) and the tasks it left out, with why."""
    try:
        aggregate = json.loads(text[text.index("{") :])["aggregate"]
    except (ValueError, KeyError):
        return None, {"*": "no JSON result"}
    return aggregate.get("value"), aggregate.get("excluded", {})
