"""Shared test set-up: no network (pytest-socket, see setup.cfg), quiet hypothesis on 2 cores."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# A shared 2-core CI box: no per-example deadline, fewer examples than hypothesis' default.
settings.register_profile("ci", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
