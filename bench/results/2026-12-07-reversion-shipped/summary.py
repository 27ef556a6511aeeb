"""The three seeds' test figures side by side: the run's fitted reversion against its paths as
sampled (the same draws), as a mean over the seeds with its 95% Student-t interval, then each seed's
coverage, QLIKE and skill against the best baseline: python summary.py (from this folder or the root)."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from bench_generalization import paired_interval  # noqa: E402

runs = {s: json.loads((HERE / f"fitted_seed{s}.json").read_text())["runs"][0] for s in (42, 1, 2)}
print("tau fitted on validation: " + ", ".join(f"seed {s} {r['fitted']['tau']:g}" for s, r in runs.items()))
for h in ("1", "5", "20"):
    rows = {s: r["horizons"][h] for s, r in runs.items()}
    gains = [row["test_chosen_vs_raw"]["value"] for row in rows.values()]
    ci = paired_interval(gains)
    print(
        f"H={h}: test CRPS gain of the fitted reversion over raw {ci['mean']:+.2%} "
        f"[{ci['ci95'][0]:+.2%}, {ci['ci95'][1]:+.2%}] (3 seeds: {', '.join(f'{g:+.2%}' for g in gains)})"
    )
    for s, row in rows.items():
        q, cov, best = row["test_qlike"], row["test_coverage90"], row["test_chosen_vs_best_baseline"]
        print(
            f"  seed {s}: 90% coverage raw {cov['s1']:.1%} -> {cov['fitted']:.1%} "
            f"(val {row['val_coverage90']['fitted']:.1%}); QLIKE raw {q['s1']:.3f} -> {q['fitted']:.3f}, "
            f"log-HAR-range {q['log_har']:.3f}; vs {best['baseline']} {best['value']:+.2%} "
            "[{:+.2%}, {:+.2%}]".format(*best["ci95"])
        )
