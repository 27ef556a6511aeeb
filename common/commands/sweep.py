"""`marketgpt sweep`: which model size pays on this corpus, from a grid of short runs.

    marketgpt sweep --config CFG [--sizes 64x2,128x4] [--fractions 0.25,0.5,1] [--by assets|time]
                    [--learning-rates 1e-3,3e-4] [--local [--jobs N]] [--name NAME] [--set k=v ...]

Each point of the grid (a shape x a share of the training split, data.train_fraction on the one
token shard of the config: nothing is prepared again) is a training run of its own experiment,
`<name>_<point>`, with the config's epochs and early stopping as its budget (--set
training.epochs=..., training.max_steps_per_epoch=... to shorten it). A finished point writes
SWEEP/points/<point>.json and is never run again; a killed one resumes its run (--resume auto).
--learning-rates adds an axis: each shape and fraction at each rate (the point's name ends in
_lr<rate>), and the fit takes, for each shape and fraction, the rate with the lowest validation
loss: a larger model often needs a lower rate, and one rate for all would hide what size buys.
SWEEP/sweep.json gathers the finished points, the missing ones and the scaling fit of their
validation losses (common/model/scaling_fit.py: sweep_fit; the test loss is reported, never
fitted), which `marketgpt plan --fit` and model.size_fit read; SWEEP/sweep.png plots validation
loss against training tokens, one line per size. SWEEP is <case>/sweeps/<name>/. The Slurm job
array is common/slurm/sweep_jobs.py.

sweep.json is a summary that every finishing task rewrites, so one that read the points folder
before another task's point file appeared may overwrite a fuller one. The point files are the
record: each is written once, atomically, and never changed, and every reader assembles the
points from them (scaling_fit.load_size_fit refits, `marketgpt status` lists them), so no lock
is needed on a shared file system.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from common.atomic import atomic_savefig, atomic_write_json, read_json
from common.commands.train import run_training
from common.config import Config, load_config
from common.errors import UserError
from common.model.scaling_fit import SHAPES, SWEEP_FORMAT, best_rates, corpus_of, sweep_fit, sweep_points
from common.paths import case_dir_of_config
from common.run.files import CONFIG_JSON, TEST_RESULTS_JSON
from common.run.log import RunLog
from common.run.resume import find_runs
from common.tokens.fractions import trim_train
from common.tokens.shard_paths import shard_folder
from common.tokens.token_set import TokenSet, token_path

__all__ = [
    "DEFAULT_FRACTIONS",
    "DEFAULT_SIZES",
    "Sweep",
    "SweepPoint",
    "best_rates",
    "plan_sweep",
    "run_point",
    "write_sweep",
]

DEFAULT_SIZES = "64x2,128x4,256x6"  # about 0.2M, 0.9M and 5M parameters with the case configs' vocabulary
DEFAULT_FRACTIONS = "0.25,0.5,1"


@dataclass(frozen=True)
class SweepPoint:
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    fraction: float
    learning_rate: Optional[float] = None  # None: the config's training.learning_rate

    @property
    def name(self) -> str:
        lr = "" if self.learning_rate is None else f"_lr{self.learning_rate:g}"
        return f"d{self.d_model}l{self.num_layers}_f{round(self.fraction * 100):03d}{lr}"

    def sets(self, by: str) -> list[str]:
        lr = [] if self.learning_rate is None else [f"training.learning_rate={self.learning_rate!r}"]
        return lr + [
            f"model.d_model={self.d_model}",
            f"model.num_layers={self.num_layers}",
            f"model.num_heads={self.num_heads}",
            f"model.d_ff={self.d_ff}",
            "model.size=null",
            f"data.train_fraction={self.fraction}",
            f'data.fraction_by="{by}"',
        ]


@dataclass
class Sweep:
    config: Path
    overrides: list[str]
    cfg: Config
    folder: Path  # <case>/sweeps/<name>
    name: str
    by: str
    shard: str  # the token shard's key the points train on
    points: list[SweepPoint]

    def experiment(self, point: SweepPoint) -> str:
        return f"{self.name}_{point.name}"

    def done_file(self, point: SweepPoint) -> Path:
        return self.folder / "points" / f"{point.name}.json"

    def missing(self) -> list[SweepPoint]:
        return [p for p in self.points if not self.done_file(p).is_file()]


def parse_sizes(text: str) -> list[tuple[int, int, int, int]]:
    """ "64x2,128x4" -> (d_model, num_layers, num_heads, d_ff): the heads of common.model.scaling_fit.SHAPES
    for its shapes, else one per 64 of d_model; d_ff 4 x d_model."""
    known = {(s[0], s[1]): s for s in SHAPES}
    shapes = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            d_model, layers = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise UserError(f"--sizes {text!r}: expected D_MODELxLAYERS items, e.g. 64x2,128x4") from None
        if d_model < 1 or layers < 1:
            raise UserError(f"--sizes {text!r}: {item} is not a model shape")
        shapes.append(known.get((d_model, layers), (d_model, layers, max(1, d_model // 64), 4 * d_model)))
    return shapes


def parse_fractions(text: str) -> list[float]:
    fractions = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            f = float(item)
        except ValueError:
            raise UserError(f"--fractions {text!r}: {item} is not a number") from None
        if not 0.0 < f <= 1.0:
            raise UserError(f"--fractions {text!r}: each fraction of the training data must be > 0 and <= 1, got {f:g}")
        fractions.append(f)
    return fractions


def parse_learning_rates(text: Optional[str]) -> list[Optional[float]]:
    """ "1e-3,3e-4" -> [0.001, 0.0003]; None or "" -> [None] (the config's rate)."""
    rates: list[Optional[float]] = []
    for item in (t.strip() for t in (text or "").split(",")):
        if not item:
            continue
        try:
            lr = float(item)
        except ValueError:
            raise UserError(f"--learning-rates {text!r}: {item} is not a number") from None
        if not lr > 0:
            raise UserError(f"--learning-rates {text!r}: each learning rate must be > 0, got {lr:g}")
        rates.append(lr)
    return rates or [None]


def plan_sweep(
    config: Path,
    overrides: Sequence[str] = (),
    sizes: str = DEFAULT_SIZES,
    fractions: str = DEFAULT_FRACTIONS,
    by: str = "assets",
    name: Optional[str] = None,
    learning_rates: Optional[str] = None,
) -> Sweep:
    """Check the grid and the config; refuse a sweep whose token shard changed since it started."""
    config = Path(config).resolve()
    cfg = load_config(config, overrides)
    rates = parse_learning_rates(learning_rates)
    grid = {
        SweepPoint(*shape, fraction=f, learning_rate=lr)
        for shape in parse_sizes(sizes)
        for f in parse_fractions(fractions)
        for lr in rates
    }
    points = sorted(grid, key=lambda p: (p.d_model, p.num_layers, p.fraction, -(p.learning_rate or 0.0)))
    if not points:
        raise UserError(f"empty grid: --sizes {sizes!r} x --fractions {fractions!r} has no point")
    if len({p.name for p in points}) < len(points):
        raise UserError(f"--fractions {fractions!r}: two fractions round to the same percent")
    case = case_dir_of_config(config)
    shard = shard_folder(cfg, case)[0].name
    name = name or f"sweep_{cfg.experiment}"
    sweep = Sweep(config, list(overrides), cfg, case / "sweeps" / name, name, by, shard, points)
    check_shard(sweep)
    return sweep


def check_shard(sweep: Sweep) -> None:
    """A sweep's points must share one token shard: refuse when the config's shard is another."""
    recorded = sweep.folder / "sweep.json"
    if recorded.is_file():
        before = read_json(recorded).get("shard")
        if before and before != sweep.shard:
            raise UserError(
                f"the token shard of sweep {sweep.name} changed under it (key {before}, now {sweep.shard}: new data "
                "or another config?); start a new sweep with --name, or delete "
                f"{sweep.folder} to redo it"
            )


def run_point(sweep: Sweep, point: SweepPoint, out: Optional[TextIO] = None) -> int:
    """Train one point to its end (or resume it) and record it; 0 at once for a finished point,
    the training's exit code when it stopped early (a requeue)."""
    out = out or sys.stdout
    done = sweep.done_file(point)
    if done.is_file():
        print(f"sweep {sweep.name}: {point.name} is finished; not run again", file=out)
        return 0
    check_shard(sweep)
    # the config as the training will read it now: an edit since the submission shows as another shard
    now = shard_folder(load_config(sweep.config, sweep.overrides), case_dir_of_config(sweep.config))[0].name
    if now != sweep.shard:
        raise UserError(f"the token shard changed under sweep {sweep.name} (key {sweep.shard}, now {now})")
    sets = [*sweep.overrides, *point.sets(sweep.by), f'experiment="{sweep.experiment(point)}"']
    run = _finished_run(sweep, point)
    if run is None:
        code = run_training(sweep.config, sets, "auto", out=out)
        if code != 0:
            return code
        run = _finished_run(sweep, point)
        if run is None:
            raise UserError(f"sweep {sweep.name}: the run of {point.name} ended without its final outputs")
    atomic_write_json(done, point_result(sweep, point, run))
    return 0


def _finished_run(sweep: Sweep, point: SweepPoint) -> Optional[Path]:
    for run in reversed(find_runs(case_dir_of_config(sweep.config) / "checkpoints", sweep.experiment(point))):
        if RunLog.read(run).status in ("finished", "early_stopped") and (run / TEST_RESULTS_JSON).is_file():
            return run
    return None


def point_result(sweep: Sweep, point: SweepPoint, run: Path) -> dict[str, Any]:
    """One point of sweep.json, from its run's training_log.json and test_results.json."""
    log, test = RunLog.read(run), read_json(run / TEST_RESULTS_JSON)
    cfg = load_config(run / CONFIG_JSON)
    ranges = trim_train(TokenSet.load(token_path(run)).ranges, cfg.data.train_fraction, cfg.data.fraction_by)
    last = log.last_epoch
    skill = test.get("token_skill", {}).get("unigram", {})
    return {
        "point": point.name,
        "d_model": point.d_model,
        "num_layers": point.num_layers,
        "fraction": point.fraction,
        "learning_rate": cfg.training.learning_rate,
        "parameters": log.num_parameters,
        "train_tokens": sum(int(r["train"][1]) - int(r["train"][0]) for r in ranges.values()),
        "best_val_loss": log.best_val_loss,
        "test_loss": test.get("test_loss"),
        "skill_vs_unigram": skill.get("value"),
        "skill_vs_unigram_ci95": skill.get("ci95"),
        "steps": last.get("step"),
        "tokens_per_s": last.get("tokens_per_sec"),
        "epochs_run": len(log.epochs),
        "best_epoch": log.best_epoch,
        # the best epoch was the last one: more budget would likely lower the loss (an upper bound)
        "still_improving": log.best_epoch == last.get("epoch"),
        "run": str(run),
    }


def write_sweep(sweep: Sweep) -> dict[str, Any]:
    """sweep.json (and sweep.png once a point is finished) from the finished points' files."""
    grid = [p.name for p in sweep.points]
    finished = sweep_points(sweep.folder, grid)
    done = {r["point"] for r in finished}
    chosen, fit, note = sweep_fit(finished, corpus_of(sweep.cfg.model, sweep.cfg.data), f"marketgpt sweep {sweep.name}")
    doc: dict[str, Any] = {
        "format": SWEEP_FORMAT,
        "config": str(sweep.config),
        "overrides": sweep.overrides,
        "shard": sweep.shard,
        "fraction_by": sweep.by,
        "corpus": corpus_of(sweep.cfg.model, sweep.cfg.data),
        "grid": grid,
        "missing": [name for name in grid if name not in done],
        "points": finished,
        "fit_points": [r["point"] for r in chosen],
        "fit": None if fit is None else fit.to_dict(),
        "fit_note": note,
    }
    sweep.folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(sweep.folder / "sweep.json", doc)
    if finished:
        _plot(chosen, sweep.folder / "sweep.png")
    return doc


def _plot(points: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib  # lazy: only when a picture is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: only when a picture is drawn

    fig, ax = plt.subplots(figsize=(6, 4))
    for size in sorted({r["parameters"] for r in points}):
        rows = sorted((r for r in points if r["parameters"] == size), key=lambda r: r["train_tokens"])
        ax.plot([r["train_tokens"] for r in rows], [r["best_val_loss"] for r in rows], "o-", label=f"{size / 1e6:.2g}M")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("best validation loss (nats per token)")
    ax.legend(title="parameters")
    fig.tight_layout()
    atomic_savefig(fig, path)
    plt.close(fig)


def summary(sweep: Sweep, doc: dict[str, Any]) -> str:
    """What a finished (or partly finished) sweep says, a few lines."""
    lines = [
        f"sweep {sweep.name}: {len(doc['points'])} of {len(doc['grid'])} points finished; {sweep.folder}/sweep.json"
    ]
    for r in doc["points"]:
        lines.append(
            f"  {r['point']:<16} {r['parameters']:>11,} params {r['train_tokens']:>12,} tokens  val loss "
            f"{_loss(r.get('best_val_loss'))} (fitted), test loss {_loss(r.get('test_loss'))}"
            + ("  (still improving)" if r["still_improving"] else "")
        )
    lines.append(
        doc["fit_note"]
        or f"fit: terms {'+'.join(doc['fit']['terms']) or 'none'}; `marketgpt plan --config CFG --fit "
        f"{sweep.folder}/sweep.json` says which size it suggests"
    )
    return "\n".join(lines)


def _loss(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4f}"


def run_local(sweep: Sweep, jobs: int = 1, out: Optional[TextIO] = None) -> int:
    """--local: the missing points here, one after another (or `jobs` processes at once)."""
    out = out or sys.stdout
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: must be 1 or more")
    missing = sweep.missing()
    print(f"sweep {sweep.name}: {len(missing)} of {len(sweep.points)} points to run here", file=out, flush=True)
    write_sweep(sweep)
    (sweep.folder / "points").mkdir(parents=True, exist_ok=True)
    if jobs == 1 or len(missing) <= 1:
        for point in missing:
            code = run_point(sweep, point, out)
            if code != 0:
                return code
    else:
        # the first point prepares the shard alone, so the others only read it
        code = run_point(sweep, missing[0], out)
        if code != 0:
            return code
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(jobs, len(missing) - 1), mp_context=ctx) as pool:
            codes = list(pool.map(_run_point_quietly, [(sweep, p) for p in missing[1:]]))
        if any(codes):
            return max(codes)
    print(summary(sweep, write_sweep(sweep)), file=out)
    return 0


def _run_point_quietly(args: tuple[Sweep, SweepPoint]) -> int:
    sweep, point = args
    with open(sweep.folder / "points" / f"{point.name}.log", "a") as log:
        return run_point(sweep, point, log)
