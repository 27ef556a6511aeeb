"""`marketgpt remote`: the ssh and rsync steps that sync, submit, follow and fetch a cluster run
from a workstation (the actions built from several steps are in common.cluster.remote_commands;
a box without Slurm, `"launcher": "direct"`, in common.cluster.remote_direct).

Settings (common.cluster.remote_settings) come from `remote.json` in the local repo
(git-ignored; remote.example.json shows every key) or from flags: the host (anything `ssh`
accepts, e.g. a ~/.ssh/config alias), the repo's path there, the python to run there and a
shell line that sets up its environment
(`module load ...`, `conda activate ...`).

Everything goes through the system's `ssh` and `rsync` with the user's own keys and agent:
nothing here stores or asks for a password (BatchMode=yes), and ConnectTimeout makes an
unreachable host fail in seconds. Every command takes --dry-run (print the exact commands, run
nothing); a failing step raises StepFailed, which names the step (exit 1).

Fetching never leaves a partial file under its final name: rsync copies the run into a
staging folder beside it (`.fetch_<run>`, kept after an interruption so a second fetch
resumes), the files are checked there (sizes against the remote listing, every checkpoint's
CRC32s as load_checkpoint checks them, every JSON file parses: common.cluster.fetch_check),
and only then is each file renamed into the run folder.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from common.cluster.fetch_check import fetch_problems, parse_listing, publish
from common.cluster.remote_settings import RemoteSettings, remote_path
from common.errors import UserError
from common.paths import case_dir, case_script

__all__ = ["Remote", "StepFailed"]

# What `remote sync` leaves out: history, environments, caches, and each case's data and outputs.
SYNC_EXCLUDES = ("/.git", "/.venv", "__pycache__", "/case_*/data", "/case_*/checkpoints", "/case_*/logs")
# Slurm states after which a job will not run again (anything else: still queued, running or requeued).
ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
_SSH_CALL_TIMEOUT_S = 120  # one short remote command (status, squeue, a listing)
_POLL_RETRIES = 5  # ssh failures in a row a wait survives (a network blip, a login node restart)


class StepFailed(Exception):
    """A remote step failed: `step` names it, the message says why and what to do."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step, self.reason = step, message


class Remote:
    """The ssh and rsync commands for one remote repo; dry_run prints them instead."""

    ended_states = ENDED_STATES

    def __init__(
        self, settings: RemoteSettings, repo: Path, dry_run: bool = False, out: Callable[[str], None] = print
    ) -> None:
        assert settings.host and settings.path, "load_settings makes sure both are set"
        self.s = settings
        self.host: str = settings.host
        self.path: str = settings.path
        self.repo = repo
        self.dry_run = dry_run
        self.out = out

    # ------------------------------------------------------------------ commands

    def ssh_base(self) -> list[str]:
        return [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={self.s.connect_timeout_s}",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=4",
            *shlex.split(self.s.ssh_options),
        ]

    def shell(self, command: str, in_repo: bool = True) -> str:
        """The remote shell line: the env line, then `command` in the repo folder."""
        parts = []
        if in_repo:
            parts.append(f"cd {remote_path(self.path)}")
        if self.s.env:
            parts.append(self.s.env)
        python = self.s.remote_python()
        if python:
            parts.append(f"export MARKETGPT_PYTHON={remote_path(python)}")
        parts.append(command)
        return " && ".join(parts)

    def ssh_cmd(self, command: str, in_repo: bool = True, tty: bool = False) -> list[str]:
        return [*self.ssh_base(), *(["-t"] if tty else []), self.host, self.shell(command, in_repo)]

    def python(self) -> str:
        return '"${MARKETGPT_PYTHON:-python3}"'

    def run(
        self,
        step: str,
        cmd: list[str],
        *,
        stream: bool = False,
        timeout: Optional[float] = _SSH_CALL_TIMEOUT_S,
        stdin: Optional[str] = None,
    ) -> str:
        """Run one local command (ssh or rsync); its stdout, or StepFailed naming `step`."""
        if self.dry_run:
            self.out(shlex.join(cmd) + ("  # the file names on stdin" if stdin is not None else ""))
            return ""
        try:
            proc = subprocess.run(
                cmd,
                input=stdin,
                text=True,
                errors="replace",
                timeout=timeout,
                stdout=None if stream else subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError:
            raise StepFailed(step, f"`{cmd[0]}` is not installed here; install OpenSSH and rsync") from None
        except subprocess.TimeoutExpired:
            raise StepFailed(step, f"no answer within {timeout:.0f} s: `{shlex.join(cmd)}`") from None
        if proc.returncode != 0:
            raise StepFailed(step, _explain(proc.returncode, proc.stderr, self.host))
        return proc.stdout or ""

    # ------------------------------------------------------------------ steps

    def check_repo(self) -> None:
        """The remote folder holds a MarketGPT repo (else: run `remote sync` first)."""
        probe = f"test -f {remote_path(self.path)}/common/cli/__init__.py || {{ echo no-repo; exit 0; }}"
        answer = self.run("check remote repo", self.ssh_cmd(probe, in_repo=False))
        if answer.strip() == "no-repo":
            raise StepFailed(
                "check remote repo",
                f"{self.host}:{self.path} holds no MarketGPT repo "
                "(common/cli/__init__.py is missing); run `marketgpt remote sync` first, or fix the path",
            )

    def sync(self) -> None:
        self.run("sync (mkdir)", self.ssh_cmd(f"mkdir -p {remote_path(self.path)}", in_repo=False))
        cmd = [
            "rsync",
            "-az",
            "--stats",
            "--human-readable",
            "-e",
            shlex.join(self.ssh_base()),
            *[f"--exclude={p}" for p in SYNC_EXCLUDES],
            *shlex.split(self.s.rsync_options),
            f"{self.repo}/",
            f"{self.host}:{self.path.rstrip('/')}/",
        ]
        summary = self.run("sync", cmd, timeout=None)
        wanted = (
            "Number of files:",
            "Number of regular files transferred",
            "Total file size",
            "Total transferred file size",
            "sent ",
            "total size is",
        )
        for line in summary.splitlines():
            if line.startswith(wanted):
                self.out(line)

    def submit(self, case: str, overrides: Sequence[str], sbatch_args: str = "") -> tuple[str, str]:
        """sbatch the case's script there; returns the job id and its log file (relative to the repo)."""
        case_path = case_dir(case, root=self.repo)
        script = case_script(case_path)
        rel = f"{case_path.name}/slurm_scripts/{script.name}"
        sets = [a for kv in overrides for a in ("--set", kv)]
        command = shlex.join(["sbatch", "--parsable", *shlex.split(sbatch_args), rel, *sets])
        if not self.dry_run:
            self.check_repo()
        answer = self.run("submit (sbatch)", self.ssh_cmd(command))
        log = f"{case_path.name}/logs/{log_prefix(script)}_{{}}.out"
        if self.dry_run:
            return "JOBID", log.format("JOBID")
        job_id = answer.strip().splitlines()[-1].split(";")[0] if answer.strip() else ""
        if not job_id.isdigit():
            raise StepFailed("submit (sbatch)", f"sbatch printed no job id: {answer.strip()!r}")
        log = log.format(job_id)
        self.out(f"Submitted job {job_id} on {self.host}")
        self.out(
            f"  follow:  marketgpt remote logs {job_id} -f     (ssh {self.host} tail -f {self.path.rstrip('/')}/{log})"
        )
        self.out(f"  queue:   ssh {self.host} squeue -j {job_id}")
        return job_id, log

    def status(self, case: Optional[str], as_json: bool = False) -> str:
        args = (" --case " + shlex.quote(case) if case else "") + (" --json" if as_json else "")
        return self.run("status", self.ssh_cmd(f"{self.python()} -m common.cli status{args}"))

    def log_path(self, job_id: str) -> str:
        """The job's .out file under <case>/logs/ there."""
        if not re.fullmatch(r"\d+|direct-\d{8}-\d{6}", job_id):
            raise UserError(f"job id {job_id!r}: expected a number such as 12345, or direct-YYYYMMDD-HHMMSS")
        found = self.run("find the job's log", self.ssh_cmd(f"ls -1 case_*/logs/*_{job_id}.out 2>/dev/null; true"))
        if self.dry_run:
            return f"case_*/logs/*_{job_id}.out"
        paths = found.split()
        if not paths:
            raise StepFailed(
                "find the job's log",
                f"no case_*/logs/*_{job_id}.out in {self.host}:{self.path} "
                "(not started yet? check `marketgpt remote status`)",
            )
        return paths[0]

    def logs(self, job_id: str, follow: bool, lines: int = 50) -> None:
        path = self.log_path(job_id)
        tail = f"tail -n {int(lines)}{' -f' if follow else ''} {path}"
        self.run("logs", self.ssh_cmd(tail), stream=True, timeout=None)

    # ------------------------------------------------------------------ waiting

    def job_state(self, job_id: str, log: Optional[str], offset: int) -> tuple[Optional[str], str, int]:
        """(state or None when Slurm forgot the job, the log's new text since `offset`, new offset)."""
        probe = (
            f"s=$(squeue -h -j {job_id} -o %T 2>/dev/null | head -1); "
            f'[ -n "$s" ] || s=$(scontrol show job -o {job_id} 2>/dev/null | '
            "sed -n 's/.*JobState=\\([A-Z_]*\\).*/\\1/p'); "
            'echo "state=${s:-UNKNOWN}"; '
        )
        return self.state_and_log("wait (squeue)", probe, log, offset)

    def state_and_log(self, step: str, probe: str, log: Optional[str], offset: int) -> tuple[Optional[str], str, int]:
        """Run `probe` (it prints `state=...`) with the log's bytes from `offset`: (state, None for
        UNKNOWN; the new text; the new offset)."""
        q = shlex.quote
        if log:
            # the bytes from `offset` up to the size just read: the next poll starts exactly there
            probe += (
                f'f={q(log)}; [ -f "$f" ] && n=$(wc -c < "$f") && echo "size=$n" && '
                f'tail -c +{offset + 1} "$f" | head -c $((n - {offset})); true'
            )
        out = self.run(step, self.ssh_cmd(probe))
        head, _, rest = out.partition("\n")
        state = head.removeprefix("state=").strip()
        if log and rest.startswith("size="):
            size_line, _, text = rest.partition("\n")
            size = int(size_line.removeprefix("size=").strip() or offset)
            return (None if state == "UNKNOWN" else state), text, max(size, offset)
        return (None if state == "UNKNOWN" else state), "", offset

    def wait(self, job_id: str, log: str, poll_s: float = 10.0, timeout_s: Optional[float] = None) -> Optional[str]:
        """Follow the job's state and log until it ends (a requeued job is followed on); its
        last state (None if Slurm no longer remembers it)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        offset, failures, last_state = 0, 0, "?"
        while True:
            try:
                state, text, offset = self.job_state(job_id, log, offset)
                failures = 0
            except StepFailed as e:
                failures += 1
                if failures >= _POLL_RETRIES:
                    raise
                self.out(f"(remote: {e}; retrying)")
                state, text = last_state, ""
            if text:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
                sys.stdout.flush()
            if state != last_state and state is not None:
                self.out(f"[job {job_id}: {state}]")
                last_state = state
            if state is None or state in self.ended_states:
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise StepFailed(
                    "wait",
                    f"job {job_id} still {state} after {timeout_s:.0f} s; it keeps running "
                    f"there: `marketgpt remote logs {job_id} -f`, then `marketgpt remote fetch`",
                )
            time.sleep(poll_s)

    def run_of_job(self, job_id: str) -> str:
        """The run folder (repo-relative) whose training_log.json records this job."""
        return self.run_recording(f'"slurm_job_id": "{job_id}"', "job's run", f"job {job_id}", job_id)

    def run_recording(self, text: str, what: str, label: str, job_id: str) -> str:
        """The newest run folder there whose training_log.json holds `text` (grep -F); the step is
        "find the <what>", `label` names the job or launch in its messages."""
        step = f"find the {what}"
        out = self.run(
            step,
            self.ssh_cmd(f"grep -l -F {shlex.quote(text)} case_*/checkpoints/*/training_log.json 2>/dev/null; true"),
        )
        if self.dry_run:
            return f"case_X/checkpoints/<run of {label}>"
        runs = [str(Path(p).parent) for p in out.split()]
        if not runs:
            raise StepFailed(
                step,
                f"no run folder there records {label} (did it fail before "
                f"training started? `marketgpt remote logs {job_id}`)",
            )
        return sorted(runs)[-1]

    # ------------------------------------------------------------------ fetching

    def resolve_run(self, run: Optional[str], case: Optional[str]) -> str:
        """A run folder's path relative to the repo: RUN as a path, a folder name (in --case or any
        case), or the newest run (`run` None)."""
        if run is not None and "/" in run.strip("/"):
            return run.strip("/")
        cases = case_glob(case, self.repo)
        pattern = f"{cases}/checkpoints/{shlex.quote(run) if run else '*'}/"
        out = self.run("find the run", self.ssh_cmd(f"ls -1dt {pattern} 2>/dev/null; true"))
        if self.dry_run:
            return f"{cases}/checkpoints/{run or '<newest run>'}"
        found = [p.rstrip("/") for p in out.split()]
        if not found:
            what = f"run {run!r}" if run else "no run at all"
            raise StepFailed(
                "find the run",
                f"{what} under {self.host}:{self.path}/{cases}/checkpoints; see `marketgpt remote status`",
            )
        if run and len(found) > 1:
            raise StepFailed("find the run", f"{run!r} is in several cases ({', '.join(found)}); pass --case")
        return found[0]

    def fetch(self, run_rel: str, all_checkpoints: bool = False) -> Path:
        """Copy a run folder into the local repo's case folder, check it, then publish it."""
        listing = self.run(
            "fetch (list)",
            self.ssh_cmd(f"cd {shlex.quote(run_rel)} && find . -type f ! -name '.*.tmp' -printf '%s\\t%P\\n'"),
        )
        local = self.repo / run_rel
        staging = local.parent / f".fetch_{local.name}"
        if self.dry_run:
            files = {}
        else:
            files = parse_listing(listing, all_checkpoints)
            if not files:
                raise StepFailed("fetch (list)", f"{run_rel} is empty there")
            staging.mkdir(parents=True, exist_ok=True)
        cmd = [
            "rsync",
            "-a",
            "--partial-dir=.rsync-partial",
            "--files-from=-",
            "-e",
            shlex.join(self.ssh_base()),
            *shlex.split(self.s.rsync_options),
            f"{self.host}:{self.path.rstrip('/')}/{run_rel}/",
            f"{staging}/",
        ]
        self.run("fetch (rsync)", cmd, timeout=None, stdin="".join(f"{name}\n" for name in sorted(files)) or "\n")
        if self.dry_run:
            self.out(f"(then check sizes, checkpoint CRC32s and JSON in {staging}, and move the files into {local})")
            return local
        bad = fetch_problems(staging, files)
        if bad:
            raise StepFailed(
                "fetch (verify)",
                f"{len(bad)} file(s) failed the check in {staging}, nothing was moved "
                "into place: " + "; ".join(bad[:5]),
            )
        publish(staging, local)
        return local


def case_glob(case: Optional[str], repo: Path) -> str:
    if case is None:
        return "case_*"
    return case_dir(case, root=repo).name


def log_prefix(script: Path) -> str:
    m = re.search(r"^LOG_PREFIX=(\S+)$", script.read_text(), flags=re.M)
    return m.group(1) if m else "*"


def _explain(code: int, stderr: str, host: Optional[str]) -> str:
    """ssh's and rsync's own message, plus what to do when the connection itself failed."""
    text = " | ".join(line.strip() for line in (stderr or "").strip().splitlines()[-6:] if line.strip())
    if code == 255 or "connection unexpectedly closed" in (stderr or ""):
        return (
            f"cannot reach {host} over ssh ({text or f'exit {code}'}); check the host and that "
            f"`ssh {host} true` works without a password (keys or agent)"
        )
    return text or f"exit code {code}"
