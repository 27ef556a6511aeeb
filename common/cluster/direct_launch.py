"""The remote side of `marketgpt remote` with launcher "direct": training on a box without Slurm.

`marketgpt remote train` runs `python -m common.cluster.direct_launch start ...` there over ssh.
It starts a supervisor in a session of its own (setsid, stdin from /dev/null), so training
survives the ssh connection closing, and returns at once. The supervisor runs
`marketgpt train --resume auto` as one plain process (no GPU) or under torchrun, one process
per GPU that torch sees there, appends everything to case_X/logs/<LOG_PREFIX>_<ID>.out (ID:
direct-YYYYMMDD-HHMMSS) and writes the exit code beside it when training ends.

Files in case_X/logs/:
  .direct.json          the case's latest launch: id, pid (= process group), the pid's start
                        time in /proc ticks, command, host, log, GPUs
  .direct_<ID>.rank<R>.json   under torchrun, each rank's pid and start time, then its exit
                        code (common.cli.direct_rank): torchrun's own exit code after a stop
                        signal is 1 whatever its ranks did
  .direct_<ID>.end      {"exit_code": N, "state": ..., "ended": ...} once training ended

A launch is running while its pid is alive with the recorded start time and a command line of
this module: a pid file left by a crashed launcher, or a pid the kernel gave to another
program since, is stale and is not trusted. SIGTERM to the supervisor (`stop`, or the box
ending it) is passed on once, to the trainer or to torchrun, which passes it to every rank
and gives them `--shutdown-timeout` seconds before SIGKILL. The launch is STOPPED only when
every rank saved its checkpoint and exited 75 (EXIT_REQUEUE, common/distributed/requeue.py); any
other end is FAILED. The same `start` continues the run (--resume auto). Only the standard
library is imported (torch only to count GPUs), so each status poll starts fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from common.atomic import atomic_write_json
from common.distributed.requeue import EXIT_REQUEUE

__all__ = ["ENDED", "RankRecord", "launch_of_log", "launch_state", "log_tail", "main", "recorded_state", "state_of"]

STATE_FILE = ".direct.json"
EXIT_REFUSED = 3  # `start` while a launch of the case runs
ENDED = ("COMPLETED", "STOPPED", "FAILED")  # the states an end file records
# training processes on a box without GPUs (default 0: one plain process); tests run 2 CPU
# ranks under torchrun over gloo this way
PROCESSES_ENV = "MARKETGPT_DIRECT_PROCESSES"
_LOG_ID = re.compile(r"_(direct-\d{8}-\d{6})\.out$")


def _logs(case: str) -> Path:
    return Path(case) / "logs"


def _start_ticks(pid: int) -> Optional[int]:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # the fields after the command's closing ")"


def _is_ours(state: dict) -> bool:
    """The launch's supervisor is alive: the same pid, started at the same tick, running this module."""
    pid = state.get("pid")
    if not isinstance(pid, int) or _start_ticks(pid) != state.get("start_ticks"):
        return False
    try:
        return b"common.cluster.direct_launch" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _read(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _ended(end: dict) -> str:
    """The state the supervisor recorded (an older end file: from its exit code alone)."""
    if end.get("state") in ENDED:
        return str(end["state"])
    code = end.get("exit_code")
    return "COMPLETED" if code == 0 else "STOPPED" if code == EXIT_REQUEUE else "FAILED"


class RankRecord:
    """One torchrun rank's record, .direct_<ID>.rank<R>.json: its pid and start time when it
    starts, its exit code when it leaves (common.cli.direct_rank writes it)."""

    def __init__(self, case: str, launch_id: str, rank: int, world_size: int) -> None:
        self.path = _logs(case) / f".direct_{launch_id}.rank{rank}.json"
        pid = os.getpid()
        self.data = {"rank": rank, "world_size": world_size, "pid": pid, "start_ticks": _start_ticks(pid)}

    def started(self) -> None:
        atomic_write_json(self.path, self.data)

    def exited(self, code: int) -> None:
        atomic_write_json(self.path, {**self.data, "exit_code": code})


def _rank_records(case: str, launch_id: str) -> list[dict]:
    found = (_read(p) for p in sorted(_logs(case).glob(f".direct_{launch_id}.rank*.json")))
    return [r for r in found if r is not None]


def _verdict(code: int, ranks: list[dict]) -> tuple[str, str]:
    """The launch's state and why: COMPLETED on exit 0; STOPPED when the trainer (or, under
    torchrun, every rank it started) exited with EXIT_REQUEUE, its checkpoint saved; FAILED otherwise."""
    if code == 0:
        return "COMPLETED", "exit code 0"
    if not ranks:  # one plain process, or torchrun that started no rank
        return ("STOPPED" if code == EXIT_REQUEUE else "FAILED"), f"exit code {code}"
    codes = {r["rank"]: r.get("exit_code") for r in ranks}
    world = max(r.get("world_size", 0) for r in ranks)
    each = [f"rank {r} " + ("killed before it exited" if c is None else f"exit {c}") for r, c in sorted(codes.items())]
    if len(codes) < world:
        each.append(f"{world - len(codes)} rank(s) never started")
    stopped = len(codes) == world and all(c == EXIT_REQUEUE for c in codes.values())
    return ("STOPPED" if stopped else "FAILED"), f"exit code {code}: " + ", ".join(each)


def launch_state(case: str) -> tuple[Optional[dict], str]:
    """The case's latest launch and its state: RUNNING, COMPLETED, STOPPED (checkpoint saved),
    FAILED, LOST (its supervisor is gone without an exit code: a crash, a reboot) or NONE."""
    state = _read(_logs(case) / STATE_FILE)
    if state is None:
        return None, "NONE"
    end = _read(_logs(case) / f".direct_{state.get('id')}.end")
    if end is not None:
        state["exit_code"] = end.get("exit_code")
        return state, _ended(end)
    return state, "RUNNING" if _is_ours(state) else "LOST"


def state_of(case: str, launch_id: str) -> str:
    """The state of one launch, also once a newer launch of the case has replaced it."""
    state, status = launch_state(case)
    if state is not None and state.get("id") == launch_id:
        return status
    end = _read(_logs(case) / f".direct_{launch_id}.end")
    if end is None:
        return "LOST"
    return _ended(end)


def recorded_state(case: str, launch_id: str) -> Optional[str]:
    """state_of, or None where this machine holds no record of the launch (a run fetched from the box)."""
    latest = _read(_logs(case) / STATE_FILE) or {}
    if latest.get("id") != launch_id and not (_logs(case) / f".direct_{launch_id}.end").is_file():
        return None
    return state_of(case, launch_id)


def launch_of_log(log_file: str) -> Optional[str]:
    """The launch id in a direct launch's log file name (<prefix>_direct-YYYYMMDD-HHMMSS.out), else None."""
    m = _LOG_ID.search(log_file)
    return m.group(1) if m else None


def _gpu_count() -> int:
    """GPUs torch can use on this box (0 without CUDA): counted, never assumed. In a child
    process: this module stays free of torch, so each state poll starts fast."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]
        raise SystemExit(f"cannot count the GPUs here: `{sys.executable} -c {probe!r}` failed: {tail[0]}")
    return int(out.stdout.split()[-1])


def _start(case: str, config: str, prefix: str, shutdown_s: int, train_args: Sequence[str]) -> int:
    logs = _logs(case)
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / ".direct.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two launches at once: the second sees the first
        state, status = launch_state(case)
        if status == "RUNNING":
            assert state is not None
            print(
                f"{case}: launch {state['id']} (pid {state['pid']}, started {state['started']}) is still "
                f"training; follow it (marketgpt remote logs {state['id']} -f) or stop it (marketgpt remote stop)",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        if status == "LOST" and state is not None:
            print(
                f"stale {logs / STATE_FILE}: launch {state.get('id')} (pid {state.get('pid')}) is gone without "
                "an exit code (crashed or rebooted); not trusted, launching anyway"
            )
        gpus = _gpu_count()
        launch_id = time.strftime("direct-%Y%m%d-%H%M%S", time.gmtime())
        while (logs / f"{prefix}_{launch_id}.out").exists():  # two launches in one second
            time.sleep(1.0)
            launch_id = time.strftime("direct-%Y%m%d-%H%M%S", time.gmtime())
        log = logs / f"{prefix}_{launch_id}.out"
        train = ["train", "--config", config, "--resume", "auto", *train_args]
        processes = gpus or int(os.environ.get(PROCESSES_ENV) or 0)
        if processes:
            # each rank records its exit code; torchrun waits shutdown_s for the ranks to
            # checkpoint after a stop signal before it SIGKILLs them (its default: 30 s)
            dist = ["torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
            rank = ["common.cli.direct_rank", case, launch_id, "--"]
            command = [sys.executable, "-m", *dist, f"--shutdown-timeout={shutdown_s}", "-m", *rank, *train]
            command += ["--num-gpus", str(processes)]
        else:
            command = [sys.executable, "-m", "common.cli", *train]
            print("no GPU here: training runs as one process on the CPU")
        with open(log, "ab") as out, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(
                [sys.executable, "-m", "common.cluster.direct_launch", "supervise", case, launch_id, "--", *command],
                stdin=devnull,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session and process group: ssh closing does not reach it
                env={**os.environ, "MARKETGPT_LOG_FILE": str(log.resolve()), "PYTHONUNBUFFERED": "1"},
            )
        state = {
            "id": launch_id,
            "pid": proc.pid,
            "pgid": proc.pid,
            "start_ticks": _start_ticks(proc.pid),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "host": socket.gethostname(),
            "gpus": gpus,
            "processes": processes or 1,
            "shutdown_timeout_s": shutdown_s,
            "command": command,
            "log": str(log),
        }
        atomic_write_json(logs / STATE_FILE, state)
    print(json.dumps({"id": launch_id, "log": str(log), "pid": proc.pid, "gpus": gpus}))
    return 0


def _supervise(case: str, launch_id: str, command: Sequence[str]) -> int:
    """Run training, pass a stop signal on to it, wait for its ranks, record how it ended."""
    stamp = lambda: time.strftime("%F %T")  # noqa: E731
    print(f"===== {stamp()} launch {launch_id} on {socket.gethostname()} =====", flush=True)
    print("command: " + " ".join(command), flush=True)
    child = subprocess.Popen(command)

    received: list[str] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        print(f"marketgpt: {stamp()} {signal.Signals(signum).name}: the trainer saves a checkpoint", flush=True)
        # once: a second signal makes torchrun give up waiting for its ranks
        if len(received) == 1 and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = child.wait()
    print(f"marketgpt: {stamp()} training exited with code {code}", flush=True)
    _wait_for_left_ranks(case, launch_id, _shutdown_timeout(command), stamp)
    state, why = _verdict(code, _rank_records(case, launch_id))
    if state == "STOPPED":
        print("marketgpt: stopped with a checkpoint; `marketgpt remote train` with the same case resumes", flush=True)
    elif state == "FAILED":
        after = f" after {received[0]}" if received else ""
        print(f"marketgpt: FAILED{after}: {why}; no checkpoint of this stop", flush=True)
    ended = {"exit_code": code, "state": state, "why": why, "stop_signal": received[0] if received else None}
    ended["ended"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    atomic_write_json(_logs(case) / f".direct_{launch_id}.end", ended)
    return 0 if code == 0 else 1


def _shutdown_timeout(command: Sequence[str], default: int = 300) -> int:
    """torchrun's --shutdown-timeout in the launch's command: how long its ranks may take to save."""
    return next((int(a.split("=", 1)[1]) for a in command if a.startswith("--shutdown-timeout=")), default)


def _wait_for_left_ranks(case: str, launch_id: str, timeout_s: float, stamp: Callable[[], str]) -> None:
    """A rank torchrun left behind (it gave up early) may still be saving: the launch ends with it,
    but waits no longer than the ranks' shutdown timeout; a rank still alive then is killed (the
    launch is then FAILED: that rank recorded no exit code)."""
    deadline = time.monotonic() + timeout_s
    said = False
    while alive := [r for r in _rank_records(case, launch_id) if "exit_code" not in r and _is_alive(r)]:
        if time.monotonic() > deadline:
            for r in alive:
                with contextlib.suppress(OSError):
                    os.kill(r["pid"], signal.SIGKILL)
            ranks = [r["rank"] for r in alive]
            print(f"marketgpt: {stamp()} rank(s) {ranks} still running {timeout_s:.0f} s on: killed", flush=True)
            return
        if not said:
            ranks = [r["rank"] for r in alive]
            print(f"marketgpt: {stamp()} waiting up to {timeout_s:.0f} s for rank(s) {ranks} to exit", flush=True)
            said = True
        time.sleep(0.5)


def _is_alive(record: dict) -> bool:
    pid = record.get("pid")
    return isinstance(pid, int) and _start_ticks(pid) == record.get("start_ticks")


def log_tail(path: str | Path, max_bytes: int = 16384) -> list[str]:
    """The non-empty lines in the last `max_bytes` of a (possibly large, growing) log; [] if unreadable.
    A progress bar's carriage returns count as line ends."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.replace("\r", "\n").splitlines() if line.strip()]


def _stop(case: str, timeout_s: float) -> int:
    state, status = launch_state(case)
    if status != "RUNNING" or state is None:
        print(f"{case}: no launch is running (latest: {status.lower()})", file=sys.stderr)
        return 1
    launch_id = state["id"]
    # the supervisor alone: it passes the signal on once (torchrun, signalled twice, would
    # stop waiting for its ranks)
    os.kill(state["pid"], signal.SIGTERM)
    print(
        f"sent SIGTERM to launch {launch_id} (pid {state['pid']}): it saves a checkpoint and stops",
        flush=True,  # shown while the wait below goes on
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = state_of(case, launch_id)
        if status != "RUNNING":
            end = _read(_logs(case) / f".direct_{launch_id}.end") or {}
            why = end.get("why") or f"exit code {end.get('exit_code')}"
            if status in ("STOPPED", "COMPLETED"):
                print(f"launch {launch_id}: {status} ({why})")
                return 0
            print(f"launch {launch_id}: {status} ({why}); the last lines of {state['log']}:")
            print("\n".join(f"  {line}" for line in log_tail(state["log"])[-15:]), flush=True)
            lost = "its launcher is gone without an exit code" if status == "LOST" else why
            print(
                f"launch {launch_id} {status} after the stop signal ({lost}): no checkpoint of this stop; "
                f"`marketgpt remote train` resumes from the last checkpoint before it",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.5)
    print(f"launch {launch_id} still running after {timeout_s:.0f} s", file=sys.stderr)
    return 1


def _status(cases: Sequence[str]) -> int:
    for case in cases:
        state, status = launch_state(case)
        if state is not None:
            code = f", exit code {state['exit_code']}" if "exit_code" in state else ""
            print(
                f"{case}: launch {state['id']} {status} (pid {state['pid']}, {state['gpus']} GPU(s), started "
                f"{state['started']}{code}); log {state['log']}"
            )
    return 0


def _follow(log: str, lines: int, follow: bool) -> int:
    """`tail` the log; with `follow`, until the launch writing it ends (tail --pid)."""
    case = Path(log).parts[0]
    state, status = launch_state(case)
    cmd = ["tail", "-n", str(lines)]
    if follow and state is not None and status == "RUNNING" and Path(state["log"]) == Path(log):
        cmd += ["-f", f"--pid={state['pid']}"]
    os.execvp("tail", [*cmd, log])
    return 1  # not reached


USAGE = """usage: python -m common.cluster.direct_launch ACTION ... (run by `marketgpt remote` over ssh)
  start CASE CONFIG LOG_PREFIX SHUTDOWN_S -- TRAIN_ARGS...
                                                  start training detached; prints the launch as JSON
  supervise CASE ID -- COMMAND...                 (what `start` runs in its own session)
  state CASE ID                                   state=RUNNING|COMPLETED|STOPPED|FAILED|LOST
  status [CASE...]                                one line per case's latest launch
  stop CASE TIMEOUT_S                             SIGTERM to the running launch; wait until it ended
  follow LOG LINES [-f]                           tail the log (-f: until the launch writing it ends)"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Positional arguments only: the caller is remote_direct.py, not a person (no argparse here)."""
    args = list(sys.argv[1:] if argv is None else argv)
    action, rest = (args[0], args[1:]) if args else ("", [])
    cut = rest.index("--") if "--" in rest else len(rest)
    head, tail = rest[:cut], rest[cut + 1 :]
    if action == "start" and len(head) == 4:
        return _start(head[0], head[1], head[2], int(head[3]), tail)
    if action == "supervise" and len(head) == 2 and tail:
        return _supervise(head[0], head[1], tail)
    if action == "state" and len(head) == 2:
        print(f"state={state_of(head[0], head[1])}")
        return 0
    if action == "status":
        return _status(head or sorted(str(p) for p in Path(".").glob("case_*") if p.is_dir()))
    if action == "stop" and len(head) == 2:
        return _stop(head[0], float(head[1]))
    if action == "follow" and len(head) in (2, 3) and head[2:] in ([], ["-f"]):
        return _follow(head[0], int(head[1]), follow=head[2:] == ["-f"])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
