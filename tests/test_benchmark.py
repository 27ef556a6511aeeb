"""`marketgpt benchmark`: the fixed tasks on the shipped sample, one row per task, the aggregate
and its interval, the leakage flag from the run's data cut-off, the leaderboard line, bad inputs;
a cut-off after every task (refused), --after-cutoff on the run's own candles, crypto pairs
answering for the sample's series of the same base."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from common.cli import main
from common.data.sample import load_sample
from common.errors import UserError
from common.evaluation import benchmark
from common.evaluation.benchmark import Draws, ModelView, aggregate_skill, run_benchmark
from common.evaluation.benchmark_tasks import (
    BENCHMARK_VERSION,
    MIN_HISTORY,
    TASKS,
    TASKS_FINGERPRINT,
    choose_tasks,
    data_cutoff,
    task_series,
    tasks_fingerprint,
)
from common.evaluation.price_baselines import RandomWalkEWMA

from test_forecast import TINY, candles, train_tiny

pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")

# a daily task before the tiny run's cut-off, one after it, and an hourly one (skipped: a 1d model)
CHOSEN = "us-2008,long-2023,fx-1h-2017"


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    _, run = train_tiny(tmp_path_factory.mktemp("bm"), TINY)
    board = run.parent / "board.jsonl"
    assert main(["benchmark", str(run), "--tasks", CHOSEN, "--samples", "4", "--leaderboard", str(board)]) == 0
    return run, board, json.loads((run / "benchmark.json").read_text())


def test_a_model_of_several_intervals_answers_at_each_and_interval_picks_one(tmp_path, capsys):
    """A tiny run on the sample's daily and hourly candles: each task is scored at its own interval
    (the hourly ones were skipped as "the model forecasts 1d candles"); --interval scores one and
    the rows of the other say how to score them."""
    spec = json.loads(json.dumps(TINY))
    spec["data"] = {"source": "sample", "interval": "1d", "intervals": ["1d", "1h"], "interval_split": "per_interval"}
    _, run = train_tiny(tmp_path, spec)
    capsys.readouterr()
    args = ["benchmark", str(run), "--tasks", "long-2023,fx-1h-2017", "--samples", "4", "--no-leaderboard"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "the model forecasts 1d, 1h candles: each task is scored at its own interval" in err
    result = json.loads((run / "benchmark.json").read_text())
    rows = {r["task"]: r for r in result["tasks"]}
    assert rows["long-2023"]["status"] == rows["fx-1h-2017"]["status"] == "scored"
    assert sorted(rows["fx-1h-2017"]["horizons"], key=int) == ["1", "6", "24"]
    assert result["model"]["intervals"] == ["1d", "1h"]

    assert main([*args, "--interval", "1d"]) == 0
    err = capsys.readouterr().err
    assert "scoring its 1d candles (--interval 1h scores another)" in err
    rows = {r["task"]: r for r in json.loads((run / "benchmark.json").read_text())["tasks"]}
    assert rows["long-2023"]["status"] == "scored" and rows["fx-1h-2017"]["status"] == "skipped"
    assert "not asked for (--interval 1d); --interval 1h scores them" in rows["fx-1h-2017"]["reason"]
    assert main([*args, "--interval", "4h"]) == 2
    assert "--interval 4h: the run was trained on 1d, 1h only" in capsys.readouterr().err

    # --after-cutoff: one interval, named; the assets with candles there (EURUSD=X has hourly ones only)
    assert main(["benchmark", str(run), "--after-cutoff", "--budget", "20", "--samples", "4"]) == 0
    assert "scoring its 1d candles (--interval 1h scores another)" in capsys.readouterr().err
    (row,) = json.loads((run / "benchmark_after_cutoff.json").read_text())["tasks"]
    assert row["interval"] == "1d" and row["status"] == "scored" and "EURUSD=X" not in row["assets"]


def test_tasks_are_frozen_for_their_version_and_fit_the_sample():
    assert tasks_fingerprint(TASKS) == TASKS_FINGERPRINT[BENCHMARK_VERSION], (
        "a task changed: give the benchmark a new BENCHMARK_VERSION and fingerprint"
    )
    for task in TASKS:
        assert task.interval in ("1d", "1h") and sorted(task.horizons) == list(task.horizons)
        for s in task_series(task):
            assert len(s.train) >= MIN_HISTORY, (task.name, s.symbol)
            assert len(s.test) >= 10 * task.stride, (task.name, s.symbol)
            # the cut-off and the end are the task's own: nothing at or after `end`
            assert s.candles.index[s.test.start] >= pd.Timestamp(task.start, tz="UTC")
            assert s.candles.index[-1] < pd.Timestamp(task.end, tz="UTC")
            assert s.candles.index[s.train.stop - 1] < pd.Timestamp(task.start, tz="UTC")
            assert s.symbol in load_sample(task.interval)


def test_rows_aggregate_leakage_and_leaderboard(benched, capsys):
    run, board, result = benched
    cutoff = pd.Timestamp(json.loads((run / "data_info.json").read_text())["split_cuts"]["test_start"])
    rows = {r["task"]: r for r in result["tasks"]}
    assert list(rows) == CHOSEN.split(",")
    for name in ("us-2008", "long-2023"):
        r = rows[name]
        assert r["status"] == "scored" and r["leakage"] == (cutoff > pd.Timestamp(r["start"], tz="UTC"))
        assert sorted(r["horizons"], key=int) == ["1", "5", "20"]
        for hc in r["horizons"].values():
            best = hc["best_baseline"]
            assert hc["crps"][best] == min(v for k, v in hc["crps"].items() if k != "model")
            assert hc["skill"]["value"] == pytest.approx(1 - hc["crps"]["model"] / hc["crps"][best])
    assert rows["us-2008"]["leakage"] is True and rows["long-2023"]["leakage"] is False  # the tiny run: 2010s cut
    assert rows["fx-1h-2017"]["status"] == "skipped" and "1d" in rows["fx-1h-2017"]["reason"]
    agg = result["aggregate"]
    assert agg["tasks"] == ["long-2023"] and agg["units"] == 3  # leaked and skipped tasks out
    assert set(agg["excluded"]) == {"us-2008", "fx-1h-2017"}
    assert agg["ci95"][0] <= agg["value"] <= agg["ci95"][1]
    line = json.loads(board.read_text())
    assert line["aggregate"]["value"] == agg["value"] and line["version"] == BENCHMARK_VERSION
    assert line["tasks"]["us-2008"]["leakage"] is True

    # --json prints the file's content; a second benchmark appends a second line
    assert (
        main(["benchmark", str(run), "--tasks", "long-2023", "--samples", "4", "--json", "--leaderboard", str(board)])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads((run / "benchmark.json").read_text()) and out["tasks"][0]["task"] == "long-2023"
    assert [json.loads(x)["aggregate"]["tasks"] for x in board.read_text().splitlines()] == [["long-2023"]] * 2


def test_table_names_every_task_and_the_leak(benched, capsys):
    _, _, result = benched
    table = benchmark.format_table(result).splitlines()
    assert sum("us-2008" in x and "LEAKED" in x for x in table) == 3
    assert any("fx-1h-2017" in x and "skipped" in x for x in table)
    assert table[-1].startswith("Aggregate over ")


def test_aggregate_is_the_geometric_mean_of_crps_ratios():
    ones = np.ones(40)
    # ratios 0.8 and 1.25: geometric mean 1, skill 0; a constant ratio: an interval of width 0
    even = aggregate_skill(
        [{"sums": {1: (0.8 * ones, ones)}, "block": 3}, {"sums": {1: (1.25 * ones, ones)}, "block": 3}]
    )
    assert even["value"] == pytest.approx(0.0, abs=1e-12) and even["units"] == 2
    rng = np.random.default_rng(0)
    base = rng.uniform(1, 2, 60)
    same = aggregate_skill([{"sums": {1: (0.9 * base, base), 5: (0.9 * base, base)}, "block": 4}])
    assert same["value"] == pytest.approx(0.1) and same["ci95"] == pytest.approx([0.1, 0.1])
    noisy = aggregate_skill([{"sums": {1: (base * rng.uniform(0.7, 1.1, 60), base)}, "block": 4}])
    assert noisy["ci95"][0] < noisy["value"] < noisy["ci95"][1] and noisy["verdict"] == "beats"
    assert aggregate_skill([])["value"] is None


def test_data_cutoff_of_a_run_and_of_an_export(tmp_path):
    run, export, old = tmp_path / "run", tmp_path / "export", tmp_path / "old"
    for d in (run, export, old):
        d.mkdir()
    (run / "data_info.json").write_text(
        json.dumps(
            {
                "split_cuts": {"val_start": "2012-01-02T00:00:00+00:00", "test_start": "2015-01-02T00:00:00+00:00"},
                "split_eras": [
                    {"test_start": "2015-01-02T00:00:00+00:00"},
                    {"test_start": "2019-06-03T00:00:00+00:00"},
                ],
            }
        )
    )
    assert data_cutoff(run) == pd.Timestamp("2019-06-03", tz="UTC")  # the latest era's
    (export / "model_card.json").write_text(
        json.dumps({"data_cutoff": "2016-01-04T00:00:00+00:00", "validation_end": "2015-01-02T00:00:00+00:00"})
    )
    assert data_cutoff(export) == pd.Timestamp("2016-01-04", tz="UTC")
    (old / "model_card.json").write_text(json.dumps({"validation_end": "2015-01-02T00:00:00+00:00"}))
    assert data_cutoff(old) == pd.Timestamp("2015-01-02", tz="UTC")  # an export made before data_cutoff
    assert data_cutoff(tmp_path) is None


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tasks", "us-2008,nope"], "unknown benchmark task nope"),
        (["--samples", "1"], "--samples 1"),
        (["--precision", "half"], "--precision 'half'"),
        (["--tasks", "fx-1h-2017"], "no chosen benchmark task fits the model (1d candles"),
        (["--after-cutoff", "--tasks", "us-2008"], "--after-cutoff builds its own task"),
        (["--budget", "10"], "--budget 10: applies to --after-cutoff only"),
        (["--after-cutoff", "--budget", "0"], "--budget 0: must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(benched, capsys, args, needle):
    run, board, _ = benched
    before = (run / "benchmark.json").read_bytes(), board.read_bytes()
    code = main(["benchmark", str(run), "--leaderboard", str(board), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("marketgpt benchmark: error: "), err
    assert needle in err[0], err[0]
    assert ((run / "benchmark.json").read_bytes(), board.read_bytes()) == before  # nothing written


def test_a_folder_that_is_no_model_is_one_line(tmp_path, capsys):
    assert main(["benchmark", str(tmp_path / "missing")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_an_hf_export_is_benchmarked_like_its_run(benched, tmp_path, capsys):
    run, _, result = benched
    out = tmp_path / "hf"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    card = json.loads((out / "model_card.json").read_text())
    assert card["data_cutoff"] == json.loads((run / "data_info.json").read_text())["split_cuts"]["test_start"]
    capsys.readouterr()
    assert main(["benchmark", str(out), "--tasks", "long-2023", "--samples", "4", "--no-leaderboard", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["data_cutoff"] == result["data_cutoff"]
    (row,) = got["tasks"]
    (same,) = [r for r in result["tasks"] if r["task"] == "long-2023"]
    assert row["leakage"] is False and row["horizons"] == same["horizons"]  # the same weights, the same scores


def test_assets_with_less_history_than_the_model_needs_are_left_out():
    (row,) = run_benchmark(RandomWalkEWMA(0.94), choose_tasks(["btc-2021"]), ModelView(min_history=10_000), Draws(4))[
        "tasks"
    ]
    assert row["status"] == "skipped" and row["assets_short"] == ["BTC-USD"]
    assert "fewer than the model's 10000 candles before 2021-01-04" in row["reason"]


def _with_cutoff(run, dest, test_start):
    """A copy of the trained run whose data_info.json records `test_start` as its cut-off (None: none)."""
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns("benchmark*.json"))
    info = json.loads((dest / "data_info.json").read_text())
    if test_start is None:
        del info["split_cuts"]
    else:
        info["split_cuts"]["test_start"] = test_start
    (dest / "data_info.json").write_text(json.dumps(info))
    return dest


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marketgpt benchmark: error: "), err
    return err[0]


def test_a_cutoff_after_every_task_is_refused_with_the_ways_out(benched, tmp_path, capsys):
    # the cases' dates and ratios (2005 to today, 70/15/15) put the cut-off in 2023: every daily task inside it
    run = _with_cutoff(benched[0], tmp_path / "late", "2023-09-01T00:00:00+00:00")
    board = tmp_path / "board.jsonl"
    capsys.readouterr()
    assert main(["benchmark", str(run), "--samples", "4", "--leaderboard", str(board)]) == 2
    line = _one_line(capsys)
    assert "cut-off 2023-09-01 is after the start of every benchmark task it can answer" in line
    assert "data.end_date before 2023-07-03" in line and "--after-cutoff" in line, line
    assert not (run / "benchmark.json").exists() and not board.exists()


def test_after_cutoff_scores_the_runs_own_candles_after_its_cutoff(benched, tmp_path, capsys):
    run = _with_cutoff(benched[0], tmp_path / "late", "2024-07-01T00:00:00+00:00")
    board = tmp_path / "board.jsonl"
    capsys.readouterr()
    assert main(["benchmark", str(run), "--after-cutoff", "--samples", "4", "--leaderboard", str(board)]) == 0
    out = capsys.readouterr().out
    result = json.loads((run / "benchmark_after_cutoff.json").read_text())
    assert result["task_set"] == "after-cutoff" and result["comparable"] is False
    assert "NOT the fixed ones" in out and "not comparable across models" in out
    assert not (run / "benchmark.json").exists() and not board.exists()  # no fixed result, no leaderboard line
    (task,), (row,) = result["task_definitions"], result["tasks"]
    daily = next(t for t in TASKS if t.interval == "1d")
    assert (tuple(task["horizons"]), task["stride"]) == (daily.horizons, daily.stride)  # the fixed tasks' scheme
    # the run's assets with candles after 2024-07-01 (the sample's daily series end in early 2025)
    assert task["start"] == "2024-07-01" and sorted(task["assets"]) == ["005930.KS", "NVDA"]
    assert task["end"] == "2025-02-15"  # after the last candle (NVDA, 2025-02-14)
    assert row["status"] == "scored" and row["leakage"] is False
    assert sorted(row["horizons"], key=int) == ["1", "5", "20"]
    assert result["aggregate"]["tasks"] == ["after-cutoff"] and result["aggregate"]["units"] == 3
    assert row["origins"]["budget"] == 2000 and not row["origins"].get("drawn")  # under the default budget

    # a run of many assets over years: at most --budget forecasts, assets drawn on each origin date
    assert main(["benchmark", str(run), "--after-cutoff", "--samples", "4", "--budget", "5", "--json"]) == 0
    (row,) = json.loads((run / "benchmark_after_cutoff.json").read_text())["tasks"]
    drawn = row["origins"]["drawn"]
    assert row["origins"]["budget"] == 5 and int(drawn.split(" drawn")[0].rsplit(" ", 1)[-1]) <= 5, drawn
    assert sum(h["n"] for h in row["horizons"].values()) <= 3 * 5


@pytest.mark.parametrize(
    "test_start, needle",
    [
        ("2025-06-01T00:00:00+00:00", "1d candles end before its data cut-off 2025-06-01 (the last is 2025-02-14)"),
        ("2025-02-10T00:00:00+00:00", "at most 5 1d candles after the data cut-off 2025-02-10, fewer than the 21"),
        (None, "records no data cut-off"),
    ],
)
def test_after_cutoff_without_candles_after_it_is_one_line(benched, tmp_path, capsys, test_start, needle):
    run = _with_cutoff(benched[0], tmp_path / "run", test_start)
    capsys.readouterr()
    assert main(["benchmark", str(run), "--after-cutoff", "--no-leaderboard"]) == 2
    line = _one_line(capsys)
    assert needle in line, line
    assert not (run / "benchmark_after_cutoff.json").exists()


def test_after_cutoff_task_splits_at_the_cutoff():
    from common.evaluation.benchmark_tasks import after_cutoff_task

    cut = pd.Timestamp("2021-01-01", tz="UTC")
    frames = {
        "A": ("us_stock", candles(400, 0, start="2020-01-01")),  # 34 candles from the cut-off on
        "B": ("us_stock", candles(380, 1, start="2020-01-01")),  # 14: fewer than H=20 needs
        "C": ("crypto", candles(300, 2, start="2020-01-01")),  # none
    }
    task, series = after_cutoff_task(frames, "1d", cut)
    (s,) = series
    assert task.assets == ("A",) and task.start == "2021-01-01" and task.end == "2021-02-04"
    assert s.candles.index[s.train.stop - 1] < cut <= s.candles.index[s.test.start] and s.test.stop == 400
    with pytest.raises(UserError, match="no 4h candles"):
        after_cutoff_task(frames, "4h", cut)


def test_crypto_pairs_answer_for_the_samples_series_of_their_base():
    seen = []
    rw = RandomWalkEWMA(0.94)

    def fn(histories, horizon, n_samples, seed):
        seen.extend(h.symbol for h in histories)
        return rw(histories, horizon, n_samples, seed)

    tasks = choose_tasks(["btc-2021"])
    pairs = run_benchmark(
        fn, tasks, ModelView(frozenset({"BTC/EUR", "BTC/USDT", "ETH/USDT"}), "1d"), Draws(4, n_boot=50)
    )
    (row,) = pairs["tasks"]
    assert row["status"] == "scored" and row["assets_scored"] == ["BTC/USDT"] and set(seen) == {"BTC/USDT"}
    assert pairs["symbol_map"] == {"BTC-USD": "BTC/USDT"}  # USDT before EUR
    lines = benchmark.format_table(pairs).splitlines()
    assert [x for x in lines if "BTC-USD -> BTC/USDT" in x] == [lines[1]]
    (same,) = run_benchmark(rw, tasks, ModelView(frozenset({"BTC-USD"}), "1d"), Draws(4, n_boot=50))["tasks"]
    assert row["horizons"] == same["horizons"]  # the sample's own series, under the pair's name


def test_the_aggregate_interval_leaves_out_draws_of_dates_without_forecasts():
    """A short task's longest horizon has no forecast on its last dates: a bootstrap draw of only
    those dates has no ratio. It is left out, and the result stays JSON (no NaN)."""
    rng = np.random.default_rng(1)
    model, best = rng.uniform(1, 2, 9), rng.uniform(1, 2, 9)
    model[3:], best[3:] = 0.0, 0.0  # 6 of 9 dates without a forecast at this horizon
    result = aggregate_skill([{"sums": {20: (model, best)}, "block": 1}], n_boot=400)
    json.dumps(result, allow_nan=False)
    assert np.isfinite(result["value"]) and (result["ci95"] is None or all(np.isfinite(result["ci95"])))
