"""How much a baseline's mean test CRPS moves with its draws alone: the scorecard's test origins of
one run (every 5th date, 200 samples, horizons 1/5/20), three sampling baselines scored at four
seeds of their draws; each seed's mean CRPS relative to the four seeds' mean, and their standard
deviation. Usage (from the repo root): python bench/results/2026-12-06-pool/draw_noise.py RUN_DIR"""

import sys
from pathlib import Path

import numpy as np

from common.evaluation.asset_series import fit_price_baselines, series_from_run
from common.evaluation.walk_forward import all_origins, forecast_all, origin_indices

series, interval = series_from_run(Path(sys.argv[1]))
baselines = {k: v for k, v in fit_price_baselines(series, interval).items() if k in ("bootstrap", "garch", "log_har")}
origins, _ = origin_indices(series, stride=5)
o = all_origins(series, origins, (1, 5, 20))
means: dict = {}
for seed in range(4):
    st, _ = forecast_all(series, o, baselines, (1, 5, 20), 200, seed, lambda m: None)
    for h in (1, 5, 20):
        for name in baselines:
            means.setdefault((h, name), []).append(float(np.mean(st[h][name]["crps"])))
print(f"{len(o.index)} test origins, 200 samples, draws' seeds 0-3")
for (h, name), v in means.items():
    rel = np.array(v) / np.mean(v) - 1
    print(f"H={h:<2} {name:9} {' '.join(f'{x:+.2%}' for x in rel)}   sd {rel.std(ddof=1):.2%}")
