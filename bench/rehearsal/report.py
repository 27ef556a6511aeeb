"""The report: every stage in turn, each stage's processes (their peak memory and reads), the
checks; printed, and written as JSON. The command line (`python bench/rehearsal`) is main()."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from rehearsal import checks
from rehearsal.after import check_outputs
from rehearsal.base import SIZES, Rehearsal
from rehearsal.corpus import write_corpus
from rehearsal.plan import plan_and_check
from rehearsal.prepare import prepare_on_slurm
from rehearsal.prepare_single import prepare_in_one_process
from rehearsal.train import reference_run, train_under_slurm

DESCRIPTION = "A rehearsal of case A's real job at full data size, on the local Slurm cluster, with faults injected."


def summarize(processes: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per stage: the processes, the largest peak RSS (and whose), the bytes read."""
    out = {}
    for stage, records in processes.items():
        top = max(records, key=lambda p: p["max_rss_mb"])
        anon = max(records, key=lambda p: p.get("max_anon_mb") or 0)
        out[stage] = {
            "processes": len(records),
            "max_rss_mb": top["max_rss_mb"],
            "max_rss_process": _who(top),
            "max_anon_mb": anon.get("max_anon_mb"),
            "max_anon_process": _who(anon),
            "read_bytes": sum(p["read_bytes"] or 0 for p in records),
            "rchar": sum(p["rchar"] or 0 for p in records),
        }
    return out


def _who(p: dict[str, Any]) -> str:
    """`cli train`, `submitit job 12_3`, `cli train job 48 rank 2`: which process a record is."""
    argv = p["argv"]
    what = (
        "submitit"
        if any("submitit" in a for a in argv)
        else "cli " + " ".join(a for a in argv[1:3] if not a.startswith("-"))
    )
    job = (f" job {p['job']}" + (f"_{p['task']}" if p["task"] else "")) if p["job"] else ""
    rank = f" rank {p['rank']}" if p["rank"] and "train" in argv else ""
    return f"{what}{job}{rank}"


def run(size: str, root: Path) -> dict[str, Any]:
    """Every stage in turn (a stage that breaks is reported and the next one still runs)."""
    r = Rehearsal(root, size)
    t0 = time.monotonic()
    r.stage("corpus", lambda: write_corpus(r))
    corpus = r.stages["corpus"]
    if "error" not in corpus:
        print(f"    {corpus['candles']:,} candles, {corpus['bytes_on_disk'] / 1e6:,.0f} MB on disk", flush=True)
    r.stage("plan", lambda: plan_and_check(r))
    r.stage("prepare", lambda: prepare_on_slurm(r))
    r.stage("prepare_single", lambda: prepare_in_one_process(r))
    r.stage("train_slurm", lambda: train_under_slurm(r))
    r.stage("reference", lambda: reference_run(r))
    r.stage("after", lambda: check_outputs(r))
    if r.jobs:  # a stage that broke may have left its jobs behind
        subprocess.run(["scancel", *r.jobs], env=r.env, timeout=60)
    for name, figures in r.stages.items():  # a stage that broke is a failed check too
        if "error" in figures:
            r.check(checks.stage_runs(name, figures))
    processes = r.processes()
    for name, summary in summarize(processes).items():
        r.stages.setdefault(name, {})["rusage"] = summary
    from common.slurm.prepare_jobs import PREP_MEM_GB  # the request the array's jobs make

    r.check(checks.prepare_jobs_fit(processes.get("prepare", []), PREP_MEM_GB * 1024))
    return {
        "name": "rehearsal",
        "size": size,
        "root": str(root),
        "seconds": round(time.monotonic() - t0, 1),
        "stages": r.stages,
        "commands": r.commands,
        "checks": r.checks,
        "passed": sum(c["ok"] for c in r.checks),
        "failed": [c["check"] for c in r.checks if not c["ok"]],
        "processes": processes,
        "outputs": r.outputs,
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"\nRehearsal ({report['size']}): {report['seconds']} s")
    for name, s in report["stages"].items():
        u = s.get("rusage")
        rss = (
            (
                f"peak RSS {u['max_rss_mb']:,.0f} MB ({u['max_rss_process']}), "
                + (f"private {u['max_anon_mb']:,.0f} MB ({u['max_anon_process']}), " if u.get("max_anon_mb") else "")
                + f"{u['processes']} processes, "
                f"{u['read_bytes'] / 1e6:,.0f} MB read from disk"
                + (f", {u['rchar'] / 1e6:,.0f} MB read in all" if u["rchar"] is not None else "")
            )
            if u
            else ""
        )
        print(f"  {name:<15} {s.get('seconds', 0):>7.1f} s  {rss}")
    for c in report["commands"]:
        print(f"    {c['command']:<40} {c['seconds']:>7.1f} s  exit {c['exit']}")
    for c in report["checks"]:
        print(f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['check']}: {c['detail'][:300]}")
    print(f"{report['passed']} of {len(report['checks'])} checks pass")


def main(argv: Optional[list[str]] = None) -> int:
    from common.distributed.scheduler import slurm_available

    ap = argparse.ArgumentParser(prog="python bench/rehearsal", description=DESCRIPTION)
    ap.add_argument("--size", choices=list(SIZES), default="reduced")
    ap.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write the report here (default: rehearsal_SIZE.json in the temp folder)",
    )
    ap.add_argument("--root", type=Path, default=None, help="the scratch folder (default: a new temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (corpus, shards, runs, logs)")
    args = ap.parse_args(argv)
    if not slurm_available():
        print("Slurm does not answer: start the local cluster first (tools/local_slurm/local_slurm.sh start --nodes 2)")
        return 1
    root = args.root or Path(tempfile.mkdtemp(prefix="rehearsal_"))
    try:
        report = run(args.size, root)
        print_report(report)
        path = args.json or Path(tempfile.gettempdir()) / f"rehearsal_{args.size}.json"
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"report: {path}")
    finally:
        if args.keep:
            print(f"corpus, shards, runs and logs: {root}")
        else:  # the corpus is large: never left behind
            shutil.rmtree(root, ignore_errors=True)
    return 0
