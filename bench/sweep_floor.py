"""A synthetic sweep's points against the oracle: the share of the gap between the unigram and the
best possible loss that each point closes on the test split.

    python bench/sweep_floor.py case_c_crypto/sweeps/rich_cpu [--draws 100000]
    python bench/sweep_floor.py SWEEP_SEED0 SWEEP_SEED1 SWEEP_SEED2      # one grid at several seeds

Several sweeps of one market (the same test candles) share one oracle: their points are scored
together, and where they are one grid at several `training.seed`s, named NAME_s0, NAME_s1, ...,
each point's mean share over the seeds is printed with a 95% t interval across them (the seeds'
spread, not the test sample's). floor.json goes into the first sweep's folder.

Every point of a sweep is scored on the same test candles (a data fraction trims the training
split only), so one oracle loss (bench/scaling_floors.py: the exact distribution of each test
token, knowing the next candle's scale and mean) serves them all. The sweep's token skill is
relative, skill = 1 - L_model / L_unigram (test_results.json's token_skill; the unigram of the
point's own training split), so L_unigram = L_model / (1 - skill) and

    gap closed = (L_unigram - L_model) / (L_unigram - L_oracle) = skill L_unigram / (L_unigram - L_oracle),

its 95% interval the skill's, scaled alike (the oracle's loss taken as exact). Writes
SWEEP/floor.json and prints a table. For data.source = "synthetic" sweeps only.

That oracle knows the next candle's latent regime and jump, which no forecaster can. On the rich
market without gaps the observable oracle (common/evaluation/observable_oracle.py: the exact predictive given
the candles up to each origin, a particle filter) is the reachable ceiling: each point's share of
the unigram-to-observable gap sits beside the share above (gap_closed_observable), and
unreachable_share = (L_observable - L_oracle) / (L_unigram - L_oracle) is the part of the first
gap no forecaster of the candles can close. Both oracles' losses are also given for the leaders
(even assets) and the followers (odd assets, whose mean carries the leader's previous shock);
the points' losses are not split by asset, so their shares are for all assets only.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.atomic import atomic_write_json, read_json  # noqa: E402
from common.model.scaling_fit import sweep_points  # noqa: E402
from common.tokens.token_set import TokenSet, token_path  # noqa: E402

from scaling_floors import by_role, oracles_by_role  # noqa: E402


def gap_closed(point: dict[str, Any], oracle: float, observable: Optional[float] = None) -> dict[str, Any]:
    """One point's unigram loss and share of the unigram-to-oracle gap closed, with its interval;
    with the observable oracle's loss, also the share of the gap to it and the unreachable share."""
    loss, skill = point["test_loss"], point["skill_vs_unigram"]
    unigram = loss / (1 - skill)
    scale = unigram / (unigram - oracle)
    row = {
        "point": point["point"],
        "sweep": point.get("sweep"),
        "parameters": point["parameters"],
        "train_tokens": point["train_tokens"],
        "test_loss": loss,
        "unigram_loss": unigram,
        "gap_closed": skill * scale,
        "gap_closed_ci95": [c * scale for c in point["skill_vs_unigram_ci95"]],
        "still_improving": point["still_improving"],
    }
    if observable is not None:
        obs_scale = unigram / (unigram - observable)
        row["gap_closed_observable"] = skill * obs_scale
        row["gap_closed_observable_ci95"] = [c * obs_scale for c in point["skill_vs_unigram_ci95"]]
        row["unreachable_share"] = (observable - oracle) / (unigram - oracle)
    return row


def role_unigram(run: Path, tokens: TokenSet) -> dict[str, Any]:
    """The unigram's mean NLL (fitted on the whole training split, as test_results.json's) on the
    oracles' test targets (each asset's test tokens but its first), for all assets and by role."""
    from common.evaluation.baselines import fit_baselines

    vocab = read_json(run / "config.json")["model"]["vocab_size"]
    train = {s: np.asarray(tokens.tokens[s][slice(*map(int, r["train"]))]) for s, r in tokens.ranges.items()}
    with np.errstate(divide="ignore"):  # PAD's probability is 0, and PAD is never a target
        log_p = np.log(fit_baselines(train, vocab)["unigram"].probs)
    nlls = {
        s: -log_p[np.asarray(tokens.tokens[s][int(r["test"][0]) + 1 : int(r["test"][1])])]
        for s, r in tokens.ranges.items()
    }
    return {"per_asset": nlls, **by_role([nlls[s] for s in sorted(nlls)])}


def role_shares(point: dict[str, Any], tokens: TokenSet, unigram: dict[str, Any], losses: dict) -> Optional[dict]:
    """A point's share of the gap to each oracle for the leaders (even assets) and the followers
    (odd) apart, from its per-asset test losses (test_results.json's per_asset) against
    `unigram` (role_unigram's). None for a point on part of the training split (whose unigram is
    its own) or whose test targets are not the oracles'."""
    if point.get("fraction", 1) != 1:
        return None
    per_asset = read_json(Path(point["run"]) / "test_results.json")["per_asset"]
    symbols = sorted(unigram["per_asset"])
    if any(per_asset[s]["num_tokens"] != len(unigram["per_asset"][s]) for s in symbols):
        return None
    out: dict[str, Any] = {}
    for role, parity in (("leaders", 0), ("followers", 1)):
        mine = [s for i, s in enumerate(symbols) if i % 2 == parity]
        n = sum(per_asset[s]["num_tokens"] for s in mine)
        loss = sum(per_asset[s]["loss"] * per_asset[s]["num_tokens"] for s in mine) / n
        u = unigram[role]
        out[role] = {"test_loss": loss, "unigram_loss": u}
        for name, key in (("oracle", "gap_closed"), ("observable", "gap_closed_observable")):
            if name in losses:
                out[role][key] = (u - loss) / (u - losses[name][role])
    return out


def test_split(run: Path) -> str:
    """A digest of a run's test split (each asset's test range and tokens): the points of one
    market share it whatever their training fraction."""
    tokens = TokenSet.load(token_path(run))
    h = hashlib.sha256()
    for s in tokens.symbols:
        lo, hi = map(int, tokens.ranges[s]["test"])
        h.update(f"{s}:{lo}:{hi};".encode())
        h.update(np.ascontiguousarray(tokens.tokens[s][lo:hi]).tobytes())
    return h.hexdigest()


def test_targets(tokens: TokenSet) -> int:
    """How many targets the oracle scores on a run's test split: each asset's test tokens but its first."""
    return sum(int(r["test"][1]) - int(r["test"][0]) - 1 for r in tokens.ranges.values())


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", type=Path, nargs="+", help="the sweep's folder (<case>/sweeps/<name>), with sweep.json")
    ap.add_argument("--draws", type=int, default=100_000, help="Monte Carlo draws per knot of the oracle's table")
    ap.add_argument("--particles", type=int, default=256, help="particles of the observable oracle's filter")
    ap.add_argument(
        "--oracles-from",
        type=Path,
        help="an earlier floor.json of the same test candles: its oracles' losses, not recomputed",
    )
    args = ap.parse_args(argv)
    points = []
    for sweep in args.sweeps:
        doc = read_json(sweep / "sweep.json")
        # the point files, not sweep.json's list alone: a task that ended late may have written a shorter one
        found = sweep_points(sweep, doc["grid"], doc["points"])
        points += [p | {"sweep": sweep.name} for p in sorted(found, key=lambda p: (p["parameters"], p["train_tokens"]))]
    if not points:
        print(f"{', '.join(map(str, args.sweeps))}: no finished point yet", file=sys.stderr)
        return 1
    tests = {test_split(Path(p["run"])) for p in points}
    earlier = read_json(args.oracles_from) if args.oracles_from else None
    if earlier is not None and {earlier.get("test_split")} != tests:
        print(f"{args.oracles_from}: its oracles scored other test candles; leave out --oracles-from", file=sys.stderr)
        return 1
    if len(tests) > 1:
        print("the sweeps' points were tested on different candles; one oracle needs one test split", file=sys.stderr)
        return 1
    run = Path(points[0]["run"])
    if read_json(run / "config.json")["data"]["source"] != "synthetic":
        print(f"{run}: not a synthetic run; the oracle knows the synthetic market only", file=sys.stderr)
        return 1
    scored = read_json(run / "test_results.json")["num_tokens"]
    tokens = TokenSet.load(token_path(run))  # read once: the count here, the targets in oracle_nll
    targets = test_targets(tokens)
    if scored != targets:
        print(
            f"{run}: its test scored {scored} of the split's {targets} targets (training.eval_max_batches caps it);"
            " the oracle's loss would be of other targets: rerun the sweep with a larger eval_max_batches",
            file=sys.stderr,
        )
        return 1
    if earlier is not None:
        losses = {"oracle": earlier["oracle_test_loss_by_role"]}
        if "observable_oracle_test_loss_by_role" in earlier:
            losses["observable"] = earlier["observable_oracle_test_loss_by_role"]
            args.particles = earlier["observable_particles"]
    else:
        losses = oracles_by_role(run, "test", tokens, args.draws, args.particles)
    oracle, observable = losses["oracle"], losses.get("observable")
    rows = [gap_closed(p, oracle["all"], observable["all"] if observable else None) for p in points]
    if "leaders" in oracle:
        unigram = role_unigram(run, tokens)
        for row, p in zip(rows, points):
            row["by_role"] = role_shares(p, tokens, unigram, losses)
    doc: dict[str, Any] = {"oracle_test_loss": oracle["all"], "oracle_test_loss_by_role": oracle}
    if observable is not None:
        doc |= {"observable_oracle_test_loss": observable["all"], "observable_oracle_test_loss_by_role": observable}
        doc["observable_particles"] = args.particles
    doc["sweeps"] = [str(sweep) for sweep in args.sweeps]
    doc["test_split"] = tests.pop()
    atomic_write_json(args.sweeps[0] / "floor.json", doc | {"from_run": str(run), "points": rows})
    print(f"oracle test loss {oracle['all']:.4f} nats/token (every point's test candles)")
    if observable is None:
        print("no observable oracle: it models the rich market without gaps")
    else:
        print(f"observable oracle test loss {observable['all']:.4f} nats/token")
        for role in ("leaders", "followers"):
            if role in oracle:
                print(f"  {role}: oracle {oracle[role]:.4f}, observable {observable[role]:.4f}")
    obs_head = " gap closed to observable [95%] | unreachable |" if observable else ""
    sweep_head, sweep_sep = ("sweep | ", "---|") if len(args.sweeps) > 1 else ("", "")
    print(f"| {sweep_head}point | parameters | training tokens | test loss | unigram | gap closed [95%] |{obs_head}")
    print("|" + sweep_sep + "---|---|---|---|---|---|" + ("---|---|" if observable else ""))
    for r in rows:
        lo, hi = r["gap_closed_ci95"]
        note = " (still improving)" if r["still_improving"] else ""
        obs_cells = ""
        if observable:
            olo, ohi = r["gap_closed_observable_ci95"]
            obs_cells = f" {r['gap_closed_observable']:.3f} [{olo:.3f}, {ohi:.3f}] | {r['unreachable_share']:.3f} |"
        sweep_cell = f"{r['sweep']} | " if sweep_head else ""
        print(
            f"| {sweep_cell}{r['point']} | {r['parameters']:,} | {r['train_tokens']:,} | {r['test_loss']:.4f} | "
            f"{r['unigram_loss']:.4f} | {r['gap_closed']:.3f} [{lo:.3f}, {hi:.3f}]{note} |{obs_cells}"
        )
    for r in rows:
        for role, v in (r.get("by_role") or {}).items():
            shares = ", ".join(f"{k} {v[k]:.3f}" for k in ("gap_closed", "gap_closed_observable") if k in v)
            print(f"  {r.get('sweep') or ''} {r['point']} {role}: test loss {v['test_loss']:.4f}, {shares}")
    if len(args.sweeps) > 1:
        print_seed_means(rows, "gap_closed_observable" if observable else "gap_closed")
    return 0


def print_seed_means(rows: list[dict[str, Any]], key: str) -> None:
    """Each point's mean share over the seeds of its sweep (sweeps named NAME_s0, NAME_s1, ...),
    with a 95% t interval across them; for all assets and, where the rows have them, for the
    leaders and the followers apart."""
    print(f"{key}, mean over the sweeps [95% t interval across them]:")
    for role in ("all", "leaders", "followers"):
        by_point: dict[str, list[float]] = {}
        for r in rows:
            value = r.get(key) if role == "all" else ((r.get("by_role") or {}).get(role) or {}).get(key)
            if value is not None:  # a sweep's seeds are its name's _s<seed> suffix: rich_s0, rich_s1, ...
                by_point.setdefault(f"{re.sub(r'_s[0-9]+$', '', r.get('sweep') or '')} {r['point']}", []).append(value)
        for name, values in by_point.items():
            v = np.array(values)
            half = stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
            print(f"  {name} ({role}): {v.mean():.3f} [{v.mean() - half:.3f}, {v.mean() + half:.3f}] over {len(v)}")


if __name__ == "__main__":
    sys.exit(main())
