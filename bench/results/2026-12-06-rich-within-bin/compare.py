"""Each card's headline figures side by side, per horizon:

    python compare.py NAME=CARD.json ...

the CRPS skill against the best baseline [95%] and its Holm p, the share of the observable oracle's
edge over that baseline [95%], the 90% coverage, and the rank IC over the best factor (t)."""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    cards = {name: json.load(open(path)) for name, path in (a.split("=", 1) for a in argv)}
    for h in ("1", "5"):
        print(f"H={h}")
        for name, card in cards.items():
            head, hc = card["headlines"][h], card["horizons"][h]
            share = hc["ceiling"]["observable_oracle"]
            edge = hc["cross_section"]["edge"]
            print(
                f"  {name:<28} vs {head['baseline']:<8} {100 * head['value']:+.1f}% "
                f"[{100 * head['ci95'][0]:+.1f}, {100 * head['ci95'][1]:+.1f}] Holm {head['p_holm']:.3f} | "
                f"oracle share {share['model_share']:+.2f} [{share['model_share_ci95'][0]:+.2f}, "
                f"{share['model_share_ci95'][1]:+.2f}] | 90% coverage {100 * hc['coverage']['model']['90']:.1f}% | "
                f"rank IC - {edge['best_factor']} {edge['model_minus_best']:+.3f} (t {edge['t_nw']:.1f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
