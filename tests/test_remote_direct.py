"""`marketgpt remote` with "launcher": "direct" (a rented box without Slurm) against the real sshd
on 127.0.0.1 (tests/ssh_helpers.py): setup, training started detached there, which outlives the
ssh client, reattaching, a refused second launch, stop (SIGTERM: a checkpoint) and resume with
the weights of an uninterrupted run, fetch, and bad input. This machine has no GPU, so the
"box" trains on its CPU, one process. Every test checks that nothing is left running there.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from slurm_helpers import REPO, TINY, assert_same_weights, sets
from ssh_helpers import marketgpt

# TINY with more steps, so that a stop requested at step 2 lands well before the end
STEPS = [*TINY, "training.max_steps_per_epoch=10", "training.log_every_steps=2"]


@pytest.fixture
def box(workstation) -> dict:
    """The workstation's remote.json with launcher direct; afterwards, nothing runs there."""
    settings = {**workstation["settings"], "launcher": "direct"}
    (workstation["local"] / "remote.json").write_text(json.dumps(settings))
    yield {**workstation, "settings": settings}
    # a launch that has written its end file may still be on its way out: give it a moment
    deadline = time.monotonic() + 30
    while (left := _running_in(workstation["remote"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # clean up before failing, so one failure does not leave CPU burners behind
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"left running there: {left}"


def _running_in(folder: Path) -> dict[int, str]:
    """Processes (pid: command line) whose working directory is under `folder`."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd").startswith(str(folder)):
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile, or a zombie
            pass
    return found


def _write(box: dict, **settings) -> None:
    (box["local"] / "remote.json").write_text(json.dumps({**box["settings"], **settings}))


def _one_line_error(proc: subprocess.CompletedProcess, code: int, *says: str) -> None:
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for text in says:
        assert text in proc.stderr, proc.stderr


def _wait_for(path: Path, text: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and text in path.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{path}: no {text!r} after {timeout_s} s"
        time.sleep(0.05)


def _state(remote: Path) -> dict:
    return json.loads((remote / "case_c_crypto" / "logs" / ".direct.json").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def test_setup_creates_the_venv_installs_and_says_plainly_that_training_runs_on_the_cpu(box, tmp_path):
    venv = tmp_path / "box" / "venv"
    # The install line runs inside the venv. No pip here, so nothing reaches the network: it notes
    # where it ran and gives the venv this test environment's packages (torch, numpy, ...) with a
    # .pth file, as a real install line would install them; the box's system Python has none.
    ours = sysconfig.get_paths()["purelib"]
    pth = f"import site; site.addsitedir({ours!r})"
    install = (
        "import site, sys; open('installed.txt', 'w').write(sys.prefix); "
        f"open(site.getsitepackages()[0] + '/test-env.pth', 'w').write({pth!r})"
    )
    _write(box, venv=str(venv), install=f"python -c {shlex.quote(install)}")
    proc = marketgpt(box["local"], "setup", timeout=300)
    _one_line_error(proc, 1, "step 'setup (doctor)' failed: no usable GPU", "pass --cpu-ok")
    assert (venv / "bin" / "python").is_file()
    assert (box["remote"] / "installed.txt").read_text() == str(venv)
    assert "PROBLEM: training here would run on the CPU" in proc.stdout  # the doctor's report, shown

    proc = marketgpt(box["local"], "setup", "--cpu-ok", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "no usable GPU: training will run on the CPU" in proc.stdout


def test_detached_training_outlives_the_client_refuses_a_second_launch_stops_and_resumes_exactly(box):
    local, remote = box["local"], box["remote"]
    ref = [*STEPS, "experiment=ref"]
    client = subprocess.Popen(
        [sys.executable, "-m", "common.cli", "remote", "train", "--case", "c", *sets(ref), "--poll", "1"]
        + ["--repo", str(local)],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        while not any("epoch 1/2 step 2/10" in line for line in lines):
            line = client.stdout.readline()
            assert line, "".join(lines) + client.stderr.read()
            lines.append(line)
        started = next(line for line in lines if line.startswith("Started direct-"))
        launch = started.split()[1]
        state = _state(remote)
        assert state["id"] == launch and state["gpus"] == 0
        os.killpg(state["pgid"], signal.SIGSTOP)  # paused, so that it is surely still training meanwhile
        try:
            second = marketgpt(local, "train", "--case", "c", *sets(ref))
            _one_line_error(second, 1, "step 'launch' failed", f"launch {launch}", "is still training")
            os.killpg(client.pid, signal.SIGKILL)  # the client, its ssh: a closed laptop lid
            client.wait(timeout=30)
            assert _alive(state["pid"]), "training goes on without the client"
        finally:
            os.killpg(state["pgid"], signal.SIGCONT)
    finally:
        if client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)
            client.wait(timeout=30)

    follow = marketgpt(local, "logs", launch, "-f", "-n", "1000", timeout=300)  # reattach until it ends
    assert follow.returncode == 0, follow.stderr
    assert "epoch 2/2 step 10/10" in follow.stdout and "training exited with code 0" in follow.stdout
    assert not _alive(state["pid"])
    status = marketgpt(local, "status", "--case", "c")
    assert f"launch {launch} COMPLETED" in status.stdout, status.stdout + status.stderr
    fetched = marketgpt(local, "fetch", "--latest", "--case", "c")
    assert fetched.returncode == 0, fetched.stderr
    (ref_run,) = (remote / "case_c_crypto" / "checkpoints").glob("ref_*")
    here = local / "case_c_crypto" / "checkpoints" / ref_run.name
    assert (here / "best_model.pt").read_bytes() == (ref_run / "best_model.pt").read_bytes()

    # the same steps, stopped midway (SIGTERM: a checkpoint first), then the same command again
    cut = [*STEPS, "experiment=cut"]
    submitted = marketgpt(local, "submit", "--case", "c", *sets(cut))
    assert submitted.returncode == 0, submitted.stderr
    _wait_for(Path(remote / _state(remote)["log"]), "epoch 1/2 step 2/10")
    # paused there, so that the stop lands mid-training however slowly this machine answers
    # (a tiny epoch takes a second); SIGTERM waits while the processes are stopped
    group = _state(remote)["pgid"]
    os.killpg(group, signal.SIGSTOP)
    stop = subprocess.Popen(
        [sys.executable, "-m", "common.cli", "remote", "stop", "--case", "c", "--repo", str(local)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    resume = threading.Timer(120, os.killpg, (group, signal.SIGCONT))  # never paused for good
    resume.start()
    try:
        assert "sent SIGTERM to launch" in stop.stdout.readline()
    finally:
        os.killpg(group, signal.SIGCONT)
        resume.cancel()
    out, err = stop.communicate(timeout=300)
    assert stop.returncode == 0, err
    assert "STOPPED (exit code 75)" in out
    (cut_run,) = (remote / "case_c_crypto" / "checkpoints").glob("cut_*")
    assert "SIGTERM at epoch" in json.loads((cut_run / "training_log.json").read_text())["interrupted"]
    assert not (cut_run / "checkpoint_epoch_2.pt").exists(), "stopped before the end"
    resumed = marketgpt(local, "train", "--case", "c", *sets(cut), "--poll", "1", timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"Fetched and checked {local / 'case_c_crypto' / 'checkpoints' / cut_run.name}" in resumed.stdout
    assert [p.name for p in (remote / "case_c_crypto" / "checkpoints").glob("cut_*")] == [cut_run.name]
    assert_same_weights(cut_run / "checkpoint_epoch_2.pt", ref_run / "checkpoint_epoch_2.pt")


def test_a_stale_pid_file_is_not_trusted_and_the_launch_proceeds(box):
    local, remote = box["local"], box["remote"]
    assert marketgpt(local, "sync").returncode == 0
    other = subprocess.Popen(["sleep", "60"])  # the recorded pid now belongs to another program
    try:
        logs = remote / "case_c_crypto" / "logs"
        logs.mkdir(parents=True)
        old = {"id": "direct-20260101-000000", "pid": other.pid, "pgid": other.pid, "start_ticks": 1, "gpus": 0}
        (logs / ".direct.json").write_text(json.dumps({**old, "started": "then", "log": "x"}))
        # a config error: this launch ends at once
        proc = marketgpt(local, "submit", "--case", "c", *sets([*TINY, "model.num_heads=3"]))
        assert proc.returncode == 0, proc.stderr
        assert "stale" in proc.stdout and "not trusted, launching anyway" in proc.stdout
        launch = _state(remote)["id"]
        assert launch != old["id"]
        _wait_for(logs / f".direct_{launch}.end", "exit_code")
        assert _alive(other.pid), "the other program is left alone"
    finally:
        other.kill()
        other.wait(timeout=30)


def test_a_launch_whose_supervisor_is_gone_or_replaced_is_lost(tmp_path, monkeypatch):
    from common.cluster.direct_launch import launch_state

    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "case_x" / "logs"
    logs.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    me = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
    for pid, ticks in [(gone.pid, 1), (os.getpid(), int(me))]:  # a dead pid; a live one, not the launcher
        (logs / ".direct.json").write_text(json.dumps({"id": "direct-1", "pid": pid, "start_ticks": ticks}))
        assert launch_state("case_x")[1] == "LOST"
    # the trainer's 75; torchrun's own code after a stop signal; a crash
    for end, state in [({"exit_code": 75}, "STOPPED"), ({"exit_code": 1, "stop_signal": "SIGTERM"}, "STOPPED")]:
        (logs / ".direct_direct-1.end").write_text(json.dumps(end))
        assert launch_state("case_x")[1] == state
    (logs / ".direct_direct-1.end").write_text(json.dumps({"exit_code": 1, "stop_signal": None}))
    assert launch_state("case_x")[1] == "FAILED"


def test_bad_input_is_one_line_and_starts_nothing(box, tmp_path):
    local, remote = box["local"], box["remote"]
    _write(box, launcher="kubernetes")
    _one_line_error(marketgpt(local, "status"), 2, "launcher 'kubernetes'", '"slurm" or "direct"')

    _write(box)
    remote.mkdir(parents=True)
    _one_line_error(marketgpt(local, "submit", "--case", "c"), 1, "holds no MarketGPT repo", "remote sync")

    dry = marketgpt(local, "train", "--case", "c", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "common.cluster.direct_launch start case_c_crypto case_c_crypto/configs/crypto_prototype.json" in dry.stdout
    assert not (remote / "case_c_crypto").exists()

    blocked = tmp_path / "a_file"
    blocked.write_text("")
    _write(box, venv=str(blocked / "venv"))  # a venv under a file: it cannot be created
    _one_line_error(marketgpt(local, "setup"), 1, "step 'setup (venv)' failed")
    _write(box)
    _one_line_error(marketgpt(local, "stop", "--case", "c"), 1, "no launch is running")


# stands in for the trainer: on SIGTERM it "saves" and exits 75, as common.training.trainer does
FAKE_TRAINER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))
print("waiting", "for SIGTERM", flush=True)  # (the log also shows this code: two strings)
time.sleep(120)
"""


def test_sigterm_to_the_launcher_alone_reaches_the_trainer(tmp_path):
    """A box that ends the launcher's pid only (a preempted instance, `kill PID`): it passes the
    signal on, the trainer checkpoints and exits 75, and the launch is STOPPED."""
    (tmp_path / "case_x" / "logs").mkdir(parents=True)
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "common.cluster.direct_launch", "supervise", "case_x", "direct-1", "--"]
            + [sys.executable, "-c", FAKE_TRAINER],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for(log, "waiting for SIGTERM", timeout_s=60)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 1
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    end = json.loads((tmp_path / "case_x" / "logs" / ".direct_direct-1.end").read_text())
    assert end["exit_code"] == 75 and end["stop_signal"] == "SIGTERM"
    assert "training exited with code 75" in log.read_text()
    assert not _running_in(tmp_path)
