"""Atomic writes: a failed write leaves the old file, no temp files, readable modes."""

from __future__ import annotations

import json
import os

import pytest

from common.atomic import atomic_path, atomic_write_json


def test_replaces_the_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "log.json"
    atomic_write_json(target, {"epochs": [1]})
    atomic_write_json(target, {"epochs": [1, 2]})
    assert json.loads(target.read_text()) == {"epochs": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["log.json"]


def test_failure_mid_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "model.pt"
    target.write_bytes(b"good")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_nan_is_refused_before_anything_is_written(tmp_path):
    target = tmp_path / "results.json"
    with pytest.raises(ValueError):
        atomic_write_json(target, {"loss": float("nan")})
    assert not target.exists()


def test_new_files_follow_the_umask_and_old_files_keep_their_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "a.json", {})
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
        os.chmod(tmp_path / "a.json", 0o640)
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)
