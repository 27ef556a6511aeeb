"""The observable oracle's calibration on a rich run's test targets: mean NLL against mean entropy, by role.

python bench/results/2026-12-05-observable-oracle/calibration.py RUN_DIR     (from the repository root)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.data.synthetic import generate_asset  # noqa: E402
from common.evaluation.observable_oracle import components  # noqa: E402

import scaling_floors as sf  # noqa: E402


def main(run: Path) -> None:
    sp = sf._scored(run, "test", None)
    log_rho, mean = sf._truth(sp)
    edges = (sp.tok.move_binning.edges, sp.tok.shape_binning.edges)
    cube = sf.observable_cube(sp.spec, np.concatenate(log_rho), np.concatenate(mean), edges, 200, 100_000)
    nll: dict[int, list] = {0: [], 1: []}
    entropy: dict[int, list] = {0: [], 1: []}
    for i, a in enumerate(sp.assets):  # as scaling_floors._observable_nlls: 256 particles, seed i
        leader = generate_asset(sp.spec, i - 1).candles if i % 2 else None
        for r, w, log_sd, m in components(sp.spec, a["asset"].candles, a["rows"], leader, 256, seed=i, chunk=16):
            at = np.searchsorted(a["rows"], r)
            p = sf.observable_probs(cube, w, log_sd, m, a["s_e"][at])
            nll[i % 2].append(-np.log(p[np.arange(len(at)), a["y"][at]]))
            entropy[i % 2].append(-(p * np.log(p)).sum(axis=1))
    for role, parts in (("leaders", [0]), ("followers", [1]), ("all", [0, 1])):
        x = np.concatenate([v for k in parts for v in nll[k]])
        d = x - np.concatenate([v for k in parts for v in entropy[k]])
        print(
            f"{role}: targets {len(x)}, mean NLL {x.mean():.4f}, mean entropy {x.mean() - d.mean():.4f}, "
            f"difference {d.mean():+.4f} (se {d.std() / np.sqrt(len(d)):.4f})"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
