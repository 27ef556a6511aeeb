"""Where `marketgpt remote` connects and how: RemoteSettings, read from `remote.json` in the local
repo (git-ignored; remote.example.json shows every key) with the command's flags on top, and the
quoting of a remote path for the remote shell.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from common.config import ConfigError, build_dataclass
from common.errors import UserError

__all__ = ["LAUNCHERS", "SETTINGS_FILE", "RemoteSettings", "load_settings", "remote_path"]

SETTINGS_FILE = "remote.json"
LAUNCHERS = ("slurm", "direct")  # sbatch on a login node; or a box without Slurm (common.cluster.remote_direct)


@dataclass
class RemoteSettings:
    host: Optional[str] = None  # user@host, or a ~/.ssh/config alias
    path: Optional[str] = None  # the repo's folder there (absolute, or ~/...)
    python: Optional[str] = None  # the python there (default: python3 on its PATH); jobs get it as MARKETGPT_PYTHON
    env: Optional[str] = None  # shell line run before every remote command, e.g. "module load python/3.11"
    ssh_options: str = ""  # extra ssh arguments, e.g. "-p 2222 -i ~/.ssh/id_cluster"
    rsync_options: str = ""  # extra rsync arguments, e.g. "--bwlimit=5m"
    connect_timeout_s: int = 10  # an unreachable host fails after this long
    launcher: str = "slurm"  # "slurm": sbatch there; "direct": train on the box itself (remote_direct.py)
    venv: Optional[str] = None  # direct: the venv `remote setup` creates there; then its python runs everything
    install: str = "pip install -r requirements_gpu.txt && pip install -e ."  # direct: `remote setup`'s install line
    shutdown_timeout_s: int = 300  # direct, under torchrun: how long ranks may take to checkpoint after a stop

    def remote_python(self) -> Optional[str]:
        """The python commands run with there: the venv's, else `python` (None: python3 on the PATH)."""
        return f"{self.venv.rstrip('/')}/bin/python" if self.venv else self.python


def load_settings(
    repo: Path,
    host: Optional[str] = None,
    path: Optional[str] = None,
    python: Optional[str] = None,
    env: Optional[str] = None,
) -> RemoteSettings:
    """remote.json of the local repo (when there is one), then the flags (those not None) on top."""
    flags = {"host": host, "path": path, "python": python, "env": env}
    settings_file = repo / SETTINGS_FILE
    settings = RemoteSettings()
    if settings_file.is_file():
        try:
            raw = json.loads(settings_file.read_text())
        except ValueError as e:
            raise UserError(f"{settings_file} is not valid JSON ({e}); see remote.example.json") from None
        if not isinstance(raw, dict):
            raise UserError(f"{settings_file}: expected a JSON object like remote.example.json")
        try:
            settings = build_dataclass(RemoteSettings, raw, str(settings_file), "")
        except ConfigError as e:
            raise UserError(str(e)) from None
    for name, value in flags.items():
        if value is not None:
            setattr(settings, name, value)
    if not settings.host or not settings.path:
        raise UserError(
            f"no remote host/path: copy remote.example.json to {settings_file} and fill in host and path, "
            "or pass --host and --path"
        )
    if settings.launcher not in LAUNCHERS:
        raise UserError(f'launcher {settings.launcher!r} in {settings_file}: use "slurm" or "direct"')
    if settings.connect_timeout_s < 1:
        raise UserError(f"connect_timeout_s {settings.connect_timeout_s}: must be at least 1 second")
    if settings.shutdown_timeout_s < 1:
        raise UserError(
            f"shutdown_timeout_s {settings.shutdown_timeout_s} in {settings_file}: must be at least 1 second "
            "(the time the ranks get to save a checkpoint after a stop)"
        )
    return settings


def remote_path(path: str) -> str:
    """The path quoted for the remote shell; a leading ~/ stays the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)
