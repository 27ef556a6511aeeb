"""Two runs' forecasts on the first run's VALIDATION split (the test split is not read): the run
trained with model.market_mask forecasting with the future market unknown ("model",
market_future = "unknown") beside the run without it forecasting with today's analog market
futures ("base", market_future = "analogs"), same data, seed and budget, on the same origins.

    python val_scorecard.py MASK_RUN BASE_RUN [--origins 300] [--samples 200] [--horizons 1,5]
        [--mask-future unknown|analogs] --json OUT.json

(--mask-future analogs: the masked run reads the analog futures too, so only its training differs.)

Prints per horizon each one's CRPS, 90% coverage, share of the observable oracle's CRPS edge over
the best fitted baseline, rank IC of the forecast mean across the assets of a date (mean and
Newey-West t), the paired CRPS skill 1 - CRPS_mask / CRPS_base with its block-bootstrap 95%
interval over dates, and the paired rank-IC difference with its t.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from common.evaluation.asset_series import fit_price_baselines, series_from_run
from common.evaluation.calibration import val_series
from common.evaluation.factors import factor_signals, nw_lags
from common.evaluation.metrics import newey_west_t, rank_ic
from common.evaluation.scorecard import ScorecardSettings, forecaster_fn, make_scorecard, observable_ceiling
from common.forecasting.forecaster import Forecaster


def _ic(dates: np.ndarray, signal: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(signal) & np.isfinite(y)
    return rank_ic(dates[ok], signal[ok], y[ok])


def _paired(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], h: int, stride: int) -> dict:
    common, ia, ib = np.intersect1d(a[0], b[0], return_indices=True)
    diff = a[1][ia] - b[1][ib]
    return {"mean": float(diff.mean()), "t_nw": newey_west_t(diff, nw_lags(len(diff), h, stride))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mask_run", type=Path)
    ap.add_argument("base_run", type=Path)
    ap.add_argument("--origins", type=int, default=300)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--horizons", default="1,5")
    ap.add_argument("--mask-future", choices=("unknown", "analogs"), default="unknown")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    series, interval = series_from_run(args.mask_run)
    val = val_series(series)
    mask, base = Forecaster.from_run(args.mask_run), Forecaster.from_run(args.base_run)
    assert mask.cfg.model.market_mask > 0 and base.cfg.model.market_mask == 0
    mask.market_future, base.market_future = args.mask_future, "analogs"
    baselines = fit_price_baselines(val, interval)
    settings = ScorecardSettings(
        horizons=tuple(int(h) for h in args.horizons.split(",")),
        n_origins=args.origins,
        stride=None,
        n_samples=args.samples,
        interval=interval,
    )
    keep: dict = {}
    card = make_scorecard(
        val,
        forecaster_fn(mask),
        settings,
        baselines={**baselines, "base": forecaster_fn(base)},
        progress=lambda m: print(m, flush=True),
        ceiling=observable_ceiling(args.mask_run, interval),
        keep=keep,
    )
    o, stride = keep["origins"], keep["stride"]
    signals = factor_signals(val, o)
    card.update(mask_run=str(args.mask_run), base_run=str(args.base_run), mask_future=args.mask_future)
    card.update(split="val", seconds=round(time.time() - t0))
    for h, hc in card["horizons"].items():
        h_int = int(h)
        scored = np.isfinite(o.y[h_int])
        dates, y = o.dates[scored], o.y[h_int][scored]
        stats = keep["stats"][h_int]
        crps = hc["crps"]
        best = min(baselines, key=lambda n: crps[n])  # the best fitted baseline (not the other run)
        oracle = hc["ceiling"]["observable_oracle"]["crps"]
        ics = {name: _ic(dates, stats[name]["mean"], y) for name in ("model", "base")}
        factors = {name: _ic(dates, sig[scored], y) for name, sig in signals.items()}
        factor = max(factors, key=lambda k: factors[k][1].mean() if len(factors[k][1]) else -np.inf)
        summary = {
            "best_baseline": best,
            "oracle_share": {n: (crps[best] - crps[n]) / (crps[best] - oracle) for n in ("model", "base")},
            "crps_skill_mask_vs_base": hc["skill"]["crps"]["base"],
            "rank_ic": {
                n: {"mean": float(ic.mean()), "t_nw": newey_west_t(ic, nw_lags(len(ic), h_int, stride))}
                for n, (_, ic) in {**ics, factor: factors[factor]}.items()
            },
            "mask_minus_base_ic": _paired(ics["model"], ics["base"], h_int, stride),
            "over_best_factor": {n: _paired(ics[n], factors[factor], h_int, stride) for n in ics},
            "best_factor": factor,
        }
        hc["market_mask_summary"] = summary
        cov, r, vs = hc["coverage"], summary["rank_ic"], summary["crps_skill_mask_vs_base"]
        d, share, over = summary["mask_minus_base_ic"], summary["oracle_share"], summary["over_best_factor"]
        print(
            f"H={h}: CRPS mask {crps['model']:.6f}, base {crps['base']:.6f}, {best} {crps[best]:.6f}, oracle "
            f"{oracle:.6f}; skill mask vs base {vs['value']:+.4f} {[round(x, 4) for x in vs['ci95']]}; oracle-edge "
            f"share mask {share['model']:+.2f}, base {share['base']:+.2f}; 90% coverage {cov['model']['90']:.3f} / "
            f"{cov['base']['90']:.3f}; rank IC mask {r['model']['mean']:+.4f} (t {r['model']['t_nw']:.2f}), base "
            f"{r['base']['mean']:+.4f} (t {r['base']['t_nw']:.2f}), {factor} {r[factor]['mean']:+.4f}; mask - base "
            f"{d['mean']:+.4f} (t {d['t_nw']:.2f}); over {factor}: mask "
            f"{over['model']['mean']:+.4f} (t {over['model']['t_nw']:.2f}), "
            f"base {over['base']['mean']:+.4f} (t {over['base']['t_nw']:.2f})",
            flush=True,
        )
    args.json.write_text(json.dumps(card, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
