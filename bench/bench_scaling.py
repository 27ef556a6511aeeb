"""Scaling study: does a bigger model or more data buy a better next-candle forecaster?

Trains a grid of model sizes x training-token counts (one candle = one token) and records for
each point the validation and test loss of the best epoch (chosen on validation by the trainer),
the token skill against the train split's unigram with its paired block-bootstrap 95% interval
(common.evaluation.metrics.skill_interval, as bench_generalization.py), and the best epoch.

Corpora:
- "synthetic": the synthetic market (common/data/synthetic.py; hourly, no seasonality, no gaps),
  whose true process is known. Each point also reports the oracle's loss on the same targets and
  the share of the gap between the unigram and the oracle that the model closes:
  gap_closed = (L_unigram - L_model) / (L_unigram - L_oracle). Nested (the default): every asset
  has NESTED_TRAIN training candles and 2,000 validation and 2,000 test candles, a corpus grows by
  assets, so a smaller corpus is the first assets of a larger one, and every point is scored on
  the same first 8 assets' candles (--no-nested: 8 assets whose length grows, another market at
  each token count, as the grid of 2026-11-25).
- "sample_1d", "sample_1h": the shipped sample's real candles at each interval it has; a token
  count below the whole sample's keeps its newest candles (a later data.start_date), so validation
  and test shrink with it.

The floors (bench/scaling_floors.py): the oracle's loss, which knows the latent regime and the
exact variance of the next candle (no forecaster reaches it), and the loss of a Kim filter that
knows the generator's parameters but sees only the asset's past candles ("filter") or only their
tokens, as the model does ("filter_tokens"): a forecaster can reach those. Each synthetic point's
test split reports all three, and the share of the gap each filter closes.

Training at every point: batch 16, context 64, learning rate by size (_LR), warmup 50, dropout
0.1, weight decay 0.1, tokenizer.ret_bins 32 (256 candle ids), flat head, the train split's
tokens in windows of stride 1 with data.epoch_stride 16. Each point trains to its best: the run
is split into --epochs validations (40) and early stopping ends it after --patience (5) without
progress; the budget (--passes x D / (16 x 64) steps, at least --min-steps, at most --max-steps:
100, 200, 6,000) only ends a point that is still improving, which its record says
("still_improving"). The cosine schedule spans the budget. Sizes come from SIZES.

    python bench/bench_scaling.py --jobs 2                  # the default CPU grid (about an hour on 2 idle cores)
    python bench/bench_scaling.py --smoke                   # a toy grid in seconds (tests/test_bench_scaling.py)
    python bench/bench_scaling.py --device cuda --grid gpu  # the GPU grid; skipped with a note without a GPU
    python bench/bench_scaling.py --points 'synthetic:0.9M:38000,synthetic:26M:100000' --name more
    python bench/bench_scaling.py --fit RESULTS.json [...]  # table, combined plot, and the fit (scaling_fit.py)

Writes bench/results/<date>-<cpu|gpu>/<--name>.json (one record per point, rewritten as each
point finishes, so a stopped grid keeps its finished points) and <--name>.png (the gap closed, or
the skill, against training tokens, one line per size). --fit writes common/model/scaling_fit.json
only when the points support a dependence on N or D. Exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO  # noqa: E402  (puts the repo on sys.path)

from bench_generalization import split_scores, trained_case_c  # noqa: E402
from scaling_floors import filter_nll, floor_losses, oracle_nll, oracle_probs, oracle_table  # noqa: E402,F401  (this module's API)

__all__ = ["GRIDS", "SIZES", "oracle_nll", "oracle_table", "plot", "run_point", "main"]

# name -> (d_model, num_layers, num_heads, d_ff); "26M" is case B's shape, "5.0M" case C's,
# "0.9M" the quickstart's (docs/generalization.md). Parameter counts are measured per run.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "toy": (16, 1, 2, 32),
    "0.05M": (32, 2, 2, 128),
    "0.2M": (64, 2, 2, 256),
    "0.9M": (128, 4, 4, 512),
    "5.0M": (256, 6, 8, 1024),
    "26M": (512, 8, 8, 2048),
}
_LR = {"toy": 1e-3, "0.05M": 3e-3, "0.2M": 2e-3, "0.9M": 1e-3, "5.0M": 6e-4, "26M": 3e-4}
SAMPLE_TRAIN = 38_000  # the daily sample's training candles (docs/generalization.md: 38,009)

# name -> (corpus, size, training tokens) points, longest first (so two --jobs finish together).
# "cpu": each point trained to its best; about an hour on 2 idle cores with --jobs 2 (docs/scaling.md:
# 38 minutes for all but the first point, which took 29 minutes beside another run).
GRIDS: dict[str, list[tuple[str, str, int]]] = {
    "cpu": [
        ("synthetic", "5.0M", 100_000),
        ("synthetic", "0.9M", 300_000),
        ("synthetic", "5.0M", SAMPLE_TRAIN),
        ("synthetic", "0.9M", 100_000),
        ("synthetic", "0.2M", 1_000_000),
        ("synthetic", "0.05M", 1_000_000),
        ("synthetic", "0.2M", 300_000),
        ("sample_1d", "0.9M", SAMPLE_TRAIN),
        ("synthetic", "0.9M", SAMPLE_TRAIN),
        ("synthetic", "0.2M", 100_000),
        ("synthetic", "0.05M", 300_000),
        ("sample_1d", "0.2M", SAMPLE_TRAIN),
        ("synthetic", "0.2M", SAMPLE_TRAIN),
        ("synthetic", "0.05M", 100_000),
        ("synthetic", "0.05M", SAMPLE_TRAIN),
        ("sample_1h", "0.9M", 5_500),
        ("sample_1h", "0.2M", 5_500),
    ],
    "gpu": (
        [
            ("synthetic", s, d)
            for s in ("26M", "5.0M", "0.9M", "0.2M")
            for d in (100_000_000, 10_000_000, 1_000_000, 100_000, SAMPLE_TRAIN)
        ]
        + [("sample_1d", s, SAMPLE_TRAIN) for s in ("26M", "5.0M", "0.9M", "0.2M")]
        + [("sample_1h", s, 5_500) for s in ("26M", "5.0M", "0.9M", "0.2M")]
    ),
    "smoke": [("synthetic", "toy", 2_000), ("synthetic", "toy", 10_000)],
}
# How long a point trains (the CLI's defaults): to its best. The run is split into EPOCHS
# validations and early stopping ends it after PATIENCE without progress; the budget, PASSES over
# the training tokens, at least MIN_STEPS and at most MAX_STEPS, only caps a point that is still
# improving (its best epoch then comes within its last PATIENCE epochs: `still_improving`).
PASSES, MIN_STEPS, MAX_STEPS, EPOCHS, PATIENCE = 100.0, 200, 6000, 40, 5
EVAL_PER_ASSET = 2_000  # synthetic: validation and test candles per asset at every token count
NESTED_TRAIN = SAMPLE_TRAIN // 8  # --nested: training candles per asset (8 assets hold the smallest corpus)
SYN_ASSETS = 8
CONTEXT, BATCH = 64, 16
PURGE = 64  # candles between the splits: fixed, so a --context check trains on the grid's own candles


def _size_sets(size: str) -> list[str]:
    d, layers, heads, ff = SIZES[size]
    return [
        f"model.d_model={d}",
        f"model.num_layers={layers}",
        f"model.num_heads={heads}",
        f"model.d_ff={ff}",
        f"training.learning_rate={_LR[size]}",
    ]


def _steps(tokens: int, passes: float, min_steps: int, max_steps: Optional[int], context: int = CONTEXT) -> int:
    steps = max(min_steps, math.ceil(passes * tokens / (BATCH * context)))
    return min(steps, max_steps) if max_steps else steps


def _data_sets(
    corpus: str, tokens: int, eval_per_asset: int = EVAL_PER_ASSET, assets: int = SYN_ASSETS, nested: bool = False
) -> list[str]:
    """The data section of one point: the corpus, sized so the train split holds about `tokens`
    candles. nested: every asset has NESTED_TRAIN training candles and the corpus grows by assets,
    so a smaller corpus is the first assets of a larger one (asset i depends only on the seed, i
    and the length: common/data/synthetic.py), and the first `assets` are the ones scored."""
    purge = PURGE
    if corpus == "synthetic":
        per_asset = NESTED_TRAIN if nested else math.ceil(tokens / assets)
        if nested:
            assets = max(assets, math.ceil(tokens / NESTED_TRAIN))
        eval_n = eval_per_asset + purge
        n = per_asset + 2 * eval_n
        spec = {
            "assets": assets,
            "candles": n,
            "categories": ["crypto"],
            "seasonality": 0.0,
            "gap_prob": 0.0,
            "seed": 0,
        }
        val = eval_n / n
        return [
            'data.source="synthetic"',
            f"data.synthetic={json.dumps(spec)}",
            'data.interval="1h"',
            'data.start_date="2000-01-01"',
            "data.categories=[]",
            f"data.train_ratio={1 - 2 * val!r}",
            f"data.val_ratio={val!r}",
            f"data.test_ratio={val!r}",
        ]
    interval = corpus.split("_")[1]
    return ['data.source="sample"', f'data.interval="{interval}"']


def run_point(
    corpus: str,
    size: str,
    tokens: int,
    *,
    device: str = "cpu",
    passes: float = PASSES,
    min_steps: int = MIN_STEPS,
    max_steps: Optional[int] = MAX_STEPS,
    keep: Optional[Path] = None,
    smoke: bool = False,
    nested: bool = True,
    epochs: int = EPOCHS,
    patience: int = PATIENCE,
    context: int = CONTEXT,
) -> dict[str, Any]:
    """Train one (corpus, size, tokens) point and score its best model on val and test."""
    from common.tokens.token_set import TokenSet, token_path

    steps = _steps(tokens, passes, min_steps, max_steps, context)
    epochs = epochs if steps >= epochs else 1
    small = {"eval_per_asset": 300, "assets": 2} if smoke else {}  # the smoke test: seconds
    sets = (
        _data_sets(corpus, tokens, nested=nested, **small)
        + _size_sets(size)
        + [
            'experiment="scale"',
            "data.universe_counts={}",
            f"model.context_length={context}",
            'model.head="flat"',
            "data.epoch_stride=16",
            "tokenizer.ret_bins=32",
            "model.dropout=0.1",
            "training.weight_decay=0.1",
            f"training.warmup_steps={min(50, steps // 4)}",
            f"training.batch_size={BATCH}",
            f"training.epochs={epochs}",
            f"training.max_steps_per_epoch={max(1, steps // epochs)}",
            f"training.early_stopping_patience={patience}",
            "training.scorecard_origins=0",
            "training.vol_reversion=false",
            "training.log_every_steps=100000",
            f'training.device="{device}"',
            "training.compile=false",
        ]
    )
    if corpus.startswith("sample"):
        sets += _sample_slice(corpus, tokens)
    with trained_case_c(sets, "bench_scaling_") as t:
        run_dir, train_log = t.run_dir, t.training_log
        ts = TokenSet.load(token_path(run_dir))
        res: dict[str, Any] = {
            "corpus": corpus,
            "size": size,
            "shape": list(SIZES[size]),
            "tokens_target": tokens,
            "train_tokens": int(sum(r["train"][1] - r["train"][0] for r in ts.ranges.values())),
            "parameters": _parameters(run_dir),
            "steps": train_log["epochs"][-1]["step"]
            if train_log["epochs"] and "step" in train_log["epochs"][-1]
            else steps,
            "planned_steps": steps,
            "tokens_processed": steps * BATCH * context,
            "context": context,
            "best_epoch": train_log.get("best_epoch"),
            "epochs_run": len(train_log["epochs"]),
            "val_losses": [e["val_loss"] for e in train_log["epochs"]],
            "wall_s": round(t.wall_s, 1),
            "loadavg_1m": [round(x, 2) for x in t.loadavg_1m],
            "overrides": sets,
        }
        res["still_improving"] = _still_improving(res)
        scored = small.get("assets", SYN_ASSETS) if nested and corpus == "synthetic" else None
        res["nested"], res["scored_assets"] = nested, scored
        draws = 10_000 if smoke else 100_000
        for split in ("val", "test"):
            test = split == "test"  # test also: each target at (nearly) full context, and the filters' floors
            s = split_scores(run_dir, split, scored, score_last=max(1, context // 4) if test else None)
            out: dict[str, Any] = {
                "loss": {k: float(np.mean(s[k])) for k in ("model", "unigram", "markov1")},
                "targets": int(len(s["model"])),
            }
            out["skill_vs_unigram"] = _skill(s["model"], s)
            if test:
                full = s["model_full_context"]
                out["full_context"] = {
                    "model": float(np.mean(full)),
                    "score_last": max(1, context // 4),
                    "skill_vs_unigram": _skill(full, s),
                }
            if corpus == "synthetic":
                floors = (
                    floor_losses(run_dir, split, scored, draws)
                    if test
                    else {"oracle": oracle_nll(run_dir, split, draws=draws, assets=scored)}
                )
                out["loss"].update(floors)
                gap = out["loss"]["unigram"] - floors["oracle"]
                if gap > 0:
                    out["gap_closed"], out["gap_closed_ci95"] = _share(out["skill_vs_unigram"], gap)
                else:
                    out["gap_closed"] = out["gap_closed_ci95"] = None
                for key in ("filter", "filter_tokens") if test else ():
                    out[f"{key}_gap_closed"] = (out["loss"]["unigram"] - floors[key]) / gap if gap > 0 else None
                if test and gap > 0:
                    fc = out["full_context"]
                    fc["gap_closed"], fc["gap_closed_ci95"] = _share(fc["skill_vs_unigram"], gap)
            res[split] = out
        if keep is not None:
            shutil.copytree(run_dir, keep / f"{corpus}_{size}_{tokens}")
        return res


def _skill(model_nll: np.ndarray, s: dict[str, Any]) -> dict[str, Any]:
    """The model's token skill against the unigram on the same targets, with its 95% interval."""
    from common.evaluation.metrics import skill_interval

    return skill_interval(model_nll, s["unigram"], s["position"], horizon=1, stride=1, kind="diff", n_boot=1000)


def _share(skill: dict[str, Any], gap: float) -> tuple[float, list[float]]:
    """A skill (and its interval) as a share of the unigram-to-oracle gap (the oracle taken as exact)."""
    return skill["value"] / gap, [c / gap for c in skill["ci95"]]


def _parameters(run_dir: Path) -> int:
    from common.config import load_config
    from common.model.sizing import meta_model

    ai = json.loads((run_dir / "asset_info.json").read_text())
    cfg = load_config(run_dir / "config.json")
    return int(meta_model(cfg.model, cfg.data, ai["num_assets"], ai["num_categories"]).num_parameters())


def _sample_slice(corpus: str, tokens: int) -> list[str]:
    """The sample cut to about `tokens` training candles by a later data.start_date: the newest
    history is kept, and validation and test shrink with it, in proportion (nothing when the
    whole sample is asked for)."""
    from common.data.sample import load_sample

    frames = load_sample(corpus.split("_")[1])
    stamps = np.sort(np.concatenate([f.index.tz_convert(None).to_numpy() for f in frames.values()]))[::-1]
    rows = math.ceil(tokens / 0.70)  # data.train_ratio's default
    if rows >= len(stamps) * 0.95:
        return []
    start = np.datetime_as_string(stamps[rows - 1], unit="D")
    return [f'data.start_date="{start}"']


# --------------------------------------------------------------------------- output


def plot(records: Sequence[dict[str, Any]], path: Path) -> None:
    """One panel per corpus: gap closed (synthetic) or skill vs unigram (real) on test, against
    training tokens, one line per size, with the 95% intervals as error bars; a hollow marker is a
    point still improving when its budget ended."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = sorted({r["corpus"] for r in records}, key=lambda c: (c != "synthetic", c))
    fig, axes = plt.subplots(1, len(corpora), figsize=(5.2 * len(corpora), 4.2), squeeze=False)
    for ax, corpus in zip(axes[0], corpora):
        syn = corpus == "synthetic"
        for size in SIZES:
            pts = sorted(
                (r for r in records if r["corpus"] == corpus and r["size"] == size), key=lambda r: r["train_tokens"]
            )
            if not pts:
                continue
            x = [r["train_tokens"] for r in pts]
            if syn:
                y = [r["test"]["gap_closed"] for r in pts]
                ci = [r["test"]["gap_closed_ci95"] for r in pts]
            else:
                y = [r["test"]["skill_vs_unigram"]["value"] for r in pts]
                ci = [r["test"]["skill_vs_unigram"]["ci95"] for r in pts]
            err = [[v - c[0] for v, c in zip(y, ci)], [c[1] - v for v, c in zip(y, ci)]]
            color = f"C{list(SIZES).index(size)}"  # one colour per size in every panel
            ax.errorbar(
                x, y, yerr=err, marker="o", capsize=3, color=color, label=f"{size} ({pts[0]['parameters'] / 1e6:.2f}M)"
            )
            open_ = [(xi, yi) for xi, yi, r in zip(x, y, pts) if _still_improving(r)]
            if open_:  # hollow: the budget ended it while still improving (an upper bound on its loss)
                ax.plot(*zip(*open_), "o", mfc="white", mec=color, zorder=3)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("training tokens (candles)")
        ax.set_ylabel("share of unigram-to-oracle gap closed (test)" if syn else "skill vs unigram, nats/token (test)")
        ax.set_title(corpus)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _line(r: dict[str, Any]) -> str:
    t, v = r["test"], r["val"]
    sk = t["skill_vs_unigram"]
    gap = (
        f" gap closed {t['gap_closed']:+.3f} [{t['gap_closed_ci95'][0]:+.3f}, {t['gap_closed_ci95'][1]:+.3f}]"
        if t.get("gap_closed") is not None
        else ""
    )
    return (
        f"{r['corpus']:<10} {r['size']:>5} ({r['parameters'] / 1e6:5.2f}M) D={r['train_tokens']:>9,} "
        f"steps {r['steps']:>5} best epoch {r['best_epoch']}: val {v['loss']['model']:.4f} test "
        f"{t['loss']['model']:.4f} (unigram {t['loss']['unigram']:.4f}"
        + (f", oracle {t['loss']['oracle']:.4f}" if "oracle" in t["loss"] else "")
        + f") skill {sk['value']:+.4f} [{sk['ci95'][0]:+.4f}, {sk['ci95'][1]:+.4f}]{gap}; {r['wall_s']:.0f} s"
    )


def _parse_points(text: str) -> list[tuple[str, str, int]]:
    points = []
    for item in text.split(","):
        corpus, size, tokens = item.split(":")
        if size not in SIZES or corpus not in ("synthetic", "sample_1d", "sample_1h"):
            raise SystemExit(f"--points: unknown size or corpus in {item!r} (sizes {', '.join(SIZES)})")
        points.append((corpus, size, int(float(tokens))))
    return points


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grid", choices=tuple(GRIDS), default="cpu")
    p.add_argument("--points", help="corpus:size:tokens,... instead of --grid")
    p.add_argument("--smoke", action="store_true", help="the toy grid, few steps (seconds)")
    p.add_argument(
        "--nested",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="synthetic corpora grow by assets of one length, each a subset of the larger ones, all "
        "scored on the same first 8 assets (default); --no-nested: each token count is its own "
        "market of 8 assets (the grid of 2026-11-25)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a busy shared machine 2 threads were 3.5x slower per step)",
    )
    p.add_argument("--jobs", type=int, default=1, help="points trained at once, each in its own process")
    p.add_argument("--passes", type=float, default=PASSES, help="budget: at most passes x training tokens trained")
    p.add_argument("--min-steps", type=int, default=MIN_STEPS)
    p.add_argument("--max-steps", type=int, default=MAX_STEPS)
    p.add_argument("--epochs", type=int, default=EPOCHS, help="validations in a point's run (its steps split evenly)")
    p.add_argument("--context", type=int, default=CONTEXT, help="model.context_length of every point")
    p.add_argument(
        "--patience", type=int, default=PATIENCE, help="early stopping after this many validations without progress"
    )
    p.add_argument("--out", type=Path, help="results folder (default bench/results/<date>-<cpu|gpu>)")
    p.add_argument(
        "--fit",
        nargs="+",
        type=Path,
        metavar="RESULTS.json",
        help="fit the synthetic points of these results and write common/model/scaling_fit.json",
    )
    p.add_argument("--name", default="scaling", help="file name of the JSON and PNG (default scaling)")
    a = p.parse_args(argv)
    if a.fit:
        return write_fit(a.fit)
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(
                "bench_scaling: no GPU here (torch.cuda.is_available() is false); the GPU grid is skipped. "
                "Run it where a GPU is lent: python bench/bench_scaling.py --device cuda --grid gpu"
            )
            return 0
    import torch

    torch.set_num_threads(a.threads)
    points = _parse_points(a.points) if a.points else GRIDS["smoke" if a.smoke else a.grid]
    if a.smoke:
        a.min_steps, a.max_steps = 4, 4
    out = a.out or REPO / "bench" / "results" / f"{dt.date.today():%Y-%m-%d}-{'gpu' if a.device == 'cuda' else 'cpu'}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{a.name}{'_smoke' if a.smoke else ''}.json"
    doc: dict[str, Any] = {
        "command": "python bench/bench_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{os.cpu_count()} vCPU, {_cpu_name()}",
        "started": _now(),
        "points": [],
    }
    from common.atomic import atomic_write_json

    kw = dict(
        device=a.device,
        passes=a.passes,
        min_steps=a.min_steps,
        max_steps=a.max_steps,
        smoke=a.smoke,
        nested=a.nested,
        epochs=a.epochs,
        patience=a.patience,
        context=a.context,
    )
    for r in _run_points(points, a.jobs, a.threads, kw):
        doc["points"].append(r)
        doc["finished"] = _now()
        atomic_write_json(path, doc)
        print(_line(r), flush=True)
        plot(doc["points"], path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def _run_points(
    points: Sequence[tuple[str, str, int]], jobs: int, threads: int, kw: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """Each point's record as it finishes: in this process one after another, or in `jobs`
    worker processes (spawned, `threads` torch threads each) in the order they finish."""
    if jobs <= 1:
        for point in points:
            yield run_point(*point, **kw)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(
        jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init, initargs=(threads,)
    ) as pool:
        for done in as_completed([pool.submit(run_point, *point, **kw) for point in points]):
            yield done.result()


def _worker_init(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


# training candles of the seed's cases today (docs/plan figures) and of larger corpora
CASE_TOKENS = {
    "sample 1d": SAMPLE_TRAIN,
    "case B": 360_000,
    "case C": 1_090_000,
    "case A": 2_210_000,
    "10M": 10_000_000,
    "100M": 100_000_000,
}


def write_fit(results: Sequence[Path], out: Optional[Path] = None) -> int:
    """Fit L(N, D) to the synthetic points' test loss above the oracle (common.model.scaling_fit)
    and write the fit file; print each point against the fit and N* for the cases' data."""
    from common.atomic import atomic_write_json
    from common.model.scaling_fit import FIT_FILE, fit_points

    every = [r for path in results for r in json.loads(path.read_text())["points"] if r["size"] != "toy"]
    plot(every, results[0].with_name("scaling_all.png"))
    print(
        "| corpus | size | parameters | training tokens | steps | best epoch / run | val loss | test loss | "
        "test unigram | test oracle | test skill vs unigram [95%] | gap closed [95%] | wall |\n|" + "---|" * 13
    )
    for r in sorted(every, key=lambda r: (r["corpus"] != "synthetic", r["corpus"], r["parameters"], r["train_tokens"])):
        t = r["test"]
        sk, gap = t["skill_vs_unigram"], t.get("gap_closed")
        oracle = f"{t['loss']['oracle']:.4f}" if "oracle" in t["loss"] else "–"
        closed = f"{gap:.3f} [{t['gap_closed_ci95'][0]:.3f}, {t['gap_closed_ci95'][1]:.3f}]" if gap is not None else "–"
        print(
            f"| {r['corpus']} | {r['size']} | {r['parameters']:,} | {r['train_tokens']:,} | {r['steps']} | "
            f"{r['best_epoch']} / {r['epochs_run']}{' (still improving)' if _still_improving(r) else ''} | "
            f"{r['val']['loss']['model']:.4f} | {t['loss']['model']:.4f} | {t['loss']['unigram']:.4f} | {oracle} | "
            f"{sk['value']:+.4f} [{sk['ci95'][0]:+.4f}, {sk['ci95'][1]:+.4f}] | "
            f"{closed} | {r['wall_s']:.0f} s |"
        )
    # the form describes each (N, D) trained to its best: a point the budget stopped while it was
    # still improving is only an upper bound on its loss, shown against the fit but not fitted
    syn = [r for r in every if r["corpus"] == "synthetic"]
    pts = [r for r in syn if not _still_improving(r)]
    capped = [r for r in syn if _still_improving(r)]
    n = [r["parameters"] for r in pts]
    d = [r["train_tokens"] for r in pts]
    excess = [r["test"]["loss"]["model"] - r["test"]["loss"]["oracle"] for r in pts]
    names = ", ".join(
        str(p.resolve().relative_to(REPO)) if p.resolve().is_relative_to(REPO) else str(p) for p in results
    )
    fit = fit_points(
        n,
        d,
        excess,
        source=f"synthetic market, test loss above the oracle; {names}",
        at_tokens=list(CASE_TOKENS.values()),
    )
    print(
        f"fit: terms {fit.terms}, "
        + ", ".join(f"{k} {v:.4g}" for k, v in fit.coef.items())
        + f"; rmse {fit.rmse:.4f} nats over {fit.points} points"
    )
    print(
        "  bootstrap 95% (200 resamples of the points): "
        + ", ".join(
            f"{k} [{fit.bootstrap[k][0]:.3g}, {fit.bootstrap[k][2]:.3g}]"
            for k in ("E", *fit.terms, *(t.lower() for t in fit.terms))
        )
    )
    for r in pts + capped:
        e = r["test"]["loss"]["model"] - r["test"]["loss"]["oracle"]
        print(
            f"  {r['size']:>5} D={r['train_tokens']:>9,}: excess {e:.4f}, "
            f"fit {fit.loss(r['parameters'], r['train_tokens']):.4f}"
            + ("  (still improving when its budget ended: an upper bound, not fitted)" if r in capped else "")
        )
    for name, tokens in CASE_TOKENS.items():
        opt = fit.optimal_parameters(tokens)
        print(
            f"  N* for {name} ({tokens:,} tokens): {'none (no interior optimum)' if opt is None else f'{opt:,.0f}'}"
            f"; bootstrap 95% {fit.optimum_ci.get(f'{tokens:.0f}')}"
        )
    if not fit.terms:
        print(
            "the points support no dependence on N or D (the constant form has the lowest AICc): nothing written; "
            "a fit that advised a size would be advice the points do not give"
        )
        return 0
    atomic_write_json(out or FIT_FILE, fit.to_dict())
    print(f"wrote {out or FIT_FILE}")
    return 0


def _still_improving(r: dict[str, Any]) -> bool:
    """The budget, not early stopping, ended the point's run: it ran every epoch and its best came
    within the last `patience` of them, so it may have improved further (not at its best)."""
    sets = dict(s.split("=", 1) for s in r.get("overrides", []))
    epochs = int(sets.get("training.epochs", r["epochs_run"]))
    patience = int(sets.get("training.early_stopping_patience", 1))
    return r["epochs_run"] >= epochs and r["best_epoch"] > r["epochs_run"] - patience


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    raise SystemExit(main())
