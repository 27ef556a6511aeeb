"""`marketgpt status`: the table built from run folders, logs and (faked) squeue states."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.cli import main
from common.cluster import status
from common.cluster.status import collect_rows, last_line, status_table

from slurm_helpers import REPO


def _epoch(n: int, val: float, tps: float = 41234.0, eta: float = 3 * 3600 + 5 * 60) -> dict:
    return {
        "epoch": n,
        "train_loss": val + 0.1,
        "train_acc": 0.3,
        "val_loss": val,
        "val_acc": 0.3,
        "lr": 1e-4,
        "tokens_per_sec": tps,
        "elapsed_s": 60.0 * n,
        "eta_s": eta,
    }


def _run(root: Path, name: str, epochs_total: int = 50, log_lines: str = "", **log) -> Path:
    case = root / "case_c_crypto"
    run = case / "checkpoints" / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps({"training": {"epochs": epochs_total}, "slurm": {"log_prefix": "crypto"}})
    )
    if log:
        (run / "training_log.json").write_text(
            json.dumps({"status": "running", "best_val_loss": None, "epochs": [], **log})
        )
    if log_lines and log.get("slurm_job_id"):
        (case / "logs").mkdir(exist_ok=True)
        (case / "logs" / f"crypto_{log['slurm_job_id']}.out").write_text(log_lines)
    return run


@pytest.fixture
def root(tmp_path) -> Path:
    shutil.copytree(REPO / "case_c_crypto" / "configs", tmp_path / "case_c_crypto" / "configs")
    return tmp_path


def _no_slurm(monkeypatch):
    monkeypatch.setattr(status, "slurm_available", lambda: False)


def _slurm(monkeypatch, states: dict[str, str], commands: dict[str, str]):
    monkeypatch.setattr(status, "slurm_available", lambda: True)
    monkeypatch.setattr(status, "job_states", lambda ids: {i: states[i] for i in ids if i in states})
    monkeypatch.setattr(status, "job_commands", lambda: commands)


def test_without_slurm_every_run_folder_is_a_row(root, monkeypatch):
    _no_slurm(monkeypatch)
    _run(
        root,
        "crypto_prototype_20250106_091500",
        slurm_job_id="812",
        best_val_loss=2.4123,
        best_epoch=11,
        epochs=[_epoch(11, 2.4123), _epoch(12, 2.4301)],
        log_lines="Epoch 12/50\n  epoch 13/50 step 150/1200 | loss 2.512 | lr 1.0e-04 | 41.2k tok/s\n\n",
    )
    _run(root, "crypto_prototype_20250101_000000", status="finished", best_val_loss=2.0, epochs=[_epoch(50, 2.1)])
    table = status_table(root=root)
    header, first, second = table.splitlines()
    for column in ("SLURM", "EPOCH", "BEST VAL", "LAST VAL", "TOK/S", "ETA", "LAST LOG LINE"):
        assert column in header
    assert first.split()[:2] == ["case_c_crypto", "crypto_prototype_20250101_000000"]
    assert "finished" in first and "50/50" in first
    cells = second.split()
    assert cells[1:5] == ["crypto_prototype_20250106_091500", "812", "-", "running"]
    assert cells[5:10] == ["12/50", "2.412", "2.430", "-", "41.2k"]  # SCORE "-": no scorecard.json
    assert "3h 5m" in second and second.endswith("epoch 13/50 step 150/1200 | loss 2.512 | lr 1.0e-04 | 41.2k tok/s")


def test_score_is_the_scorecard_headline(root, monkeypatch):
    _no_slurm(monkeypatch)
    scored = _run(
        root, "crypto_prototype_20250101_000000", status="finished", best_val_loss=2.0, epochs=[_epoch(50, 2.1)]
    )
    (scored / "scorecard.json").write_text(
        json.dumps(
            {
                "headline": {
                    "horizon": 1,
                    "baseline": "garch",
                    "value": -0.0042,
                    "ci95": [-0.019, 0.01],
                    "verdict": "no edge",
                }
            }
        )
    )
    _run(root, "crypto_prototype_20250102_000000", status="finished", best_val_loss=2.0, epochs=[_epoch(50, 2.1)])
    broken = _run(
        root, "crypto_prototype_20250103_000000", status="finished", best_val_loss=2.0, epochs=[_epoch(50, 2.1)]
    )
    (broken / "scorecard.json").write_text('{"headline": null')  # half-written: no score, no crash
    header, *rows = status_table(root=root).splitlines()
    column = header.index("SCORE")
    assert header.index("LAST VAL") < column < header.index("TOK/S")
    assert [row[column:].split("  ")[0] for row in rows] == ["-0.4% GARCH", "-", "-"]
    assert [r.score for r in collect_rows(root=root)] == ["-0.4% GARCH", "-", "-"]


def test_slurm_states_come_from_the_job_id_in_the_log(root, monkeypatch):
    _run(root, "crypto_prototype_20250106_091500", slurm_job_id="812", epochs=[_epoch(1, 3.0)])
    _run(
        root,
        "crypto_prototype_20250105_000000",
        slurm_job_id="700",
        epochs=[_epoch(1, 3.0)],
        interrupted="SIGTERM at epoch 2 step 5; saved ...",
    )
    _run(root, "crypto_prototype_20250104_000000", slurm_job_id="600", epochs=[_epoch(1, 3.0)])
    _run(root, "crypto_prototype_20250103_000000", epochs=[_epoch(1, 3.0)])  # trained outside Slurm
    script = root / "case_c_crypto" / "slurm_scripts" / "train_crypto_a100.sh"
    _slurm(
        monkeypatch,
        {"812": "RUNNING", "900": "PENDING", "901": "PENDING"},
        {
            "812": f"{script}",
            "900": f"{script} --set training.epochs=5",
            "901": "/elsewhere/case_c_crypto/slurm_scripts/train_crypto_a100.sh",
        },
    )
    rows = {r.run: r for r in collect_rows(root=root)}
    assert (rows["crypto_prototype_20250106_091500"].slurm, rows["crypto_prototype_20250106_091500"].status) == (
        "RUNNING",
        "running",
    )
    assert rows["crypto_prototype_20250105_000000"].status == "interrupted"  # job gone, checkpoint saved
    assert rows["crypto_prototype_20250104_000000"].status == "stopped"  # job gone (scancel, kill -9)
    queued = rows["(no run folder yet)"]  # a job of this case (its script is here) without a run yet
    assert (queued.job, queued.slurm, queued.status) == ("900", "PENDING", "queued")
    assert rows["crypto_prototype_20250103_000000"].status == "running"  # no job to ask about
    assert len(rows) == 5  # job 901 runs another checkout's script


def test_a_run_folder_without_a_log_yet(root, monkeypatch):
    _no_slurm(monkeypatch)
    _run(root, "crypto_prototype_20250106_091500")
    (row,) = collect_rows(root=root)
    assert (row.status, row.epoch, row.best_val) == ("no log", "0/50", "-")


def test_last_line_reads_the_end_of_a_long_log_and_shortens_it(tmp_path):
    log = tmp_path / "x.out"
    log.write_text("x\n" * 100000 + "y" * 200 + "\r\n\n")
    assert last_line(log, width=20) == "y" * 17 + "..."
    assert last_line(tmp_path / "missing.out") == ""


def test_the_cli_prints_the_table_or_says_there_are_no_runs(tmp_path, capsys, monkeypatch):
    _no_slurm(monkeypatch)
    monkeypatch.setattr(status, "REPO_ROOT", tmp_path)
    assert main(["status"]) == 0
    assert "No runs under case_*/checkpoints yet" in capsys.readouterr().out
    assert main(["status", "--case", "case_c_cripto"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "marketgpt status: error: unknown case 'case_c_cripto'; did you mean 'case_c_crypto'?"


def test_a_direct_launch_whose_supervisor_is_gone_is_lost_not_running(root, monkeypatch):
    """A run trained by `marketgpt remote` (launcher direct) is as alive as its launch: pid and
    start time (.direct.json) decide, in the table and in --json, with no ETA for a dead one."""
    import subprocess
    import sys

    from common.cluster.status import status_json

    _no_slurm(monkeypatch)
    logs = root / "case_c_crypto" / "logs"
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "common.cluster.direct_launch"])
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    try:
        runs = {}
        for launch, pid in [("direct-20261201-093000", alive.pid), ("direct-20261202-093000", gone.pid)]:
            log_file = logs / f"crypto_{launch}.out"
            runs[launch] = _run(root, f"crypto_{launch[7:]}", log_file=str(log_file), epochs=[_epoch(3, 2.5)]).name
            logs.mkdir(exist_ok=True)
            log_file.write_text("  epoch 4/50 step 10/100\n")
            ticks = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19] if pid == alive.pid else 1
            (logs / ".direct.json").write_text(json.dumps({"id": launch, "pid": pid, "start_ticks": int(ticks)}))
            if launch == "direct-20261201-093000":  # the older launch, replaced by the newer one
                row = next(r for r in collect_rows(root=root) if r.run == runs[launch])
                assert (row.job, row.status, row.eta) == (launch, "running", "3h 5m")
        rows = {r.run: r for r in collect_rows(root=root)}
        dead = rows[runs["direct-20261202-093000"]]
        assert (dead.job, dead.status, dead.eta) == ("direct-20261202-093000", "lost", "-")
        # the older launch ended with an exit code after a stop signal that failed to save
        (logs / ".direct_direct-20261201-093000.end").write_text(json.dumps({"exit_code": 1, "state": "FAILED"}))
        table = status_table(root=root)
        assert [line.split()[1:5] for line in table.splitlines()[1:]] == [
            [runs["direct-20261201-093000"], "direct-20261201-093000", "-", "failed"],
            [runs["direct-20261202-093000"], "direct-20261202-093000", "-", "lost"],
        ]
        by_run = {r["run"]: r for r in status_json(root=root)["runs"]}
        lost = by_run[runs["direct-20261202-093000"]]
        assert (lost["status"], lost["job"], lost["eta_s"]) == ("lost", "direct-20261202-093000", None)
        # a run fetched from the box: no record of its launch here, so its own log decides
        (logs / ".direct.json").unlink()
        (logs / ".direct_direct-20261201-093000.end").unlink()
        assert {r.status for r in collect_rows(root=root)} == {"running"}
    finally:
        alive.kill()
        alive.wait(timeout=30)
