"""How often the PIT uniformity test rejects a calibrated forecaster (its size) with 5 and 10 bins,
on the generator of tests/test_pit.py: 300 dates of 4 assets sharing a market factor, 5-step
returns at every date (overlapping), so 60 kept dates. Run from the repository root:

    PYTHONPATH=. python bench/results/2026-11-28-scorecard-har/pit_size.py
"""

import sys

import numpy as np
from scipy.stats import norm

sys.path.insert(0, "tests")
from common.evaluation.pit import pit_bins, pit_uniformity  # noqa: E402

from test_pit import _overlapping  # noqa: E402

for bins in (5, 10):
    for scale, label in ((1.0, "calibrated"), (0.7, "30% too narrow")):
        rejected = []
        for seed in range(300):
            dates, y = _overlapping(seed)
            pit = norm.cdf(y / (scale * np.sqrt(5)))
            test = pit_uniformity(pit_bins(pit, bins), np.full(bins, 1 / bins), dates, horizon=5, stride=1)
            rejected.append(not test["uniform"])
        print(f"{bins} bins, {label}: rejected at 5% in {np.mean(rejected):.1%} of 300")
