"""report.png: one picture of a run, written into its run folder.

    write_report(run_dir, log, test_results, status) -> run_dir / "report.png"

Four panels: train/val loss per epoch (best epoch marked), test loss (with the loss skill
against unigram and markov1 and its 95% block-bootstrap interval) and test accuracy
(top-1, top-5) of the model next to the naive baselines, and directional accuracy with its 95%
interval next to always-up. `log` is the run's training_log.json (a RunLog), `test_results` its
test_results.json; a missing or null value leaves its bar or point out instead of failing.
Rendering uses matplotlib's Agg backend, so no display is needed (Slurm nodes have none).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from common.atomic import atomic_savefig
from common.run.files import REPORT_PNG
from common.run.log import RunLog

__all__ = ["write_report"]

_PREDICTORS = (("model", "model"), ("unigram", "unigram"), ("repeat_last", "repeat last"), ("markov1", "Markov-1"))
_MODEL_COLOR, _BASELINE_COLOR = "#1f77b4", "#b0b0b0"


def write_report(run_dir: str | os.PathLike, log: RunLog, test_results: dict, status: Optional[str] = None) -> Path:
    """Draw the report and write it atomically as run_dir/report.png; returns its path.
    `status`: the run's, when the log does not say it yet (the final outputs come before it)."""
    import matplotlib

    matplotlib.use("Agg")  # before pyplot: no display on compute nodes
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    title = log.experiment or Path(run_dir).name
    fig.suptitle(
        f"MarketGPT run {title}: status {status or log.status or '?'}, "
        f"{test_results.get('num_tokens', 0):,} test tokens",
        fontsize=12,
    )
    _loss_curves(axes[0, 0], log)
    _bars(axes[0, 1], test_results, "loss", "Test loss (cross-entropy, nats; lower is better)", "{:.3f}")
    _skill_note(axes[0, 1], test_results)
    _accuracy(axes[1, 0], test_results)
    _directional(axes[1, 1], test_results)
    fig.tight_layout(rect=(0, 0, 1, 0.96))

    target = Path(run_dir) / REPORT_PNG
    try:
        atomic_savefig(fig, target)
    finally:
        plt.close(fig)
    return target


def _metric(results: dict, predictor: str, key: str) -> Optional[float]:
    """The model's value sits at the top level (test_loss, test_accuracy), a baseline's under baselines."""
    if predictor == "model":
        value = results.get({"loss": "test_loss", "accuracy": "test_accuracy"}.get(key, key))
    else:
        value = results.get("baselines", {}).get(predictor, {}).get(key)
    return None if value is None else float(value)


def _loss_curves(ax: Any, log: RunLog) -> None:
    from matplotlib.ticker import MaxNLocator  # matplotlib only when a report is drawn

    epochs = log.epochs
    for key, label, style in (("train_loss", "train", "-o"), ("val_loss", "val", "-s")):
        points = [(e["epoch"], e[key]) for e in epochs if e.get(key) is not None]
        if points:
            ax.plot(*zip(*points), style, markersize=3, label=label)
    if log.best_epoch is not None:
        ax.axvline(log.best_epoch, color="gray", linestyle=":", label=f"best epoch {log.best_epoch}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Loss per epoch")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy (nats)")
    if epochs:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no finished epoch yet", ha="center", va="center", transform=ax.transAxes)


def _bars(ax: Any, results: dict, key: str, title: str, fmt: str) -> None:
    names, values, colors = [], [], []
    for predictor, label in _PREDICTORS:
        value = _metric(results, predictor, key)
        if value is not None:
            names.append(label)
            values.append(value)
            colors.append(_MODEL_COLOR if predictor == "model" else _BASELINE_COLOR)
    bars = ax.bar(names, values, color=colors)
    ax.bar_label(bars, labels=[fmt.format(v) for v in values], padding=2, fontsize=9)
    ax.set_title(title)
    ax.margins(y=0.15)


def _skill_note(ax: Any, results: dict) -> None:
    """The model's loss skill against unigram and markov1 with its block-bootstrap interval."""
    skill = results.get("token_skill") or {}
    lines = [
        f"skill vs {name}: {100 * s['value']:+.1f}% [{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}] "
        f"({s['verdict']})"
        for name in ("unigram", "markov1")
        if isinstance(s := skill.get(name), dict)
    ]
    if lines:
        ax.text(
            0.98,
            0.97,
            "\n".join(lines),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
        )


def _accuracy(ax: Any, results: dict) -> None:
    labels = [label for _, label in _PREDICTORS]
    width = 0.38
    series = ((-width / 2, "accuracy", "top-1", 1.0), (width / 2, "top5_accuracy", "top-5", 0.5))
    for offset, key, name, alpha in series:
        xs, values, colors = [], [], []
        for i, (predictor, _) in enumerate(_PREDICTORS):
            value = _metric(results, predictor, key)
            if value is not None:
                xs.append(i + offset)
                values.append(100 * value)
                colors.append(_MODEL_COLOR if predictor == "model" else _BASELINE_COLOR)
        bars = ax.bar(xs, values, width, color=colors, alpha=alpha, edgecolor="black", linewidth=0.5, label=name)
        ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], padding=2, fontsize=8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("%")
    ax.set_title("Test accuracy, next token (%): top-1 solid, top-5 light")
    ax.margins(y=0.15)


def _directional(ax: Any, results: dict) -> None:
    d = results.get("directional", {})
    rows = [
        (label, d.get(key))
        for key, label in (
            ("model", "model"),
            ("always_up", "always up"),
            ("markov1", "Markov-1"),
            ("repeat_last", "repeat last"),
        )
    ]
    rows = [(label, r) for label, r in rows if r and r.get("accuracy") is not None]
    if not rows:
        ax.text(0.5, 0.5, "no test moves to score", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Directional accuracy")
        return
    values = [100 * r["accuracy"] for _, r in rows]
    low = [100 * (r["accuracy"] - r["ci95_low"]) for _, r in rows]
    high = [100 * (r["ci95_high"] - r["accuracy"]) for _, r in rows]
    colors = [_MODEL_COLOR if label == "model" else _BASELINE_COLOR for label, _ in rows]
    bars = ax.bar([label for label, _ in rows], values, color=colors, yerr=[low, high], capsize=6)
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], padding=2, fontsize=9, label_type="center")
    ax.axhline(50, color="gray", linestyle=":", linewidth=1)
    ax.set_ylim(0, 100)
    ax.set_ylabel("%")
    ax.set_title(f"Directional accuracy (95% Wilson interval), {d.get('num_moves', 0):,} moves")
