"""The user's own scaling fit (common/model/scaling_fit.py: size_advice, load_size_fit) and
`marketgpt sweep` (common/commands/sweep.py): points from a known L(N, D) give size advice only
when size moves the loss, a fit of another corpus is refused, a toy sweep fills in only what is
missing."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import common.commands.train  # noqa: F401  (at collection: its import chain probes a socket)
from common.cli import main
from common.config import load_config
from common.errors import UserError
from common.model.scaling_fit import NO_SIZE_ADVICE, corpus_of, fit_points, load_size_fit, size_advice
from common.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import sweep_floor  # noqa: E402

CASE_C = REPO_ROOT / "case_c_crypto" / "configs" / "crypto_prototype.json"
SIZES = (1.7e5, 9.3e5, 5.0e6)
TOKENS = (4e4, 1e5, 3e5, 1e6)


def _points(size_term: float, seed: int = 0) -> tuple[list[float], list[float], list[float]]:
    """L = 1 + size_term / N^0.4 + 0.02 / D^0.3 (N, D in millions) with 1 mnat of noise."""
    rng = np.random.default_rng(seed)
    n = [s for s in SIZES for _ in TOKENS]
    d = [t for _ in SIZES for t in TOKENS]
    loss = [1 + size_term * (a / 1e6) ** -0.4 + 0.02 * (b / 1e6) ** -0.3 + rng.normal(0, 1e-3) for a, b in zip(n, d)]
    return n, d, loss


def test_no_size_advice_without_a_size_effect_and_a_larger_shape_with_one():
    cfg = load_config(CASE_C)
    flat = fit_points(*_points(0.0), n_boot=40)
    advice = size_advice(cfg.model, cfg.data, 3e5, flat, 2, 1, min_tokens_per_parameter=1.0)
    assert advice["shape"] is None and advice["text"].startswith(NO_SIZE_ADVICE)

    sized = fit_points(*_points(0.05), n_boot=40)
    advice = size_advice(cfg.model, cfg.data, 3e5, sized, 2, 1, min_tokens_per_parameter=1.0)
    shape = advice["shape"]
    assert shape is not None and shape["parameters"] > 2 * SIZES[0]  # bigger: not the smallest shape
    low, high = shape["parameters_ci95"]
    assert low <= shape["parameters"] <= high and "bootstrap 95%" in advice["text"]
    # 3e5 tokens on a multi-million-parameter shape: the plan's memorization rule warns, and so does the advice
    assert shape["memorizes"] and "memorize" in advice["text"]


def _fit_file(tmp_path, cfg_sets=()):
    fit = fit_points(*_points(0.05), n_boot=20)
    cfg = load_config(CASE_C, list(cfg_sets))
    fit.corpus = corpus_of(cfg.model, cfg.data)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"points": [], "fit": fit.to_dict()}))
    return path


@pytest.mark.parametrize("sets", [["model.vocab_size=512"], ['data.interval="1d"']])
def test_a_fit_of_another_vocabulary_or_interval_is_refused_in_one_line(tmp_path, capsys, sets):
    path = _fit_file(tmp_path, sets)
    cfg = load_config(CASE_C)
    with pytest.raises(UserError, match="sweep"):
        load_size_fit(path, corpus_of(cfg.model, cfg.data))
    assert main(["plan", "--config", str(CASE_C), "--fit", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fitted on" in err


TOY = [
    'data.source="synthetic"',
    'data.synthetic={"assets": 2, "candles": 1500, "categories": ["crypto"], "seasonality": 0.0}',
    'data.interval="1h"',
    'data.start_date="2020-01-01"',
    "data.universe_counts={}",
    "model.context_length=32",
    "tokenizer.ret_bins=16",
    "training.epochs=2",
    "training.max_steps_per_epoch=2",
    "training.eval_max_batches=1",
    "training.scorecard_origins=0",
    "training.vol_reversion=false",
    'training.device="cpu"',
    "training.compile=false",
    'experiment="toy"',
]


def _toy_case(tmp_path):
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "c.json"
    config.write_text(CASE_C.read_text())
    return config, [a for kv in TOY for a in ("--set", kv)]


def test_a_toy_sweep_runs_here_writes_its_points_and_fills_in_only_what_is_missing(tmp_path, capsys):
    from common.cluster.status import status_table

    config, sets = _toy_case(tmp_path)
    grid = ["--sizes", "16x1", "--fractions", "0.5"]
    assert main(["sweep", "--config", str(config), *sets, *grid, "--local"]) == 0
    folder = tmp_path / "sweeps" / "sweep_toy"
    (point,) = json.loads((folder / "sweep.json").read_text())["points"]
    assert point["point"] == "d16l1_f050" and point["parameters"] > 0 and point["steps"] == 4
    full = sum(1500 * 0.7 for _ in range(2))  # the two assets' training candles, about
    assert 0.3 * full < point["train_tokens"] < 0.7 * full  # one of the two assets
    assert point["test_loss"] > 0 and len(point["skill_vs_unigram_ci95"]) == 2 and point["still_improving"]
    assert (folder / "sweep.png").stat().st_size > 1000

    # the same sweep with one more fraction: only the new point trains
    assert main(["sweep", "--config", str(config), *sets, "--sizes", "16x1", "--fractions", "0.5,1", "--local"]) == 0
    doc = json.loads((folder / "sweep.json").read_text())
    assert [p["point"] for p in doc["points"]] == ["d16l1_f050", "d16l1_f100"] and doc["missing"] == []
    assert doc["points"][1]["train_tokens"] > 1.5 * point["train_tokens"]
    assert len(list((tmp_path / "checkpoints").glob("sweep_toy_d16l1_f050_*"))) == 1  # not run again
    assert doc["fit"] is None and "still improving" in doc["fit_note"]
    assert "sweep sweep_toy" in status_table(case=str(tmp_path)) and "2 of 2 points" in status_table(case=str(tmp_path))

    # the synthetic market's oracle: each point's share of the unigram-to-oracle gap closed
    assert sweep_floor.main([str(folder), "--draws", "5000"]) == 0
    floor = json.loads((folder / "floor.json").read_text())
    for row, p in zip(floor["points"], doc["points"]):
        unigram = p["test_loss"] / (1 - p["skill_vs_unigram"])
        assert floor["oracle_test_loss"] < row["unigram_loss"] == pytest.approx(unigram)
        share = (unigram - p["test_loss"]) / (unigram - floor["oracle_test_loss"])
        assert row["gap_closed"] == pytest.approx(share)
        assert row["gap_closed_ci95"][0] <= row["gap_closed"] <= row["gap_closed_ci95"][1]
    # the leaders (even assets) and followers (odd) apart, for a point on the whole training split
    part, whole = floor["points"]
    assert part["by_role"] is None and set(whole["by_role"]) == {"leaders", "followers"}
    roles = whole["by_role"].values()
    assert min(r["test_loss"] for r in roles) <= whole["test_loss"] <= max(r["test_loss"] for r in roles)
    assert min(r["unigram_loss"] for r in roles) <= whole["unigram_loss"] <= max(r["unigram_loss"] for r in roles)
    for r, role in zip(roles, ("leaders", "followers")):
        oracle = floor["oracle_test_loss_by_role"][role]
        assert r["gap_closed"] == pytest.approx((r["unigram_loss"] - r["test_loss"]) / (r["unigram_loss"] - oracle))

    # a learning-rate axis: one point per rate, and the fit takes the rate with the lower validation loss
    lrs = ["--sizes", "16x1", "--fractions", "0.5", "--learning-rates", "1e-3,3e-2", "--name", "lrs"]
    assert main(["sweep", "--config", str(config), *sets, *lrs, "--local"]) == 0
    doc = json.loads((tmp_path / "sweeps" / "lrs" / "sweep.json").read_text())
    by_rate = {p["learning_rate"]: p for p in doc["points"]}
    assert set(by_rate) == {1e-3, 3e-2} and by_rate[1e-3]["point"] == "d16l1_f050_lr0.001"
    assert doc["fit_points"] == [min(doc["points"], key=lambda p: p["best_val_loss"])["point"]]

    # sweeps of one shard (here the same market at other rates) share one oracle: every point scored
    assert sweep_floor.main([str(folder), str(tmp_path / "sweeps" / "lrs"), "--draws", "5000"]) == 0
    both = json.loads((folder / "floor.json").read_text())
    assert [r["sweep"] for r in both["points"]] == ["sweep_toy"] * 2 + ["lrs"] * 2
    assert both["oracle_test_loss"] == pytest.approx(floor["oracle_test_loss"])
    # the oracles' losses of an earlier floor.json of the same test candles, not recomputed
    earlier = tmp_path / "floor_before.json"
    earlier.write_text((folder / "floor.json").read_text())
    assert sweep_floor.main([str(tmp_path / "sweeps" / "lrs"), "--oracles-from", str(earlier)]) == 0
    again = json.loads((tmp_path / "sweeps" / "lrs" / "floor.json").read_text())
    assert again["oracle_test_loss"] == both["oracle_test_loss"] and again["points"] == both["points"][2:]
    doc = json.loads(earlier.read_text())
    earlier.write_text(json.dumps(doc | {"test_split": "another market"}))
    assert sweep_floor.main([str(tmp_path / "sweeps" / "lrs"), "--oracles-from", str(earlier)]) == 1

    capsys.readouterr()
    bad = [
        (["--learning-rates", "0"], "must be > 0"),
        (["--fractions", "0"], "> 0 and <= 1"),
        (["--fractions", "1.5"], "> 0 and <= 1"),
        (["--sizes", ""], "empty grid"),
        (["--set", "tokenizer.ret_bins=8"], "changed under it"),  # another shard under the same sweep
    ]
    for args, message in bad:
        assert main(["sweep", "--config", str(config), *sets, *grid, *args, "--local"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")
def test_a_toy_sweep_as_a_job_array_survives_a_killed_task_and_a_requeue(slurm_cluster, tmp_path, monkeypatch):
    """Two points as one array on the local cluster: task 1 is cancelled, finished task 0 is
    requeued (it finds its point done and trains nothing), and submitting again runs only point 1."""
    import subprocess

    from common.commands.sweep import plan_sweep
    from common.distributed.scheduler import wait_for_jobs
    from common.slurm.sweep_jobs import submit_sweep

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the jobs inherit the submitting environment
    config, _ = _toy_case(tmp_path)
    sets = [*TOY, "slurm.time=00:30:00", "slurm.cpus_per_task=1", "slurm.mem_gb=2", 'slurm.partition="long"']
    sweep = plan_sweep(config, sets, sizes="16x1", fractions="0.5,1")
    jobs = submit_sweep(sweep)
    assert len(jobs) == 2
    subprocess.run(["scancel", jobs[1].job_id], check=True)  # killed before it finishes
    states = wait_for_jobs([j.job_id for j in jobs], timeout_s=300, poll_s=0.5)
    logs = "".join(p.read_text() for p in sorted((sweep.folder / "logs").rglob("*_log.*")))
    assert states[jobs[0].job_id] == "COMPLETED" and states[jobs[1].job_id] in ("CANCELLED", "GONE"), (
        f"{states}\n{logs[-3000:]}"
    )
    assert [p.name for p in sweep.missing()] == ["d16l1_f100"]

    subprocess.run(["scontrol", "requeue", jobs[0].job_id], check=True)  # a finished task started again
    again = submit_sweep(sweep)  # only the missing point is queued
    assert len(again) == 1
    states = wait_for_jobs([jobs[0].job_id, again[0].job_id], timeout_s=300, poll_s=0.5)
    logs = "".join(p.read_text() for p in sorted((sweep.folder / "logs").rglob("*_log.*")))
    assert set(states.values()) == {"COMPLETED"}, f"{states}\n{logs[-3000:]}"
    assert "d16l1_f050 is finished; not run again" in logs
    assert sweep.missing() == [] and len(list((tmp_path / "checkpoints").glob("sweep_toy_d16l1_f050_*"))) == 1
    doc = json.loads((sweep.folder / "sweep.json").read_text())
    assert doc["missing"] == [] and len(doc["points"]) == 2


def test_the_fit_takes_each_cell_at_the_rate_with_the_lowest_validation_loss():
    from common.commands.sweep import best_rates

    def point(name, parameters, tokens, val, test):
        return {
            "point": name,
            "parameters": parameters,
            "train_tokens": tokens,
            "best_val_loss": val,
            "test_loss": test,
        }

    rows = [
        point("a_lr1", 170_000, 4000, 4.80, 4.70),  # the better test loss, the worse validation loss: not chosen
        point("a_lr2", 170_000, 4000, 4.79, 4.75),
        point("b_lr1", 930_000, 4000, 4.70, 4.72),
        point("b_lr2", 930_000, 2000, None, None),  # another cell, its only point
    ]
    assert [r["point"] for r in best_rates(rows)] == ["a_lr2", "b_lr1", "b_lr2"]


def test_a_training_fraction_cuts_assets_or_time_on_the_same_shard(tmp_path):
    from common.tokens.fractions import trim_train
    from common.tokens.shard_paths import shard_folder

    ranges = {s: {"train": (0, 100), "val": (130, 150), "test": (180, 200)} for s in ("A", "B", "C")}
    by_assets = trim_train(ranges, 0.5, "assets")
    assert [by_assets[s]["train"] for s in "ABC"] == [(0, 100), (0, 100), (0, 0)]  # ceil(1.5): two assets
    by_time = trim_train(ranges, 0.25, "time")
    assert all(by_time[s]["train"] == (75, 100) for s in "ABC")  # the latest quarter, next to validation
    assert all(r[k] == ranges[s][k] for t in (by_assets, by_time) for s, r in t.items() for k in ("val", "test"))
    cfg = load_config(CASE_C, TOY)
    half = load_config(CASE_C, [*TOY, "data.train_fraction=0.5", 'data.fraction_by="time"'])
    assert shard_folder(cfg, tmp_path)[0] == shard_folder(half, tmp_path)[0]  # no new preparation


def _write_points(tmp_path, test_of=lambda val, i: val):
    """A toy sweep of 9 finished points on the known L(N, D) of _points: their best validation
    losses follow it, their test losses are test_of(val, i)."""
    from common.atomic import atomic_write_json
    from common.commands.sweep import plan_sweep

    config, _ = _toy_case(tmp_path)
    sweep = plan_sweep(config, TOY, sizes="64x2,128x4,256x6", fractions="0.1,0.3,1")
    n, d, loss = _points(0.05)
    by_size = {64: SIZES[0], 128: SIZES[1], 256: SIZES[2]}
    rows = []
    for p in sweep.points:
        i = next(
            k for k in range(len(n)) if n[k] == by_size[p.d_model] and d[k] == TOKENS[[0.1, 0.3, 1].index(p.fraction)]
        )
        row = {
            "point": p.name,
            "parameters": n[i],
            "train_tokens": d[i],
            "best_val_loss": loss[i],
            "test_loss": test_of(loss[i], len(rows)),
            "still_improving": False,
        }
        atomic_write_json(sweep.done_file(p), row)
        rows.append(row)
    return config, sweep, rows


def test_sweep_json_fits_the_points_that_stopped_improving_and_plan_reads_it(tmp_path):
    from common.commands.sweep import write_sweep

    config, sweep, _ = _write_points(tmp_path)
    doc = write_sweep(sweep)
    assert doc["missing"] == [] and doc["fit"]["points"] == 9 and "A" in doc["fit"]["terms"]
    cfg = load_config(config, TOY)
    fit = load_size_fit(sweep.folder / "sweep.json", corpus_of(cfg.model, cfg.data))
    assert size_advice(cfg.model, cfg.data, 1e6, fit, 2, 1, min_tokens_per_parameter=1.0)["shape"] is not None


def test_a_sweep_json_written_by_a_task_that_saw_fewer_points_loses_none(tmp_path, capsys):
    """Two array tasks end at once: the one that listed the points before the other's file
    appeared writes sweep.json last. plan --fit and model.size_fit still see every point."""
    from common.commands.sweep import write_sweep

    config, sweep, _ = _write_points(tmp_path)
    last = sweep.done_file(sweep.points[-1])
    kept = last.read_bytes()
    last.unlink()  # what the late task saw
    stale = write_sweep(sweep)
    last.write_bytes(kept)  # the other task's point, finished all along
    assert len(stale["points"]) == 8 and stale["fit"]["points"] == 8  # the summary lags

    cfg = load_config(config, TOY)
    fit = load_size_fit(sweep.folder / "sweep.json", corpus_of(cfg.model, cfg.data))
    assert fit.points == 9 and fit.coef == write_sweep(sweep)["fit"]["coef"]
    assert main(["plan", "--config", str(config), *(a for kv in TOY for a in ("--set", kv)), "--fit",
                 str(sweep.folder / "sweep.json")]) == 0  # fmt: skip
    assert "Model size (" in capsys.readouterr().out


def test_the_size_fit_takes_validation_losses_and_only_reports_the_test_loss(tmp_path):
    """Points whose test losses order differently from their validation losses: the fit is the
    validation losses' (the final run reports on the test split, so choosing on it would leak)."""
    from common.commands.sweep import summary, write_sweep

    reversed_test = lambda val, i: 6.0 - val + 1e-3 * i  # noqa: E731  (larger where validation is smaller)
    config, sweep, rows = _write_points(tmp_path, reversed_test)
    doc = write_sweep(sweep)
    on_val = fit_points([r["parameters"] for r in rows], [r["train_tokens"] for r in rows],
                        [r["best_val_loss"] for r in rows])  # fmt: skip
    on_test = fit_points([r["parameters"] for r in rows], [r["train_tokens"] for r in rows],
                         [r["test_loss"] for r in rows])  # fmt: skip
    assert on_val.coef != on_test.coef
    assert doc["fit"]["coef"] == on_val.coef and "validation loss" in doc["fit"]["source"]
    cfg = load_config(config, TOY)
    assert load_size_fit(sweep.folder / "sweep.json", corpus_of(cfg.model, cfg.data)).coef == on_val.coef
    text = summary(sweep, doc)
    assert f"val loss {rows[0]['best_val_loss']:.4f} (fitted), test loss {rows[0]['test_loss']:.4f}" in text


def test_the_gpu_grid_says_it_needs_a_gpu_and_runs_nothing_here(tmp_path):
    """bench/sweep_gpu.sh on this CPU machine: one line, exit 0, no sweep folder made."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MARKETGPT_PYTHON": sys.executable, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "bench" / "sweep_gpu.sh")], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1 and "sees no CUDA GPU" in proc.stdout, proc
    assert not (REPO_ROOT / "case_c_crypto" / "sweeps" / "rich_gpu").exists()
    # and the config it sweeps is a valid case config on the rich market
    cfg = load_config(REPO_ROOT / "case_c_crypto" / "configs" / "sweep_rich.json")
    assert cfg.data.source == "synthetic" and cfg.data.synthetic["process"] == "rich"
