"""`marketgpt remote` against a real sshd on 127.0.0.1 (the "login node"), with the local Slurm
cluster behind it for the `remote train` loop.

The sshd is Debian's openssh-server with its own config, host key and a generated user key,
on a free port, stopped by its pid. The client reaches it through an ssh config alias with
strict host key checking, as a user's ~/.ssh/config would. The "workstation" is a throwaway
copy of the repo, the remote repo another temp folder, so nothing lands in the working tree.
Without sshd, ssh or rsync the tests that need them fail under CI=true (.ci/run installs them)
and skip elsewhere. Every address is on 127.0.0.1: no packet leaves this machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch

from common.run.checkpoint import save_checkpoint

from slurm_helpers import REPO, TINY
from ssh_helpers import ALIAS, free_port, marketgpt


def _fake_run(remote: Path, name: str = "exp_20240101_000000", big_bytes: int = 0) -> Path:
    """A finished-looking run folder there: a real checkpoint, JSON files, epoch checkpoints."""
    run = remote / "case_c_crypto" / "checkpoints" / name
    run.mkdir(parents=True)
    save_checkpoint({"model": {"w": torch.arange(1000.0)}, "epoch": 2}, run / "best_model.pt")
    save_checkpoint({"model": {"w": torch.zeros(10)}}, run / "checkpoint_epoch_1.pt")
    (run / "training_log.json").write_text(json.dumps({"slurm_job_id": "7", "epochs": []}))
    (run / "config.json").write_text("{}")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out").write_bytes(os.urandom(big_bytes or 100))
    return run


# --------------------------------------------------------------------------- sync, fetch


def test_sync_copies_the_repo_without_outputs_and_shows_the_summary(workstation):
    local, remote = workstation["local"], workstation["remote"]
    (local / "case_c_crypto" / "logs").mkdir()
    (local / "case_c_crypto" / "logs" / "old.out").write_text("x")
    (local / "common" / "__pycache__").mkdir(exist_ok=True)
    (local / "common" / "__pycache__" / "x.pyc").write_text("x")
    proc = marketgpt(local, "sync")
    assert proc.returncode == 0, proc.stderr
    assert "Number of files" in proc.stdout and "total size is" in proc.stdout
    cli = Path("common", "cli", "__init__.py")
    assert (remote / cli).read_text() == (local / cli).read_text()
    assert (remote / "case_c_crypto" / "slurm_scripts").is_dir()
    assert not (remote / "case_c_crypto" / "logs").exists()
    assert not (remote / "common" / "__pycache__").exists()


def test_fetch_latest_copies_verifies_and_leaves_out_epoch_checkpoints(workstation):
    local, remote = workstation["local"], workstation["remote"]
    assert marketgpt(local, "sync").returncode == 0
    _fake_run(remote, "exp_20240101_000000")
    time.sleep(1.1)
    newest = _fake_run(remote, "exp_20240202_000000")
    proc = marketgpt(local, "fetch", "--latest", "--case", "c")
    assert proc.returncode == 0, proc.stderr
    got = local / "case_c_crypto" / "checkpoints" / newest.name
    assert (got / "best_model.pt").read_bytes() == (newest / "best_model.pt").read_bytes()
    assert (got / "tensorboard" / "events.out").read_bytes() == (newest / "tensorboard" / "events.out").read_bytes()
    assert not (got / "checkpoint_epoch_1.pt").exists()
    assert not (local / "case_c_crypto" / "checkpoints" / "exp_20240101_000000").exists()
    assert not list(got.parent.glob(".fetch_*")), "the staging folder is removed"
    proc = marketgpt(local, "fetch", "exp_20240101_000000", "--all-checkpoints")
    assert proc.returncode == 0, proc.stderr
    assert (local / "case_c_crypto" / "checkpoints" / "exp_20240101_000000" / "checkpoint_epoch_1.pt").is_file()


def test_a_damaged_checkpoint_or_json_there_is_caught_and_nothing_is_moved_into_place(workstation):
    local, remote = workstation["local"], workstation["remote"]
    assert marketgpt(local, "sync").returncode == 0
    run = _fake_run(remote)
    data = bytearray((run / "best_model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit inside the tensor data: torch.load would not notice
    (run / "best_model.pt").write_bytes(bytes(data))
    (run / "config.json").write_text("{not json")
    proc = marketgpt(local, "fetch", run.name)
    assert proc.returncode == 1
    assert "step 'fetch (verify)' failed" in proc.stderr
    assert "best_model.pt: fails its CRC32 check" in proc.stderr and "config.json: not valid JSON" in proc.stderr
    assert not (local / "case_c_crypto" / "checkpoints" / run.name).exists()


def test_an_interrupted_fetch_leaves_no_file_under_its_final_name_and_a_second_fetch_completes(workstation):
    local, remote = workstation["local"], workstation["remote"]
    assert marketgpt(local, "sync").returncode == 0
    run = _fake_run(remote, big_bytes=3_000_000)
    settings = {**workstation["settings"], "rsync_options": "--bwlimit=300"}  # ~10 s for the big file
    (local / "remote.json").write_text(json.dumps(settings))
    proc = subprocess.Popen(
        [sys.executable, "-m", "common.cli", "remote", "fetch", run.name, "--case", "c", "--repo", str(local)],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    staging = local / "case_c_crypto" / "checkpoints" / f".fetch_{run.name}"
    deadline = time.monotonic() + 60
    while not any(p.is_file() and p.stat().st_size > 0 for p in staging.rglob("*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # midway through the big file
    os.killpg(proc.pid, signal.SIGKILL)  # the command and its rsync and ssh, as a closed laptop lid would
    proc.wait(timeout=30)
    final = local / "case_c_crypto" / "checkpoints" / run.name
    assert any(staging.rglob("*")), "the interrupted fetch had started"
    assert not final.exists(), "nothing is published before the whole run is checked"

    (local / "remote.json").write_text(json.dumps(workstation["settings"]))
    again = marketgpt(local, "fetch", run.name)
    assert again.returncode == 0, again.stderr
    big = run / "tensorboard" / "events.out"
    assert (final / "tensorboard" / "events.out").read_bytes() == big.read_bytes()
    assert (final / "best_model.pt").read_bytes() == (run / "best_model.pt").read_bytes()


def test_status_and_logs_run_there(workstation):
    local, remote = workstation["local"], workstation["remote"]
    assert marketgpt(local, "sync").returncode == 0
    _fake_run(remote)
    logs = remote / "case_c_crypto" / "logs"
    logs.mkdir()
    (logs / "crypto_123.out").write_text("".join(f"line {i}\n" for i in range(10)))
    proc = marketgpt(local, "logs", "123", "-n", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "line 8\nline 9\n"
    proc = marketgpt(local, "logs", "999")
    assert proc.returncode == 1 and "no case_*/logs/*_999.out" in proc.stderr
    proc = marketgpt(local, "status", "--case", "c")
    assert proc.returncode == 0, proc.stderr
    assert "exp_20240101_000000" in proc.stdout  # `marketgpt status` of the remote repo, not of this one
    proc = marketgpt(local, "status", "--case", "c", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # the JSON object alone, for a dashboard on the workstation
    assert report["schema"] == "marketgpt.health/1" and [r["run"] for r in report["runs"]] == ["exp_20240101_000000"]


# --------------------------------------------------------------------------- bad input


# Accepts TCP connections on 127.0.0.1 and never says a word: ssh waits for the server's banner,
# which its ConnectTimeout covers as it covers the connect (a host that never answers, without a
# packet leaving this machine). Prints its port, then holds the connections until killed.
SILENT_SERVER = """
import socket
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
held = []
while True:
    held.append(server.accept()[0])
"""


@pytest.fixture
def silent_port() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", SILENT_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize("where", ["closed port", "no answer"])
def test_an_unreachable_host_fails_in_seconds_naming_the_step(workstation, request, where):
    local = workstation["local"]
    # a port nothing listens on (refused at once), or a server that never answers (ConnectTimeout);
    # only 127.0.0.1: a test sends no packet off this machine (test_loopback_only.py)
    port = free_port() if where == "closed port" else request.getfixturevalue("silent_port")
    host, says = "root@127.0.0.1", ("Connection refused" if where == "closed port" else "timed out")
    (local / "remote.json").write_text(
        json.dumps({**workstation["settings"], "host": host, "ssh_options": f"-p {port}", "connect_timeout_s": 3})
    )
    # timeout=30 bounds the test: an ssh that hung for minutes would fail it with TimeoutExpired
    proc = marketgpt(local, "status", timeout=30)
    assert proc.returncode == 1
    assert f"step 'status' failed: cannot reach {host} over ssh" in proc.stderr
    assert says in proc.stderr


def test_a_remote_path_without_the_repo_is_named(workstation):
    local = workstation["local"]
    workstation["remote"].mkdir(parents=True)
    proc = marketgpt(local, "submit", "--case", "c")
    assert proc.returncode == 1
    assert "step 'check remote repo' failed" in proc.stderr
    assert "holds no MarketGPT repo" in proc.stderr and "marketgpt remote sync" in proc.stderr


def test_missing_settings_and_bad_remote_json_are_usage_errors(workstation):
    local = workstation["local"]
    (local / "remote.json").write_text(json.dumps({"hots": "x"}))
    proc = marketgpt(local, "status")
    assert proc.returncode == 2 and "unknown key 'hots' (did you mean 'host'?)" in proc.stderr
    (local / "remote.json").unlink()
    proc = marketgpt(local, "sync")
    assert proc.returncode == 2 and "copy remote.example.json" in proc.stderr


def test_dry_run_prints_the_exact_commands_and_runs_nothing(workstation):
    local, remote = workstation["local"], workstation["remote"]
    proc = marketgpt(local, "train", "--case", "c", "--set", "training.epochs=1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("rsync -az --stats") and f"{ALIAS}:{remote}/" in line for line in lines)
    assert any(
        "sbatch --parsable case_c_crypto/slurm_scripts/train_crypto_a100.sh --set training.epochs=1" in line
        for line in lines
    )
    assert any(line.startswith("ssh -o BatchMode=yes") for line in lines)
    assert not remote.exists()


# --------------------------------------------------------------------------- with Slurm behind the sshd


@pytest.mark.slurm
def test_sbatch_failing_there_shows_its_message(workstation, slurm_cluster):
    local = workstation["local"]
    assert marketgpt(local, "sync").returncode == 0
    proc = marketgpt(local, "submit", "--case", "c", "--sbatch-args=--partition=nosuchpartition")
    assert proc.returncode == 1
    assert "step 'submit (sbatch)' failed" in proc.stderr
    assert "invalid partition" in proc.stderr.lower()


@pytest.mark.slurm
@pytest.mark.slow
def test_remote_train_runs_the_whole_loop_on_the_local_cluster(workstation, slurm_cluster):
    local, remote = workstation["local"], workstation["remote"]
    settings = {
        **workstation["settings"],
        "env": f"export OMP_NUM_THREADS=1 SLURM_CONF={os.environ.get('SLURM_CONF', '/etc/slurm/slurm.conf')}",
    }
    (local / "remote.json").write_text(json.dumps(settings))
    # a small end-of-training scorecard (TINY turns it off), so that the results printed at the end include one
    scored = [*TINY, "training.scorecard_origins=2", "training.scorecard_samples=4", "experiment=remote_tiny"]
    args = [a for kv in scored for a in ("--set", kv)]
    proc = marketgpt(local, "train", "--case", "c", *args, "--poll", "2", "--timeout", "600", timeout=700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "Number of files" in out  # sync
    job_id = out.split("Submitted job ")[1].split()[0]
    assert f"marketgpt remote logs {job_id} -f" in out and f"squeue -j {job_id}" in out
    assert "[job " in out and "COMPLETED" in out  # followed the queue
    assert "epoch 2/2" in out  # followed the log
    (run,) = (local / "case_c_crypto" / "checkpoints").glob("remote_tiny_*")
    assert f"Fetched and checked {run}" in out
    results = out.split(f"Fetched and checked {run}")[1]  # printed from the fetched files (the log has them too)
    assert "Test (best model, epoch" in results  # the test results
    card = json.loads((run / "scorecard.json").read_text())
    assert card["verdicts"] and f"Scorecard headline: H={card['headline']['horizon']}: CRPS skill vs " in results
    assert all(f"  {line}\n" in results for line in card["verdicts"])
    for name in (
        "best_model.pt",
        "test_results.json",
        "training_log.json",
        "config.json",
        "tokenizer.json",
        "scorecard.json",
    ):
        assert (run / name).is_file(), name
    assert not list(run.glob("checkpoint_epoch_*.pt"))
    there = remote / "case_c_crypto" / "checkpoints" / run.name
    assert (run / "best_model.pt").read_bytes() == (there / "best_model.pt").read_bytes()
    assert json.loads((run / "training_log.json").read_text())["slurm_job_id"] == job_id


# --------------------------------------------------------------------------- unit: following a job


def test_wait_follows_a_requeued_job_to_its_end_and_survives_a_few_ssh_failures(capsys):
    from common.cluster.remote import Remote, StepFailed
    from common.cluster.remote_settings import RemoteSettings

    answers = [
        ("PENDING", "", 0),
        ("RUNNING", "epoch 1/2\n", 10),
        StepFailed("wait (squeue)", "blip"),
        ("REQUEUED", "requeueing\n", 21),
        ("PENDING", "", 21),
        ("RUNNING", "resumed\n", 29),
        ("COMPLETED", "done\n", 34),
    ]

    class Scripted(Remote):
        def job_state(self, job_id, log, offset):
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    r = Scripted(RemoteSettings(host="h", path="/p"), Path("."))
    assert r.wait("5", "case_c_crypto/logs/crypto_5.out", poll_s=0) == "COMPLETED"
    assert not answers
    out = capsys.readouterr().out
    assert out.index("[job 5: REQUEUED]") < out.index("resumed") < out.index("[job 5: COMPLETED]")
    assert "retrying" in out

    failing = Scripted(RemoteSettings(host="h", path="/p"), Path("."))
    answers[:] = [StepFailed("wait (squeue)", "down")] * 5
    with pytest.raises(StepFailed, match="down"):
        failing.wait("5", "log", poll_s=0)
