"""Every shell script of the repo passes ShellCheck (each remaining warning is disabled in the
script with a reason), and expands possibly-empty arrays in the form bash < 4.4 accepts under
`set -u` (RHEL/CentOS 7 login nodes run bash 4.2). ShellCheck is Debian's `shellcheck` package
(.ci/run installs it): missing, these tests fail under CI=true and skip elsewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ci_helpers import unavailable
from slurm_helpers import REPO

SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "checkpoints", "logs", "data", "build"}


def shell_scripts(root: Path = REPO) -> list[Path]:
    """*.sh files and files whose first line names a shell (.ci/run)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in filenames:
            path = Path(dirpath, name)
            if name.endswith(".sh"):
                found.append(path)
                continue
            try:
                with path.open("rb") as f:
                    first = f.readline(200)
            except OSError:
                continue
            if re.match(rb"#!\s*/(usr/)?bin/(env\s+)?(ba)?sh\b", first):
                found.append(path)
    return sorted(found)


SCRIPTS = shell_scripts()


def test_the_scripts_are_found():
    names = {str(p.relative_to(REPO)) for p in SCRIPTS}
    assert {
        ".ci/run",
        "launch_parallel_training.sh",
        "common/slurm/job.sh",
        "common/slurm/cluster_env.sh",
        "tools/local_slurm/local_slurm.sh",
        "quickstart.sh",
    } <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_is_clean(script):
    if shutil.which("shellcheck") is None:
        unavailable("shellcheck is not installed (Debian: apt-get install shellcheck; .ci/run installs it)")
    # from the repo root, so `# shellcheck source=common/slurm/job.sh` directives resolve
    proc = subprocess.run(
        ["shellcheck", "--external-sources", "--format=gcc", str(script.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ${a[@]} or ${a[*]} not inside ${a[@]+"${a[@]}"} / ${a[*]-}: "unbound variable" on bash < 4.4
# when `a` is empty and set -u is on.
_GUARDED = re.compile(r'\$\{(\w+)\[([@*])\](?:\+"?\$\{\1\[\2\]\}"?|-)\}')
_ARRAY = re.compile(r"\$\{\w+\[[@*]\]\}")


def unguarded_arrays(text: str) -> list[str]:
    """Lines that expand an array the way bash < 4.4 rejects when it is empty."""
    bad = []
    for line in text.splitlines():
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        if _ARRAY.search(_GUARDED.sub("", code)):
            bad.append(line.strip())
    return bad


def test_the_check_catches_an_unguarded_array():
    assert unguarded_arrays('sbatch x "${sets[@]}"\necho "${ids[*]}"') == ['sbatch x "${sets[@]}"', 'echo "${ids[*]}"']
    assert unguarded_arrays('sbatch x ${sets[@]+"${sets[@]}"}\necho "${ids[*]-}" ${#ids[@]}') == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_possibly_empty_arrays_expand_on_bash_before_4_4(script):
    assert unguarded_arrays(script.read_text()) == []
