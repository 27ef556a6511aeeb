"""The sshd on 127.0.0.1 that tests/test_remote.py and tests/test_remote_direct.py run
`marketgpt remote` against (Debian's openssh-server with its own config, host key and user key,
on a free port, stopped by its pid; reached through an ssh config alias with strict host key
checking), and the command line they run. No packet leaves this machine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ci_helpers import unavailable

REPO = Path(__file__).resolve().parent.parent

__all__ = ["ALIAS", "free_port", "marketgpt", "sshd", "workstation"]

SSHD = Path("/usr/sbin/sshd")
ALIAS = "loginnode"


def free_port() -> int:
    # a subprocess: pytest-socket blocks sockets in the test process itself
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return int(out.stdout)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> dict:
    if not SSHD.is_file() or not all(shutil.which(tool) for tool in ("ssh", "ssh-keygen", "rsync")):
        unavailable("needs Debian's openssh-server, openssh-client and rsync (.ci/run installs them)")
    d = tmp_path_factory.mktemp("sshd")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True, timeout=60)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "user_key")], check=True, timeout=60)
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation folder
    port = free_port()
    (d / "sshd_config").write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {d / "host_key"}
PidFile {d / "sshd.pid"}
AuthorizedKeysFile {d / "authorized_keys"}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
""")
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (d / "ssh_config").write_text(f"""Host {ALIAS}
    HostName 127.0.0.1
    Port {port}
    User root
    IdentityFile {d / "user_key"}
    IdentitiesOnly yes
    UserKnownHostsFile {d / "known_hosts"}
    StrictHostKeyChecking yes
""")
    proc = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")],
        stdout=subprocess.DEVNULL,
        stderr=open(d / "sshd.log", "w"),
    )
    ssh = ["ssh", "-F", str(d / "ssh_config"), "-o", "BatchMode=yes", ALIAS, "true"]
    deadline = time.monotonic() + 30
    while subprocess.run(ssh, capture_output=True, timeout=30).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"sshd did not come up: {(d / 'sshd.log').read_text()[-2000:]}")
        time.sleep(0.2)
    yield {"dir": d, "port": port, "ssh_options": f"-F {d / 'ssh_config'}"}
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def workstation(sshd, tmp_path) -> dict:
    """A local repo copy with remote.json pointing at an empty remote folder behind the sshd."""
    from slurm_helpers import copy_repo  # lazy: it imports torch, and conftest imports this module

    local = copy_repo(tmp_path / "laptop")
    remote = tmp_path / "cluster" / "marketgpt"
    settings = {
        "host": ALIAS,
        "path": str(remote),
        "python": sys.executable,
        "env": "export OMP_NUM_THREADS=1",
        "ssh_options": sshd["ssh_options"],
    }
    (local / "remote.json").write_text(json.dumps(settings))
    return {"local": local, "remote": remote, "settings": settings}


def marketgpt(local: Path, *args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "common.cli", "remote", *args, "--repo", str(local)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        **kw,
    )
