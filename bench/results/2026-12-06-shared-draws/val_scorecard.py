"""A run's scorecard on its VALIDATION split (the test split is not read): its forecasts with the
draws of a date's assets shared ("model", ForecasterCore.shared_draws = True) beside the same run
drawing each origin's uniforms on its own ("independent", today's default), on the same origins,
both with the analog market futures, so the choice is made on validation, paired.

    python val_scorecard.py RUN_DIR [--origins 500] [--samples 200] [--horizons 1,5] --json OUT.json

Prints per horizon each one's CRPS, 90% coverage and rank IC of the forecast mean across the
assets of a date (mean and Newey-West t), the paired CRPS skill (1 - CRPS_shared / CRPS_indep,
block-bootstrap 95% interval), the paired rank-IC difference (shared - independent, with its t)
and each one's rank IC over the best cross-sectional factor's.
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
    lags = nw_lags(len(diff), h, stride)
    return {"mean": float(diff.mean()), "t_nw": newey_west_t(diff, lags), "n_dates": int(len(common))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--origins", type=int, default=500)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--horizons", default="1,5")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    series, interval = series_from_run(args.run)
    val = val_series(series)
    shared, independent = Forecaster.from_run(args.run), Forecaster.from_run(args.run)
    shared.market_future = independent.market_future = "analogs"
    shared.shared_draws, independent.shared_draws = True, False
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
        forecaster_fn(shared),
        settings,
        baselines={**baselines, "independent": forecaster_fn(independent)},
        progress=lambda m: print(m, flush=True),
        ceiling=observable_ceiling(args.run, interval),
        keep=keep,
    )
    o, stride = keep["origins"], keep["stride"]
    signals = factor_signals(val, o)
    card.update(run=str(args.run), split="val", seconds=round(time.time() - t0))
    for h, hc in card["horizons"].items():
        h_int = int(h)
        scored = np.isfinite(o.y[h_int])
        dates, y = o.dates[scored], o.y[h_int][scored]
        stats = keep["stats"][h_int]
        ics = {name: _ic(dates, stats[name]["mean"], y) for name in ("model", "independent")}
        factors = {name: _ic(dates, sig[scored], y) for name, sig in signals.items()}
        best = max(factors, key=lambda k: factors[k][1].mean() if len(factors[k][1]) else -np.inf)
        summary = {
            "rank_ic": {
                name: {"mean": float(ic.mean()), "t_nw": newey_west_t(ic, nw_lags(len(ic), h_int, stride))}
                for name, (_, ic) in {**ics, best: factors[best]}.items()
            },
            "shared_minus_independent": _paired(ics["model"], ics["independent"], h_int, stride),
            "over_best_factor": {name: _paired(ics[name], factors[best], h_int, stride) for name in ics},
            "best_factor": best,
            "crps_skill_shared_vs_independent": hc["skill"]["crps"]["independent"],
        }
        hc["shared_draws_summary"] = summary
        crps, cov, r = hc["crps"], hc["coverage"], summary["rank_ic"]
        vs = summary["crps_skill_shared_vs_independent"]
        d = summary["shared_minus_independent"]
        print(
            f"H={h}: CRPS shared {crps['model']:.6f}, independent {crps['independent']:.6f}, skill "
            f"{vs['value']:+.4f} {[round(x, 4) for x in vs['ci95']]}; 90% coverage {cov['model']['90']:.3f} / "
            f"{cov['independent']['90']:.3f}; rank IC shared {r['model']['mean']:+.4f} (t {r['model']['t_nw']:.2f}), "
            f"independent {r['independent']['mean']:+.4f} (t {r['independent']['t_nw']:.2f}), {best} "
            f"{r[best]['mean']:+.4f} (t {r[best]['t_nw']:.2f}); shared - independent {d['mean']:+.4f} "
            f"(t {d['t_nw']:.2f}); over {best}: shared {summary['over_best_factor']['model']['mean']:+.4f} "
            f"(t {summary['over_best_factor']['model']['t_nw']:.2f}), independent "
            f"{summary['over_best_factor']['independent']['mean']:+.4f} "
            f"(t {summary['over_best_factor']['independent']['t_nw']:.2f})",
            flush=True,
        )
    args.json.write_text(json.dumps(card, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
