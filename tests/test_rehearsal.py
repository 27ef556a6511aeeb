"""The rehearsal of case A's job (bench/rehearsal.py) at its reduced size, on the local Slurm
cluster (tools/local_slurm): a 2M-candle corpus of the 600-asset universe in the download cache's
layout, `plan` and `data check`, `data prepare --array 8` with a task killed, a second submission
and a training started meanwhile, the case script on 2 nodes requeued twice, the scorecard,
`benchmark` and `status`. Every check of its report must pass, but those in KNOWN_FAILING: defects
of today's code that the rehearsal shows, each with its reason. They are reported, not asserted
(one of them fails only when the race goes one way): remove a name once its defect is fixed, and
the check is asserted from then on."""
from __future__ import annotations

import shutil
import sys

import pytest

from common.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import rehearsal  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")]

# check name -> why it fails on today's code
KNOWN_FAILING = {
    "the array's shard equals a one-process preparation":
        "shard publishing races in the array preparation: the encode tasks of two submissions, the killed "
        "task's retry and a training's own preparation write and publish one work/ folder at once; "
        "tokens.bin and moves.bin differ",
    "a training started during the preparation finishes":
        "the same race, when it goes one way: the training reads a shard whose tokens are still being "
        "written and stops on a NaN loss at step 1",
    "marketgpt benchmark answers (not n/a)":
        "the benchmark answers n/a for a run of 1d and 1h: its 1h tasks are skipped ('the model forecasts "
        "1d candles') and the 1d tasks fall before the run's data cutoff (leakage)",
}


@pytest.fixture(scope="module")
def report(slurm_cluster, tmp_path_factory) -> dict:
    if slurm_cluster["nodes"] < 2:
        pytest.fail(f"the rehearsal's 2-node job needs 2 Slurm nodes, sinfo lists {slurm_cluster['nodes']}: "
                    "tools/local_slurm/local_slurm.sh start --nodes 2")
    root = tmp_path_factory.mktemp("rehearsal")
    try:
        result = rehearsal.run("reduced", root)
        rehearsal.print_report(result)
        yield result
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the corpus and the shards: some 300 MB


def _failed(report: dict) -> dict[str, str]:
    return {c["check"]: c["detail"] for c in report["checks"] if not c["ok"]}


def test_every_stage_ran_and_every_check_not_known_to_fail_passes(report):
    assert set(report["stages"]) >= {"corpus", "plan", "prepare", "prepare_single", "train_slurm", "reference", "after"}
    unexpected = {name: detail for name, detail in _failed(report).items() if name not in KNOWN_FAILING}
    assert not unexpected, unexpected


def test_known_failures_name_real_checks(report):
    names = {c["check"] for c in report["checks"]}
    assert set(KNOWN_FAILING) <= names, set(KNOWN_FAILING) - names
    now_passing = [name for name in KNOWN_FAILING if name not in _failed(report)]
    if now_passing:  # shown with -rA or -s: a fixed defect's check can be asserted again
        print(f"known failures that passed this time: {now_passing}")


def test_the_report_has_the_corpus_size_and_each_stage_s_processes(report):
    corpus = report["stages"]["corpus"]
    assert 1_000_000 <= corpus["candles"] <= 5_000_000 and corpus["bytes_on_disk"] > 0
    assert corpus["assets"] == 600 and corpus["sources"] == ["ccxt", "yfinance"]
    assert set(corpus["categories"]) == {"us_stock", "eu_stock", "emerging", "commodity", "crypto"}
    for stage in ("corpus", "plan", "prepare", "prepare_single", "train_slurm", "reference", "after"):
        rusage = report["stages"][stage]["rusage"]
        assert rusage["processes"] >= 1 and rusage["max_rss_mb"] > 0, (stage, rusage)
    # the array tasks and the 4 ranks of each of the job's 3 starts left their records
    tasks = [p for p in report["processes"]["prepare"] if p["task"] is not None]
    ranks = [p for p in report["processes"]["train_slurm"] if p["rank"] is not None and "train" in p["argv"]]
    assert len(tasks) >= 8 and len(ranks) >= 3 * rehearsal.NODES * rehearsal.TASKS_PER_NODE, (len(tasks), len(ranks))
