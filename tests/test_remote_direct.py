"""`marketgpt remote` with "launcher": "direct" (a rented box without Slurm) against the real sshd
on 127.0.0.1 (tests/ssh_helpers.py): setup, training started detached there, which outlives the
ssh client, reattaching, a refused second launch, stop (SIGTERM: a checkpoint) and resume with
the weights of an uninterrupted run, fetch, and bad input. This machine has no GPU, so the
"box" trains on its CPU: one process, or 2 ranks under torchrun over gloo
(MARKETGPT_DIRECT_PROCESSES). The stop tests hold validation until the stop signal arrived, and
can make the checkpoint after it fail, through tests/stop_hooks/sitecustomize.py on the box's
PYTHONPATH. Every test checks that nothing is left running there.
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
    # the trainer's 75; a trainer that failed after the stop signal (while saving); a crash
    for end, state in [
        ({"exit_code": 75}, "STOPPED"),
        ({"exit_code": 1, "stop_signal": "SIGTERM"}, "FAILED"),
        ({"exit_code": 1, "stop_signal": None}, "FAILED"),
        ({"exit_code": 1, "state": "STOPPED"}, "STOPPED"),  # the supervisor's verdict from its ranks
    ]:
        (logs / ".direct_direct-1.end").write_text(json.dumps(end))
        assert launch_state("case_x")[1] == state, end


@pytest.mark.parametrize(
    "ranks, state, why",
    [
        ({0: 75, 1: 75}, "STOPPED", "exit code 1: rank 0 exit 75, rank 1 exit 75"),
        ({0: 75, 1: 1}, "FAILED", "exit code 1: rank 0 exit 75, rank 1 exit 1"),
        ({0: 75, 1: None}, "FAILED", "exit code 1: rank 0 exit 75, rank 1 killed before it exited"),
        ({0: 75}, "FAILED", "exit code 1: rank 0 exit 75, 1 rank(s) never started"),
    ],
    ids=["all-saved", "one-failed", "one-sigkilled", "one-missing"],
)
def test_under_torchrun_a_stop_is_stopped_only_when_every_rank_exited_75(tmp_path, ranks, state, why):
    """torchrun exits 1 after a stop signal whatever its ranks did: the ranks' own records decide."""
    logs = tmp_path / "case_x" / "logs"
    logs.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    for rank, code in ranks.items():
        record = {"rank": rank, "world_size": 2, "pid": gone.pid, "start_ticks": 1}
        record.update({} if code is None else {"exit_code": code})
        (logs / f".direct_direct-1.rank{rank}.json").write_text(json.dumps(record))
    supervise = [sys.executable, "-m", "common.cluster.direct_launch", "supervise", "case_x", "direct-1", "--"]
    proc = subprocess.run(
        [*supervise, "sh", "-c", "exit 1"],  # torchrun's exit code after a stop
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    end = json.loads((logs / ".direct_direct-1.end").read_text())
    assert (end["state"], end["why"]) == (state, why)
    assert ("stopped with a checkpoint" in proc.stdout) == (state == "STOPPED"), proc.stdout


def test_a_rank_left_running_after_torchrun_is_waited_for_only_its_shutdown_timeout_then_killed(tmp_path):
    """torchrun gone, one rank still alive without an exit code: the supervisor waits the ranks'
    shutdown timeout, no longer, kills it and records FAILED."""
    logs = tmp_path / "case_x" / "logs"
    logs.mkdir(parents=True)
    stuck = subprocess.Popen(["sleep", "300"])
    try:
        ticks = int(Path(f"/proc/{stuck.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        record = {"rank": 1, "world_size": 2, "pid": stuck.pid, "start_ticks": ticks}
        (logs / ".direct_direct-1.rank1.json").write_text(json.dumps(record))
        (logs / ".direct_direct-1.rank0.json").write_text(json.dumps({**record, "rank": 0, "exit_code": 75}))
        supervise = [sys.executable, "-m", "common.cluster.direct_launch", "supervise", "case_x", "direct-1", "--"]
        proc = subprocess.run(
            [*supervise, "sh", "-c", "exit 1", "--shutdown-timeout=2"],  # sh takes the option as $0: ignored
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stuck.wait(timeout=30) == -signal.SIGKILL
    finally:
        if stuck.poll() is None:
            stuck.kill()
    assert proc.returncode == 1, proc.stderr
    assert "waiting up to 2 s for rank(s) [1]" in proc.stdout and "still running 2 s on: killed" in proc.stdout
    assert json.loads((logs / ".direct_direct-1.end").read_text())["state"] == "FAILED"


def _hooks(box: dict, tmp_path: Path, processes: int = 0, fail_save: bool = False, **settings) -> Path:
    """remote.json whose env line puts tests/stop_hooks on the box's PYTHONPATH: validation is
    held until the stop signal arrived (and with `fail_save` the checkpoint after it fails);
    returns the folder where each held rank leaves its mark."""
    held = tmp_path / "held"
    held.mkdir()
    env = f"OMP_NUM_THREADS=1 PYTHONPATH={REPO / 'tests' / 'stop_hooks'} MARKETGPT_TEST_HOLD_VALIDATION={held}"
    env += f" MARKETGPT_DIRECT_PROCESSES={processes}" + (" MARKETGPT_TEST_FAIL_STOP_SAVE=1" if fail_save else "")
    _write(box, env=f"export {env}", **settings)
    return held


def test_a_torchrun_launch_stopped_during_validation_saves_on_every_rank_and_resumes(box, tmp_path):
    local, remote = box["local"], box["remote"]
    held = _hooks(box, tmp_path, processes=2, shutdown_timeout_s=240)
    steps = [*STEPS, "training.max_steps_per_epoch=4", "experiment=ddp"]
    assert marketgpt(local, "sync").returncode == 0
    submitted = marketgpt(local, "submit", "--case", "c", *sets(steps))
    assert submitted.returncode == 0, submitted.stderr
    launch = _state(remote)
    assert launch["processes"] == 2 and "--shutdown-timeout=240" in launch["command"], launch
    _wait_for(held / "rank1", "", timeout_s=240)
    _wait_for(held / "rank0", "", timeout_s=60)  # both ranks validate epoch 1
    stop = marketgpt(local, "stop", "--case", "c", timeout=400)
    assert stop.returncode == 0, stop.stdout[-3000:] + stop.stderr
    assert f"launch {launch['id']}: STOPPED (exit code 1: rank 0 exit 75, rank 1 exit 75)" in stop.stdout
    (run,) = (remote / "case_c_crypto" / "checkpoints").glob("ddp_*")
    log = json.loads((run / "training_log.json").read_text())
    assert log["world_size"] == 2  # stopped after validating epoch 1, its checkpoint saved:
    assert log["interrupted"].startswith("SIGTERM at epoch 2 step 0; saved checkpoint_epoch_1.pt")
    assert (run / "checkpoint_epoch_1.pt").is_file() and not (run / "checkpoint_epoch_2.pt").exists()

    _write(box, env="export OMP_NUM_THREADS=1 MARKETGPT_DIRECT_PROCESSES=2")  # no hooks: to the end
    resumed = marketgpt(local, "train", "--case", "c", *sets(steps), "--poll", "1", timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "from checkpoint_epoch_1.pt" in resumed.stdout, resumed.stdout[-3000:]
    assert "COMPLETED" in resumed.stdout and (run / "checkpoint_epoch_2.pt").is_file()


def test_a_trainer_that_fails_to_save_on_a_stop_is_failed_and_stop_exits_non_zero(box, tmp_path):
    local, remote = box["local"], box["remote"]
    held = _hooks(box, tmp_path, fail_save=True)
    steps = [*STEPS, "training.max_steps_per_epoch=4", "experiment=full"]
    assert marketgpt(local, "sync").returncode == 0
    submitted = marketgpt(local, "submit", "--case", "c", *sets(steps))
    assert submitted.returncode == 0, submitted.stderr
    launch = _state(remote)["id"]
    _wait_for(held / "rank0", "", timeout_s=240)
    stop = marketgpt(local, "stop", "--case", "c", timeout=400)
    _one_line_error(stop, 1, "step 'stop' failed", f"launch {launch} FAILED after the stop signal (exit code ")
    assert "No space left on device (test hook)" in stop.stdout  # the log's last lines
    (run,) = (remote / "case_c_crypto" / "checkpoints").glob("full_*")
    assert not (run / "checkpoint_epoch_1.pt").exists()
    status = marketgpt(local, "status", "--case", "c")
    assert f"launch {launch} FAILED" in status.stdout, status.stdout + status.stderr
    (row,) = [line.split() for line in status.stdout.splitlines() if run.name in line]
    assert row[1:5] == [run.name, launch, "-", "failed"], status.stdout


def test_bad_input_is_one_line_and_starts_nothing(box, tmp_path):
    local, remote = box["local"], box["remote"]
    _write(box, launcher="kubernetes")
    _one_line_error(marketgpt(local, "status"), 2, "launcher 'kubernetes'", '"slurm" or "direct"')
    _write(box, shutdown_timeout_s=0)
    _one_line_error(marketgpt(local, "submit", "--case", "c"), 2, "shutdown_timeout_s 0", "at least 1 second")

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
