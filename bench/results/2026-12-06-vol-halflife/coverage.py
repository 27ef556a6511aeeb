"""90% coverage (validation and test) and test QLIKE per horizon and seed, of the default runs
(../2026-12-06-within-bin) and each variant named on the command line by a label and its
bench_spread JSONs, `{}` standing for the seed:

    cd bench/results/2026-12-06-vol-halflife && python coverage.py hl60 "hl60_seed{}.json"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEEDS = (42, 1, 2)
DEFAULT = ("default (hl 20, close)", str(Path(__file__).parent.parent / "2026-12-06-within-bin" / "within_seed{}.json"))


def horizons(path: str) -> dict:
    with open(path) as f:
        return json.load(f)["runs"][0]["horizons"]


def main(variants: list[tuple[str, str]]) -> None:
    for label, pattern in [DEFAULT, *variants]:
        runs = [horizons(pattern.format(s)) for s in SEEDS]
        for h in ("1", "5", "20"):
            cells = [r[h] for r in runs]
            val = " / ".join(f"{100 * c['val_coverage90']['s1']:.1f}" for c in cells)
            test = " / ".join(f"{100 * c['test_coverage90']['s1']:.1f}" for c in cells)
            qlike = " / ".join(f"{c['test_qlike']['s1']:.3f}" for c in cells)
            log_har = cells[0]["test_qlike"]["log_har"]
            print(f"{label:22s} H={h:2s} val cov90 {val} | test cov90 {test} | QLIKE {qlike} (log-HAR {log_har:.3f})")


if __name__ == "__main__":
    main(list(zip(sys.argv[1::2], sys.argv[2::2])))
