"""Loss against model size and data: the fit of bench/bench_scaling.py's grid, and the size it suggests.

The form (Chinchilla's, plus a term for a model too large for its data):

    L(N, D) = E + A / N^a + B / D^b + C * (N / D)^c        N, D in millions (parameters, training tokens)

Each of A, B, C may be left out when the points do not support it: every subset of the three
terms is fitted (exponents on a grid, the coefficients by least squares, all >= 0) and the one
with the lowest AICc (AIC corrected for few points) is kept. The error is a bootstrap over the
points (the same terms refitted on resampled points). With both the A and the C term, the
loss-minimising size for D tokens is

    N*(D) = (a A / (c C))^(1 / (a + c)) * D^(c / (a + c))

without the C term bigger is better, without the A term smaller is. `best_shape` takes the
smallest of SHAPES whose predicted loss is within TOLERANCE of the lowest one, among the shapes
inside the measured range of N (the fit says nothing outside it).

`size_advice` is what `marketgpt plan --fit` and model.size = "auto" (with model.size_fit) say
from a fit of the user's own corpus (`marketgpt sweep`, fitted by `sweep_fit` on the points'
validation losses; `load_size_fit` refits a sweep.json from the point files beside it, so a
summary written by a task that saw fewer points loses none): a shape only when the size term is
resolved (its effect across the measured sizes exceeds TOLERANCE in 97.5% of the bootstrap
draws), with the 95% interval of the shape each draw would pick; never the smallest shape by
default. The fit of bench/bench_scaling.py's synthetic grid lives in scaling_fit.json next to
this module (`python bench/bench_scaling.py --fit RESULTS.json`).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from common.atomic import read_json
from common.config import DataConfig, ModelConfig
from common.errors import UserError
from common.model.sizing import meta_model

__all__ = [
    "FIT_FILE",
    "MIN_FIT_POINTS",
    "NO_SIZE_ADVICE",
    "SHAPES",
    "TOLERANCE",
    "ScalingFit",
    "best_rates",
    "best_shape",
    "corpus_of",
    "fit_points",
    "load_fit",
    "load_size_fit",
    "size_advice",
    "size_resolved",
    "sweep_fit",
    "sweep_points",
]

FIT_FILE = Path(__file__).with_name("scaling_fit.json")
UNIT = 1e6  # N and D are fitted in millions
TOLERANCE = 0.002  # nats per token: predicted losses closer than this count as equal (then the smaller shape)
RANGE_SLACK = 1.05  # token counts within 5% beyond the fitted span are not extrapolation (ScalingFit.in_range)
# (d_model, num_layers, num_heads, d_ff) that model.size = "auto" chooses from: the grid's sizes and
# shapes between them, case C's (256, 6) and case B's (512, 8) among them
SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (64, 2, 2, 256),
    (128, 2, 4, 512),
    (128, 4, 4, 512),
    (192, 4, 6, 768),
    (256, 4, 8, 1024),
    (256, 6, 8, 1024),
    (384, 6, 8, 1536),
    (512, 8, 8, 2048),
    (768, 12, 12, 3072),
)
NO_SIZE_ADVICE = "no size advice: the points do not resolve the size term"
_EXPONENTS = np.linspace(0.05, 1.5, 20)
_TERMS = ("A", "B", "C")
_UNBOUNDED = 1e30  # N* of a bootstrap draw without an interior optimum
MIN_FIT_POINTS = 4  # fit_points' minimum
SWEEP_FORMAT = "marketgpt-sweep"  # sweep.json's "format"


@dataclass
class ScalingFit:
    terms: list[str]  # which of A, B, C the form keeps
    coef: dict[str, float]  # E, A, a, B, b, C, c (0 where a term is left out)
    n_range: list[float]  # parameters of the smallest and largest model fitted
    d_range: list[float]  # training tokens of the fewest and most
    rmse: float  # nats per token, of the fit on its points
    points: int
    bootstrap: dict[str, list[float]] = field(default_factory=dict)  # coefficient -> [2.5%, 50%, 97.5%]
    source: str = ""  # the grid's JSON and the loss fitted
    optimum_ci: dict[str, list[Optional[float]]] = field(default_factory=dict)  # tokens -> N* [2.5%, 50%, 97.5%]
    draws: list[dict[str, float]] = field(default_factory=list)  # each bootstrap draw's coefficients
    corpus: dict[str, Any] = field(default_factory=dict)  # what its points were trained on (corpus_of)

    def loss(self, n: float, d: float) -> float:
        """Predicted loss (the fitted quantity) of n parameters trained on d tokens."""
        return float(_predict(self.coef, np.array([n / UNIT]), np.array([d / UNIT]))[0])

    def optimal_parameters(self, d: float) -> Optional[float]:
        """N*(d) of the module docstring, or None when the form has no interior optimum."""
        k = self.coef
        if not (k["A"] > 0 and k["C"] > 0):
            return None
        a, c = k["a"], k["c"]
        return UNIT * (a * k["A"] / (c * k["C"])) ** (1 / (a + c)) * (d / UNIT) ** (c / (a + c))

    def in_range(self, d: float) -> bool:
        """Whether `d` training tokens lie in the span the fit saw. A few percent beyond its ends
        counts as inside: the same corpus's training tokens vary that much with the split's purge
        and the context (37,921 against a fitted 37,992), and a power law barely moves over it."""
        return self.d_range[0] / RANGE_SLACK <= d <= self.d_range[1] * RANGE_SLACK

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ScalingFit":
        return cls(**raw)


def _predict(coef: dict[str, float], n: np.ndarray, d: np.ndarray) -> np.ndarray:
    return coef["E"] + coef["A"] * n ** -coef["a"] + coef["B"] * d ** -coef["b"] + coef["C"] * (n / d) ** coef["c"]


def _fit_terms(terms: Sequence[str], n: np.ndarray, d: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, float]]:
    """(residual sum of squares, coefficients) of the best fit keeping `terms`: every exponent
    combination of the grid at once, least squares for E and the term coefficients."""
    columns = {
        "A": lambda e: n[None, :] ** -e[:, None],
        "B": lambda e: d[None, :] ** -e[:, None],
        "C": lambda e: (n / d)[None, :] ** e[:, None],
    }
    combos = np.array(list(itertools.product(_EXPONENTS, repeat=len(terms)))) if terms else np.zeros((1, 0))
    g = len(combos)
    X = np.ones((g, len(y), 1 + len(terms)))
    for j, t in enumerate(terms):
        X[:, :, 1 + j] = columns[t](combos[:, j])
    XtX = X.transpose(0, 2, 1) @ X + 1e-10 * np.eye(1 + len(terms))
    beta = np.linalg.solve(XtX, (X.transpose(0, 2, 1) @ y)[..., None])[..., 0]
    rss = ((X @ beta[..., None])[..., 0] - y) ** 2
    rss = rss.sum(axis=1)
    # a term with a negative coefficient is no such term; E < 0 would be a loss below the floor
    # (the fitted losses are above the oracle's, which no forecaster beats)
    rss[(beta < 0).any(axis=1)] = np.inf
    best = int(np.argmin(rss))
    coef = {"E": float(beta[best, 0]), "A": 0.0, "a": 0.0, "B": 0.0, "b": 0.0, "C": 0.0, "c": 0.0}
    for j, t in enumerate(terms):
        coef[t] = float(beta[best, 1 + j])
        coef[t.lower()] = float(combos[best, j])
    return float(rss[best]), coef


def fit_points(
    n: Sequence[float],
    d: Sequence[float],
    loss: Sequence[float],
    *,
    n_boot: int = 200,
    seed: int = 0,
    source: str = "",
    at_tokens: Sequence[float] = (),
) -> ScalingFit:
    """The form with the lowest AICc over the subsets of its terms, with a bootstrap over the points;
    at_tokens: also the bootstrap's 95% interval of N* at these token counts (None: no optimum, unbounded)."""
    N, D, y = (np.asarray(v, dtype=np.float64) for v in (n, d, loss))
    if len(y) < 4:
        raise UserError(f"a scaling fit needs at least 4 points, got {len(y)}")
    Ns, Ds = N / UNIT, D / UNIT
    best = None
    for k in range(len(_TERMS) + 1):
        for subset in itertools.combinations(_TERMS, k):
            rss, coef = _fit_terms(subset, Ns, Ds, y)
            if not math.isfinite(rss):
                continue
            k, n_pts = 1 + 2 * len(subset), len(y)
            if n_pts - k - 1 <= 0:  # AICc needs more points than parameters + 1
                continue
            aic = n_pts * math.log(max(rss, 1e-12) / n_pts) + 2 * k + 2 * k * (k + 1) / (n_pts - k - 1)
            if best is None or aic < best[0]:
                best = (aic, list(subset), coef, rss)
    assert best is not None  # the empty form (a constant) always fits
    _, terms, coef, rss = best
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {key: [] for key in coef}
    for _ in range(n_boot):
        pick = rng.integers(0, len(y), len(y))
        b_rss, b_coef = _fit_terms(terms, Ns[pick], Ds[pick], y[pick])
        if math.isfinite(b_rss):
            for key, value in b_coef.items():
                draws[key].append(value)
    boot = {key: [float(q) for q in np.quantile(v, [0.025, 0.5, 0.975])] for key, v in draws.items() if v}
    kept = [{key: v[i] for key, v in draws.items()} for i in range(len(draws["E"]))]
    fit = ScalingFit(
        terms=terms,
        coef=coef,
        n_range=[float(N.min()), float(N.max())],
        d_range=[float(D.min()), float(D.max())],
        rmse=math.sqrt(rss / len(y)),
        points=len(y),
        bootstrap=boot,
        source=source,
        draws=kept,
    )
    for tokens in at_tokens:  # N*(tokens) of every bootstrap draw: inf where a draw has no interior optimum
        values = []
        for i in range(len(draws["E"])):
            draw = ScalingFit(terms, {key: v[i] for key, v in draws.items()}, fit.n_range, fit.d_range, 0.0, 0)
            values.append(draw.optimal_parameters(tokens) or _UNBOUNDED)
        q = np.quantile(values, [0.025, 0.5, 0.975], method="lower") if values else np.zeros(0)
        fit.optimum_ci[f"{tokens:.0f}"] = [float(v) if v < _UNBOUNDED else None for v in q]
    return fit


def load_fit(path: Path = FIT_FILE) -> Optional[ScalingFit]:
    """The committed fit, or None when there is none."""
    if not path.is_file():
        return None
    try:
        return ScalingFit.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise UserError(
            f"{path}: not a scaling fit ({e}); rewrite it with python bench/bench_scaling.py --fit"
        ) from None


def corpus_of(m: ModelConfig, d: DataConfig) -> dict[str, Any]:
    """What a fit's points must share with a run for its advice to apply: the token vocabulary
    and the candles' interval(s)."""
    return {"vocab_size": m.vocab_size, "intervals": list(d.run_intervals())}


def _val(point: dict[str, Any]) -> float:
    """A point's best validation loss (infinite when it has none)."""
    val = point.get("best_val_loss")
    return float("inf") if val is None else float(val)


def best_rates(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each shape and data fraction, the point of the learning rate with the lowest best
    validation loss (chosen on validation, never on test); one point per cell without --learning-rates."""
    best: dict[tuple, dict[str, Any]] = {}
    for r in points:
        cell = (r["parameters"], r["train_tokens"])  # a shape and a fraction: what the fit sees of a point
        if cell not in best or _val(r) < _val(best[cell]):
            best[cell] = r
    return list(best.values())


def sweep_fit(
    points: Sequence[dict[str, Any]], corpus: dict[str, Any], source: str
) -> tuple[list[dict[str, Any]], Optional[ScalingFit], str]:
    """(the point of each shape and fraction the fit uses, the fit of their best validation losses
    or None, why there is none). Points still improving at their last epoch are upper bounds, left
    out. The test loss is never fitted: the final run reports on that split."""
    chosen = best_rates(points)
    usable = [r for r in chosen if not r.get("still_improving") and r.get("best_val_loss") is not None]
    if len(usable) < MIN_FIT_POINTS:
        note = (
            f"no fit: {len(usable)} finished points that stopped improving (early stopping) and {MIN_FIT_POINTS} "
            "are needed; points still improving at their last epoch are upper bounds, left out"
        )
        return chosen, None, note
    fit = fit_points(
        [r["parameters"] for r in usable],
        [r["train_tokens"] for r in usable],
        [r["best_val_loss"] for r in usable],
        source=f"{source}, validation loss",
    )
    fit.corpus = dict(corpus)
    return chosen, fit, ""


def sweep_points(folder: Path, grid: Sequence[str], recorded: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The finished points of a sweep folder, in grid order: each point's own file
    (points/<point>.json, written once, atomically, when it finishes), else its row in `recorded`
    (a sweep.json copied without its points/ folder)."""
    rows = {r["point"]: r for r in recorded}
    for name in grid:
        path = Path(folder) / "points" / f"{name}.json"
        if path.is_file():
            rows[name] = read_json(path)
    return [rows[name] for name in grid if name in rows]


def load_size_fit(path: Path, corpus: dict[str, Any]) -> ScalingFit:
    """The fit of a user's sweep for a run's `corpus` (corpus_of): a sweep.json is refitted from every finished
    point file beside it (sweep_points, sweep_fit), so a summary that lags loses no point; a fit
    file is read as it is. Refused in one line when it is missing or was fitted on another
    vocabulary or interval."""
    try:
        doc = json.loads(Path(path).read_text())
        if doc.get("format") == SWEEP_FORMAT:
            points = sweep_points(Path(path).parent, doc["grid"], doc.get("points") or [])
            _, fit, note = sweep_fit(points, doc.get("corpus") or {}, f"marketgpt sweep {Path(path).parent.name}")
            if fit is None:
                raise UserError(f"{path}: the sweep has no fit yet ({note})")
        else:
            raw = doc["fit"] if "fit" in doc and "coef" not in doc else doc
            if raw is None:
                note = doc.get("fit_note") or "too few finished points"
                raise UserError(f"{path}: the sweep has no fit yet ({note})")
            fit = ScalingFit.from_dict(raw)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"{path}: not a scaling fit ({e})") from None
    for key, value in corpus.items():
        if fit.corpus.get(key) != value:
            raise UserError(
                f"{path}: fitted on {key} {fit.corpus.get(key)}, this config has {value}: "
                "its sizes do not carry over; run `marketgpt sweep` for this corpus"
            )
    return fit


def _shape_rows(
    m: ModelConfig, d: DataConfig, fit: ScalingFit, num_assets: Optional[int], num_categories: Optional[int]
) -> list[tuple[int, tuple[int, int, int, int]]]:
    """(parameters, shape) of the SHAPES inside the fit's measured range of N (within 1.5x)."""
    rows = []
    for d_model, layers, heads, d_ff in SHAPES:
        shape = copy.deepcopy(m)
        shape.d_model, shape.num_layers, shape.num_heads, shape.d_ff = d_model, layers, heads, d_ff
        n = meta_model(shape, d, num_assets, num_categories).num_parameters()
        if fit.n_range[0] / 1.5 <= n <= fit.n_range[1] * 1.5:
            rows.append((n, (d_model, layers, heads, d_ff)))
    if not rows:
        raise UserError("no shape of common.model.scaling_fit.SHAPES lies inside the fit's range of model sizes")
    return rows


def _pick(rows: Sequence[tuple[int, tuple[int, int, int, int]]], coef: dict[str, float], d: float) -> int:
    """Index in `rows` of the smallest shape within TOLERANCE of the lowest loss `coef` predicts."""
    losses = [float(_predict(coef, np.array([n / UNIT]), np.array([d / UNIT]))[0]) for n, _ in rows]
    lowest = min(losses)
    return min((i for i, v in enumerate(losses) if v <= lowest + TOLERANCE), key=lambda i: rows[i][0])


def best_shape(
    m: ModelConfig,
    d: DataConfig,
    train_tokens: float,
    fit: ScalingFit,
    num_assets: Optional[int] = None,
    num_categories: Optional[int] = None,
) -> dict[str, Any]:
    """The shape of SHAPES (inside the fit's measured range of N) that the fit predicts best for
    `train_tokens`: the smallest one within TOLERANCE of the lowest predicted loss. Returns
    d_model, num_layers, num_heads, d_ff, parameters, predicted_loss and why."""
    rows = _shape_rows(m, d, fit, num_assets, num_categories)
    n, (d_model, layers, heads, d_ff) = rows[_pick(rows, fit.coef, train_tokens)]
    loss = fit.loss(n, train_tokens)
    extrapolated = not fit.in_range(train_tokens)
    return {
        "d_model": d_model,
        "num_layers": layers,
        "num_heads": heads,
        "d_ff": d_ff,
        "parameters": int(n),
        "train_tokens": int(train_tokens),
        "predicted_loss": round(loss, 4),
        "optimal_parameters": fit.optimal_parameters(train_tokens),
        "why": (
            f"smallest shape within {TOLERANCE} nats of the lowest loss the scaling fit predicts for "
            f"{int(train_tokens):,} training tokens ({fit.source})"
            + (
                "; extrapolated: the fit saw " + f"{fit.d_range[0]:,.0f} to {fit.d_range[1]:,.0f} tokens"
                if extrapolated
                else ""
            )
        ),
    }


def size_resolved(fit: ScalingFit) -> bool:
    """Whether the fit's size term moves the loss: A kept, and its effect between the smallest and
    the largest measured size above TOLERANCE in 97.5% of the bootstrap draws."""
    if "A" not in fit.terms or not fit.draws:
        return False
    lo, hi = fit.n_range[0] / UNIT, fit.n_range[1] / UNIT
    effects = [k["A"] * (lo ** -k["a"] - hi ** -k["a"]) for k in fit.draws]
    return float(np.quantile(effects, 0.025)) > TOLERANCE


def size_advice(
    m: ModelConfig,
    d: DataConfig,
    train_tokens: float,
    fit: ScalingFit,
    num_assets: Optional[int] = None,
    num_categories: Optional[int] = None,
    *,
    min_tokens_per_parameter: float,
) -> dict[str, Any]:
    """What a user's fit says about model size for `train_tokens`: {"shape": best_shape's dict or
    None, "text": one line}. With a shape: the 95% interval of the parameters each bootstrap
    draw would pick, and a warning when it has fewer training tokens per parameter than the plan's
    memorization rule (min_tokens_per_parameter, common/commands/plan_figures.py) allows."""
    if not size_resolved(fit):
        return {"shape": None, "text": f"{NO_SIZE_ADVICE} ({fit.points} points; {fit.source})"}
    choice = best_shape(m, d, train_tokens, fit, num_assets, num_categories)
    rows = _shape_rows(m, d, fit, num_assets, num_categories)
    picked = [rows[_pick(rows, k, train_tokens)][0] for k in fit.draws]
    low, high = (int(q) for q in np.quantile(picked, [0.025, 0.975], method="lower"))
    choice["parameters_ci95"] = [low, high]
    text = (
        f"d_model {choice['d_model']}, num_layers {choice['num_layers']} ({choice['parameters']:,} parameters; "
        f"bootstrap 95%: {low:,} to {high:,}) for {int(train_tokens):,} training tokens"
    )
    if train_tokens / choice["parameters"] < min_tokens_per_parameter:
        choice["memorizes"] = True
        text += (
            f"; warning: under {min_tokens_per_parameter:g} training token per parameter, "
            "the plan's rule says the model can memorize the data"
        )
    if not fit.in_range(train_tokens):
        text += f" (extrapolated: the fit saw {fit.d_range[0]:,.0f} to {fit.d_range[1]:,.0f} tokens)"
    choice["why"] = text + f" ({fit.source})"
    return {"shape": choice, "text": text}
