"""The recipe, measured: each change against today's defaults on the rich synthetic market, at one
fixed token budget, over several seeds.

Every variant trains case C's sweep config (case_c_crypto/configs/sweep_rich.json: the rich market,
8 assets x 12,000 hourly candles, the quickstart's 0.93M shape) for the same optimizer steps, with
early stopping off, so each sees the same training tokens; the trainer keeps its best epoch by
validation loss. That best model is then scored on every validation target (never the test split:
this chooses defaults). Reported per variant, paired by seed with the baseline:

    delta   mean over seeds of (variant - baseline) validation NLL, nats per token, with a t interval
            (95%, seeds - 1 degrees of freedom, bench_generalization.paired_interval); < 0: the change pays
    tokens  the training tokens after which the variant's validation loss (the trainer's per-epoch
            figure) first reaches the baseline's best, mean over seeds; None where it never does

    python bench/bench_recipe.py                               # every variant, 3 seeds, 20 epochs
    python bench/bench_recipe.py --variants base,swiglu --seeds 0 --epochs 2 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine_info  # noqa: E402  (puts the repo on sys.path)

from bench_generalization import paired_interval, split_scores  # noqa: E402

SWEEP_RICH = REPO / "case_c_crypto" / "configs" / "sweep_rich.json"
# name -> the --set overrides that make it; "base" is today's defaults
VARIANTS: dict[str, tuple[str, ...]] = {
    "base": (),
    "lr3e-4": ("training.learning_rate=3e-4",),
    "rope": ('model.positional="rope"',),
    "rmsnorm": ('model.norm="rms"',),
    "qk_norm": ("model.qk_norm=true",),
    "swiglu": ('model.mlp="swiglu"',),
    "all": ('model.positional="rope"', 'model.norm="rms"', "model.qk_norm=true", 'model.mlp="swiglu"'),
    "muon": ('training.optimizer="muon"',),  # the blocks' matrices by Muon at training.muon_lr 0.02
    # inputs rather than recipe, measured the same way: what the rest of the market did, the level of volatility
    "market": ("model.market_context=true",),
    "vol_level": ("model.vol_level_input=true",),
}


@contextlib.contextmanager
def case_folder() -> Iterator[Path]:
    """A throwaway case folder with the sweep config: its token shard is prepared by the first run
    and reused by every other (the same data for every variant and seed)."""
    case = Path(tempfile.mkdtemp(prefix="bench_recipe_"))
    try:
        (case / "configs").mkdir()
        shutil.copy(SWEEP_RICH, case / "configs" / SWEEP_RICH.name)
        yield case / "configs" / SWEEP_RICH.name
    finally:
        shutil.rmtree(case, ignore_errors=True)


def train_run(config: Path, name: str, seed: int, epochs: int, sets: Sequence[str]) -> Path:
    """Train the case's config as experiment `name` with `seed` for `epochs` epochs (early
    stopping off) and `sets`; its run folder."""
    from common.commands.train import run_training

    overrides = [
        f'experiment="{name}"',
        f"training.seed={seed}",
        f"training.epochs={epochs}",
        "training.early_stopping_patience=0",
        "training.log_every_steps=1000",
        *sets,
    ]
    out = io.StringIO()
    if run_training(config, overrides, out=out) != 0:
        raise RuntimeError(f"{name}: training failed:\n{out.getvalue()[-3000:]}")
    (run_dir,) = (config.parent.parent / "checkpoints").glob(f"{name}_*")
    return run_dir


def one_run(config: Path, variant: str, seed: int, epochs: int) -> dict[str, Any]:
    """Train `variant` with `seed` for `epochs` epochs; its validation NLL on every target."""
    started = time.perf_counter()
    run_dir = train_run(config, f"recipe_{variant.replace('-', '_')}_s{seed}", seed, epochs, VARIANTS[variant])
    wall = time.perf_counter() - started
    log = json.loads((run_dir / "training_log.json").read_text())
    scores = split_scores(run_dir, "val")
    shutil.rmtree(run_dir)  # its checkpoints are not needed again
    return {
        "variant": variant,
        "seed": seed,
        "val_nll": float(scores["model"].mean()),
        "unigram_nll": float(scores["unigram"].mean()),
        "best_epoch": log.get("best_epoch"),
        "epoch_val_loss": [e["val_loss"] for e in log["epochs"]],
        "tokens_per_epoch": log["epochs"][0]["step"] * 16 * 64,  # steps x batch x context of the sweep config
        "wall_s": round(wall, 1),
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each variant against "base", paired by seed."""
    base = {r["seed"]: r for r in runs if r["variant"] == "base"}
    rows = []
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == variant and r["seed"] in base]
        deltas = [r["val_nll"] - base[r["seed"]]["val_nll"] for r in mine]
        mean = sum(deltas) / len(deltas) if deltas else math.nan
        lo, hi = paired_interval(deltas)["ci95"] if len(deltas) > 1 else (math.nan, math.nan)
        reach = []
        for r in mine:
            target = min(base[r["seed"]]["epoch_val_loss"])
            first = next((i + 1 for i, v in enumerate(r["epoch_val_loss"]) if v <= target), None)
            reach.append(None if first is None else first * r["tokens_per_epoch"])
        reached = [x for x in reach if x is not None]
        rows.append(
            {
                "variant": variant,
                "seeds": len(mine),
                "val_nll": sum(r["val_nll"] for r in mine) / max(len(mine), 1),
                "delta": mean,
                "ci95": [lo, hi],
                "pays": bool(hi < 0),
                "tokens_to_base_best": sum(reached) / len(reached) if len(reached) == len(reach) else None,
                "base_tokens": mine[0]["tokens_per_epoch"] * len(mine[0]["epoch_val_loss"]) if mine else None,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)} (base is always run)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=20, help="epochs of 50 steps of 16 x 64 tokens each")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    variants = ["base", *[v for v in args.variants.split(",") if v != "base"]]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    started, load0 = time.perf_counter(), os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    with case_folder() as config:
        for seed in seeds:  # seed-major, so a stopped bench still has complete pairs
            for variant in variants:
                r = one_run(config, variant, seed, args.epochs)
                runs.append(r)
                print(
                    f"{variant:8s} seed {seed}: val NLL {r['val_nll']:.4f}, best epoch {r['best_epoch']}",
                )
                if args.json:  # after every run: a stopped bench keeps what it measured
                    args.json.write_text(json.dumps({"epochs": args.epochs, "runs": runs}, indent=2) + "\n")
    rows = summarize(runs)
    print(f"\n{'variant':8s}  seeds  val NLL  delta vs base [95% t]        tokens to base's best")
    for r in rows:
        reach = (
            "n/a" if r["tokens_to_base_best"] is None else f"{r['tokens_to_base_best']:,.0f} of {r['base_tokens']:,}"
        )
        print(
            f"{r['variant']:8s}  {r['seeds']:5d}  {r['val_nll']:.4f}  {r['delta']:+.4f} "
            f"[{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]{'  pays' if r['pays'] else ''}  {reach}"
        )
    result = {
        "config": str(SWEEP_RICH.relative_to(REPO)),
        "epochs": args.epochs,
        "seeds": seeds,
        "runs": runs,
        "summary": rows,
        "wall_s": round(time.perf_counter() - started, 1),
        "loadavg_1m": [load0, os.getloadavg()[0]],
        "machine": machine_info(),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
