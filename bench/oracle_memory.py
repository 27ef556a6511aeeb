"""Peak memory of the oracle's loss on synthetic targets: the chunked gather of each target's
probability (oracle_target_probs, what oracle_nll runs) against the full distributions
(oracle_probs, targets x 256 floats, what it ran before).

    python bench/oracle_memory.py --targets 2e7 [--mean] [--full]

Random targets: rho log-normal, m = mu / s normal (with --mean, the rich market's axis), tokens
uniform over 32 move x 8 shape bins. Prints one line: the path, the targets, the seconds of the
loss and the peak resident memory (ru_maxrss) after the inputs and after the loss. One process per
figure, as ru_maxrss is the process's peak. Results: bench/results/2026-11-29-oracle-memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaling_floors import CHUNK, oracle_probs, oracle_target_probs  # noqa: E402


def peak_mib() -> float:
    """This process's peak resident memory so far, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--targets", type=float, default=2e7, help="how many targets (2e7: about 10^8 training tokens' test)"
    )
    ap.add_argument("--mean", action="store_true", help="give each target an m, so the table gains the mean axis")
    ap.add_argument("--full", action="store_true", help="the old path: every target's full distribution at once")
    ap.add_argument("--chunk", type=int, default=CHUNK, help="targets per chunk of the gather")
    ap.add_argument("--draws", type=int, default=100_000, help="Monte Carlo draws per knot, as oracle_nll")
    args = ap.parse_args(argv)
    n = int(args.targets)
    rng = np.random.default_rng(0)
    rho = np.exp(rng.normal(0.0, 0.4, n))
    mean = rng.normal(0.0, 0.5, n) if args.mean else None
    y = rng.integers(0, 32 * 8, n)
    edges = (np.linspace(-3.0, 3.0, 31), np.linspace(0.3, 5.0, 7))  # 32 x 8 = 256 tokens
    inputs = peak_mib()
    start = time.perf_counter()
    if args.full:
        p = oracle_probs(rho, *edges, 4.0, 100, args.draws, mean)[np.arange(n), y]
    else:
        p = oracle_target_probs(rho, y, *edges, 4.0, 100, args.draws, mean, chunk=args.chunk)
    loss = float(np.mean(-np.log(p)))
    seconds = time.perf_counter() - start
    path = "full rows" if args.full else f"gather, chunk {args.chunk:.0e}"
    print(
        f"{path} | {'with' if args.mean else 'no'} mean axis | {n:.1e} targets | loss {loss:.6f} | "
        f"{seconds:.1f} s | peak RSS {inputs:,.0f} MiB after the inputs, {peak_mib():,.0f} MiB after the loss"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
