"""Per seed and long-run window: the tau validation would choose with that window, its mean
validation CRPS skill over the paths as sampled (1, 5, 20 steps), and on test its 90% coverage and
QLIKE at 5 and 20 steps. Reads long_run_seed*.json (bench_spread.py --long-run)."""

import json
from pathlib import Path

here = Path(__file__).parent
for path in sorted(here.glob("long_run_seed*.json")):
    (run,) = json.loads(path.read_text())["runs"]
    lr = run["long_run"]
    print(f"{path.stem}: val chooses {lr['chosen']}; at the library's 500 {lr['chosen_500']}")
    for window in lr["grid"]:
        names = [n for n in lr["val_score"] if n.endswith(f"_lr{window}")]
        best = max(names, key=lr["val_score"].__getitem__)
        h5, h20 = run["horizons"]["5"], run["horizons"]["20"]
        print(
            f"  window {window:>4}: {best:<14} val {lr['val_score'][best]:+.3%}; test coverage H=5 "
            f"{h5['test_coverage90'][best]:.1%}, H=20 {h20['test_coverage90'][best]:.1%}; QLIKE H=5 "
            f"{h5['test_qlike'][best]:.3f}, H=20 {h20['test_qlike'][best]:.3f}"
        )
    for h, r in run["horizons"].items():
        s = r["test_chosen_vs_500"]
        lo, hi = s["ci95"]
        print(f"  H={h}: test CRPS, val's choice vs the best at 500: {s['value']:+.2%} [{lo:+.2%}, {hi:+.2%}]")
