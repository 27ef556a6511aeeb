"""Checkpoint cost at case A's size: the Trainer's atomic save and verified load of
its full training state against a plain torch.save / torch.load of the same objects, and the
timer checkpoint's share of training time at the default interval.

    python bench/bench_checkpoint.py [--rounds 10] [--case a] [--dir DIR] [--threads N] [--json PATH]

The state is a real Trainer's (case A: d_model 768, 12 layers, vocab 4096, 600 assets) after one
AdamW step, so it holds the model, both AdamW moments, the RNG states, the log and the config.
"Atomic" is what the Trainer runs for a timer checkpoint (`Trainer._save`): training waits for
torch.save into a temp file, then a background thread fsyncs it, renames it over the target
and prunes the oldest step checkpoint. "Plain" is `torch.save(state, path)` of the same dict
(which leaves the bytes in the page cache) and the unlink of its oldest file, as both keep two.
The figure is what a checkpoint costs training: each save is followed by a fixed amount of
matmul work on torch's threads (training's stand-in, about 1 s), and its cost is that
round's time minus the same work alone, so the background thread's share of the CPU counts.
Rounds alternate (atomic, plain, work alone); each starts after an untimed `os.sync()`, as a
timer checkpoint finds the previous one long written. Loads: `load_checkpoint` (every zip
record's CRC32 checked beside torch.load with weights_only) against `torch.load(path,
weights_only=True)`; both read a file just written, so from the page cache.
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
from _common import (  # noqa: E402
    REPO,
    alternate,
    bench_args,
    bench_run,
    best_ratio,
    blank_features,
    finish,
    row,
    set_threads,
    timed,
)

from common.config import load_config  # noqa: E402
from common.model.gpt import MarketGPT  # noqa: E402
from common.paths import case_config  # noqa: E402
from common.run.checkpoint import load_checkpoint, step_checkpoint_name  # noqa: E402
from common.training.batches import build_windows  # noqa: E402
from common.training.rng import seed_everything  # noqa: E402
from common.training.trainer import Trainer  # noqa: E402

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
    features = blank_features(cfg.model, 3000)
    windows = build_windows(
        tokens,
        ranges,
        {"A": 0, "B": 1},
        {"A": 0, "B": 0},
        T,
        strides={"train": 1, "val": T, "test": T},
        features=None if features is None else dict.fromkeys(tokens, features),
    )
    seed_everything(cfg.training.seed)
    model = MarketGPT(cfg.model, num_assets=sum(counts.values()), num_categories=len(counts))
    run = bench_run(run_dir, cfg, sum(counts.values()))
    trainer = Trainer(cfg.training, model, windows, run, out=io.StringIO(), tensorboard=False)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    trainer.step.optimizer.step()  # creates exp_avg and exp_avg_sq for every parameter
    trainer.step.optimizer.zero_grad(set_to_none=True)
    return trainer


def busy_work(seconds: float = 1.0) -> Callable[[], None]:
    """A fixed amount of matmul work on torch's threads that takes `seconds` on an idle machine:
    training's stand-in, to see what the checkpoint's background work takes from it."""
    a, out = torch.randn(1024, 1024), torch.empty(1024, 1024)

    def work(ops: int) -> None:
        for _ in range(ops):
            torch.mm(a, a, out=out)

    ops = max(1, round(seconds / (timed(lambda: work(20)) / 20)))
    return lambda: work(ops)


def run(rounds: int = 6, case: str = "a", folder: Optional[Path] = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_checkpoint_", dir=folder) as tmp:
        run_dir = Path(tmp)
        trainer = case_trainer(run_dir, case)
        state = {"format": "marketgpt-checkpoint", "version": 1, **trainer.state_dict()}
        saved: list[Path] = []
        plain: list[Path] = []
        parts: dict[str, list[float]] = {"atomic_waits": [], "atomic_published": [], "plain_save": []}
        work = busy_work()

        def atomic_save() -> float:
            name = step_checkpoint_name(1, len(saved) + 1)  # the timer's names; pruning keeps two
            saved.append(run_dir / name)
            os.sync()
            start = time.perf_counter()
            trainer._save(name)  # returns when training may go on
            parts["atomic_waits"].append(time.perf_counter() - start)
            trainer.checkpoints.writer._pending[-1].add_done_callback(  # fsynced, renamed, pruned
                lambda _: parts["atomic_published"].append(time.perf_counter() - start)
            )
            work()  # training goes on beside the background thread
            trainer.checkpoints.writer.wait()
            return time.perf_counter() - start

        def plain_save() -> float:
            plain.append(run_dir / f"plain_{len(plain)}.pt")
            os.sync()
            start = time.perf_counter()
            torch.save(state, plain[-1])
            if len(plain) > 2:
                plain[-3].unlink()  # keeps two, like the Trainer's pruning
            parts["plain_save"].append(time.perf_counter() - start)
            work()
            return time.perf_counter() - start

        def work_alone() -> float:
            os.sync()
            return timed(work)

        subjects: dict[str, Callable[[], float]] = {
            "atomic": atomic_save,
            "plain": plain_save,
            "work_alone": work_alone,
        }
        # warm-up to a long run's steady state: two step checkpoints on disk, each save prunes one
        for fn in (atomic_save, atomic_save, atomic_save, plain_save, plain_save, plain_save):
            fn()
        parts = {k: [] for k in parts}
        save_times = alternate(subjects, rounds)
        size = saved[-1].stat().st_size
        loads = {
            "verified_load": lambda: timed(lambda: load_checkpoint(saved[-1])),
            "plain_load": lambda: timed(lambda: torch.load(plain[-1], weights_only=True)),
        }
        load_times = alternate(loads, rounds)

    # What a checkpoint costs training: the save plus whatever the work after it lost, against
    # the same work alone; each side's best round, as other load only ever adds.
    alone = min(save_times["work_alone"])
    # never below the save itself: with a small state the work's own noise can exceed the rest
    atomic_cost = max(min(save_times["atomic"]) - alone, min(parts["atomic_waits"]))
    plain_cost = max(min(save_times["plain"]) - alone, min(parts["plain_save"]))
    interval_s = 60.0 * trainer.t.checkpoint_every_minutes
    worst = max(max(save_times["atomic"]) - alone, max(parts["atomic_waits"]))
    figures = {
        "parameters": trainer.model.num_parameters(),
        "file_bytes": size,
        "round_seconds": {**save_times, **parts, **load_times},
        "atomic_cost_s": atomic_cost,
        "plain_cost_s": plain_cost,
        "save_ratio": atomic_cost / plain_cost,
        "load_ratio": best_ratio(load_times["verified_load"], load_times["plain_load"]),
        "interval_s": interval_s,
        "timer_share": worst / interval_s,
    }
    waits, published = min(parts["atomic_waits"]), min(parts["atomic_published"])
    rows = [
        row(
            f"Checkpoint save, case {case.upper()}",
            "atomic / plain torch.save, cost to training",
            figures["save_ratio"],
            "x",
            "<= 1.5",
            f"{atomic_cost:.2f} vs {plain_cost:.2f} s (training waits {waits:.2f} s, then the background "
            f"fsync/rename/prune takes the rest; plain save {min(parts['plain_save']):.2f} s); "
            f"{size / 2**20:,.0f} MiB ({figures['parameters'] / 1e6:.1f}M params + AdamW moments)",
        ),
        row(
            f"Checkpoint on disk, case {case.upper()}",
            "seconds until published",
            published,
            "s",
            None,
            "torch.save, fsync, rename, prune: a crash after this loses nothing",
        ),
        row(
            f"Checkpoint load, case {case.upper()}",
            "verified / plain torch.load",
            figures["load_ratio"],
            "x",
            None,
            f"{min(load_times['verified_load']):.2f} vs {min(load_times['plain_load']):.2f} s (page cache)",
        ),
        row(
            "Timer checkpoint",
            "cost / interval",
            100 * figures["timer_share"],
            "%",
            "< 1",
            f"costliest round {worst:.2f} s every {trainer.t.checkpoint_every_minutes:g} min "
            "(training.checkpoint_every_minutes)",
        ),
    ]
    return {"rows": rows, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--case", choices=sorted(CASES), default="a", help="whose model and optimizer state")
    ap.add_argument("--dir", type=Path, default=None, help="where the temporary run folder goes")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    return finish("checkpoint", run(args.rounds, args.case, args.dir), args.json)


if __name__ == "__main__":
    sys.exit(main())
