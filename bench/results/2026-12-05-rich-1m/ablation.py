"""Off against on at the 10^6-token rich market: each variant's sweep point against the base's of the
same seed (training.seed), on the validation split only.

    python bench/results/2026-12-05-rich-1m/ablation.py case_c_crypto/sweeps rich1m_s{seed} \
        market:rich1m_market_s{seed} rope:rich1m_rope_s{seed}

Per variant: the mean paired difference of the best validation loss (variant - base, nats a token)
with a 95% t interval over the seeds, and the training tokens after which the variant's per-epoch
validation loss first reaches the base's best loss of the same seed (training_log.json's epochs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

POINT = "d128l4_f100_lr0.001.json"  # the base learning rate: every variant ran at it
SEEDS = (0, 1, 2)


def point(sweeps: Path, name: str) -> dict:
    return json.loads((sweeps / name / "points" / POINT).read_text())


def val_curve(p: dict) -> list[tuple[int, float]]:
    """(training tokens so far, validation loss) after each epoch."""
    log = json.loads((Path(p["run"]) / "training_log.json").read_text())
    per_step = (
        p["train_tokens"]
        and log["effective_batch_size"]
        * json.loads((Path(p["run"]) / "config.json").read_text())["model"]["context_length"]
    )
    return [(e["step"] * per_step, e["val_loss"]) for e in log["epochs"]]


def main(argv: list[str]) -> int:
    sweeps, base = Path(argv[0]), argv[1]
    out: dict = {}
    for spec in argv[2:]:
        name, pattern = spec.split(":")
        rows = []
        for seed in SEEDS:
            b, v = point(sweeps, base.format(seed=seed)), point(sweeps, pattern.format(seed=seed))
            target = b["best_val_loss"]
            reach = next((tok for tok, loss in val_curve(v) if loss <= target), None)
            base_tokens = next(tok for tok, loss in val_curve(b) if loss <= target)
            rows.append(
                {
                    "seed": seed,
                    "base": target,
                    "variant": v["best_val_loss"],
                    "delta": v["best_val_loss"] - target,
                    "tokens_to_base_best": reach,
                    "base_tokens": base_tokens,
                }
            )
        d = np.array([r["delta"] for r in rows])
        half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
        out[name] = {
            "seeds": rows,
            "delta_mean": float(d.mean()),
            "delta_ci95": [float(d.mean() - half), float(d.mean() + half)],
        }
        print(
            f"{name}: variant - base = {d.mean():+.4f} [{d.mean() - half:+.4f}, {d.mean() + half:+.4f}]"
            " nats/token (validation, 3 seeds)"
        )
        for r in rows:
            reach = (
                "never" if r["tokens_to_base_best"] is None else f"{r['tokens_to_base_best']:,} of {r['base_tokens']:,}"
            )
            print(
                f"  seed {r['seed']}: base {r['base']:.4f}, variant {r['variant']:.4f} ({r['delta']:+.4f}); "
                f"reaches the base's best after {reach} tokens"
            )
    (sweeps / "ablation_rich1m.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
