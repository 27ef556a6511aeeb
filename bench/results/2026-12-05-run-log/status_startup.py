"""`marketgpt status` start-up in each worktree: python status_startup.py /tmp/before /tmp/after (12 runs each, alternating)."""

import subprocess, sys, time, statistics

trees = sys.argv[1:]
times = {t: [] for t in trees}
for i in range(12):
    for t in trees:
        s = time.perf_counter()
        subprocess.run([f"{t}/.venv/bin/python", "-m", "common.cli", "status"], cwd=t, capture_output=True)
        times[t].append(time.perf_counter() - s)
for t in trees:
    print(f"{t}: median {statistics.median(times[t]):.3f} s, min {min(times[t]):.3f} s over {len(times[t])} runs")
