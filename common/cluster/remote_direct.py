"""`marketgpt remote` with launcher "direct": one rented GPU box (or any ssh host) without Slurm.

The same workstation loop as on a cluster (sync, start, follow, fetch, check), with the steps
that differ: `setup` creates the environment there and runs `marketgpt doctor`; `submit`
starts training detached through common.cluster.direct_launch (run there over ssh) instead of
sbatch; the launch's state comes from that module instead of squeue; `stop` sends SIGTERM to
the launch's supervisor, which passes it on (a checkpoint, then exit 75; the same `remote train`
resumes); a launch that ends otherwise is FAILED and `stop` fails.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Optional, Sequence

from common.cluster.remote import Remote, StepFailed, case_glob, log_prefix
from common.cluster.remote_settings import remote_path
from common.errors import UserError
from common.paths import case_dir, case_script, script_config

__all__ = ["DirectRemote", "DIRECT_ENDED"]

# direct_launch.launch_state's states after which the launch will not run again
DIRECT_ENDED = frozenset({"COMPLETED", "STOPPED", "FAILED", "LOST"})
_LAUNCHER = "-m common.cluster.direct_launch"


class DirectRemote(Remote):
    """A Remote whose jobs are processes started on the box itself."""

    ended_states = DIRECT_ENDED

    def _launcher(self, *args: str) -> str:
        return f"{self.python()} {_LAUNCHER} {shlex.join(args)}"

    def setup(self, cpu_ok: bool) -> None:
        """Sync, create the venv (when `venv` is set), run the install line in it, then `marketgpt
        doctor` there: StepFailed when torch cannot use the box's GPUs, or (without `cpu_ok`)
        when the box has none."""
        self.sync()
        install = self.s.install
        if self.s.venv:
            venv = remote_path(self.s.venv)
            # --system-site-packages: a rented image's own CUDA torch is used, not downloaded again
            base = remote_path(self.s.python) if self.s.python else "python3"
            self.run(
                "setup (venv)",
                self.ssh_cmd(f"{{ test -x {venv}/bin/python || {base} -m venv --system-site-packages {venv}; }}"),
            )
            install = f". {venv}/bin/activate && {install}"
        if self.s.install.strip():
            self.run("setup (install)", self.ssh_cmd(install), stream=True, timeout=None)
        doctor = f"{{ {self.python()} -m common.cli doctor 2>&1; echo doctor-exit=$?; }}"  # the report also on exit 1
        out = self.run("setup (doctor)", self.ssh_cmd(doctor))
        if self.dry_run:
            return
        report, _, code = out.rpartition("doctor-exit=")
        self.out(report.rstrip())
        problem = next((line for line in report.splitlines() if line.startswith("PROBLEM:")), "")
        if code.strip() == "0":
            self.out(f"{self.host} is ready: marketgpt remote train --case <case>")
        elif code.strip() == "1" and "NVIDIA driver: not found" in report and cpu_ok:
            self.out("no usable GPU: training will run on the CPU (--cpu-ok)")
        elif code.strip() == "1" and "NVIDIA driver: not found" in report:
            raise StepFailed(
                "setup (doctor)",
                f"no usable GPU on {self.host}: training would run on the CPU ({problem.removeprefix('PROBLEM: ')}); "
                "pass --cpu-ok to train on the CPU on purpose",
            )
        else:
            last = report.strip().splitlines()[-1] if report.strip() else f"doctor exit {code.strip()}"
            raise StepFailed("setup (doctor)", problem.removeprefix("PROBLEM: ") or last)

    def submit(self, case: str, overrides: Sequence[str], sbatch_args: str = "") -> tuple[str, str]:
        """Start the case's training there, detached; returns the launch id and its log (repo-relative)."""
        if sbatch_args:
            raise UserError('--sbatch-args is for launcher "slurm"; this host\'s launcher is "direct"')
        case_path = case_dir(case, root=self.repo)
        script = case_script(case_path)
        name = script_config(script)
        if name is None:
            raise UserError(f"{script}: no CONFIG= line naming the case's config")
        config = f"{case_path.name}/{name}"
        sets = [a for kv in overrides for a in ("--set", kv)]
        if not self.dry_run:
            self.check_repo()
        shutdown = str(self.s.shutdown_timeout_s)
        command = self._launcher("start", case_path.name, config, log_prefix(script), shutdown, "--", *sets)
        answer = self.run("launch", self.ssh_cmd(command))
        if self.dry_run:
            return "direct-ID", f"{case_path.name}/logs/{log_prefix(script)}_direct-ID.out"
        *notes, last = answer.strip().splitlines() or [""]
        try:
            launched = json.loads(last)
        except ValueError:
            raise StepFailed("launch", f"the launcher printed no launch id: {answer.strip()!r}") from None
        for note in notes:
            self.out(note)
        job_id, log = launched["id"], launched["log"]
        self.out(f"Started {job_id} on {self.host} (pid {launched['pid']}, {launched['gpus']} GPU(s)), detached")
        self.out(f"  follow:  marketgpt remote logs {job_id} -f")
        self.out(f"  stop:    marketgpt remote stop --case {case_path.name}  (saves a checkpoint first)")
        return job_id, log

    def job_state(self, job_id: str, log: Optional[str], offset: int) -> tuple[Optional[str], str, int]:
        case = Path(log).parts[0] if log else "case_*"
        return self.state_and_log("wait (launch state)", self._launcher("state", case, job_id) + "; ", log, offset)

    def run_of_job(self, job_id: str) -> str:
        """The run folder whose training_log.json records the launch's log file."""
        return self.run_recording(f'_{job_id}.out"', "launch's run", job_id, job_id)

    def status(self, case: Optional[str], as_json: bool = False) -> str:
        if as_json:  # the JSON object alone; its runs carry their states
            return super().status(case, as_json=True)
        cases = [case_glob(case, self.repo)] if case else []
        args = " --case " + shlex.quote(case) if case else ""
        launches = self._launcher("status", *cases)
        return self.run("status", self.ssh_cmd(f"{launches} && {self.python()} -m common.cli status{args}"))

    def logs(self, job_id: str, follow: bool, lines: int = 50) -> None:
        """The launch's log; with `follow`, until the training writing it ends."""
        path = self.log_path(job_id)
        command = self._launcher("follow", path, str(int(lines)), *(["-f"] if follow else []))
        self.run("logs", self.ssh_cmd(command), stream=True, timeout=None)

    def stop(self, case: str, timeout_s: float) -> None:
        """SIGTERM to the case's running training there; waits until it has saved and stopped.
        StepFailed when it ended FAILED or LOST instead (the launcher there names why, with
        the log's last lines), or is still running after `timeout_s`."""
        name = case_dir(case, root=self.repo).name
        if not self.dry_run:
            self.check_repo()
        command = self._launcher("stop", name, str(timeout_s))
        self.run("stop", self.ssh_cmd(command), stream=True, timeout=timeout_s + 60)
