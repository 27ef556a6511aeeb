"""Generalization on the shipped sample: does a short CPU training beat the token unigram?

Trains case C's config on the shipped sample (data.source=sample) with the small-data
settings below plus any --set overrides, then scores the best model (chosen on validation by
the trainer) on one split against the unigram and Markov baselines, per target:

    skill = mean over targets of (baseline NLL - model NLL), nats per token (> 0: model better)

with a paired block-bootstrap 95% interval (common.evaluation.metrics.skill_interval, kind "diff") over
the split's candle positions: every asset's target at the same position is resampled together
(the daily sample's assets share dates), in blocks of consecutive positions.

    python bench/bench_generalization.py --split val [--set model.head="factorized" ...]   # select here
    python bench/bench_generalization.py --split val,test     # one training; read test once, for the chosen settings

Prints the per-epoch train/val losses, the wall time with the load average, and the skill
lines. Always exits 0: it reports, it does not gate.

An ablation trains each seed twice, without and with one setting, on the same data and budget,
and compares the best model's validation loss (never test: the choice is made on it):

    python bench/bench_generalization.py --ablate model.vol_level_input=true --seeds 0,1,2 --json out.json

prints each pair and the mean difference (on - off, nats per token; < 0: the setting helps) with
a 95% Student-t interval over the seeds (paired by seed: each pair shares the initial weights'
seed and the window order).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO  # noqa: E402  (puts the repo on sys.path)

__all__ = ["SMALL_DATA", "Trained", "ablate", "paired_interval", "run", "main", "trained_case_c"]

CASE_C = REPO / "case_c_crypto" / "configs" / "crypto_prototype.json"


class Trained(NamedTuple):
    """One training of case C's config in a throwaway case folder (`trained_case_c`)."""

    run_dir: Path
    log: str  # what the training printed
    wall_s: float
    loadavg_1m: tuple[float, float]  # at start and at end: the machine is shared
    training_log: dict[str, Any]


@contextlib.contextmanager
def trained_case_c(sets: Sequence[str], prefix: str) -> Iterator[Trained]:
    """Train case C's config with `sets` (`experiment` among them) in a copy of its case folder,
    timed; yields the run; the folder is removed after. A failed training raises with its log."""
    from common.commands.train import run_training

    case = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        (case / "configs").mkdir()
        shutil.copy(CASE_C, case / "configs" / CASE_C.name)
        shutil.copy(CASE_C.parent.parent / "universe.csv", case / "universe.csv")
        log = io.StringIO()
        t0, load0 = time.perf_counter(), os.getloadavg()[0]
        code = run_training(case / "configs" / CASE_C.name, list(sets), out=log)
        wall, load1 = time.perf_counter() - t0, os.getloadavg()[0]
        if code != 0:
            raise RuntimeError(f"training exited {code}:\n{log.getvalue()[-3000:]}")
        run_dir = next(p for p in (case / "checkpoints").iterdir() if p.is_dir())  # the one run
        yield Trained(
            run_dir, log.getvalue(), wall, (load0, load1), json.loads((run_dir / "training_log.json").read_text())
        )
    finally:
        shutil.rmtree(case, ignore_errors=True)


# The documented small-data settings (docs/generalization.md): a smaller model than case C's on the daily sample.
SMALL_DATA = (
    'data.source="sample"',
    'data.interval="1d"',
    "data.universe_counts={}",
    "model.d_model=128",
    "model.num_layers=4",
    "model.num_heads=4",
    "model.d_ff=512",
    "model.context_length=64",
    'model.head="flat"',
    "data.epoch_stride=16",
    "tokenizer.ret_bins=32",
    "model.dropout=0.2",
    # case C's config reads the market with rotary positions (they pay at 10^6 training tokens);
    # on the sample at this budget neither pays, alone or together (bench/results/2026-12-05-defaults)
    "model.market_context=false",
    'model.positional="learned"',
    "training.weight_decay=0.1",
    "training.learning_rate=1e-3",
    "training.warmup_steps=50",
    "training.batch_size=32",
    "training.epochs=12",
    "training.max_steps_per_epoch=40",
    "training.early_stopping_patience=4",
    "training.scorecard_origins=0",
    "training.vol_reversion=false",
    "training.log_every_steps=1000",
)


def split_scores(
    run_dir: Path, split: str, first_assets: int | None = None, score_last: int | None = None
) -> dict[str, Any]:
    """Per-target NLL of the run's best model and of the baselines on `split` ("val" or "test"),
    with each target's asset and candle position inside the split; of the run's first
    `first_assets` symbols only, when given (the baselines still fit on every asset's train split);
    score_last: also "model_full_context", the model's NLL of the same targets scored at (nearly)
    its full context (token_scoring.split_windows)."""
    import numpy as np
    import torch

    from common.config import load_config
    from common.evaluation.baselines import fit_baselines
    from common.evaluation.token_scoring import eval_inputs, score_baseline, score_model, split_windows
    from common.model.gpt import MarketGPT
    from common.run.checkpoint import load_checkpoint
    from common.special_tokens import PAD_TOKEN
    from common.tokens.token_set import TokenSet, token_path
    from common.tokens.tokenizer import OHLCTokenizer

    cfg = load_config(run_dir / "config.json")
    tokens = TokenSet.load(token_path(run_dir))
    tok = OHLCTokenizer.load(run_dir / "tokenizer.json")
    ai = json.loads((run_dir / "asset_info.json").read_text())
    ranges = {s: {"train": r["train"], "test": r[split]} for s, r in tokens.ranges.items()}
    data, train = eval_inputs(tokens.tokens, tokens.moves, ranges, tokens.features)
    if first_assets is not None:
        data = {s: data[s] for s in tokens.symbols[:first_assets] if s in data}
    data = {s: t for s, t in data.items() if len(t.tokens) > 1}
    best = load_checkpoint(run_dir / "best_model.pt", map_location="cpu")
    model = MarketGPT(cfg.model, num_assets=ai["num_assets"], num_categories=ai["num_categories"])
    model.load_state_dict(best["model"])
    model.eval()
    w = split_windows(data, cfg.model.context_length)
    cat = {rec["symbol"]: ai["categories"][rec["category"]] for rec in ai["assets"]}
    a_ids = np.array([ai["symbols"][s] for s in w.symbols], np.int64)
    c_ids = np.array([cat[s] for s in w.symbols], np.int64)
    moves = torch.zeros(tok.vocab_size)
    mask = w.y != PAD_TOKEN
    out = {"model": score_model(model, w, a_ids, c_ids, moves, 64, torch.device("cpu")).nll}
    if score_last is not None:  # the same targets in the same order, each with more context
        out["model_full_context"] = score_model(
            model,
            split_windows(data, cfg.model.context_length, score_last),
            a_ids,
            c_ids,
            moves,
            64,
            torch.device("cpu"),
        ).nll
    baselines = fit_baselines(train, tok.vocab_size)
    for name in ("unigram", "markov1"):
        out[name] = score_baseline(baselines[name], w.x[mask], w.y[mask], moves).nll
    # targets come window by window, each asset's in order: positions 1 .. n - 1 of its split
    out["position"] = np.concatenate([np.arange(1, len(data[s].tokens)) for s in w.symbols])
    assert len(out["position"]) == len(out["model"]), "target order differs from the windows'"
    out["best_epoch"] = best["epoch"]
    return out


def run(splits: Sequence[str], overrides: Sequence[str] = (), keep: Path | None = None) -> dict[str, Any]:
    from common.evaluation.metrics import skill_interval

    sets = list(SMALL_DATA) + ['experiment="gen"'] + list(overrides)
    with trained_case_c(sets, "bench_gen_") as t:
        train_log = t.training_log
        res: dict[str, Any] = {
            "overrides": sets,
            "wall_s": round(t.wall_s, 1),
            "loadavg_1m": list(t.loadavg_1m),
            "steps": train_log["epochs"][-1]["step"],
            "best_epoch": train_log.get("best_epoch"),
            "epochs": [{k: round(e[k], 4) for k in ("epoch", "train_loss", "val_loss")} for e in train_log["epochs"]],
            "vocabulary": next((line for line in t.log.splitlines() if line.startswith("Vocabulary:")), None),
        }
        for split in splits:
            s = split_scores(t.run_dir, split)
            res["best_epoch"] = s["best_epoch"]
            res[split] = {"loss": {name: float(s[name].mean()) for name in ("model", "unigram", "markov1")}}
            for name in ("unigram", "markov1"):
                res[split][f"skill_vs_{name}"] = skill_interval(
                    s["model"], s[name], s["position"], horizon=1, stride=1, kind="diff", n_boot=2000
                )
        if keep is not None:
            shutil.copytree(t.run_dir, keep / t.run_dir.name)
    return res


def paired_interval(diffs: Sequence[float]) -> dict[str, Any]:
    """Mean of paired differences with its 95% Student-t interval (at least two pairs)."""
    import numpy as np
    from scipy.stats import t as student_t

    d = np.asarray(diffs, dtype=np.float64)
    mean, half = float(d.mean()), float(student_t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": len(d)}


def ablate(
    setting: str | Sequence[str], seeds: Sequence[int], overrides: Sequence[str] = (), progress: Path | None = None
) -> dict[str, Any]:
    """Per seed: the validation loss of a training without `setting` and one with it (same data,
    budget and seed), and the paired difference (on - off) with its interval. `setting`: one
    KEY=VALUE or several, switched on together. progress: a JSON file rewritten after each pair
    (a long ablation on a shared machine keeps what it finished)."""
    settings = [setting] if isinstance(setting, str) else list(setting)
    setting = " ".join(settings)  # as the JSON records it
    pairs: list[dict[str, Any]] = []
    for seed in seeds:
        base = [*overrides, f"training.seed={seed}"]
        off, on = run(["val"], base), run(["val"], [*base, *settings])
        pairs.append(
            {
                "seed": seed,
                "off": off["val"]["loss"]["model"],
                "on": on["val"]["loss"]["model"],
                "off_best_epoch": off["best_epoch"],
                "on_best_epoch": on["best_epoch"],
                "unigram": off["val"]["loss"]["unigram"],
                "wall_s": [off["wall_s"], on["wall_s"]],
                "loadavg_1m": [off["loadavg_1m"], on["loadavg_1m"]],
            }
        )
        if progress is not None:
            so_far = {"setting": setting, "overrides": list(overrides), "pairs": pairs}
            progress.write_text(json.dumps(so_far, indent=1))
    diffs = [p["on"] - p["off"] for p in pairs]
    return {"setting": setting, "overrides": list(overrides), "pairs": pairs, "diff": paired_interval(diffs)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--split",
        choices=("val", "test", "val,test"),
        default="val",
        help="val,test: both from one training (select on val; read test once, for the chosen settings)",
    )
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--json", type=Path, help="also write the result here")
    p.add_argument(
        "--ablate",
        action="append",
        metavar="KEY=VALUE",
        help="train each seed without and with this setting (val only); repeat it to switch several on together",
    )
    p.add_argument("--seeds", default="0,1,2", help="with --ablate: the training seeds (default 0,1,2)")
    a = p.parse_args(argv)
    if a.ablate:
        res = ablate(a.ablate, [int(s) for s in a.seeds.split(",")], a.overrides, a.json)
        print(
            f"machine: {os.cpu_count()} vCPU; ablation of {res['setting']}, "
            "validation loss of the best model (nats/token)"
        )
        for q in res["pairs"]:
            print(
                f"  seed {q['seed']}: off {q['off']:.4f} (epoch {q['off_best_epoch']})  on {q['on']:.4f} "
                f"(epoch {q['on_best_epoch']})  on - off {q['on'] - q['off']:+.4f}  [unigram {q['unigram']:.4f}; "
                f"{q['wall_s'][0]:.0f} s + {q['wall_s'][1]:.0f} s]"
            )
        d = res["diff"]
        lo, hi = d["ci95"]
        print(f"mean on - off {d['mean']:+.4f} nats/token, 95% CI [{lo:+.4f}, {hi:+.4f}] ({d['n']} seeds)")
        if a.json:
            a.json.write_text(json.dumps(res, indent=1))
        return 0
    res = run(a.split.split(","), a.overrides)
    print(
        f"machine: {os.cpu_count()} vCPU; wall {res['wall_s']} s for {res['steps']} steps; "
        f"load average (1 min) {res['loadavg_1m'][0]:.1f} at start, {res['loadavg_1m'][1]:.1f} at end"
    )
    print(res["vocabulary"])
    for e in res["epochs"]:
        print(f"  epoch {e['epoch']:>2}: train {e['train_loss']:.4f}  val {e['val_loss']:.4f}")
    for split in a.split.split(","):
        L = res[split]["loss"]
        print(
            f"{split} loss (best epoch {res['best_epoch']}): model {L['model']:.4f} | unigram {L['unigram']:.4f} | "
            f"markov1 {L['markov1']:.4f}"
        )
        for name in ("unigram", "markov1"):
            sk = res[split][f"skill_vs_{name}"]
            print(
                f"  {split} skill vs {name}: {sk['value']:+.4f} nats/token, 95% CI [{sk['ci95'][0]:+.4f}, "
                f"{sk['ci95'][1]:+.4f}] ({sk['verdict']})"
            )
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
