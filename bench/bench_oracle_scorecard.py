"""The observable oracle as a forecaster in the scorecard: on the rich synthetic market, how much of
the best possible forecast's CRPS edge over the best baseline the model holds, in price space.

Each seed trains case C's sweep config (case_c_crypto/configs/sweep_rich.json: the rich market, 8
assets x 12,000 hourly candles, the quickstart's 0.93M shape) at bench_recipe.py's budget (epochs of
50 steps, early stopping off; `--set` adds overrides, e.g. model.market_context=true), then scores
it with `make_scorecard` on the test split beside the price baselines and the observable oracle
(common/evaluation/observable_oracle.paths: the exact predictive paths given the asset's candles, and its
leader's for a follower, up to the origin; the particles' latent regimes, jumps and variances
simulated forward). Reported per horizon, pooled over seeds:

    share   (CRPS_best - CRPS_model) / (CRPS_best - CRPS_oracle), the best baseline being the
            one with the lowest mean CRPS at that horizon: 1 is the oracle, 0 the best baseline;
            a 95% interval by resampling the origin dates (the same draw for all three)

This reports; it chooses nothing (it reads the test split, as every scorecard does).

    python bench/bench_oracle_scorecard.py --seeds 0,1,2 --json out.json
    python bench/bench_oracle_scorecard.py --seeds 0 --epochs 1 --origins 4 --samples 20   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info  # noqa: E402  (puts the repo on sys.path)

from common.evaluation import observable_oracle  # noqa: E402

from bench_recipe import SWEEP_RICH, case_folder, train_run  # noqa: E402

HORIZONS = (1, 5)
ORACLE = "observable_oracle"


def score_seed(config: Path, seed: int, epochs: int, sets: list[str], settings_kw: dict, particles: int) -> dict:
    from common.config import load_config
    from common.data.synthetic import synthetic_spec
    from common.evaluation.asset_series import fit_price_baselines, series_from_run
    from common.evaluation.scorecard import ScorecardSettings, forecaster_fn, make_scorecard
    from common.forecasting.forecaster import Forecaster

    run_dir = train_run(config, f"oracle_card_s{seed}", seed, epochs, sets)
    spec = synthetic_spec(load_config(run_dir / "config.json").data)
    series, interval = series_from_run(run_dir)
    baselines = {**fit_price_baselines(series, interval), ORACLE: observable_oracle.forecaster(spec, particles)}
    settings = ScorecardSettings(interval=interval, horizons=HORIZONS, seed=seed, **settings_kw)
    keep: dict = {}
    make_scorecard(series, forecaster_fn(Forecaster.from_run(run_dir)), settings, baselines=baselines, keep=keep)
    o = keep["origins"]
    return {
        "seed": seed,
        "run": run_dir.name,
        "dates": {h: o.dates[np.isfinite(o.y[h])].astype("datetime64[ns]").astype(np.int64).tolist() for h in HORIZONS},
        "crps": {h: {n: keep["stats"][h][n]["crps"].tolist() for n in keep["stats"][h]} for h in HORIZONS},
    }


def shares(seeds: list[dict], n_boot: int = 2000, rng_seed: int = 0) -> dict[int, dict]:
    """Per horizon: every forecaster's mean CRPS over the pooled origins, the best baseline, the
    model's share of the oracle's edge over it and its 95% interval (origin dates resampled)."""
    rng = np.random.default_rng(rng_seed)
    out = {}
    for h in HORIZONS:
        crps = {n: np.concatenate([np.asarray(s["crps"][h][n]) for s in seeds]) for n in seeds[0]["crps"][h]}
        dates = np.concatenate([np.asarray(s["dates"][h]) for s in seeds])
        mean = {n: float(v.mean()) for n, v in crps.items()}
        best = min((n for n in mean if n not in ("model", ORACLE)), key=mean.__getitem__)

        def share(idx: np.ndarray, crps: dict = crps, best: str = best) -> float:
            b, m, o = (crps[n][idx].mean() for n in (best, "model", ORACLE))
            return float((b - m) / (b - o))

        groups = [np.flatnonzero(dates == d) for d in np.unique(dates)]
        boot = []
        for _ in range(n_boot):
            pick = rng.integers(0, len(groups), len(groups))
            boot.append(share(np.concatenate([groups[g] for g in pick])))
        lo, hi = np.nanpercentile(boot, [2.5, 97.5])
        out[h] = {
            "mean_crps": mean,
            "best_baseline": best,
            "oracle_edge": mean[best] - mean[ORACLE],
            "share": share(np.arange(len(dates))),
            "ci95": [float(lo), float(hi)],
            "origins": int(len(dates)),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=12, help="epochs of 50 steps of 16 x 64 tokens each")
    p.add_argument(
        "--set", dest="sets", action="append", default=[], help="a config override, e.g. model.market_context=true"
    )
    p.add_argument("--origins", type=int, default=60, help="test origins per asset (evenly spaced)")
    p.add_argument("--samples", type=int, default=200, help="paths per origin and forecaster")
    p.add_argument("--particles", type=int, default=observable_oracle.PARTICLES)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    started, load0 = time.perf_counter(), os.getloadavg()[0]
    settings_kw = {"n_origins": args.origins, "stride": None, "n_samples": args.samples}
    runs = []
    with case_folder() as config:
        for seed in (int(s) for s in args.seeds.split(",")):
            runs.append(score_seed(config, seed, args.epochs, args.sets, settings_kw, args.particles))
            print(f"seed {seed}: scored {runs[-1]['run']}", flush=True)
    table = shares(runs)
    for h, r in table.items():
        means = ", ".join(f"{n} {v:.5f}" for n, v in sorted(r["mean_crps"].items(), key=lambda kv: kv[1]))
        print(f"H={h}: {r['origins']} origins; mean CRPS {means}")
        print(
            f"H={h}: the model holds {r['share']:+.2f} [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}] of the observable "
            f"oracle's CRPS edge over the best baseline ({r['best_baseline']}, edge {r['oracle_edge']:.5f})"
        )
    result = {
        "config": str(SWEEP_RICH.name),
        "sets": args.sets,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "origins_per_asset": args.origins,
        "samples": args.samples,
        "particles": args.particles,
        "figures": {f"share H={h}": r["share"] for h, r in table.items()},
        "horizons": {str(h): r for h, r in table.items()},
        "wall_s": round(time.perf_counter() - started, 1),
        "loadavg_1m": [load0, os.getloadavg()[0]],
        "machine": machine_info(),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
