"""Shared test set-up: no network (pytest-socket, see setup.cfg), quiet hypothesis on 2 cores."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from ci_helpers import unavailable
from ssh_helpers import sshd, workstation  # noqa: F401 (fixtures of the remote tests)

# A shared 2-core CI box: no per-example deadline, fewer examples than hypothesis' default.
settings.register_profile("ci", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


LOCAL_SLURM = Path(__file__).resolve().parent.parent / "tools" / "local_slurm" / "local_slurm.sh"
LOCAL_SLURM_STATE = Path(os.environ.get("LOCAL_SLURM_DIR", "/tmp/marketgpt-slurm"))
HOW_TO_ENABLE = (
    "the Slurm tests run on the local test cluster (tools/local_slurm/local_slurm.sh, as root) "
    "only when asked: set MARKETGPT_LOCAL_SLURM=1 (or CI=true)"
)


def _slurm_nodes() -> int | None:
    """Nodes `sinfo` lists, or None when Slurm doesn't answer."""
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return len(set(out.split()))


def _local_slurm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LOCAL_SLURM), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    """The local test cluster (tools/local_slurm), never a site's own Slurm: only under CI=true
    or MARKETGPT_LOCAL_SLURM=1 (else a skip that says so). Starts it with 2 nodes unless it
    runs, then points SLURM_CONF (for this process and every command the tests run) at the
    config it runs from. Unavailable: a failure under CI=true, a skip elsewhere.
    Returns {"nodes": N}."""
    if os.environ.get("CI") != "true" and os.environ.get("MARKETGPT_LOCAL_SLURM") != "1":
        pytest.skip(HOW_TO_ENABLE)
    why = None
    if _local_slurm("status").returncode != 0:
        started = _local_slurm("start", "--nodes", "2")
        if started.returncode != 0:
            why = f"{LOCAL_SLURM.name} start failed: {(started.stderr or started.stdout).strip()[-1500:]}"
    nodes = None
    if why is None:
        os.environ["SLURM_CONF"] = (LOCAL_SLURM_STATE / "slurm_conf").read_text().strip()
        nodes = _slurm_nodes()
        why = "the local cluster runs but Slurm does not answer (sinfo failed)" if nodes is None else None
    if why is not None:
        unavailable(f"the local Slurm cluster is unavailable: {why}")
    return {"nodes": nodes}


@pytest.fixture
def nothing_queued(monkeypatch):
    """Any attempt to build a submitit executor (i.e. to queue something) fails the test."""
    import submitit  # only the tests that ask for this fixture load it

    def refuse(*args, **kwargs):
        raise AssertionError("a job was about to be submitted")

    monkeypatch.setattr(submitit, "SlurmExecutor", refuse)
    monkeypatch.setattr(submitit, "LocalExecutor", refuse)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (setup.cfg: -n 2 --dist loadgroup) every test of the local Slurm cluster
    runs on one worker, one after another: the cluster's four fake GPUs fit one such test at a time.
    The other tests share the other worker (and this one, once the Slurm tests are done). Marked as
    each test is collected, before pytest-xdist reads the groups in its collection_modifyitems."""
    if item.get_closest_marker("slurm") or "slurm_cluster" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group("slurm"))
