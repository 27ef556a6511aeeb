"""Training speed on the CPU: MarketGPT's full train step, run by the Trainer itself, against a
plain reference GPT of the same dimensions; achieved FLOP/s against this machine's matmul peak;
and how fast the data path gathers batches compared with how fast the step consumes them.

    python bench/bench_train.py [--rounds 12] [--cases C,B] [--threads N] [--json PATH]

- Throughput: tokens/s of MarketGPT's step as the Trainer does it (learning rate, gather,
  forward, loss and accuracy sums, backward, gradient clipping, AdamW, zero_grad), timed by the
  Trainer's own step clock (`Trainer.train(stop_after_steps=...)`, whose per-step seconds land in
  its epoch sums), against `RefGPT` below: standard pre-norm blocks, SDPA attention, tied head,
  torch's nn.Dropout at the same places as MarketGPT's (embeddings and residual branches), the
  same AdamW and clipping, fed the same batches from the same TokenWindows. Case C's shape as
  configured (batch 32 x 128); case B's shape (d_model 512, 8 layers, vocab 2048, batch 32)
  with its context cut from 256 to 128 so a round takes seconds, not a minute.
- Utilization: model FLOPs (`MarketGPT.flops_per_token`: 6 x weights + attention) x tokens/s,
  over the FLOP/s of a 2048 x 2048 fp32 `torch.mm` timed in the same rounds.
- Data path: tokens/s of `TokenWindows.batches` (the trainer's batch source: one gather per
  batch) over tokens/s of case C's step.

Subjects run in alternating rounds (ABBA: MarketGPT, reference, mm peak, gather, then back) of
one train step each, on the same threads; each figure compares the subjects' fastest rounds
(see _common). Always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, alternate, bench_args, bench_run, best_ratio, blank_features, finish, row, set_threads  # noqa: E402

from common.config import Config, load_config  # noqa: E402
from common.model.gpt import MarketGPT  # noqa: E402
from common.paths import case_config  # noqa: E402
from common.tokens.tokenizer import NUM_SPECIAL_TOKENS  # noqa: E402
from common.training.batches import TokenWindows, build_windows  # noqa: E402
from common.training.rng import seed_everything  # noqa: E402
from common.training.trainer import Trainer  # noqa: E402

__all__ = ["RefGPT", "matmul_peak_round", "run", "main"]

# case -> (case folder, config overrides, what the shape note says)
CASES = {
    "C": ("case_c_crypto", [], "batch 32 x 128, as configured"),
    "B": ("case_b_reduced", ["model.context_length=128"], "batch 32 x 128 (context cut from 256)"),
}
PEAK_N, PEAK_REPS = 2048, 8  # the "large torch.mm": 17 GFLOP each, a round of about 0.65 s here


# --------------------------------------------------------------------------- the reference


class RefBlock(nn.Module):
    def __init__(self, C: int, n_head: int, d_ff: int, p: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(C, bias=False), nn.LayerNorm(C, bias=False)
        self.qkv, self.attn_proj = nn.Linear(C, 3 * C, bias=False), nn.Linear(C, C, bias=False)
        self.fc, self.mlp_proj = nn.Linear(C, d_ff, bias=False), nn.Linear(d_ff, C, bias=False)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(self.attn_proj(y))
        return x + self.drop(self.mlp_proj(F.gelu(self.fc(self.ln2(x)))))


class RefGPT(nn.Module):
    """A minimal GPT, written plainly: token + position embeddings, pre-norm blocks, tied head."""

    def __init__(self, vocab: int, T: int, C: int, n_layer: int, n_head: int, d_ff: int, p: float) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, C), nn.Embedding(T, C)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(RefBlock(C, n_head, d_ff, p) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(C, bias=False)
        self.head = nn.Linear(C, vocab, bias=False)
        self.head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.size(1))))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


# --------------------------------------------------------------------------- set-up


def _windows(cfg: Config, num_assets: int, seed: int = 0) -> TokenWindows:
    """Random tokens for `num_assets` assets, 4,000 each: plenty of training windows."""
    rng = np.random.default_rng(seed)
    n = 4000
    tokens = {f"A{i}": rng.integers(NUM_SPECIAL_TOKENS, cfg.model.vocab_size, n) for i in range(num_assets)}
    ranges = {s: {"train": (0, 3000), "val": (3000, 3500), "test": (3500, n)} for s in tokens}
    T = cfg.model.context_length
    features = blank_features(cfg.model, n)
    return build_windows(
        tokens,
        ranges,
        {s: i for i, s in enumerate(tokens)},
        {s: 0 for s in tokens},
        T,
        strides={"train": 1, "val": T, "test": T},
        features=None if features is None else dict.fromkeys(tokens, features),
    )


def _trainer_round(trainer: Trainer, steps: int) -> Callable[[], float]:
    """A round: `steps` more steps through Trainer.train; returns the Trainer's own step seconds."""

    def go() -> float:
        before = trainer.sums.seconds
        status = trainer.train(stop_after_steps=trainer.global_step + steps)
        if status != "stopped":
            raise RuntimeError(f"the trainer ended with {status!r}: {trainer.log.error}")
        return trainer.sums.seconds - before

    return go


def _reference_round(
    ref: RefGPT, opt: torch.optim.Optimizer, batches: Iterator, steps: int, clip: float
) -> Callable[[], float]:
    def go() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            b = next(batches)
            loss = ref(b.x, b.y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    return go


def matmul_peak_round(n: int = PEAK_N, reps: int = 8) -> Callable[[], float]:
    """A round of `reps` n x n fp32 matmuls; returns seconds (FLOPs: 2 n^3 reps)."""
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    torch.mm(a, b, out=c)  # warm: MKL picks its kernel, pages are touched

    def go() -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=c)
        return time.perf_counter() - t0

    return go


def _gather_round(windows: TokenWindows, batch_size: int, n_batches: int) -> Callable[[], float]:
    epoch = [0]

    def go() -> float:
        epoch[0] += 1  # a new permutation each round, as each epoch draws one
        t0 = time.perf_counter()
        for i, _ in enumerate(windows.batches("train", batch_size, shuffle=True, seed=1, epoch=epoch[0])):
            if i + 1 == n_batches:
                break
        return time.perf_counter() - t0

    return go


# --------------------------------------------------------------------------- the benchmark


def measure_case(key: str, rounds: int, run_dir: Path, steps: int = 1) -> dict[str, Any]:
    folder, overrides, note = CASES[key]
    cfg = load_config(case_config(REPO / folder), overrides)
    m, t = cfg.model, cfg.training
    num_assets = sum(cfg.data.universe_counts.values()) or 1
    windows = _windows(cfg, num_assets)

    seed_everything(t.seed)
    model = MarketGPT(cfg.model, num_assets=num_assets, num_categories=max(len(cfg.data.universe_counts), 1))
    run = bench_run(run_dir, cfg, num_assets)
    trainer = Trainer(cfg.training, model, windows, run, out=io.StringIO(), tensorboard=False)
    # Trainer.train(stop_after_steps) saves a checkpoint when it stops: outside the step clock, and
    # measured by bench_checkpoint; skipped here so a round costs only its steps.
    trainer._save = lambda name: None  # type: ignore[method-assign]

    torch.manual_seed(t.seed)
    ref = RefGPT(m.vocab_size, m.context_length, m.d_model, m.num_layers, m.num_heads, m.d_ff, m.dropout)
    ref_opt = torch.optim.AdamW(
        ref.parameters(), lr=t.learning_rate, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay
    )
    ref_batches = windows.batches("train", t.batch_size, shuffle=True, seed=t.seed, epoch=0)

    n_gather = 200
    subjects = {
        "marketgpt": _trainer_round(trainer, steps),
        "reference": _reference_round(ref, ref_opt, ref_batches, steps, t.gradient_clip),
        "peak": matmul_peak_round(reps=PEAK_REPS),
        "gather": _gather_round(windows, t.batch_size, n_gather),
    }
    for fn in subjects.values():  # warm-up: allocator, AdamW state, first-touch pages
        fn()
    times = alternate(subjects, rounds)

    tokens = t.batch_size * m.context_length  # per batch, both models
    best = {k: min(v) for k, v in times.items()}
    mgpt_tps, ref_tps = tokens * steps / best["marketgpt"], tokens * steps / best["reference"]
    peak = 2 * PEAK_N**3 * PEAK_REPS / best["peak"]
    gather_tps = tokens * n_gather / best["gather"]
    fpt = model.flops_per_token(m.context_length)
    return {
        "case": key,
        "note": note,
        "rounds": rounds,
        "steps_per_round": steps,
        "batch_size": t.batch_size,
        "context_length": m.context_length,
        "d_model": m.d_model,
        "num_layers": m.num_layers,
        "vocab_size": m.vocab_size,
        "dropout": m.dropout,
        "parameters": model.num_parameters(),
        "flops_per_token": fpt,
        "round_seconds": times,
        "marketgpt_tokens_per_s": mgpt_tps,
        "reference_tokens_per_s": ref_tps,
        "throughput_ratio": best_ratio(times["reference"], times["marketgpt"]),
        "matmul_peak_flops": peak,
        "utilization": fpt * mgpt_tps / peak,
        "reference_utilization": fpt * ref_tps / peak,
        "gather_tokens_per_s": gather_tps,
        "data_path_ratio": gather_tps / mgpt_tps,
    }


def run(rounds: int = 12, cases: str = "C,B") -> dict[str, Any]:
    figures: dict[str, Any] = {"threads": torch.get_num_threads(), "cases": {}}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        for key in [c.strip().upper() for c in cases.split(",") if c.strip()]:
            # case B's steps take ~5x case C's: half the rounds keep it to about a minute
            r = measure_case(key, rounds if key == "C" else max(3, rounds // 2), Path(tmp) / key)
            figures["cases"][key] = r
            rows.append(
                row(
                    f"Training throughput, case {key}",
                    "MarketGPT / reference tokens/s",
                    r["throughput_ratio"],
                    "x",
                    ">= 1.0",
                    f"{r['marketgpt_tokens_per_s']:,.0f} vs {r['reference_tokens_per_s']:,.0f} tok/s; {r['note']}",
                )
            )
            rows.append(
                row(
                    f"Hardware utilization, case {key}",
                    "model FLOP/s / torch.mm peak",
                    r["utilization"],
                    "",
                    ">= 0.75" if key == "C" else None,
                    f"{r['utilization'] * r['matmul_peak_flops'] / 1e9:.0f} of "
                    f"{r['matmul_peak_flops'] / 1e9:.0f} GFLOP/s ({PEAK_N}^2 fp32 mm); "
                    f"reference {r['reference_utilization']:.2f}",
                )
            )
            if key == "C":
                rows.append(
                    row(
                        "Data path",
                        "batch gather / train step tokens/s",
                        r["data_path_ratio"],
                        "x",
                        ">= 100",
                        f"{r['gather_tokens_per_s'] / 1e6:,.1f} M tok/s gathered "
                        f"(TokenWindows.batches, batch 32 x 128)",
                    )
                )
    return {"rows": rows, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12, help="alternating rounds (case B: half, at least 3)")
    ap.add_argument("--cases", default="C,B", help="comma-separated: C, B")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    return finish("train", run(args.rounds, args.cases), args.json)


if __name__ == "__main__":
    sys.exit(main())
