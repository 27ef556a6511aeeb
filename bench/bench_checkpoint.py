"""Checkpoint cost at case A's size: the Trainer's atomic, checksummed save and verified load of
its full training state against a plain torch.save / torch.load of the same objects, and the
timer checkpoint's share of training time at the default interval.

    python bench/bench_checkpoint.py [--rounds 6] [--case a] [--dir DIR] [--threads N] [--json PATH]

The state is a real Trainer's (case A: d_model 768, 12 layers, vocab 4096, 600 assets) after one
AdamW step, so it holds the model, both AdamW moments, the RNG states, the log and the config.
"Atomic" is what the Trainer runs for a timer checkpoint (`Trainer._save`): training waits for
the state to be serialized into a temp file, then a background thread hashes it (sha256),
fsyncs, renames it over the target, writes the sidecar and prunes. Its ratio is the time
training waits; the time until the file is on disk is reported beside it. "Plain" is
`torch.save(state, path)` of the same dict, which leaves the bytes in the page cache. Both write
a new file each round and keep the last two, as successive checkpoints do (the plain side
deletes its old files untimed). Each save starts after an untimed `os.sync()`, as a timer
checkpoint finds the previous one long written: otherwise one save's fsync would also wait for
the other's gigabyte still in flight. Loads:
`load_checkpoint` (sha256 check, then torch.load with weights_only) against
`torch.load(path, weights_only=True)`; both read a file just written, so from the page cache.
Files go to a temporary folder in --dir (default: the system's temp folder; pass a run
folder's filesystem to measure that disk). Always exits 0: it reports, it does not gate.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, alternate, bench_args, best_ratio, finish, row, set_threads, timed  # noqa: E402

from common.batches import build_windows  # noqa: E402
from common.checkpoint import load_checkpoint, step_checkpoint_name  # noqa: E402
from common.config import load_config  # noqa: E402
from common.model import MarketGPT  # noqa: E402
from common.paths import case_config  # noqa: E402
from common.rng import seed_everything  # noqa: E402
from common.trainer import Trainer  # noqa: E402

__all__ = ["case_trainer", "run", "main"]


CASES = {"a": "case_a_full_market", "b": "case_b_reduced", "c": "case_c_crypto"}


def case_trainer(run_dir: Path, case: str = "a") -> Trainer:
    """A Trainer of the case's model with its AdamW moments filled by one step on random gradients."""
    cfg = load_config(case_config(REPO / CASES[case]))
    counts = cfg.data.universe_counts
    T = cfg.model.context_length
    rng = np.random.default_rng(0)
    tokens = {s: rng.integers(3, cfg.model.vocab_size, 3000) for s in ("A", "B")}  # a few windows suffice
    ranges = {s: {"train": (0, 1800), "val": (1800, 2400), "test": (2400, 3000)} for s in tokens}
    windows = build_windows(tokens, ranges, {"A": 0, "B": 1}, {"A": 0, "B": 0}, T,
                            strides={"train": 1, "val": T, "test": T})
    seed_everything(cfg.training.seed)
    model = MarketGPT(cfg.model, num_assets=sum(counts.values()), num_categories=len(counts))
    trainer = Trainer(cfg, model, windows, run_dir, out=io.StringIO(), tensorboard=False)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    trainer.optimizer.step()  # creates exp_avg and exp_avg_sq for every parameter
    trainer.optimizer.zero_grad(set_to_none=True)
    return trainer


def run(rounds: int = 6, case: str = "a", folder: Optional[Path] = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_checkpoint_", dir=folder) as tmp:
        run_dir = Path(tmp)
        trainer = case_trainer(run_dir, case)
        state = {"format": "marketgpt-checkpoint", "version": 1, **trainer.state_dict()}
        saved: list[Path] = []
        plain: list[Path] = []

        published: list[float] = []

        def atomic_save() -> float:
            name = step_checkpoint_name(1, len(saved) + 1)  # the timer's names; pruning keeps two
            saved.append(run_dir / name)
            os.sync()
            start = time.perf_counter()
            trainer._save(name)  # returns when training may go on
            blocked = time.perf_counter() - start
            trainer._checkpoints.wait()  # hashed, fsynced, renamed, pruned: on disk
            published.append(time.perf_counter() - start)
            return blocked

        def plain_save() -> float:
            plain.append(run_dir / f"plain_{len(plain)}.pt")
            os.sync()
            seconds = timed(lambda: torch.save(state, plain[-1]))
            if len(plain) > 2:
                plain[-3].unlink()  # untimed, unlike the Trainer's pruning
            return seconds

        subjects: dict[str, Callable[[], float]] = {"atomic_save": atomic_save, "plain_save": plain_save}
        # warm-up to a long run's steady state: two step checkpoints on disk, each save prunes one
        for fn in (atomic_save, atomic_save, atomic_save, plain_save):
            fn()
        save_times = alternate(subjects, rounds)
        size = saved[-1].stat().st_size
        loads = {"verified_load": lambda: timed(lambda: load_checkpoint(saved[-1])),
                 "plain_load": lambda: timed(lambda: torch.load(plain[-1], weights_only=True))}
        load_times = alternate(loads, rounds)

    interval_s = 60.0 * trainer.cfg.training.checkpoint_every_minutes
    save_s, plain_s = min(save_times["atomic_save"]), min(save_times["plain_save"])
    share = max(save_times["atomic_save"]) / interval_s  # the worst round: a cost, not a speed
    published = published[-len(save_times["atomic_save"]):]  # the timed rounds, not the warm-up
    figures = {"parameters": trainer.model.num_parameters(), "file_bytes": size, "round_seconds":
               {**save_times, "atomic_save_published": published, **load_times},
               "save_ratio": best_ratio(save_times["atomic_save"], save_times["plain_save"]),
               "published_ratio": best_ratio(published, save_times["plain_save"]),
               "load_ratio": best_ratio(load_times["verified_load"], load_times["plain_load"]),
               "interval_s": interval_s, "timer_share": share}
    rows = [
        row(f"Checkpoint save, case {case.upper()}", "atomic / plain torch.save", figures["save_ratio"], "x", "<= 1.5",
            f"training waits {save_s:.2f} vs {plain_s:.2f} s; {size / 2**20:,.0f} MiB file "
            f"({figures['parameters'] / 1e6:.1f}M params + AdamW moments)"),
        row(f"Checkpoint on disk, case {case.upper()}", "atomic until published / plain", figures["published_ratio"],
            "x", None, f"{min(published):.2f} s until hashed, fsynced, renamed and pruned (background thread)"),
        row(f"Checkpoint load, case {case.upper()}", "verified / plain torch.load", figures["load_ratio"], "x", None,
            f"{min(load_times['verified_load']):.2f} vs {min(load_times['plain_load']):.2f} s (page cache)"),
        row("Timer checkpoint", "save time / interval", 100 * share, "%", "< 1",
            f"slowest save {max(save_times['atomic_save']):.2f} s every "
            f"{trainer.cfg.training.checkpoint_every_minutes:g} min (training.checkpoint_every_minutes)"),
    ]
    return {"rows": rows, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--case", choices=sorted(CASES), default="a", help="whose model and optimizer state")
    ap.add_argument("--dir", type=Path, default=None, help="where the temporary run folder goes")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    return finish("checkpoint", run(args.rounds, args.case, args.dir), args.json)


if __name__ == "__main__":
    sys.exit(main())
