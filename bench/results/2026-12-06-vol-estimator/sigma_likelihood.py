"""How well the tokenizer's volatility scale alone predicts the next daily return on the shipped
sample: the Gaussian log-likelihood per return (nats, higher is better) of r[t+1] under sigma_t * k,
k the one best constant (quantile bins make any constant scale irrelevant to the tokens), after
260 candles, pooled over the sample's assets; by half-life and by what the EWMA averages.

    python bench/results/2026-12-06-vol-estimator/sigma_likelihood.py
"""

from __future__ import annotations

import numpy as np

from common.data.sample import load_sample
from common.tokens.volatility import VOL_ESTIMATORS, ewma, vol_readings

frames = {s: f.dropna(subset=["open", "high", "low", "close"]) for s, f in load_sample("1d").items()}
print(f"{len(frames)} assets of the shipped sample, daily")
for halflife in (10, 20, 40, 60, 80):
    cells = []
    for estimator in VOL_ESTIMATORS:
        log_var, ratio = [], []
        for f in frames.values():
            logs = np.log(f[["open", "high", "low", "close"]].to_numpy())
            close = logs[:, 3]
            var = ewma(vol_readings(close, logs.max(axis=1), logs.min(axis=1), estimator), halflife)
            r = np.diff(close)
            log_var.append(np.log(var[260:-1]))  # var[j]: known once candle j + 1 has closed
            ratio.append(r[261:] ** 2 / var[260:-1])
        lv, q = np.concatenate(log_var), np.concatenate(ratio)
        k = q.mean()  # the best constant scale of the variance
        loglik = -0.5 * (np.log(2 * np.pi) + lv.mean() + np.log(k) + 1)
        cells.append(f"{estimator} {loglik:+.4f} (k {k:.2f})")
    print(f"half-life {halflife:3d}: " + "  ".join(cells))
