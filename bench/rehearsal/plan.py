"""Stage 2: `marketgpt plan` and `marketgpt data check` of case A's config with data.intervals
["1d", "1h"] (per-interval splits) and a tiny model through --set, on all the data."""

from __future__ import annotations

import re
from typing import Any

from rehearsal import checks
from rehearsal.base import CASE, CONFIG, Rehearsal, overrides, sets

_COUNT_ROW = re.compile(r"^\s{4}(\S+)\s+(\d[\d,]*) series\s+(\d[\d,]*) candles\s+(\d[\d,]*) train", re.M)


def plan_counts(text: str) -> dict[str, dict[str, dict[str, int]]]:
    """plan's 'per interval' and 'per category' tables: name -> series, candles (= tokens), train."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for block in ("per interval", "per category"):
        start = text.find(f"  {block}:")
        if start < 0:
            continue
        end = text.find("\n  per ", start + 1)
        rows = _COUNT_ROW.findall(text[start : end if end > 0 else None])
        out[block.split()[1]] = {
            name: {"series": _int(s), "candles": _int(c), "train": _int(t)} for name, s, c, t in rows
        }
    return out


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def plan_and_check(r: Rehearsal) -> dict[str, Any]:
    plan = r.cli("plan", "plan", "--config", CONFIG, *sets(overrides(r.size)))
    check = r.cli("plan", "data", "check", "--case", CASE, "--config", CONFIG, *sets(overrides(r.size)))
    r.plan = plan_counts(plan.stdout)
    head = plan.stdout.splitlines()[0] if plan.stdout else ""
    r.check(checks.plan_and_check_run(plan.returncode, check.returncode, head))
    return {
        "plan_exit": plan.returncode,
        "check_exit": check.returncode,
        "plan_first_line": head,
        "plan_counts": r.plan,
    }
