"""A run's scorecard on its VALIDATION split (the test split is not read), its forecasts with the
market's future held at the origin's ids ("model") beside the same run with analog market futures
("analogs", ForecasterCore.market_future), scored on the same origins with the same seed, so the
choice between them is made on validation, paired.

    python val_scorecard.py RUN_DIR [--origins 500] [--samples 200] [--horizons 1,5] --json OUT.json

Prints per horizon each one's CRPS, 90% coverage and QLIKE, the best real baseline's and the
observable oracle's CRPS (the rich synthetic market), each one's share of the oracle's edge over
that baseline, and the skill of held against analogs (1 - CRPS_held / CRPS_analogs) with its
block-bootstrap 95% interval: negative means the analogs forecast better.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common.evaluation.asset_series import fit_price_baselines, series_from_run
from common.evaluation.calibration import val_series
from common.evaluation.scorecard import ScorecardSettings, forecaster_fn, make_scorecard, observable_ceiling
from common.forecasting.forecaster import Forecaster


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
    held, analogs = Forecaster.from_run(args.run), Forecaster.from_run(args.run)
    held.market_future, analogs.market_future = "held", "analogs"
    baselines = fit_price_baselines(val, interval)
    real = list(baselines)
    settings = ScorecardSettings(
        horizons=tuple(int(h) for h in args.horizons.split(",")),
        n_origins=args.origins,
        stride=None,
        n_samples=args.samples,
        interval=interval,
    )
    card = make_scorecard(
        val,
        forecaster_fn(held),
        settings,
        baselines={**baselines, "analogs": forecaster_fn(analogs)},
        progress=lambda m: print(m, flush=True),
        ceiling=observable_ceiling(args.run, interval),
    )
    card.update(run=str(args.run), split="val", seconds=round(time.time() - t0))
    for h, hc in card["horizons"].items():
        crps = hc["crps"]
        best = min(real, key=lambda b: crps[b])
        oracle = hc["ceiling"]["observable_oracle"]["crps"]
        share = {m: (crps[best] - crps[m]) / (crps[best] - oracle) for m in ("model", "analogs")}
        vs = hc["skill"]["crps"]["analogs"]
        hc["analogs_summary"] = {"best_baseline": best, "share": share, "held_vs_analogs": vs}
        print(
            f"H={h}: CRPS held {crps['model']:.6f}, analogs {crps['analogs']:.6f}, {best} {crps[best]:.6f}, "
            f"oracle {oracle:.6f}; oracle-edge share held {share['model']:+.3f}, analogs {share['analogs']:+.3f}; "
            f"90% coverage held {hc['coverage']['model']['90']:.3f}, analogs {hc['coverage']['analogs']['90']:.3f}; "
            f"QLIKE held {hc['qlike']['model']:.4f}, analogs {hc['qlike']['analogs']:.4f}, "
            f"{best} {hc['qlike'][best]:.4f}; "
            f"skill held vs analogs {vs['value']:+.4f} {[round(x, 4) for x in vs['ci95']]}",
            flush=True,
        )
    args.json.write_text(json.dumps(card, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
