"""Shared test set-up: no network (pytest-socket, see setup.cfg), quiet hypothesis on 2 cores."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# A shared 2-core CI box: no per-example deadline, fewer examples than hypothesis' default.
settings.register_profile("ci", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _slurm_nodes() -> int | None:
    """Nodes `sinfo` lists, or None when Slurm doesn't answer."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return len(set(out.split()))


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    """The local test cluster (tools/local_slurm): `sinfo` must answer. When it doesn't and we
    are root, start it with 2 nodes. Unavailable: a failure under CI=true, a skip elsewhere.
    Returns {"nodes": N}."""
    nodes = _slurm_nodes()
    why = "Slurm does not answer (sinfo failed)"
    if nodes is None and os.geteuid() == 0:
        script = Path(__file__).resolve().parent.parent / "tools" / "local_slurm" / "local_slurm.sh"
        started = subprocess.run([str(script), "start", "--nodes", "2"], capture_output=True, text=True, timeout=600)
        nodes = _slurm_nodes()
        if nodes is None:
            why = f"{script.name} start failed: {(started.stderr or started.stdout).strip()[-500:]}"
    elif nodes is None:
        why += " and only root can start tools/local_slurm"
    if nodes is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the local Slurm cluster: {why}")
        pytest.skip(why)
    return {"nodes": nodes}
