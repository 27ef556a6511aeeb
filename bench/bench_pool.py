"""Does the model know something the baselines do not? Its forecasts pooled with a baseline's,
the pool's weight chosen on the validation split, scored on the test split.

A linear pool draws each sample from the model with probability w and from the baseline
otherwise; here the first round(w n) of an origin's n samples are the model's and the rest the
baseline's, both i.i.d., so the pool is the mixture (w = 0 is the baseline alone, w = 1 the model
alone, on the same draws). If no weight above 0 beats the baseline, the model adds nothing to it;
a pool better than both is what a forecast combination test (encompassing) asks: each side knows
something the other does not. Per horizon and baseline, the weight with the lowest mean CRPS on
validation (the calibration's origins, nothing after its last row) is scored on the test split
(the scorecard's origins, every 5th date, 200 samples) against that baseline and against the
test's best baseline, each with the scorecard's paired block-bootstrap interval over dates.

    python bench/bench_pool.py RUN_DIR [RUN_DIR ...] --json out.json
    python bench/bench_pool.py --summary a.json,b.json,c.json   # runs of the same data, e.g. seeds

--summary reads such JSON files and reports, per horizon, each run's pool (the baseline and weight
its validation chose) over the test's best baseline, their mean and a Student-t 95% interval over
the runs. It chooses nothing for the library: the scorecard scores the model as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info  # noqa: E402  (puts the repo on sys.path)

WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))  # the model's share of the pool
HORIZONS = (1, 5, 20)


def pooled_forecasters(model: Callable, baselines: dict[str, Callable]) -> dict[str, Callable]:
    """The model, each baseline, and every pool "BASELINE@w". forecast_all calls a batch's
    forecasters in order on one list of histories, each at every horizon before the next, so the
    pools (last) read the model's and the baselines' draws of that batch from `drawn`."""
    drawn: dict = {}

    def keep(name: str, fn: Callable) -> Callable:
        def kept(histories, horizon, n, seed):
            if drawn.get("batch") != id(histories):
                drawn.clear()
                drawn["batch"] = id(histories)
            out = np.asarray(fn(histories, horizon, n, seed))
            # paths serve every horizon up to theirs; H-step returns their own horizon only
            for h in range(1, horizon + 1) if out.ndim == 3 else (horizon,):
                drawn[name, h] = out[:, :, h - 1] if out.ndim == 3 else out
            return out

        return kept

    def pool(baseline: str, w: float) -> Callable:
        def fn(histories, horizon, n, seed):
            assert drawn.get("batch") == id(histories), "the pools come after the model and the baselines"
            k = round(w * n)
            return np.concatenate([drawn["model", horizon][:, :k], drawn[baseline, horizon][:, k:]], axis=1)

        return fn

    return {
        "model": keep("model", model),
        **{b: keep(b, fn) for b, fn in baselines.items()},
        **{f"{b}@{w:g}": pool(b, w) for b in baselines for w in WEIGHTS},
    }


def score_run(run: Path, samples: int, seed: int) -> dict:
    import torch

    from common.evaluation.asset_series import fit_price_baselines, series_from_run
    from common.evaluation.calibration import val_series
    from common.evaluation.metrics import skill_interval
    from common.evaluation.scorecard import forecaster_fn
    from common.evaluation.walk_forward import all_origins, forecast_all, origin_indices
    from common.forecasting.forecaster import Forecaster

    say = lambda msg: print(f"{run.name}: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    series, interval = series_from_run(run)
    fc = Forecaster.from_run(run, device=torch.device("cpu"))
    baselines = fit_price_baselines(series, interval)  # each asset's train split only
    fcs = pooled_forecasters(forecaster_fn(fc), baselines)
    val = val_series(series)
    o_val = all_origins(val, origin_indices(val, stride=5)[0], HORIZONS)
    st_val, _ = forecast_all(val, o_val, fcs, HORIZONS, samples, seed, say)
    origins, stride = origin_indices(series, stride=5)
    o = all_origins(series, origins, HORIZONS)
    st, _ = forecast_all(series, o, fcs, HORIZONS, samples, seed, say)
    out: dict = {"run": str(run), "within_bin": fc.within_bin and fc.tokenizer.within_bins, "horizons": {}}
    for h in HORIZONS:
        dates = o.dates[np.isfinite(o.y[h])]

        def skill(a: str, b: str, h: int = h, dates: np.ndarray = dates) -> dict:
            return skill_interval(st[h][a]["crps"], st[h][b]["crps"], dates, horizon=h, stride=stride, seed=seed)

        val_crps = {name: float(np.mean(st_val[h][name]["crps"])) for name in fcs}
        best = min(baselines, key=lambda b: float(np.mean(st[h][b]["crps"])))  # on test: the hardest judge
        per_baseline = {}
        for b in baselines:
            w = min(WEIGHTS, key=lambda w: val_crps[f"{b}@{w:g}"])
            per_baseline[b] = {
                "val_weight": w,
                # validation CRPS skill of each weight's pool over the baseline alone
                "val_skill": {f"{x:g}": 1 - val_crps[f"{b}@{x:g}"] / val_crps[b] for x in WEIGHTS},
                "test_pool_vs_baseline": skill(f"{b}@{w:g}", b),
                "test_pool_vs_model": skill(f"{b}@{w:g}", "model"),
                "test_coverage90": float(np.mean(st[h][f"{b}@{w:g}"]["cover90"])),
            }
        chosen = min(baselines, key=lambda b: val_crps[f"{b}@{per_baseline[b]['val_weight']:g}"])
        pool = f"{chosen}@{per_baseline[chosen]['val_weight']:g}"
        out["horizons"][str(h)] = {
            "test_n": int(len(dates)),
            "best_baseline": best,
            "chosen_pool": pool,
            "test_model_vs_best_baseline": skill("model", best),
            "test_pool_vs_best_baseline": skill(pool, best),
            "per_baseline": per_baseline,
            # per origin, for --summary
            "test": {
                "dates": dates.tolist(),
                "pool_crps": st[h][pool]["crps"].tolist(),
                "best_crps": st[h][best]["crps"].tolist(),
            },
        }
    return out


def _pct(d: dict) -> str:
    return f"{d['value']:+.2%} [{d['ci95'][0]:+.2%}, {d['ci95'][1]:+.2%}]"


def _lines(run: dict) -> list[str]:
    lines = [run["run"]]
    for h, r in run["horizons"].items():
        lines.append(
            f"  H={h}: model vs {r['best_baseline']} {_pct(r['test_model_vs_best_baseline'])}; "
            f"pool {r['chosen_pool']} (chosen on validation) vs it {_pct(r['test_pool_vs_best_baseline'])}"
        )
        for b, p in r["per_baseline"].items():
            w = f"{p['val_weight']:g}"
            lines.append(
                f"    {b}: val weight {w} (val skill over {b} {p['val_skill'][w]:+.2%}); "
                f"test vs {b} {_pct(p['test_pool_vs_baseline'])}, vs the model {_pct(p['test_pool_vs_model'])}; "
                f"90% coverage {p['test_coverage90']:.1%}"
            )
    return lines


def summary(runs: list[dict]) -> dict:
    """Per horizon, each run's chosen pool over the test's best baseline (1 - pool / best), their
    mean with a Student-t 95% interval over the runs."""
    from bench_generalization import paired_interval

    if len(runs) < 2:
        raise SystemExit(f"--summary: {len(runs)} run; give two or more")
    out = {}
    for h in runs[0]["horizons"]:
        each = [
            1 - np.sum(r["horizons"][h]["test"]["pool_crps"]) / np.sum(r["horizons"][h]["test"]["best_crps"])
            for r in runs
        ]
        out[h] = {"pools": [r["horizons"][h]["chosen_pool"] for r in runs], "skills": each, **paired_interval(each)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--summary", metavar="JSONS", help="comma-separated JSON files of this script")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.summary:
        result = summary([r for p in args.summary.split(",") for r in json.loads(Path(p).read_text())["runs"]])
        for h, r in result.items():
            print(
                f"H={h}: pool over the best baseline {r['mean']:+.2%} [{r['ci95'][0]:+.2%}, {r['ci95'][1]:+.2%}] "
                f"over {r['n']} runs ({', '.join(f'{p} {x:+.2%}' for p, x in zip(r['pools'], r['skills']))})"
            )
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
        return 0
    if not args.runs:
        ap.error("give RUN_DIR ... or --summary A.json,B.json")
    runs = [score_run(r, args.samples, args.seed) for r in args.runs]
    for r in runs:
        print("\n".join(_lines(r)))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "weights": WEIGHTS, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
