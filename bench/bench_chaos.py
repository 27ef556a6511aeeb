"""Twenty faults in one job, nothing lost: bench/rehearsal/chaos.py on the local 2-node Slurm.

    tools/local_slurm/local_slurm.sh start --nodes 2
    python bench/bench_chaos.py [--faults 20] [--seed 0] [--json PATH]

The rehearsal's reduced corpus (600 assets, 1d and 1h) prepared in one process, then case A's
script on 2 nodes x 2 ranks for 12,000 steps with `faults` faults (each kind as often, at random
steps), then the same job again without a fault, its reference. Prints each fault's overhead (from the
fault to the first step after it), split into the time until the job stopped (a node loss waits
for Slurm to notice) and the requeue (from that stop to the first step), and the checks; the
JSON holds them all. Exits 0 whatever the
checks say: it reports (bench/results/<date>-chaos).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info  # noqa: E402  (puts the repo on sys.path)

from rehearsal import chaos  # noqa: E402
from rehearsal.base import CONFIG, Rehearsal, overrides, sets  # noqa: E402
from rehearsal.corpus import write_corpus  # noqa: E402


def main(argv: Optional[list[str]] = None) -> int:
    from common.distributed.scheduler import slurm_available

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (corpus, runs, logs)")
    args = ap.parse_args(argv)
    if not slurm_available():
        print("Slurm does not answer: start the local cluster first (tools/local_slurm/local_slurm.sh start --nodes 2)")
        return 1
    root = Path(tempfile.mkdtemp(prefix="chaos_"))
    t0 = time.monotonic()
    try:
        r = Rehearsal(root, "reduced")
        r.stage("corpus", lambda: write_corpus(r))
        r.stage(
            "prepare",
            lambda: {
                "exit": r.cli("prepare", "data", "prepare", "--config", CONFIG, *sets(overrides(r.size))).returncode
            },
        )
        r.stage("chaos", lambda: chaos.run_chaos(r, args.faults, args.seed))
        r.stage("reference", lambda: chaos.reference(r))
        if r.jobs:
            subprocess.run(["scancel", *r.jobs], env=r.env, timeout=60)
        figures = r.stages.get("chaos", {})
        overheads = figures.get("overheads_s", [])
        report = {
            "name": "chaos",
            "faults": args.faults,
            "seed": args.seed,
            "seconds": round(time.monotonic() - t0, 1),
            "stages": r.stages,
            "checks": r.checks,
            "overhead_s": {
                "max": max(overheads, default=None),
                "median": sorted(overheads)[len(overheads) // 2] if overheads else None,
                "by_kind": {
                    k: [f["overhead_s"] for f in figures.get("faults", []) if f["kind"] == k] for k in chaos.KINDS
                },
            },
            "requeue_s": {  # from the job's own stop to its first step after
                k: [f["requeue_s"] for f in figures.get("faults", []) if f["kind"] == k] for k in chaos.KINDS
            },
            "figures": {
                "faults": len(overheads),
                "max overhead s": max(overheads, default=None),
                "max requeue s": max((f["requeue_s"] or 0 for f in figures.get("faults", [])), default=None),
            },
            "machine": machine_info(),
        }
        for c in r.checks:
            print(f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['check']}: {c['detail']}")
        print(
            f"{len(overheads)} faults, overhead max {report['overhead_s']['max']} s, "
            f"median {report['overhead_s']['median']} s"
        )
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    finally:
        if args.keep:
            print(f"scratch: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
