"""Is the model's spread right? A run's sampled paths widened or narrowed around their median,
chosen on the validation split, scored on the test split.

Per horizon h and scale s in GRID, every origin's samples x become m + s (x - m), m their median
(s = 1: the model as it is). On the validation split (the calibration's origins, nothing after
its last row) the scale with the lowest mean CRPS is chosen; on the test split (the scorecard's
origins, every 5th date, 200 samples) the chosen scale is scored against the raw model and the
price baselines, each skill with the scorecard's paired block-bootstrap interval over dates. The
model is sampled once per origin: every scale reads the same draws, so their differences are
the scale's alone.

    python bench/bench_spread.py RUN_DIR [RUN_DIR ...] --json out.json
    python bench/bench_spread.py RUN_DIR ... --within-bin --json out.json  # moves drawn within their bins
    python bench/bench_spread.py RUN_DIR ... --revert --json out.json  # variance pulled to its long-run level
    python bench/bench_spread.py RUN_DIR ... --fitted --json out.json  # the run's reversion.json, on and off
    python bench/bench_spread.py RUN_DIR ... --long-run --json out.json  # the reversion's long-run window too
    python bench/bench_spread.py --compare A.json B.json   # A's runs against B's, paired in order
    python bench/bench_spread.py --compare a1.json,a2.json,a3.json b1.json,b2.json,b3.json

--compare reads two such JSON files (or comma-separated lists of them, their runs in order), whose
runs must share their data (the same origins: the same sample, splits and context), and reports
A's raw CRPS skill over B's per horizon, on validation (where a choice may be made) and on test:
per pair, their mean and a Student-t interval over the pairs, and pooled, with the block
bootstrap over dates (e.g. fine-tuned from a parent against trained from scratch, seed by seed).

--within-bin decodes each sampled token by a draw within its bins (ForecasterCore.within_bin)
rather than by the bins' medians; a run whose tokenizer.json predates the within-bin quantiles
gets them from its training candles, fitted again as training fitted it (the same edges, checked).

It chooses nothing for the library: it reports whether a spread correction fitted on validation
would pay in CRPS, the score the scorecard ranks by, and how runs compare in price space.
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

GRID = (0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.6)
HORIZONS = (1, 5, 20)
REVERSION = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7)
LONG_RUNS = (125, 250, 500, 1000)  # --long-run: returns in the long-run variance (the library's: 500)


def _scaled_forecasters(
    raw: Callable, revert: bool = False, fitted=None, long_runs: tuple[int, ...] = ()
) -> dict[str, Callable]:
    """The model itself as "s1", first; every other point of the grid rescales those same paths
    (forecast_all calls the forecasters of a batch in order, on one list of histories). With
    `revert`, the grid is REVERSION: "wW" moves each forecast's variance v at step k a share W of the
    way to the asset's long-run variance over k steps, v -> (1 - W) v + W k v_long, as log-HAR's
    long-run term pulls a calm or a turbulent stretch back to the usual level. With `fitted` (a
    common.forecasting.reversion.Reversion: the run's reversion.json), "fitted" alone: that pull. With
    `long_runs`, "tau{T}_lr{L}": the library's fit's taus, each with the long-run variance of the
    asset's last L returns, for each L."""
    from common.evaluation.vol_reversion import TAUS
    from common.forecasting.reversion import LONG_RUN, Reversion, long_run_variance, revert_returns

    last: dict = {}

    def model(histories, horizon, n, seed):
        last.clear()  # a new batch: nothing derived from the last one's draws
        last.update(key=id(histories), out=np.asarray(raw(histories, horizon, n, seed)))
        return last["out"]

    def scaled(s: float) -> Callable:
        def fn(histories, horizon, n, seed):
            assert last["key"] == id(histories), "the raw model is called first in each batch"
            x = last["out"]
            m = np.median(x, axis=1, keepdims=True)
            return m + s * (x - m)

        return fn

    def reverted(weights: Callable[[int], np.ndarray], long_run: int = LONG_RUN) -> Callable:
        def fn(histories, horizon, n, seed):
            assert last["key"] == id(histories), "the raw model is called first in each batch"
            x = last["out"]  # (origins, samples, steps): the log return to each step 1..horizon
            key = f"v_long{long_run}"
            if key not in last:  # once per batch, shared by every W
                last[key] = np.array([long_run_variance(h.candles["close"].to_numpy(), long_run) for h in histories])
            return revert_returns(x, last[key], weights(x.shape[2]))

        return fn

    if fitted is not None:
        return {"s1": model, "fitted": reverted(fitted.weights)}
    if long_runs:
        pulls = {f"tau{t:g}_lr{lr}": reverted(Reversion(t).weights, lr) for lr in long_runs for t in TAUS}
        return {"s1": model, **pulls}
    if revert:
        return {"s1": model, **{f"w{w:g}": reverted(lambda h, w=w: np.full(h, w)) for w in REVERSION if w != 0.0}}
    return {"s1": model, **{f"s{s:g}": scaled(s) for s in GRID if s != 1.0}}


def with_within_bins(tokenizer, series) -> None:
    """Give a tokenizer fitted before the within-bin quantiles were stored those of its run's
    training candles (the train splits, pooled as common.tokens.corpus.fit_tokenizer pools them)."""
    from common.tokens.corpus import FIT_CANDLES
    from common.tokens.tokenizer import OHLCTokenizer

    if tokenizer.within_bins:
        return
    every = max(1, -(-sum(len(s.train) for s in series) // FIT_CANDLES))
    refit = OHLCTokenizer(
        tokenizer.vocab_size, tokenizer.shape_bins, tokenizer.vol_halflife, tokenizer.vol_warmup, tokenizer.ret_bins
    ).fit([s.candles.iloc[s.train.start : s.train.stop] for s in series], every=every)
    for old, new in ((tokenizer.move_binning, refit.move_binning), (tokenizer.shape_binning, refit.shape_binning)):
        if not np.allclose(old.edges, new.edges, rtol=0, atol=1e-9):
            raise SystemExit("--within-bin: the tokenizer fitted again has other edges than the run's")
        old.inner = new.inner


def score_run(
    run: Path,
    samples: int,
    seed: int,
    within_bin: bool = False,
    revert: bool = False,
    fitted: bool = False,
    long_runs: tuple[int, ...] = (),
) -> dict:
    import torch

    from common.evaluation.asset_series import fit_price_baselines, series_from_run
    from common.evaluation.calibration import val_series
    from common.evaluation.metrics import qlike, skill_interval
    from common.evaluation.scorecard import forecaster_fn
    from common.evaluation.walk_forward import all_origins, forecast_all, origin_indices
    from common.forecasting.forecaster import Forecaster
    from common.forecasting.reversion import LONG_RUN

    say = lambda msg: print(f"{run.name}: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    series, interval = series_from_run(run)
    fc = Forecaster.from_run(run, device=torch.device("cpu"))
    if within_bin:
        with_within_bins(fc.tokenizer, series)
        fc.within_bin = True
    reversion, fc.reversion = fc.reversion, None  # "s1" is always the paths as sampled
    if fitted and reversion is None:
        raise SystemExit(f"--fitted: {run} has no reversion.json with a pull (tau null or absent)")
    fcs = _scaled_forecasters(forecaster_fn(fc), revert, reversion if fitted else None, long_runs)
    # what the forecasts were decoded by: a run fitted since the quantiles are stored draws by default
    out: dict = {"run": str(run), "within_bin": fc.within_bin and fc.tokenizer.within_bins, "revert": revert}
    if fitted:
        out["fitted"] = {"tau": reversion.tau, "long_run": reversion.long_run}
    out["horizons"] = {}
    val = val_series(series)
    o_val = all_origins(val, origin_indices(val, stride=5)[0], HORIZONS)
    st_val, _ = forecast_all(val, o_val, fcs, HORIZONS, samples, seed, say)
    joint = at500 = None
    if long_runs:  # one pull for every horizon, as the library's fit chooses it: the best mean val skill
        val_mean = {h: {name: float(np.mean(st_val[h][name]["crps"])) for name in fcs} for h in HORIZONS}
        score = {name: float(np.mean([1 - val_mean[h][name] / val_mean[h]["s1"] for h in HORIZONS])) for name in fcs}
        joint = max(score, key=score.__getitem__)  # the paths as sampled score 0
        library = f"_lr{LONG_RUN}"  # the library's window: what its own fit chooses tau with ("_500" in the JSON)
        at500 = max((n for n in score if n == "s1" or n.endswith(library)), key=score.__getitem__)
        out["long_run"] = {"grid": list(long_runs), "val_score": score, "chosen": joint, "chosen_500": at500}
    baselines = fit_price_baselines(series, interval)
    origins, stride = origin_indices(series, stride=5)
    o = all_origins(series, origins, HORIZONS)
    st, _ = forecast_all(series, o, {**fcs, **baselines}, HORIZONS, samples, seed, say)
    for h in HORIZONS:
        val_crps = {name: float(np.mean(st_val[h][name]["crps"])) for name in fcs}
        chosen = "fitted" if fitted else joint or min(val_crps, key=val_crps.__getitem__)  # fitted: its tau
        dates = o.dates[np.isfinite(o.y[h])]
        y = o.y[h][np.isfinite(o.y[h])]

        def skill(a: str, b: str, h: int = h, dates: np.ndarray = dates) -> dict:
            return skill_interval(st[h][a]["crps"], st[h][b]["crps"], dates, horizon=h, stride=stride, seed=seed)

        best = min(baselines, key=lambda b: float(np.mean(st[h][b]["crps"])))
        out["horizons"][str(h)] = {
            "val_crps_vs_raw": {k: 1 - v / val_crps["s1"] for k, v in val_crps.items()},
            "val_coverage90": {k: float(np.mean(st_val[h][k]["cover90"])) for k in fcs},
            "chosen": chosen,
            "test_n": int(len(y)),
            "test_chosen_vs_raw": skill(chosen, "s1"),
            "test_raw_vs_best_baseline": {"baseline": best, **skill("s1", best)},
            "test_chosen_vs_best_baseline": {"baseline": best, **skill(chosen, best)},
            **({"test_chosen_vs_500": skill(chosen, at500)} if at500 else {}),
            "test_coverage90": {k: float(np.mean(st[h][k]["cover90"])) for k in (*fcs, *baselines)},
            "test_qlike": {k: float(np.mean(qlike(st[h][k]["var"], y))) for k in (*fcs, *baselines)},
            # per origin, for comparing runs on the same origins (--compare)
            "val": {"dates": o_val.dates[np.isfinite(o_val.y[h])].tolist(), "crps": st_val[h]["s1"]["crps"].tolist()},
            "test": {
                "dates": dates.tolist(),
                "crps": st[h]["s1"]["crps"].tolist(),
                "baseline_crps": st[h][best]["crps"].tolist(),
            },
        }
    return out


def _line(run: dict) -> list[str]:
    lines = [run["run"]]
    for h, r in run["horizons"].items():
        c, rb, cb = r["test_chosen_vs_raw"], r["test_raw_vs_best_baseline"], r["test_chosen_vs_best_baseline"]
        q = r["test_qlike"]
        best_q = min((k for k in q if k not in r["val_crps_vs_raw"]), key=q.__getitem__)  # the best baseline's
        pct = lambda d: f"{d['value']:+.2%} [{d['ci95'][0]:+.2%}, {d['ci95'][1]:+.2%}]"  # noqa: E731
        lines.append(
            f"  H={h}: val chooses {r['chosen']} (val CRPS {r['val_crps_vs_raw'][r['chosen']]:+.2%} vs raw); "
            f"test: chosen vs raw {pct(c)}; raw vs {rb['baseline']} {pct(rb)}, chosen vs it {pct(cb)}; "
            f"90% coverage raw {r['test_coverage90']['s1']:.1%}, chosen {r['test_coverage90'][r['chosen']]:.1%}; "
            f"QLIKE raw {q['s1']:.3f}, chosen {q[r['chosen']]:.3f}, {best_q} {q[best_q]:.3f}"
        )
        if "test_chosen_vs_500" in r:
            lr = run["long_run"]
            lines.append(
                f"    long-run window: val chooses {lr['chosen']} ({lr['val_score'][lr['chosen']]:+.3%}), at 500 "
                f"{lr['chosen_500']} ({lr['val_score'][lr['chosen_500']]:+.3%}); test: chosen vs it "
                f"{pct(r['test_chosen_vs_500'])}, 90% coverage {r['test_coverage90'][lr['chosen_500']]:.1%} -> "
                f"{r['test_coverage90'][lr['chosen']]:.1%}"
            )
    return lines


def compare(a: dict, b: dict, n_boot: int = 1000, seed: int = 0) -> dict:
    """Per horizon and split, A's raw CRPS skill over B's (1 - A / B): each pair's, their mean with a
    Student-t 95% interval, and the pooled value with the date block bootstrap."""
    from common.evaluation.metrics import skill_interval

    from bench_generalization import paired_interval

    if len(a["runs"]) != len(b["runs"]) or len(a["runs"]) < 2:
        raise SystemExit(f"--compare: {len(a['runs'])} runs against {len(b['runs'])}; pair two or more one to one")
    out: dict = {}
    for h in a["runs"][0]["horizons"]:
        out[h] = {}
        for split in ("val", "test"):
            pairs = [(ra["horizons"][h][split], rb["horizons"][h][split]) for ra, rb in zip(a["runs"], b["runs"])]
            if any(pa["dates"] != pb["dates"] for pa, pb in pairs):
                raise SystemExit(f"--compare: H={h} {split}: the runs' origins differ; compare runs of the same data")
            each = [1 - np.sum(pa["crps"]) / np.sum(pb["crps"]) for pa, pb in pairs]
            t95 = paired_interval(each)
            pooled = skill_interval(
                np.concatenate([pa["crps"] for pa, _ in pairs]),
                np.concatenate([pb["crps"] for _, pb in pairs]),
                np.concatenate([pa["dates"] for pa, _ in pairs]),
                horizon=int(h),
                stride=5,
                n_boot=n_boot,
                seed=seed,
            )
            out[h][split] = {"pairs": each, "mean": t95["mean"], "t95": t95["ci95"], "pooled": pooled}
    return out


def _runs(path: Path) -> list[dict]:
    return json.loads(path.read_text())["runs"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--compare", nargs=2, metavar=("A_JSON", "B_JSON"))
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--within-bin", action="store_true", help="decode sampled tokens by draws within their bins")
    mode = ap.add_mutually_exclusive_group()  # which corrections of the same draws; default: the scale
    mode.add_argument("--revert", action="store_true", help="the grid pulls the variance to its long-run level")
    mode.add_argument("--fitted", action="store_true", help="the run's reversion.json against the paths as sampled")
    mode.add_argument("--long-run", action="store_true", help="the reversion's taus with each long-run window")
    args = ap.parse_args()
    if args.compare:
        a, b = ({"runs": [r for p in side.split(",") for r in _runs(Path(p))]} for side in args.compare)
        result = compare(a, b)
        for h, r in result.items():
            for split, v in r.items():
                p = v["pooled"]
                print(
                    f"H={h} {split}: A over B {v['mean']:+.2%} [{v['t95'][0]:+.2%}, {v['t95'][1]:+.2%}] over "
                    f"{len(v['pairs'])} pairs ({', '.join(f'{x:+.2%}' for x in v['pairs'])}); pooled "
                    f"{p['value']:+.2%} [{p['ci95'][0]:+.2%}, {p['ci95'][1]:+.2%}] by dates"
                )
        if args.json:
            args.json.write_text(json.dumps({"a": str(args.compare[0]), "b": str(args.compare[1]), **result}, indent=1))
        return 0
    if not args.runs:
        ap.error("give RUN_DIR ... or --compare A.json B.json")
    long_runs = LONG_RUNS if args.long_run else ()
    runs = [
        score_run(r, args.samples, args.seed, args.within_bin, args.revert, args.fitted, long_runs) for r in args.runs
    ]
    for r in runs:
        print("\n".join(_line(r)))
    if args.json:
        # one line: the per-origin lists are long
        grid = ["fitted"] if args.fitted else list(long_runs) if long_runs else REVERSION if args.revert else GRID
        args.json.write_text(json.dumps({"machine": machine_info(), "grid": grid, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
