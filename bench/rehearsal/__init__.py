"""A rehearsal of case A's real job at full data size, on the local Slurm cluster (tools/local_slurm),
driven as a user drives it, with faults injected on the way:

    python bench/rehearsal [--size reduced|medium|full] [--json PATH] [--keep] [--root DIR]

A stage a module:
1. corpus          case A's universe (600 assets) as a synthetic market, 1h and 1d candles, in the
                   download cache's layout. full: 115M candles; medium: 10.5M; reduced: 1.26M.
2. plan            `marketgpt plan` and `marketgpt data check` of case A's config with data.intervals
                   ["1d", "1h"] (per-interval splits) and a tiny model through --set.
3. prepare         `marketgpt data prepare --array 8` on Slurm, submitted twice, one encode task
                   SIGKILLed while it runs, a `marketgpt train` started meanwhile; resubmitted until the
                   shard is there. Who published it is read from its manifest (prepared_by); where the
                   training won, the faulted array runs again alone, so it publishes at least once.
   prepare_single  a one-process `data prepare` of the same candles, the reference the array's shard
                   (and the raced one) must equal byte for byte.
4. train           the case script with --nodes=2 (2 ranks each, gloo on the CPU), forced to requeue
                   twice, against one uninterrupted process training the same global batch.
5. after           data_info.json and test_results.json against plan, the scorecard, `marketgpt
                   benchmark RUN` (then `--after-cutoff`; `--budget 200` at the reduced size) and `marketgpt status`.
checks.py holds every check as a pure function of what a stage measured (tests/test_rehearsal_checks.py
breaks each one); report.py runs the stages and writes the report; base.py is what they share.

Every Python process of the rehearsal (Slurm array tasks and DDP ranks included) records its peak
RSS, its peak private memory (RssAnon, sampled every 50 ms) and bytes read when it exits, through a
sitecustomize.py on its PYTHONPATH; a process killed by a signal leaves no record. The JSON report
holds the sizes, each stage's time and processes, and the checks (each pass or fail with its
numbers). Exits 0 whatever the checks say: it reports, it does not gate (tests/test_rehearsal.py does).
"""

from rehearsal.base import NODES, SIZES, TASKS_PER_NODE
from rehearsal.report import main, print_report, run

__all__ = ["NODES", "SIZES", "TASKS_PER_NODE", "main", "print_report", "run"]
