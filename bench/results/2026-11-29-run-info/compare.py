"""Compare the runs train_both.py made into two roots: python compare.py BEFORE_ROOT AFTER_ROOT,
or two run folders (e.g. the quickstart's, trained in two worktrees): python compare.py RUN_A RUN_B.
Prints one line per file and run; exits 1 where anything differs beyond wall time, tokens/s and
the run folder's own path."""

import json
import sys
from pathlib import Path

import torch

VOLATILE = {"tokens_per_sec", "elapsed_s", "eta_s", "mfu", "time_s", "wall_s"}  # wall time and its rates


def run_of(root: Path, name: str) -> Path:
    (run,) = (root / name / "checkpoints").iterdir()
    return run


def strip(value, drop=()):
    """A JSON value without the keys that change from run to run (timings, paths)."""
    if isinstance(value, dict):
        return {k: strip(v, drop) for k, v in value.items() if k not in VOLATILE and k not in drop}
    if isinstance(value, list):
        return [strip(v, drop) for v in value]
    return value


def compare(a: Path, b: Path) -> list[tuple[str, bool]]:
    out = []
    for name in ("asset_info.json", "tokenizer.json", "data_info.json", "tokens/tokens.bin", "tokens/index.json"):
        out.append((f"{name} byte-identical", (a / name).read_bytes() == (b / name).read_bytes()))
    ra, rb = (json.loads((r / "test_results.json").read_text()) for r in (a, b))
    out.append(("test_results.json equal", json.dumps(ra, sort_keys=True) == json.dumps(rb, sort_keys=True)))
    wa, wb = (torch.load(r / "best_model.pt", weights_only=True)["model"] for r in (a, b))
    out.append(
        ("best_model.pt weights torch.equal", wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa))
    )
    la, lb = (json.loads((r / "training_log.json").read_text()) for r in (a, b))
    out.append(("training_log.json epochs equal but for timings", strip(la["epochs"]) == strip(lb["epochs"])))
    sa, sb = ((r / "scorecard.json").read_text().replace(str(r), "RUN") for r in (a, b))
    out.append(("scorecard.json equal but for the run folder's path", strip(json.loads(sa)) == strip(json.loads(sb))))
    return out


if __name__ == "__main__":
    before, after = Path(sys.argv[1]), Path(sys.argv[2])
    ok = True
    pairs = (
        [("run", before, after)]
        if (before / "config.json").is_file()
        else [(name, run_of(before, name), run_of(after, name)) for name in ("one", "multi")]
    )
    for name, a, b in pairs:
        for what, same in compare(a, b):
            print(f"{name:5s} {what}: {'yes' if same else 'NO'}")
            ok &= same
    sys.exit(0 if ok else 1)
