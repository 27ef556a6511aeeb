"""The Slurm tests form one pytest-xdist group (tests/conftest.py), so that under setup.cfg's
`-n 2 --dist loadgroup` they run in turn on one worker: the local cluster's GPUs fit one such test
at a time, and a module's fixture (the rehearsal's, minutes) runs once."""

from __future__ import annotations

import pytest


def test_every_slurm_test_is_in_the_slurm_group(request: pytest.FixtureRequest) -> None:
    slurm = [item for item in request.session.items if item.get_closest_marker("slurm")]
    if not slurm:  # run alone (the whole suite, as CI runs it, always has them)
        pytest.skip("no Slurm test was collected with this one")
    for item in slurm:
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        assert groups == ["slurm"], (item.nodeid, groups)
        if request.config.getvalue("loadgroup"):  # under --dist loadgroup: pytest-xdist read the group
            assert item.nodeid.endswith("@slurm"), item.nodeid
