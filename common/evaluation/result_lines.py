"""The lines a run's results print as: the test results' summary (the end of a job, `marketgpt
evaluate`, `remote`), a skill verdict, the baselines' names. Plain dicts in, strings out, nothing
imported: `marketgpt status` and `remote` print them without loading numpy, pandas or torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["BASELINE_NAMES", "SKILL_BASELINES", "format_verdict", "summarize_results"]

BASELINE_NAMES = {
    "rw_ewma": "RW-EWMA",
    "bootstrap": "bootstrap",
    "garch": "GARCH",
    "har": "HAR-range",
    "log_har": "log-HAR-range",
}
SKILL_BASELINES = ("unigram", "markov1")  # test_results.json's token_skill: the model's loss against these


def format_verdict(horizon: int, score: str, baseline: str, skill: dict, percent: bool = True, detail: str = "") -> str:
    """`H=1: CRPS skill vs GARCH +2.1% [0.8, 3.4] (beats)`; detail goes before the verdict."""
    scale, unit = (100.0, "%") if percent else (1.0, "")
    # a bound just below zero prints as -0.0: the verdict's sign stays visible
    v, lo, hi = (x * scale for x in (skill["value"], *skill["ci95"]))
    return f"H={horizon}: {score} skill vs {baseline} {v:+.1f}{unit} [{lo:.1f}, {hi:.1f}]{detail} ({skill['verdict']})"


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _skill(s: dict) -> str:
    lo, hi = s["ci95"]
    return f"{100 * s['value']:+.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] ({s['verdict']})"


def _num(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def summarize_results(run_dir: Path, r: dict) -> str:
    """A few lines for the end of a job: where the run is, and the test metrics vs baselines."""
    lines = [
        f"Run folder: {run_dir}",
        f"Test (best model, epoch {r.get('best_epoch')}): loss {_num(r['test_loss'])} | "
        f"accuracy {_pct(r['test_accuracy'])} | top-5 {_pct(r['top5_accuracy'])} | "
        f"perplexity {_num(r['perplexity'])} | {r['num_tokens']:,} tokens"
        + (f" (interval {r['interval']}; each below)" if r.get("interval") else ""),
    ]
    for name, b in r.get("baselines", {}).items():
        lines.append(
            f"  baseline {name:<12} loss {_num(b['loss'])} | accuracy {_pct(b['accuracy'])} | "
            f"top-5 {_pct(b['top5_accuracy'])}"
        )
    skill = r.get("token_skill") or {}
    parts = [f"vs {name} {_skill(skill[name])}" for name in SKILL_BASELINES if skill.get(name)]
    if parts:
        lines.append("Loss skill 1 - model/baseline [95% block-bootstrap CI]: " + " | ".join(parts))
    for interval, ri in (r.get("per_interval") or {}).items():  # a run of several intervals
        skill = (ri.get("token_skill") or {}).get("unigram")
        lines.append(
            f"  interval {interval:<4} loss {_num(ri['test_loss'])} | {ri['num_tokens']:,} tokens"
            + (f" | skill vs unigram {_skill(skill)}" if skill else "")
        )
    d = r.get("directional", {})
    if d.get("model"):
        m, up = d["model"], d.get("always_up", {})
        lines.append(
            f"Directional accuracy: model {_pct(m['accuracy'])} "
            f"[95% CI {_pct(m['ci95_low'])}, {_pct(m['ci95_high'])}] vs always-up "
            f"{_pct(up.get('accuracy'))} on {d.get('num_moves', 0):,} moves"
        )
    return "\n".join(lines)
