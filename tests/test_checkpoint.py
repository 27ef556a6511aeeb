"""Checkpoint files: weights_only loading, zip CRC checks, corruption fallback, the background
writer, pruning, unwrapping."""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import io
import os
import threading
import zipfile

import pytest
import torch

from common.distributed.ddp import unwrap
from common.run.checkpoint import (
    CheckpointWriter,
    CorruptCheckpoint,
    checkpoint_files,
    epoch_checkpoint_name,
    latest_good_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    remove_stale_temp_files,
    save_checkpoint,
    step_checkpoint_name,
    unwrap_state_dict,
    verify_checkpoint,
)


def _payload(value: float = 1.0) -> dict:
    return {
        "model": {"w": torch.full((64, 64), value)},
        "progress": {"epoch": 2, "step": 5},
        "rng": [3, [1, 2, 3], None],
        "best": float("inf"),
        "name": "x",
    }


def test_roundtrip_with_weights_only_and_zip_crcs(tmp_path):
    path = tmp_path / "checkpoint_epoch_1.pt"
    save_checkpoint(_payload(), path)
    with zipfile.ZipFile(path) as archive:  # what `unzip -t` checks by hand
        assert archive.testzip() is None and all(info.CRC for info in archive.infolist())
    assert verify_checkpoint(path) is True
    plain = torch.load(path, weights_only=True)  # any researcher can open it without our code
    loaded = load_checkpoint(path)
    for d in (plain, loaded):
        assert torch.equal(d["model"]["w"], _payload()["model"]["w"])
        assert d["progress"] == {"epoch": 2, "step": 5} and d["best"] == float("inf")
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_epoch_1.pt"]  # no temp file, nothing beside it


def test_crcs_are_written_even_when_switched_off_globally(tmp_path):
    from torch.utils.serialization import config

    with config.patch({"save.compute_crc32": False}):
        save_checkpoint(_payload(), tmp_path / "best_model.pt")
    assert verify_checkpoint(tmp_path / "best_model.pt") is True


def test_writer_returns_after_serializing_and_publishes_in_order_in_the_background(tmp_path):
    g = torch.Generator().manual_seed(0)
    payload = {"a": torch.randn(700_000, generator=g), "b": torch.randn(3, 1_000_000, generator=g), "name": "big"}
    writer, seen = CheckpointWriter(), []

    def then(name: str) -> None:  # the trainer prunes here: the new file must already be whole
        seen.append((name, verify_checkpoint(tmp_path / name)))

    names, saved = [step_checkpoint_name(1, s) for s in range(1, 5)], []
    for name in names:
        writer.save(payload, tmp_path / name, then=functools.partial(then, name))
        saved.append(payload["a"].clone())
        payload["a"].add_(1.0)  # training changes the tensors as soon as save() returns
    writer.wait()
    assert seen == [(name, True) for name in names]
    for name, a in zip(names, saved):
        loaded = load_checkpoint(tmp_path / name)
        assert torch.equal(loaded["a"], a) and torch.equal(loaded["b"], payload["b"])
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def _wait_published(writer: CheckpointWriter, timeout_s: float = 30.0) -> None:
    """Wait, at most timeout_s, until the writer's queued publishes have run, without collecting
    their outcome (check() and save() must still see a failure)."""
    _, running = concurrent.futures.wait(list(writer._pending), timeout=timeout_s)
    assert not running, f"a checkpoint publish still runs after {timeout_s} s"


def test_writer_failures_surface_on_check_wait_or_the_next_save(tmp_path):
    writer = CheckpointWriter()
    with pytest.raises(TypeError, match="pickle"):  # a pickling failure happens in save() itself
        writer.save({"lock": threading.Lock()}, tmp_path / "best_model.pt")
    assert list(tmp_path.iterdir()) == []  # no temp file left behind

    def fail() -> None:
        raise OSError("disk went away")

    writer.save(_payload(), tmp_path / epoch_checkpoint_name(1), then=fail)
    with pytest.raises(OSError, match="disk went away"):
        writer.wait()
    release = threading.Event()
    writer.save(_payload(), tmp_path / epoch_checkpoint_name(2), then=lambda: (release.wait(), fail()))
    writer.check()  # still publishing: nothing to report, and check() doesn't wait for it
    release.set()
    _wait_published(writer)
    with pytest.raises(OSError, match="disk went away"):
        writer.check()
    writer.save(_payload(), tmp_path / epoch_checkpoint_name(3), then=fail)
    _wait_published(writer)
    with pytest.raises(OSError, match="disk went away"):  # the next save reports it, having saved
        writer.save(_payload(), tmp_path / epoch_checkpoint_name(4))
    writer.wait()
    assert [p.name for p in checkpoint_files(tmp_path)] == [epoch_checkpoint_name(n) for n in (1, 2, 3, 4)]


def test_temp_files_of_a_killed_writer_are_removed_and_nothing_else(tmp_path):
    stale = [
        ".checkpoint_epoch_3_step_7.pt.k2j_x1.tmp",
        ".checkpoint_epoch_3.pt.a8b9c0.tmp",
        ".best_model.pt.zz99.tmp",
        ".training_log.json.abc123.tmp",
        ".report.png.q1w2e3r4.tmp",
        ".test_results.json.x_y_z.tmp",
    ]
    others = [".notes.txt.abc123.tmp", "notes.tmp", "checkpoint_epoch_3.pt", ".checkpoint_epoch_3.pt.tmp"]
    for name in stale + others:
        (tmp_path / name).write_bytes(b"x")
    assert sorted(p.name for p in remove_stale_temp_files(tmp_path)) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
    assert remove_stale_temp_files(tmp_path / "missing") == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupted_checkpoint_is_detected_and_auto_falls_back(tmp_path, damage):
    good, bad = tmp_path / epoch_checkpoint_name(1), tmp_path / step_checkpoint_name(2, 3)
    save_checkpoint(_payload(1.0), good)
    save_checkpoint(_payload(2.0), bad)
    data = bytearray(bad.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x01  # one bit in a tensor: torch.load alone doesn't notice
        assert torch.load(io.BytesIO(bytes(data)), weights_only=True)["name"] == "x"
    else:
        data = bytearray()
    bad.write_bytes(bytes(data))
    assert verify_checkpoint(bad) is False
    with pytest.raises(CorruptCheckpoint, match="truncated or corrupted"):
        load_checkpoint(bad)
    warnings = []
    assert latest_good_checkpoint(tmp_path, warn=warnings.append) == good
    assert len(warnings) == 1 and bad.name in warnings[0] and "truncated or corrupted" in warnings[0]


def test_code_in_a_checkpoint_is_refused(tmp_path):
    path = tmp_path / epoch_checkpoint_name(1)
    save_checkpoint({"obj": hashlib.sha256}, path)  # any pickled callable: weights_only refuses it
    with pytest.raises(CorruptCheckpoint, match="cannot be loaded"):
        load_checkpoint(path)


def test_an_interrupt_before_the_rename_leaves_the_old_file_and_removes_the_temp_file(tmp_path, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) just before the rename: the save's own cleanup runs. A kill -9
    would skip it and leave the temp file (test_resume.py's kill -9 test covers that case)."""
    path = tmp_path / "best_model.pt"
    save_checkpoint(_payload(1.0), path)

    def interrupted(src, dst):  # the exception a Ctrl-C raises, just before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(_payload(2.0), path)
    monkeypatch.undo()
    assert verify_checkpoint(path) is True
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.full((64, 64), 1.0))
    assert [p.name for p in tmp_path.iterdir()] == ["best_model.pt"]


def test_files_are_ordered_by_training_position(tmp_path):
    names = [
        epoch_checkpoint_name(2),
        step_checkpoint_name(3, 10),
        epoch_checkpoint_name(10),
        step_checkpoint_name(2, 7),
        epoch_checkpoint_name(1),
        step_checkpoint_name(3, 9),
    ]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    (tmp_path / "best_model.pt").write_bytes(b"")
    (tmp_path / ".checkpoint_epoch_11.pt.abc.tmp").write_bytes(b"")
    assert [p.name for p in checkpoint_files(tmp_path)] == [
        "checkpoint_epoch_1.pt",
        "checkpoint_epoch_2_step_7.pt",
        "checkpoint_epoch_2.pt",
        "checkpoint_epoch_3_step_9.pt",
        "checkpoint_epoch_3_step_10.pt",
        "checkpoint_epoch_10.pt",
    ]


def test_prune_keeps_the_last_epochs_and_fresh_steps(tmp_path):
    names = [epoch_checkpoint_name(e) for e in range(1, 6)] + [
        step_checkpoint_name(3, 4),
        step_checkpoint_name(6, 1),
        step_checkpoint_name(6, 2),
        step_checkpoint_name(6, 3),
    ]
    for n in names:
        save_checkpoint({"n": n}, tmp_path / n)
    deleted = {p.name for p in prune_checkpoints(tmp_path, keep=2)}
    left = [p.name for p in checkpoint_files(tmp_path)]
    assert left == [
        "checkpoint_epoch_4.pt",
        "checkpoint_epoch_5.pt",
        "checkpoint_epoch_6_step_2.pt",
        "checkpoint_epoch_6_step_3.pt",
    ]
    assert deleted == set(names) - set(left)


def test_unwrap_strips_wrapper_prefixes():
    model = torch.nn.Linear(3, 2)
    wrapped = torch.nn.DataParallel(model)
    assert unwrap(wrapped) is model
    assert set(wrapped.state_dict()) == {"module.weight", "module.bias"}
    assert set(unwrap_state_dict(wrapped.state_dict())) == {"weight", "bias"}
    assert set(unwrap_state_dict({"module._orig_mod.blocks.0.w": 1, "_orig_mod.x": 2})) == {"blocks.0.w", "x"}

    class Compiled(torch.nn.Module):  # what torch.compile returns keeps the model as _orig_mod
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

    assert unwrap(torch.nn.DataParallel(Compiled(model))) is model
