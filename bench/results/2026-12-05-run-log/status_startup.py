"""`marketgpt status` start-up in each worktree: python status_startup.py /tmp/before /tmp/after
(12 runs each, alternating between the trees)."""

import statistics
import subprocess
import sys
import time

trees = sys.argv[1:]
times: dict[str, list[float]] = {t: [] for t in trees}
for _ in range(12):
    for t in trees:
        start = time.perf_counter()
        subprocess.run([f"{t}/.venv/bin/python", "-m", "common.cli", "status"], cwd=t, capture_output=True)
        times[t].append(time.perf_counter() - start)
for t in trees:
    print(f"{t}: median {statistics.median(times[t]):.3f} s, min {min(times[t]):.3f} s over {len(times[t])} runs")
