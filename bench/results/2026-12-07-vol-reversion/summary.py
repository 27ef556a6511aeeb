"""The three seeds' test figures side by side, with each pick's gain over the raw model as a mean
over the seeds and its 95% Student-t interval: python summary.py (from this folder or the root)."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from bench_generalization import paired_interval  # noqa: E402

runs = {s: json.loads((HERE / f"revert_seed{s}.json").read_text())["runs"][0] for s in (42, 1, 2)}
for h in ("1", "5", "20"):
    rows = {s: r["horizons"][h] for s, r in runs.items()}
    gains = [row["test_chosen_vs_raw"]["value"] for row in rows.values()]
    ci = paired_interval(gains)
    print(
        f"H={h}: chosen on val {', '.join(row['chosen'] for row in rows.values())}; test CRPS gain over raw "
        f"{ci['mean']:+.2%} [{ci['ci95'][0]:+.2%}, {ci['ci95'][1]:+.2%}]"
        f" (3 seeds: {', '.join(f'{g:+.2%}' for g in gains)})"
    )
    for s, row in rows.items():
        q, cov = row["test_qlike"], row["test_coverage90"]
        c = row["chosen"]
        print(
            f"  seed {s}: 90% coverage raw {cov['s1']:.1%} -> {cov[c]:.1%} (val {row['val_coverage90'][c]:.1%}); "
            f"QLIKE raw {q['s1']:.3f} -> {q[c]:.3f}, log-HAR-range {q['log_har']:.3f}; "
            f"vs {row['test_chosen_vs_best_baseline']['baseline']} {row['test_chosen_vs_best_baseline']['value']:+.2%} "
            "[{:+.2%}, {:+.2%}]".format(*row["test_chosen_vs_best_baseline"]["ci95"])
        )
