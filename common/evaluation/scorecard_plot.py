"""scorecard.png: CRPS skill per horizon and baseline (the significant ones starred, the model
confidence set under each horizon), the model's coverage (and its calibrated coverage, when the
run has calibration.json), its PIT histogram, the backtest's equity curves, and the barrier
lines under the panels (scorecard --barrier). Rendering uses matplotlib's Agg backend (no display on Slurm nodes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import pandas as pd

from common.atomic import atomic_savefig
from common.evaluation.backtest import DEFAULT_COST_BP
from common.evaluation.metrics import COVERAGE_LEVELS

__all__ = ["plot_scorecard"]


def plot_scorecard(card: dict, path: Path, labels: Mapping[str, str]) -> None:
    """Draw the card into `path` (PNG, written atomically); labels: baseline name -> its name in the legend."""
    import matplotlib  # slow to import: only when a picture is drawn

    matplotlib.use("Agg")  # before pyplot: no display on compute nodes
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    _skill_panel(ax[0, 0], card, labels)
    _coverage_panel(ax[0, 1], card)
    _pit_panel(ax[1, 0], card)
    _backtest_panel(ax[1, 1], card)
    barrier = card.get("barrier_lines", [])  # scorecard --barrier: the Brier scores, as text under the panels
    if barrier:
        fig.text(0.01, 0.005, "\n".join(barrier), fontsize=7, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, min(0.025 * len(barrier), 0.3), 1, 1))
    atomic_savefig(fig, path)
    plt.close(fig)


def _skill_panel(ax: Any, card: dict, labels: Mapping[str, str]) -> None:
    """Top left (a matplotlib Axes): CRPS skill per horizon and baseline with its 95% interval, a star where
    the Holm-adjusted DM test gives a verdict, the model confidence set under each horizon."""
    horizons = list(card["horizons"])
    names = list(next(iter(card["horizons"].values()))["skill"]["crps"])
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        sk = [card["horizons"][h]["skill"]["crps"][name] for h in horizons]
        v = np.array([s["value"] for s in sk]) * 100
        err = np.abs(np.array([s["ci95"] for s in sk]).T * 100 - v)
        x = np.arange(len(horizons)) + j * width
        ax.bar(x, v, width, yerr=err, capsize=3, label=labels.get(name, name))
        for k, h in enumerate(horizons):  # a star where the family-wise rule (Holm-adjusted DM) gives a verdict
            dm = card["horizons"][h].get("dm", {}).get("crps", {}).get(name, {})
            if dm.get("verdict", "no edge") != "no edge":
                top = max(v[k] + err[1, k], 0) if v[k] >= 0 else min(v[k] - err[0, k], 0)
                ax.annotate("*", (x[k], top), ha="center", va="bottom" if v[k] >= 0 else "top", fontsize=12)
    ax.axhline(0, color="k", lw=0.8)
    ax.margins(y=0.12)  # room for the stars
    ax.set_xticks(
        np.arange(len(horizons)) + width * (len(names) - 1) / 2,
        [_horizon_label(card["horizons"][h], h, labels) for h in horizons],
        fontsize=8,
    )
    ax.set(
        title="CRPS skill vs baseline (95% block-bootstrap CI)\n* Holm-adjusted DM p < 0.05; "
        "below: the 90% model confidence set",
        ylabel="skill, %",
    )
    ax.legend(fontsize=8)


def _coverage_panel(ax: Any, card: dict) -> None:
    """Top right: the model's central interval coverage per horizon against nominal, raw and calibrated."""
    horizons = list(card["horizons"])
    levels = [int(level) for level in COVERAGE_LEVELS]
    ax.plot(levels, levels, "k--", lw=0.8, label="nominal")
    for h in horizons:
        cov = card["horizons"][h]["coverage"]["model"]
        (line,) = ax.plot(levels, [100 * (cov[str(level)] or 0) for level in levels], "o-", label=f"H={h}")
        cal = card["horizons"][h].get("coverage_calibrated")  # calibration.json's intervals, when fitted
        if cal:
            cal_levels = [level for level in levels if str(level) in cal]
            ax.plot(
                cal_levels,
                [100 * cal[str(level)] for level in cal_levels],
                "s--",
                color=line.get_color(),
                label=f"H={h} calibrated",
            )
    ax.set(title="central interval coverage (model)", xlabel="nominal %", ylabel="actual %")
    ax.legend(fontsize=8)


def _pit_panel(ax: Any, card: dict) -> None:
    """Bottom left: the model's PIT histogram, the calibrated one over it, and the uniformity test."""
    pit = card["calibration"]["pit"]
    ax.bar(np.arange(len(pit)) / len(pit), pit, 1 / len(pit), align="edge", edgecolor="w", label="raw")
    ax.axhline(1 / len(pit), color="k", ls="--", lw=0.8)
    cal = card["calibration"].get("pit_calibrated")  # on the grid of the calibrated interval ends
    if cal:
        edges = np.array(cal["edges"])
        per_bin = np.array(cal["calibrated"]) / np.diff(edges) / len(pit)  # as a share per raw bin
        ax.stairs(per_bin, edges, color="C3", lw=1.5, label="calibrated")
        ax.legend(fontsize=8)
    test = card["calibration"].get("pit_test")
    ax.set(
        title=f"PIT histogram (model, H={card['calibration']['horizon']})"
        + (f"\nuniformity p {_p(test['p_value'])} (5 bins, Hotelling F over non-overlapping dates)" if test else ""),
        xlabel="PIT",
        ylabel="share",
    )


def _backtest_panel(ax: Any, card: dict) -> None:
    """Bottom right: the backtest's equity curves, their Sharpe ratios in the legend."""
    bt = card.get("backtest", {})
    for name, st in bt.get("strategies", {}).items():
        dates = pd.to_datetime(st["dates"], format="ISO8601")  # with or without fractional seconds
        ax.plot(dates, st["equity"], label=f"{name} (Sharpe {_fmt(st['sharpe'])})")
    ax.set(
        title=f"backtest equity, {bt.get('cost_bp', DEFAULT_COST_BP):g} bp per side (H={bt.get('horizon', '-')})",
        ylabel="growth of 1",
    )
    if bt.get("strategies"):
        ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelrotation=30)


def _horizon_label(hc: dict, h: str, labels: Mapping[str, str]) -> str:
    """`H=1` and, below it, the forecasters left in the model confidence set."""
    mcs = hc.get("mcs") or {}
    if mcs.get("included") is None:
        return f"H={h}"
    names = [labels.get(k, k) for k in mcs["included"]]
    return f"H={h}\n" + "\n".join(", ".join(names[i : i + 2]) for i in range(0, len(names), 2))


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.2f}"
