"""Every check of the rehearsal (bench/rehearsal/checks.py) can fail: each is fed the figures of a
good run (it passes) and of a run where what it guards is broken (the fault not injected, the fix
reverted, the file left behind), and must then fail. Milliseconds, no Slurm: these run in CI where
the rehearsal itself (tests/test_rehearsal.py) needs the local cluster."""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
from typing import Any

import pytest
import torch

from common.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
from rehearsal import checks, prepare  # noqa: E402

KILL = {"killed": "3_6", "pids": [9352], "gone": True, "encoded": "encoded 15/150 assets"}
STATES = {"3_6": "FAILED", "3_0": "COMPLETED", "4": "CANCELLED", "22": "COMPLETED"}
HASHES = {"manifest.json": "m1", "tokens/tokens.bin": "a", "tokens/moves.bin": "b", "tokenizer.json": "c"}
LINES = {"DDP starts": 3, "batch lines": 3, "requeues": 2, "resumes": 2, "last epoch lines": 1}
WEIGHTS = {"w": torch.ones(3, 2), "b": torch.zeros(2)}
EPOCHS = [{"epoch": e, "train_loss": 4.1, "train_acc": 0.06, "val_loss": 4.0, "val_acc": 0.07} for e in (1, 2)]
PLAN = {
    "1d": {"series": 600, "candles": 180000, "train": 126000},
    "1h": {"series": 600, "candles": 1080000, "train": 1},
}
JOB = {"argv": ["submitit/core/_submit.py", "logs"], "job": "12", "task": "0", "max_rss_mb": 900.0}
JOB["max_anon_mb"] = 700.0  # an encode task
CARD = {"origins": {"drawn": "1800 forecasts over the budget of 400: 399 drawn, up to 133 assets", "budget": 400}}
REFUSED = (
    "the model forecasts 1d, 1h candles: each task is scored at its own interval\n"
    "marketgpt benchmark: error: the model's data cut-off 2023-09-12T04:00 is after the start of every "
    "benchmark task it can answer (...): score tasks after it with --after-cutoff"
)


def changed(d: dict, key: str, value: Any) -> dict:
    return {**d, key: value}


# check -> (the figures of a good run, the figures of a broken one: what is broken)
CASES: dict[str, tuple[Any, dict, dict]] = {
    "stage_runs": (checks.stage_runs, {"stage": "prepare", "figures": {"seconds": 1}}, {"figures": {"error": "boom"}}),
    "plan_and_check_run": (
        checks.plan_and_check_run,
        {"plan_exit": 0, "check_exit": 0, "head": "plan"},
        {"check_exit": 2},  # data check found damaged candles
    ),
    "shard_published": (
        checks.shard_published,
        {"shard": "effbed10", "manifest": True, "leftovers": [], "resubmissions": 0},
        {"leftovers": ["effbed10.work"]},  # a straggling task's work folder left beside the shard
    ),
    "encode_task_killed": (
        checks.encode_task_killed,
        {"kill": KILL, "states": STATES},
        {"kill": {"killed": None, "why": "no encode task ran before the deadline"}},  # the fault not injected
    ),
    "array_published": (
        checks.array_published,
        {"publishers": {"raced": "the training started meanwhile", "alone": "array, second submission"}},
        {"publishers": {"raced": "the training started meanwhile"}},  # the array's path never published
    ),
    "train_during_prepare": (
        checks.train_during_prepare,
        {"returncode": 0, "output": "Directional accuracy: ..."},
        {"returncode": 1, "output": "ValueError: the token shard ... is damaged"},
    ),
    "shard_equals_single": (
        checks.shard_equals_single,
        {
            "exit_code": 0,
            "array": HASHES,
            "single": changed(HASHES, "manifest.json", "m2"),
            "publisher": "array, first submission",
        },
        {"array": changed(HASHES, "tokens/tokens.bin", "x")},  # one file differs
    ),
    "requeued_twice": (
        checks.requeued_twice,
        {"state": "COMPLETED", "exit_code": "0:0", "restarts": "2", "lines": LINES, "signalled": []},
        {"restarts": "1", "lines": changed(LINES, "resumes", 1)},  # one requeue lost
    ),
    "weights_equal": (
        checks.weights_equal,
        {"a": WEIGHTS, "b": {k: v + 1e-7 for k, v in WEIGHTS.items()}},
        {"b": changed(WEIGHTS, "b", torch.full((2,), 1e-3))},
    ),
    "losses_equal": (
        checks.losses_equal,
        {"mine": EPOCHS, "theirs": EPOCHS},
        {"theirs": [EPOCHS[0], changed(EPOCHS[1], "val_loss", 4.01)]},
    ),
    "counts_match_plan": (
        checks.counts_match_plan,
        {"what": "interval", "names": ["1d", "1h"], "plan": PLAN, "seen": PLAN},
        {"seen": changed(PLAN, "1h", changed(PLAN["1h"], "train", 2))},
    ),
    "tested_every": (
        checks.tested_every,
        {"what": "interval", "tested": {"1d": 5, "1h": 7}, "expected": {"1d": 5, "1h": 7}, "capped": False},
        {"tested": {"1d": 5, "1h": 0}},  # an interval left out of test_results.json
    ),
    "scorecard_within_budget": (
        checks.scorecard_within_budget,
        {"card": CARD, "error": ""},
        {"card": {"origins": {"drawn": "1,800 drawn, up to 600 assets", "budget": 400}}},  # over its budget
    ),
    "benchmark_refuses": (
        checks.benchmark_refuses,
        {"exit_code": 2, "said": REFUSED},
        {"exit_code": 0, "said": ""},  # scored the leaked tasks
    ),
    "benchmark_answers_after": (
        checks.benchmark_answers_after,
        {"exit_code": 0, "aggregate": -0.1, "excluded": {"a": "leaked"}, "before": ["a"], "after": ["b"], "said": ""},
        {"excluded": {}},  # a task before the cut-off scored
    ),
    "benchmark_after_cutoff": (
        checks.benchmark_after_cutoff,
        {"exit_code": 0, "aggregate": -0.1, "excluded": {}, "said": ""},
        {"aggregate": None},  # n/a
    ),
    "prepare_jobs_fit": (
        checks.prepare_jobs_fit,
        {"records": [JOB, {**JOB, "argv": ["marketgpt", "train"], "max_anon_mb": 9000.0}], "request_mb": 8192},
        {"records": [JOB, {**JOB, "job": "15", "task": None, "max_anon_mb": 8793.6}]},  # the finish job over its 8 GB
    ),
    "status_lists": (
        checks.status_lists,
        {"exit_code": 0, "stdout": "ddp_20261205_0930  finished", "run": "ddp_20261205_0930"},
        {"stdout": "no runs"},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_check_passes_on_a_good_run_and_fails_when_what_it_guards_is_broken(name):
    fn, good, broken = CASES[name]
    assert fn(**good)["ok"], fn(**good)
    failed = fn(**{**good, **broken})
    assert failed["ok"] is False and failed["detail"], failed


def test_every_check_of_the_rehearsal_has_its_mutation_case():
    public = {
        n
        for n, f in inspect.getmembers(checks, inspect.isfunction)
        if f.__module__ == checks.__name__ and not n.startswith("_") and n not in ("result", "publisher_of")
    }
    assert public == set(CASES)


@pytest.mark.parametrize(
    "kill, states",
    [
        (changed(KILL, "gone", False), STATES),  # the process outlived its SIGKILL
        (KILL, changed(STATES, "3_6", "COMPLETED")),  # the task was not the one killed, or ran again
        (changed(KILL, "pids", []), STATES),
    ],
)
def test_the_killed_task_s_end_state_is_verified(kill, states):
    assert not checks.encode_task_killed(kill, states)["ok"]


def test_the_raced_shard_need_not_be_the_array_s_but_the_faulted_one_must():
    single = changed(HASHES, "manifest.json", "m2")
    by_training = dict(exit_code=0, array=HASHES, single=single, publisher="the training started meanwhile")
    assert not checks.shard_equals_single(**by_training)["ok"]  # the array's path was not the one checked
    assert checks.shard_equals_single(**by_training, faulted=False)["ok"]


def test_who_published_is_read_from_the_manifest():
    subs = {"first": ["4"], "second": ["22"], "resubmission": ["31"]}
    me = {"host": "h", "pid": 77, "slurm_job": None}
    assert checks.publisher_of(dict(me, slurm_job="4"), subs, 77) == "array, first submission"
    assert checks.publisher_of(dict(me, slurm_job="22_0"), subs, 77) == "array, second submission"
    assert checks.publisher_of(dict(me, slurm_job="31"), subs, 77) == "array, resubmission"
    assert checks.publisher_of(me, subs, 77) == "the training started meanwhile"
    assert checks.publisher_of(dict(me, pid=78), subs, 77).startswith("unknown")
    assert checks.publisher_of(None, subs, 77).startswith("unknown")  # a shard made before prepared_by


def test_leftovers_are_looked_for_beside_the_shard_not_inside_it(tmp_path):
    shard = tmp_path / "shards" / "effbed10"
    (shard / "tokens").mkdir(parents=True)
    (shard / "manifest.json").write_text("{}")
    assert prepare.leftovers(shard) == []
    (tmp_path / "shards" / "effbed10.work" / "clean").mkdir(parents=True)  # a straggling clean task's
    (tmp_path / "shards" / ".effbed10.abc.publish").mkdir()
    assert prepare.leftovers(shard) == [".effbed10.abc.publish", "effbed10.work"]


def test_a_killed_process_is_seen_gone_and_a_living_one_is_not():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not prepare.gone([proc.pid], timeout_s=0.3)
        proc.send_signal(signal.SIGKILL)
        assert prepare.gone([proc.pid])  # a zombie until reaped: ended all the same
    finally:
        proc.kill()
        proc.wait()


def test_the_command_line_starts():
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "rehearsal"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "--size {reduced,medium,full}" in out.stdout


@pytest.mark.parametrize(
    "said",
    [
        "Traceback (most recent call last):\nValueError: no task\nmarketgpt benchmark: error: use --after-cutoff",
        "marketgpt benchmark: error: the cut-off is after every task\nmarketgpt benchmark: error: use --after-cutoff",
        "marketgpt benchmark: error: the cut-off is after every task",  # no way out named
    ],
)
def test_the_benchmark_refusal_is_one_error_line_naming_the_way_out(said):
    assert not checks.benchmark_refuses(2, said)["ok"]


def test_the_chaos_plan_draws_every_fault_kind_as_often_at_random_gaps():
    import random

    from rehearsal import chaos

    kinds, gaps = chaos.fault_plan(20, random.Random(0))
    assert sorted(kinds) == sorted(chaos.KINDS * 4) and kinds != sorted(kinds)
    assert len(gaps) == 20 and len(set(gaps)) > 10 and all(20 <= g < 6 * chaos.STEPS for g in gaps)
    # the gaps, and the steps a node loss and a time limit let the job train on until Slurm acts
    # (about 1,400 and 900 on 2 vCPU, 4 of each: bench/results/2026-12-05-chaos), end before the run
    assert sum(gaps) + 4 * 1_400 + 4 * 900 < chaos.EPOCHS * chaos.STEPS
    assert chaos.fault_plan(20, random.Random(0)) == (kinds, gaps)  # a seed, one plan
    log = f"  epoch 1/{chaos.EPOCHS} step 40/40 | loss 3\n  epoch 3/{chaos.EPOCHS} step 5/40 | loss 2\n"
    assert chaos.global_steps(log) == [40, 85]
