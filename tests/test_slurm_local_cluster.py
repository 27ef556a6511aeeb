"""tools/local_slurm/local_slurm.sh never touches a Slurm it did not set up. Its config dir,
hosts file and state folder point into tmp_path here (LOCAL_SLURM_CONF_DIR, LOCAL_SLURM_HOSTS,
LOCAL_SLURM_DIR), so none of this touches the real /etc or the running test cluster; the
"foreign" daemons are copies of `sleep` named slurmd and slurmctld."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Iterator

import pytest

from slurm_helpers import REPO

LOCAL_SLURM = REPO / "tools" / "local_slurm" / "local_slurm.sh"

FOREIGN_CONF = b"# the site's own Slurm\nClusterName=site\nSlurmctldHost=head01\r\nNodeName=gpu[01-64]\n"
FOREIGN_GRES = b"NodeName=gpu[01-64] Name=gpu File=/dev/nvidia[0-3]\n"
HOSTS = b"127.0.0.1 localhost\n10.0.0.1 head01\n::1 localhost ip6-localhost\n"


@pytest.fixture
def site(tmp_path) -> dict:
    """A machine with its own Slurm: /etc/slurm with a foreign config, an /etc/hosts."""
    etc = tmp_path / "etc_slurm"
    etc.mkdir()
    (etc / "slurm.conf").write_bytes(FOREIGN_CONF)
    (etc / "gres.conf").write_bytes(FOREIGN_GRES)
    (tmp_path / "hosts").write_bytes(HOSTS)
    env = {
        **os.environ,
        "LOCAL_SLURM_DIR": str(tmp_path / "state"),
        "LOCAL_SLURM_CONF_DIR": str(etc),
        "LOCAL_SLURM_HOSTS": str(tmp_path / "hosts"),
    }
    env.pop("LOCAL_SLURM_OWN_CONF", None)
    return {"etc": etc, "hosts": tmp_path / "hosts", "state": tmp_path / "state", "env": env}


@pytest.fixture
def site_daemons(tmp_path) -> Iterator[dict[str, subprocess.Popen]]:
    """Processes named slurmd and slurmctld that this tool did not start."""
    procs = {}
    for name in ("slurmd", "slurmctld"):
        binary = tmp_path / "bin" / name
        binary.parent.mkdir(exist_ok=True)
        shutil.copy2(shutil.which("sleep"), binary)
        procs[name] = subprocess.Popen([str(binary), "300"])
    yield procs
    for proc in procs.values():
        proc.kill()
        proc.wait()


def _tool(site: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LOCAL_SLURM), *args], env=site["env"], capture_output=True, text=True, timeout=60)


def _shell(site: dict, code: str) -> subprocess.CompletedProcess:
    """`code` run with the tool's functions defined (the script, sourced, only defines them)."""
    return subprocess.run(
        ["bash", "-c", f'source "{LOCAL_SLURM}" && {code}'], env=site["env"], capture_output=True, text=True, timeout=60
    )


def test_start_refuses_a_foreign_slurm_conf_and_signals_no_foreign_daemon(site, site_daemons):
    started = _tool(site, "start", "--nodes", "2")
    assert started.returncode == 1
    err = started.stderr
    assert f"refusing to start: {site['etc']}/slurm.conf was not written by this tool" in err
    assert "this machine's own Slurm" in err
    assert "start --own-conf" in err and f"export SLURM_CONF={site['state']}/slurm.conf" in err
    stopped = _tool(site, "stop")  # nothing of its own to stop
    assert stopped.returncode == 0, stopped.stderr
    assert (site["etc"] / "slurm.conf").read_bytes() == FOREIGN_CONF
    assert (site["etc"] / "gres.conf").read_bytes() == FOREIGN_GRES
    assert site["hosts"].read_bytes() == HOSTS
    assert sorted(p.name for p in site["etc"].iterdir()) == ["gres.conf", "slurm.conf"]
    assert all(proc.poll() is None for proc in site_daemons.values()), "a foreign daemon was signalled"


def test_a_foreign_gres_conf_alone_is_refused_too(site):
    (site["etc"] / "slurm.conf").unlink()
    started = _tool(site, "start")
    assert started.returncode == 1 and f"{site['etc']}/gres.conf was not written by this tool" in started.stderr
    assert (site["etc"] / "gres.conf").read_bytes() == FOREIGN_GRES


def test_its_own_or_no_config_may_be_written(site):
    (site["etc"] / "slurm.conf").unlink()
    (site["etc"] / "gres.conf").unlink()
    assert _shell(site, "check_conf_dir").returncode == 0
    (site["etc"] / "slurm.conf").write_text(
        "# Written by tools/local_slurm/local_slurm.sh: a one-machine test cluster.\nClusterName=marketgpt-local\n"
    )
    (site["etc"] / "gres.conf").write_bytes(FOREIGN_GRES)  # beside our slurm.conf: an older version's
    assert _shell(site, "check_conf_dir").returncode == 0


def test_stop_signals_only_what_its_pid_files_name_and_only_if_it_is_that_daemon(site, site_daemons):
    site["state"].mkdir()
    other = subprocess.Popen(["sleep", "300"])  # a reused pid: the file says slurmd, the process is not
    try:
        (site["state"] / "slurmd_node1.pid").write_text(f"{other.pid}\n")
        (site["state"] / "slurmctld.pid").write_text("999999999\n")  # long gone
        stopped = _tool(site, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert other.poll() is None and all(proc.poll() is None for proc in site_daemons.values())
        assert not list(site["state"].glob("*.pid"))
    finally:
        other.kill()
        other.wait()
    # the pid file of a daemon it started: that one stops
    (site["state"] / "slurmd_node2.pid").write_text(f"{site_daemons['slurmd'].pid}\n")
    assert _tool(site, "stop").returncode == 0
    assert site_daemons["slurmd"].wait(timeout=30) is not None and site_daemons["slurmctld"].poll() is None


def test_hosts_lines_are_added_once_marked_and_stop_removes_them(site):
    added = _shell(site, 'add_hosts "node1 node2" && add_hosts "node1 node2"')
    assert added.returncode == 0, added.stderr
    lines = site["hosts"].read_text().splitlines()
    assert lines[:3] == HOSTS.decode().splitlines()
    assert lines[3:] == ["127.0.0.1 node1 node2  # marketgpt-local-slurm"]
    assert _tool(site, "stop").returncode == 0
    assert site["hosts"].read_bytes() == HOSTS
