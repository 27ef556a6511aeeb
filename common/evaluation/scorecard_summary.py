"""The scorecard's summary: the Holm-adjusted verdicts, the best baseline per horizon, and the
text lines `marketgpt scorecard` prints and scorecard.json keeps (headline, verdicts, model
confidence set, PIT, cross-section). Plain dicts in, strings out: no torch, so `marketgpt status`
reads the baselines' names from common.evaluation.result_lines without loading the scoring.
"""

from __future__ import annotations

from typing import Optional

from common.evaluation.result_lines import BASELINE_NAMES, format_verdict
from common.evaluation.significance import FAMILY_ALPHA, family_verdict, holm

__all__ = [
    "BASELINE_NAMES",
    "add_summary",
    "best_baseline",
    "ceiling_lines",
    "cross_section_lines",
    "headline_lines",
    "mcs_lines",
    "pit_lines",
    "verdict_lines",
]


def add_summary(card: dict, shortest: int) -> None:
    """The card's calibration at the shortest horizon, the Holm-adjusted tests, its headline and
    its verdict and MCS lines."""
    first = card["horizons"][str(shortest)]
    card["calibration"] = {
        "horizon": shortest,
        "coverage": first["coverage"]["model"],
        "pit": first["pit"]["model"],
        "pit_test": first["pit_test"]["model"],
        "pit_calibrated": first["pit_calibrated"],
    }
    card["significance"] = adjust_tests(card)
    # `marketgpt status`'s SCORE: CRPS skill against the best baseline (lowest CRPS) at the shortest horizon
    for hc in card["horizons"].values():
        hc["best_baseline"] = best_baseline(hc)
    card["headline"] = None if first["best_baseline"] is None else {"horizon": shortest, **first["best_baseline"]}
    card["headlines"] = {h: hc["best_baseline"] for h, hc in card["horizons"].items()}
    card["headline_lines"] = headline_lines(card)
    card["verdicts"] = verdict_lines(card)
    card["mcs_lines"] = mcs_lines(card)
    card["pit_lines"] = pit_lines(card)
    card["cross_section_lines"] = cross_section_lines(card)
    card["ceiling_lines"] = ceiling_lines(card)


CEILING_NAMES = {"observable_oracle": "Observable oracle (the best forecast from the candles seen)"}


def ceiling_lines(card: dict) -> list[str]:
    """Per horizon and ceiling (the observable oracle of a rich synthetic run): its CRPS against the
    best baseline's and the share of that edge the model holds, with its interval; and, where the
    card ranks assets, the ceiling's rank IC and its edge over the best factor (the model's line's)."""
    lines = []
    for h, hc in card["horizons"].items():
        for name, c in (hc.get("ceiling") or {}).items():
            base = BASELINE_NAMES.get(c["best_baseline"], c["best_baseline"])
            share = c["model_share"]
            held = "n/a (no edge to share)" if share is None else f"{share:+.2f}"
            if share is not None and c["model_share_ci95"] is not None:
                held += " [{:+.2f}, {:+.2f}]".format(*c["model_share_ci95"])
            lines.append(
                f"{CEILING_NAMES.get(name, name)} at H={h}: CRPS {c['crps']:.5g} against {base}'s"
                f" {c['best_baseline_crps']:.5g}; the model holds {held} of that edge (1 = the oracle)"
            )
            over, ic = c.get("over_best_factor"), c.get("rank_ic")
            if over is not None and ic is not None and over["model_minus_best"] is not None:
                lines.append(
                    f"{CEILING_NAMES.get(name, name)} at H={h} across assets: rank IC {ic['mean']:.3f}"
                    f" (t {_t(ic['t_nw'])}); over {over['best_factor']} {over['model_minus_best']:+.3f}"
                    f" (t {_t(over['t_nw'])}, {over['n_dates']} dates)"
                )
    return lines


def best_baseline(hc: dict) -> Optional[dict]:
    """The baseline with the lowest CRPS at one horizon and the model's skill against it, with the
    family-wise verdict of its DM test (as in the verdict lines)."""
    best = min(hc["skill"]["crps"], key=lambda name: hc["crps"][name], default=None)
    if best is None:
        return None
    dm = hc["dm"]["crps"][best]
    return {
        "baseline": best,
        **hc["skill"]["crps"][best],
        "verdict": dm["verdict"],
        "p_value": dm["p_value"],
        "p_holm": dm["p_holm"],
    }


def headline_lines(card: dict) -> list[str]:
    """Per horizon, the model against its best baseline (lowest CRPS):
    `Best baseline at H=5: log-HAR-range; CRPS skill -1.2% [-3.0, 0.5], Holm 0.410 (no edge)`."""
    lines = []
    for h, best in card.get("headlines", {}).items():
        if best is not None:
            verdict = format_verdict(int(h), "CRPS", "", best, detail=f", Holm {p_text(best['p_holm'])}")
            name = BASELINE_NAMES.get(best["baseline"], best["baseline"])
            lines.append(f"Best baseline at H={h}: {name}; CRPS skill{verdict.split('skill vs ', 1)[1]}")
    return lines


def adjust_tests(card: dict) -> dict:
    """Holm's adjustment over every DM test of the card (all horizons and baselines: the family
    the verdict lines draw from), and each test's verdict at the family-wise level."""
    tests = [dm for hc in card["horizons"].values() for dm in hc["dm"]["crps"].values()]
    for dm, p in zip(tests, holm([dm["p_value"] for dm in tests])):
        dm["p_holm"] = p
        dm["verdict"] = family_verdict(dm["mean_diff"], p)
    return {
        "test": "Diebold-Mariano with the Harvey-Leybourne-Newbold correction, per-date CRPS",
        "adjustment": "holm",
        "family_alpha": FAMILY_ALPHA,
        "family": sum(dm["p_value"] is not None for dm in tests),
    }


def p_text(p: Optional[float]) -> str:
    return "n/a" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def verdict_lines(card: dict) -> list[str]:
    """One CRPS verdict line per horizon and baseline: the skill with its interval, the DM
    p-value, Holm's adjusted one, and the verdict at the family-wise 5% level."""
    lines = []
    for h, hc in card["horizons"].items():
        for name, skill in hc["skill"]["crps"].items():
            dm = hc.get("dm", {}).get("crps", {}).get(name)
            if dm is None:  # a card made before the tests: the interval's own verdict
                lines.append(format_verdict(int(h), "CRPS", BASELINE_NAMES.get(name, name), skill))
                continue
            lines.append(
                format_verdict(
                    int(h),
                    "CRPS",
                    BASELINE_NAMES.get(name, name),
                    {**skill, "verdict": dm["verdict"]},
                    detail=f", DM p {p_text(dm['p_value'])}, Holm {p_text(dm['p_holm'])}",
                )
            )
    return lines


def _t(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def cross_section_lines(card: dict) -> list[str]:
    """`Rank IC at H=1: model 0.044 (t 0.9); best factor reversal 0.061 (t 2.3); model - best -0.017 (t -0.4)`."""
    lines = []
    for h, hc in card["horizons"].items():
        edge, model = (hc.get("cross_section") or {}).get("edge"), hc.get("rank_ic", {}).get("model")
        if edge is None or model is None or edge["model_minus_best"] is None:
            continue
        best = hc["cross_section"]["factors"][edge["best_factor"]]
        lines.append(
            f"Rank IC at H={h}: model {model['mean']:.3f} (t {_t(model['t_nw'])}); best factor "
            f"{edge['best_factor']} {best['mean']:.3f} (t {_t(best['t_nw'])}); model - best "
            f"{edge['model_minus_best']:+.3f} (t {_t(edge['t_nw'])}, {edge['n_dates']} dates)"
        )
    return lines


def pit_lines(card: dict) -> list[str]:
    """`PIT uniform at H=1: model p 0.412, GARCH p 0.088; not: RW-EWMA p <0.001`, one line per horizon."""
    lines = []
    for h, hc in card["horizons"].items():
        tests = {k: t for k, t in hc.get("pit_test", {}).items() if t is not None}
        if not tests:
            continue
        named = {k: f"{BASELINE_NAMES.get(k, k)} p {p_text(t['p_value'])}" for k, t in tests.items()}
        yes = ", ".join(named[k] for k, t in tests.items() if t["uniform"]) or "none"
        no = ", ".join(named[k] for k, t in tests.items() if not t["uniform"])
        lines.append(f"PIT uniform at H={h}: {yes}" + (f"; not: {no}" if no else ""))
    return lines


def mcs_lines(card: dict) -> list[str]:
    """`MCS 90% at H=1: model, GARCH (out: RW-EWMA, bootstrap)`, one line per horizon."""
    lines = []
    for h, hc in card["horizons"].items():
        mcs = hc.get("mcs")
        if mcs is None:
            continue
        label = f"MCS {round(100 * (1 - mcs['alpha']))}% at H={h}:"
        if mcs["included"] is None:
            lines.append(f"{label} n/a ({mcs['note']})")
            continue

        def name(k: str) -> str:
            return BASELINE_NAMES.get(k, k)

        out = [name(k) for k in mcs["pvalues"] if k not in mcs["included"]]
        lines.append(
            f"{label} {', '.join(name(k) for k in mcs['included'])}"
            + (f" (out: {', '.join(out)})" if out else " (none out)")
        )
    return lines
