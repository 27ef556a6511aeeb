"""Why the ensemble's 5-day rank IC is below every member's: the members' forecast means and
their average ranked against the realized 5-day returns on the same origins (every 2nd test
date of the default card's with 5 assets or more), 200 samples each, as the scorecard draws them.

    python bench/results/2026-12-06-within-bin/ensemble_ic.py > bench/results/2026-12-06-within-bin/ensemble_ic.txt
"""

import glob

import numpy as np

from common.evaluation.asset_series import series_from_run
from common.evaluation.metrics import rank_ic
from common.evaluation.scorecard import forecaster_fn
from common.evaluation.walk_forward import all_origins, forecast_all, origin_indices
from common.forecasting.ensemble import Ensemble

runs = [sorted(glob.glob(f"case_c_crypto/checkpoints/wb_seed{s}_*"))[-1] for s in (42, 1, 2)]
series, _ = series_from_run(runs[0])
ens = Ensemble.from_runs(runs, device="cpu")
fcs = {"ensemble": forecaster_fn(ens), **{f"seed{s}": forecaster_fn(m) for s, m in zip((42, 1, 2), ens.members)}}
origins, _ = origin_indices(series, stride=5)
o = all_origins(series, origins, (5,))
dates, counts = np.unique(o.dates, return_counts=True)
o = o.subset(np.isin(o.dates, dates[counts >= 5][::2]), 5)
st, _ = forecast_all(series, o, fcs, (5,), 200, 0, lambda _: None)
y = o.y[5]


def show(name: str, signal: np.ndarray) -> None:
    ic = np.asarray(rank_ic(o.dates, signal, y)[1])  # per date
    t = ic.mean() / ic.std(ddof=1) * np.sqrt(len(ic))
    print(f"{name:>26}: mean rank IC {ic.mean():+.3f}, t {t:+.2f}, {len(ic)} dates")


for name in fcs:
    show(name + " mean", st[5][name]["mean"])
show("average of the seeds' means", np.mean([st[5][f"seed{s}"]["mean"] for s in (42, 1, 2)], axis=0))
