"""What a test needs from the machine but pip cannot install (sshd, ShellCheck, the local Slurm
cluster): CI installs it (.ci/run), so there it must be present; elsewhere it is optional."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(why: str) -> NoReturn:
    """A failure under CI=true, a skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)
