"""The whole training_log.json of two runs, as users' jq reads it: python compare_log.py RUN_A RUN_B.
Prints one line; exits 1 unless both logs have the same keys in the same order, at every level,
and the same values but for wall time and its rates, the start time and the run folder's name."""

import json
import sys
from pathlib import Path

VOLATILE = {"tokens_per_sec", "elapsed_s", "eta_s", "mfu", "time_s", "wall_s", "started_at", "run"}


def shape(value):
    """Keys in order at every level, values but the volatile ones."""
    if isinstance(value, dict):
        return [(k, None if k in VOLATILE else shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(v) for v in value]
    return value


if __name__ == "__main__":
    a, b = (json.loads((Path(p) / "training_log.json").read_text()) for p in sys.argv[1:3])
    same = shape(a) == shape(b)
    print(f"training_log.json keys in order and values but for timings: {'yes' if same else 'NO'}")
    sys.exit(0 if same else 1)
