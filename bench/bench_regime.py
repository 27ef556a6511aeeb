"""Where do the model's intervals fall short? A run's test forecasts split by what was known at
the origin (the volatility regime) and by calendar year, each group's 90% coverage with its
misses below and above, and the CRPS skill over the best baseline.

The regime of an origin is log(sd of its last 20 daily log returns / sd of its last 250), read
from the candles up to the origin only; its terciles over the test origins make three groups
(calm, usual, turbulent against the asset's own past). A spread too narrow in one group and right
in the others says the multi-step variance fails in that state; misses on one side only say the
centre (the drift) is off, not the spread.

    python bench/bench_regime.py RUN_DIR [RUN_DIR ...] --json out.json

Test origins as bench/bench_spread.py's (every 5th date, 200 samples, seed 0): the same forecasts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info  # noqa: E402  (puts the repo on sys.path)

HORIZONS = (1, 5, 20)
SHORT, LONG = 20, 250


def regime(close: np.ndarray) -> np.ndarray:
    """Per candle: log(sd of the last SHORT log returns / sd of the last LONG), NaN before LONG;
    row i uses closes up to i only."""
    r = pd.Series(np.log(close)).diff()
    return np.log(r.rolling(SHORT).std() / r.rolling(LONG, min_periods=LONG).std()).to_numpy()


def _group_rows(stats: dict, baseline: str, mask: np.ndarray, dates: np.ndarray, h: int, seed: int) -> dict:
    from common.evaluation.metrics import skill_interval

    m, b = stats["s1"], stats[baseline]
    row: dict = {"n": int(mask.sum())}
    for name, st in (("model", m), (baseline, b)):
        pit = st["pit"][mask]
        row[name] = {
            "cover90": float(np.mean(st["cover90"][mask])),
            "miss_below": float(np.mean(pit < 0.05)),
            "miss_above": float(np.mean(pit > 0.95)),
        }
    row["crps_skill"] = skill_interval(m["crps"][mask], b["crps"][mask], dates[mask], horizon=h, stride=5, seed=seed)
    return row


def score_run(run: Path, samples: int, seed: int) -> dict:
    import torch

    from common.evaluation.asset_series import fit_price_baselines, series_from_run
    from common.evaluation.scorecard import forecaster_fn
    from common.evaluation.walk_forward import all_origins, forecast_all, origin_indices
    from common.forecasting.forecaster import Forecaster

    say = lambda msg: print(f"{run.name}: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    series, interval = series_from_run(run)
    model = forecaster_fn(Forecaster.from_run(run, device=torch.device("cpu")))
    baselines = fit_price_baselines(series, interval)
    origins, _ = origin_indices(series, stride=5)
    o = all_origins(series, origins, HORIZONS)
    st, _ = forecast_all(series, o, {"s1": model, **baselines}, HORIZONS, samples, seed, say)
    reg_by_asset = [regime(s.candles["close"].to_numpy(dtype=np.float64)) for s in series]
    reg = np.array([reg_by_asset[k][i] for k, i in zip(o.series, o.index)])
    year = pd.to_datetime(o.dates).year.to_numpy()
    out: dict = {"run": str(run), "horizons": {}}
    for h in HORIZONS:
        ok = np.isfinite(o.y[h])
        stats = st[h]  # per forecaster, over the origins with a target at h
        r, yr, dates = reg[ok], year[ok], o.dates[ok]
        best = min(baselines, key=lambda b: float(np.mean(stats[b]["crps"])))
        cuts = np.nanquantile(r, [1 / 3, 2 / 3])
        groups = {
            "all": np.ones(len(r), bool),
            "calm": r <= cuts[0],
            "usual": (r > cuts[0]) & (r <= cuts[1]),
            "turbulent": r > cuts[1],
            "regime_unknown": ~np.isfinite(r),
            **{str(y): yr == y for y in np.unique(yr)},
        }
        out["horizons"][str(h)] = {
            "baseline": best,
            "regime_cuts": cuts.tolist(),
            "groups": {g: _group_rows(stats, best, m, dates, h, seed) for g, m in groups.items() if m.sum() >= 20},
        }
    return out


def _lines(run: dict) -> list[str]:
    lines = [run["run"]]
    for h, r in run["horizons"].items():
        b = r["baseline"]
        lines.append(f"  H={h} (regime cuts {r['regime_cuts'][0]:+.2f}, {r['regime_cuts'][1]:+.2f}; against {b})")
        for g, row in r["groups"].items():
            m, bb, s = row["model"], row[b], row["crps_skill"]
            lines.append(
                f"    {g:>14} n={row['n']:4d}: cover90 model {m['cover90']:.1%} (below {m['miss_below']:.1%}, "
                f"above {m['miss_above']:.1%}), {b} {bb['cover90']:.1%} (below {bb['miss_below']:.1%}, "
                f"above {bb['miss_above']:.1%}); CRPS skill {s['value']:+.2%} "
                f"[{s['ci95'][0]:+.2%}, {s['ci95'][1]:+.2%}]"
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    runs = [score_run(r, args.samples, args.seed) for r in args.runs]
    for r in runs:
        print("\n".join(_lines(r)))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
