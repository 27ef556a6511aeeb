"""The rehearsal of case A's job (bench/rehearsal/) at its reduced size, on the local Slurm
cluster (tools/local_slurm): a 1.26M-candle corpus of the 600-asset universe in the download cache's
layout, `plan` and `data check`, `data prepare --array 8` with a task killed, a second submission
and a training started meanwhile, the case script on 2 nodes requeued twice, the scorecard,
`benchmark` (refused for the fixed tasks, then `--after-cutoff`) and `status`. Every check of its
report must pass: among them, the killed task ended FAILED, nothing is left beside the shard, the
faulted array published a shard at least once and it equals a one-process preparation byte for
byte, and the training started during the preparation finishes. That each check can fail:
tests/test_rehearsal_checks.py."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from common.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import rehearsal  # noqa: E402

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:A test tried to use socket.socket"),
]


@pytest.fixture(scope="module")
def report(slurm_cluster, tmp_path_factory) -> dict:
    if slurm_cluster["nodes"] < 2:
        pytest.fail(
            f"the rehearsal's 2-node job needs 2 Slurm nodes, sinfo lists {slurm_cluster['nodes']}: "
            "tools/local_slurm/local_slurm.sh start --nodes 2"
        )
    root = tmp_path_factory.mktemp("rehearsal")
    try:
        result = rehearsal.run("reduced", root)
        rehearsal.print_report(result)
        yield result
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the corpus and the shards: some 300 MB


def _failed(report: dict) -> dict[str, str]:
    return {c["check"]: c["detail"] for c in report["checks"] if not c["ok"]}


def test_every_stage_ran_and_every_check_passes(report):
    assert set(report["stages"]) >= {"corpus", "plan", "prepare", "prepare_single", "train_slurm", "reference", "after"}
    assert len(report["checks"]) >= 17 and not _failed(report), _failed(report)


def test_the_faulted_array_published_a_shard_and_the_report_says_who(report):
    rounds = report["stages"]["prepare"]["rounds"]
    assert set(rounds) in ({"raced"}, {"raced", "alone"}), rounds
    assert not rounds["raced"]["publisher"].startswith("unknown") and rounds["raced"]["prepared_by"], rounds
    assert any(r["publisher"].startswith("array, ") for r in rounds.values()), rounds
    assert all(r["kill"]["killed"] and r["states"][r["kill"]["killed"]] == "FAILED" for r in rounds.values())


def test_the_requeued_job_is_one_run_of_every_rank_on_both_nodes(report):
    """The 2-node job (4 ranks; on one node a rank's local id is its global one, so 2 nodes is
    the layout that tells them apart) trained one run folder, resumed twice, as Slurm's job."""
    log = json.loads(report["outputs"]["train_slurm: training_log"])
    ranks = rehearsal.NODES * rehearsal.TASKS_PER_NODE
    assert log == {
        "status": "finished",
        "world_size": ranks,
        "launcher": "slurm",
        "slurm_job_id": report["stages"]["train_slurm"]["job"],
        "resumes": 2,
    }, log


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
    # each rank's private memory (RssAnon, sampled) is measured, and is part of its peak RSS
    assert all(0 < p["max_anon_mb"] <= p["max_rss_mb"] for p in ranks), ranks
