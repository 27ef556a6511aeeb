"""Token shards: prepared once, reused without reading a candle, keyed, resumable, locked, exact."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from common.config import ConfigError, load_config
from common.data.cache import CandleCache
from common.data.synthetic import SyntheticSpec, generate_asset
from common.errors import UserError
from common.paths import REPO_ROOT
from common.tokens import shard_stages, shards
from common.tokens.corpus import prepare_in_memory
from common.tokens.shard_paths import shard_folder, work_folder
from common.tokens.shards import prepare_shards
from common.tokens.token_set import TokenSet, token_path
from common.tokens.tokenizer import OHLCTokenizer

SPEC = SyntheticSpec(assets=5, candles=400, interval="1d", seed=3, gap_prob=0.02)
CONFIG = {
    "experiment": "shards",
    "model": {
        "vocab_size": 64,
        "context_length": 8,
        "d_model": 16,
        "num_layers": 1,
        "num_heads": 2,
        "d_ff": 32,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
        "dropout": 0.0,
    },
    "training": {
        "batch_size": 8,
        "epochs": 2,
        "max_steps_per_epoch": 3,
        "eval_max_batches": 1,
        "warmup_steps": 1,
        "device": "cpu",
        "scorecard_origins": 0,
        "vol_reversion": False,
    },
    "data": {"source": "download", "interval": "1d", "start_date": "2019-01-01"},
}


def make_case(root: Path, spec: SyntheticSpec = SPEC, **data) -> Path:
    """A case folder whose parquet cache holds the synthetic market; returns its config."""
    case = root / "case"
    (case / "configs").mkdir(parents=True)
    cache = CandleCache(case / "data")
    rows = ["symbol,source,category,name"]
    for i in range(spec.assets):
        asset = generate_asset(spec, i)
        cache.write("yfinance", spec.interval, asset.symbol, asset.candles, adjusted=True)
        rows.append(f"{asset.symbol},yfinance,us_stock,{asset.symbol}")
    (case / "universe.csv").write_text("\n".join(rows) + "\n")
    raw = json.loads(json.dumps(CONFIG))
    raw["data"].update(data)
    config = case / "configs" / "shards.json"
    config.write_text(json.dumps(raw))
    return config


def same_tokens(a: TokenSet, b: TokenSet) -> bool:
    return (
        a.symbols == b.symbols
        and a.ranges == b.ranges
        and all(
            np.array_equal(a.tokens[s], b.tokens[s]) and np.array_equal(a.moves[s], b.moves[s], equal_nan=True)
            for s in a.symbols
        )
    )


def test_prepared_once_then_reused_without_reading_the_cache(tmp_path, monkeypatch, capsys):
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    first = prepare_shards(cfg, case)
    folder, _ = shard_folder(cfg, case)
    assert (folder / "manifest.json").is_file() and not work_folder(folder).exists()
    assert isinstance(first.tokens.tokens[first.tokens.symbols[0]], np.memmap)

    reads = []
    real_read = CandleCache.read
    monkeypatch.setattr(CandleCache, "read", lambda self, *a: reads.append(a) or real_read(self, *a))
    again = prepare_shards(cfg, case)
    assert reads == []  # the spy: no parquet file was opened
    assert "reusing" in capsys.readouterr().out
    assert same_tokens(first.tokens, again.tokens) and again.data_info == first.data_info

    # the in-memory path (data.shards = false) gives the same corpus, bit for bit
    memory = prepare_in_memory(cfg, case)
    assert same_tokens(first.tokens, memory.tokens) and reads  # and it does read the cache
    assert memory.data_info == first.data_info and memory.tokenizer.to_dict() == first.tokenizer.to_dict()


def test_rebuilt_when_a_keyed_setting_or_an_input_file_changes(tmp_path):
    config = make_case(tmp_path)
    case = config.parent.parent
    base, _ = shard_folder(load_config(config), case)
    changed = {
        ("tokenizer.ret_bins=4",): True,
        ("data.train_ratio=0.6", "data.test_ratio=0.25"): True,
        ("model.context_length=6",): True,
        ("model.time_features=true",): True,
        ("model.vol_level_input=true",): True,  # a 4th feature column
        ("model.market_context=true",): True,
        # the peer is a part of the market context: not read, not keyed without it
        ("model.market_peer=true",): False,
        ('data.end_date="2020-06-01"',): True,
        # windows only, the model, or where the cache is: the same tokens
        ("data.window_stride=2",): False,
        ("data.epoch_stride=4",): False,
        ("training.batch_size=4",): False,
        ("model.d_model=32",): False,
        ("data.shards=false",): False,
    }
    for overrides, rebuilt in changed.items():
        folder, _ = shard_folder(load_config(config, list(overrides)), case)
        assert (folder != base) == rebuilt, overrides
    # a setting at its default is not in the key: every shard prepared before it existed is reused
    assert set(shard_folder(load_config(config), case)[1]["model"]) == {
        "vocab_size",
        "context_length",
        "time_features",
        "volume_input",
    }
    # a cache file rewritten (a later download): new key
    parquet = next((case / "data").rglob("*.parquet"))
    os.utime(parquet, ns=(parquet.stat().st_atime_ns, parquet.stat().st_mtime_ns + 10**9))
    assert shard_folder(load_config(config), case)[0] != base


def test_vol_level_ids_are_a_4th_column_equal_in_shards_and_in_memory(tmp_path):
    config = make_case(tmp_path)
    cfg, case = load_config(config, ["model.vol_level_input=true"]), config.parent.parent
    shard, memory = prepare_shards(cfg, case), prepare_in_memory(cfg, case)
    assert json.loads((shard.tokens.folder / "index.json").read_text())["feature_columns"] == 4
    for s in shard.tokens.symbols:
        assert shard.tokens.features[s].shape == (len(shard.tokens.tokens[s]), 4)
        np.testing.assert_array_equal(shard.tokens.features[s], memory.tokens.features[s])
    assert any((shard.tokens.features[s][:, 3] > 0).any() for s in shard.tokens.symbols)


def test_a_changed_setting_prepares_a_new_shard_and_keeps_the_old(tmp_path):
    config = make_case(tmp_path)
    case = config.parent.parent
    a = prepare_shards(load_config(config), case)
    b = prepare_shards(load_config(config, ["tokenizer.ret_bins=4"]), case)
    assert a.tokens.folder.parent != b.tokens.folder.parent and a.tokens.folder.is_dir()
    assert b.tokenizer.ret_bins == 4 and a.tokenizer.ret_bins != 4


def test_the_tokenizer_never_sees_a_val_or_test_candle(tmp_path, monkeypatch):
    config = make_case(tmp_path)
    seen: list[pd.Timestamp] = []
    real_fit = OHLCTokenizer.fit

    def spy(self, frames, **kwargs):
        frames = list(frames.values()) if isinstance(frames, dict) else list(frames)
        seen.extend(f.index.max() for f in frames)
        return real_fit(self, frames, **kwargs)

    monkeypatch.setattr(OHLCTokenizer, "fit", spy)
    p = prepare_shards(load_config(config), config.parent.parent)
    val_start = pd.Timestamp(p.data_info["split_cuts"]["val_start"])
    assert len(seen) == SPEC.assets and max(seen) < val_start


KILLER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from common.config import load_config
    from common.tokens import shard_stages, shards
    real = shard_stages.encode_asset
    gate = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    def slow(*a, **k):
        time.sleep(float(sys.argv[2]))
        while gate is not None and not gate.exists():  # hold the lock until the test opens the gate
            time.sleep(0.05)
        return real(*a, **k)
    shard_stages.encode_asset = slow
    config = Path(sys.argv[1])
    shards.prepare_shards(load_config(config), config.parent.parent)
""")


def _preparer(config: Path, delay: float, gate: Path | None = None, log: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = open(log, "w") if log is not None else subprocess.PIPE
    return subprocess.Popen(
        [sys.executable, "-c", KILLER, str(config), str(delay), *([str(gate)] if gate else [])],
        env=env,
        text=True,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def _wait_for(predicate, what: str, proc: subprocess.Popen, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the preparer ended before {what}: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {what} within {limit} s")
        time.sleep(0.05)


def test_a_killed_preparation_continues_and_ends_as_a_clean_one(tmp_path, monkeypatch):
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    folder, _ = shard_folder(cfg, case)

    def encoded() -> int:
        return len(list((work_folder(folder) / "encoded").glob("*.npz")))

    proc = _preparer(config, 0.5)
    _wait_for(lambda: encoded() >= 2, "two assets encoded", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (folder / "manifest.json").exists() and not (folder / "tokens").exists()

    cleaned = []
    real_clean = shard_stages.clean_asset
    monkeypatch.setattr(shard_stages, "clean_asset", lambda *a, **k: cleaned.append(a[0]) or real_clean(*a, **k))
    resumed = prepare_shards(cfg, case)
    assert cleaned == []  # every asset was cleaned before the kill: none is read again
    fresh = prepare_in_memory(cfg, case)
    assert same_tokens(resumed.tokens, fresh.tokens) and resumed.data_info == fresh.data_info


def test_two_jobs_preparing_the_same_shard_at_once(tmp_path):
    config = make_case(tmp_path)
    gate, log = tmp_path / "gate", tmp_path / "second.log"
    first = _preparer(config, 0.0, gate)  # holds the lock in its encode stage until the gate opens
    folder, _ = shard_folder(load_config(config), config.parent.parent)
    _wait_for(lambda: (work_folder(folder) / "encoded").is_dir(), "the first preparer's encode stage", first)
    second = _preparer(config, 0.0, log=log)
    _wait_for(lambda: "waiting" in log.read_text(), "the second preparer waiting", second)
    gate.touch()
    first_out = first.communicate(timeout=300)[0]
    second.wait(timeout=300)
    outs = [first_out, log.read_text()]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    assert "prepared" in outs[0] and "waiting" in outs[1] and "reusing" in outs[1], outs
    p = prepare_shards(load_config(config), config.parent.parent)
    assert same_tokens(p.tokens, prepare_in_memory(load_config(config), config.parent.parent).tokens)


def test_a_full_disk_is_one_clear_error_and_leaves_no_shard(tmp_path, monkeypatch):
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shard_stages, "write_index", full)
    with pytest.raises(UserError, match="disk is full.*rerun continues") as e:
        prepare_shards(cfg, case)
    assert "\n" not in str(e.value)
    folder, _ = shard_folder(cfg, case)
    assert not (folder / "manifest.json").exists() and not (folder / "tokens").exists()
    monkeypatch.undo()
    assert same_tokens(prepare_shards(cfg, case).tokens, prepare_in_memory(cfg, case).tokens)


def test_a_token_folder_of_another_version_or_damaged_is_refused(tmp_path):
    config = make_case(tmp_path)
    p = prepare_shards(load_config(config), config.parent.parent)
    copy = tmp_path / "run" / "tokens"
    p.tokens.save(copy)
    assert os.stat(copy / "tokens.bin").st_ino == os.stat(p.tokens.folder / "tokens.bin").st_ino  # a hard link
    index = json.loads((copy / "index.json").read_text())
    (copy / "index.json").unlink()  # a link: rewrite our own copy, not the shard's
    (copy / "index.json").write_text(json.dumps(dict(index, version=99)))
    with pytest.raises(UserError, match="token format version 99.*reads version 1"):
        TokenSet.load(copy)
    (copy / "index.json").write_text(json.dumps(index))
    (copy / "tokens.bin").unlink()
    (copy / "tokens.bin").write_bytes(b"\0" * 10)
    with pytest.raises(UserError, match="damaged"):
        TokenSet.load(copy)
    with pytest.raises(ConfigError, match="data.shards"):
        load_config(config, ["data.shard=true"])


def test_a_run_made_before_token_folders_still_reads_its_tokens_npz(tmp_path):
    np.savez(
        tmp_path / "tokens.npz",
        symbols=np.array(["A", "B"]),
        lengths=np.array([3, 2]),
        ranges=np.array([[[0, 1], [1, 2], [2, 3]], [[0, 1], [1, 1], [1, 2]]]),
        tokens=np.arange(5, dtype=np.int16),
        moves=np.linspace(0, 1, 5),
    )
    assert token_path(tmp_path) == tmp_path / "tokens.npz"
    t = TokenSet.load(token_path(tmp_path))
    assert t.tokens["B"].tolist() == [3, 4] and t.ranges["A"]["test"] == (2, 3) and t.features is None


def test_training_reads_a_token_folder_larger_than_its_memory_bound(tmp_path):
    """The tokens stay memory-mapped: a 400 MB token folder, batches drawn from all over it,
    and the process grows by far less than the folder."""
    folder = tmp_path / "tokens"
    n = 200_000_000  # candles: 400 MB of int16 tokens, 1.6 GB of moves (sparse files: no disk used)
    folder.mkdir()
    for name, size in (("tokens.bin", 2 * n), ("moves.bin", 8 * n)):
        with open(folder / name, "wb") as f:
            f.truncate(size)
    ranges = {"train": (0, n - 20_000_000), "val": (n - 19_000_000, n - 10_000_000), "test": (n - 9_000_000, n)}
    (folder / "index.json").write_text(
        json.dumps(
            {
                "format": "marketgpt-tokens",
                "version": 1,
                "candles": n,
                "symbols": ["A"],
                "lengths": [n],
                "ranges": [[list(ranges[s]) for s in ("train", "val", "test")]],
                "features": False,
            }
        )
    )
    script = textwrap.dedent(f"""
        import resource, torch
        from common.tokens.token_set import TokenSet
        from common.training.batches import build_windows
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = TokenSet.load({str(folder)!r})
        w = build_windows(t.tokens, t.ranges, {{"A": 0}}, {{"A": 0}}, 64, flat=t.flat(),
                          strides={{"train": 4096, "val": 4096, "test": 4096}})
        for b in w.batches("train", 64, shuffle=True, limit=50):
            assert b.x.dtype == torch.int64 and b.x.shape == (64, 64)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(grown * 1024)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert out.returncode == 0, out.stderr
    grown = int(out.stdout.split()[-1])
    bound = 100 * 2**20
    assert (folder / "tokens.bin").stat().st_size > 3 * bound and grown < bound, grown


def test_training_is_bit_identical_with_shards_and_without(tmp_path):
    from common.commands.train import run_training

    config = make_case(tmp_path)
    runs = {}
    for shards_on in ("true", "false", "true"):  # prepared, in memory, reused
        assert run_training(config, [f"data.shards={shards_on}"]) == 0
        newest = max((config.parent.parent / "checkpoints").glob("shards_*"), key=lambda p: p.stat().st_mtime_ns)
        runs[len(runs)] = newest
        time.sleep(1.1)  # run folders are named by the second
    logs = [
        [(e["train_loss"], e["val_loss"]) for e in json.loads((r / "training_log.json").read_text())["epochs"]]
        for r in runs.values()
    ]
    weights = [torch.load(r / "best_model.pt", weights_only=False) for r in runs.values()]
    assert logs[0] == logs[1] == logs[2] and len(logs[0]) == 2
    key = next(k for k in weights[0] if "model" in k)
    for w in weights[1:]:
        assert all(torch.equal(weights[0][key][k], w[key][k]) for k in weights[0][key])
    assert (runs[0] / "tokens" / "tokens.bin").stat().st_nlink > 1  # linked from the shard
    assert (runs[1] / "tokens" / "tokens.bin").stat().st_nlink == 1  # written for that run alone


def test_data_prepare_makes_the_shard_training_then_reuses(tmp_path, capsys):
    from common.cli import main

    config = make_case(tmp_path)
    assert main(["data", "prepare", "--config", str(config)]) == 0
    assert "prepared" in capsys.readouterr().out
    assert main(["data", "prepare", "--config", str(config)]) == 0
    assert "reusing" in capsys.readouterr().out
    assert main(["data", "prepare", "--config", str(config), "--set", "data.shards=false"]) == 2
    assert "nothing to prepare" in capsys.readouterr().err


def test_stages_split_across_array_tasks_give_the_same_shard(tmp_path):
    """What a Slurm job array runs: clean and encode split over tasks, fit and finish once."""
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    prepare_stage = shard_stages.prepare_stage
    prepare_stage(cfg, case, "clean", task=1, tasks=2)
    with pytest.raises(UserError, match="was not cleaned: run the clean stage for every task"):
        prepare_stage(cfg, case, "fit")
    prepare_stage(cfg, case, "clean", task=0, tasks=2)
    prepare_stage(cfg, case, "fit")
    prepare_stage(cfg, case, "encode", task=2, tasks=3)
    with pytest.raises(UserError, match="not encoded yet"):
        prepare_stage(cfg, case, "finish")
    for task in (0, 1):
        prepare_stage(cfg, case, "encode", task=task, tasks=3)
    prepare_stage(cfg, case, "finish")
    folder, _ = shard_folder(cfg, case)
    assert (folder / "manifest.json").is_file() and not work_folder(folder).exists()
    p, memory = prepare_shards(cfg, case), prepare_in_memory(cfg, case)
    assert same_tokens(p.tokens, memory.tokens) and p.data_info == memory.data_info


def _encoded_but_not_finished(cfg, case) -> Path:
    for stage in ("clean", "fit", "encode"):
        shard_stages.prepare_stage(cfg, case, stage)
    return shard_folder(cfg, case)[0]


def test_a_second_fit_after_the_encode_tasks_cannot_corrupt_the_shard(tmp_path):
    """A resubmitted array (or a training run) repeats the fit stage after the encode tasks wrote:
    the tokens they wrote stay, and the published shard equals one made in memory."""
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    folder = _encoded_but_not_finished(cfg, case)
    (work_folder(folder) / "split.json").unlink()  # a second fit that began before the first ended
    shard_stages.prepare_stage(cfg, case, "fit")
    shard_stages.prepare_stage(cfg, case, "finish")
    p, memory = prepare_shards(cfg, case), prepare_in_memory(cfg, case)
    assert same_tokens(p.tokens, memory.tokens) and p.tokens.flat()[0].any()


def test_two_finishers_publish_one_whole_shard_without_any_lock(tmp_path, monkeypatch, capsys):
    """No flock (an NFS mount without lockd): a second preparer that finishes first wins the rename;
    the other's folder is discarded whole and nothing of either is left beside the shard."""
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    monkeypatch.setattr(shards.fcntl, "flock", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOLCK, "no locks")))
    folder = _encoded_but_not_finished(cfg, case)
    real, raced = shard_stages.publish_folder, []

    def rival_first(private, target):
        if not raced:  # another preparer publishes its own folder while ours is being written
            raced.append(True)
            shard_stages._finish_stage(target, shard_folder(cfg, case)[1], sys.stdout)
        return real(private, target)

    monkeypatch.setattr(shard_stages, "publish_folder", rival_first)
    p = prepare_shards(cfg, case)
    assert "ours is discarded" in capsys.readouterr().out
    assert same_tokens(p.tokens, prepare_in_memory(cfg, case).tokens)
    assert sorted(x.name for x in folder.parent.iterdir()) == [folder.name, f"{folder.name}.lock"]


def test_a_damaged_shard_is_one_line_naming_the_file_and_the_rebuild(tmp_path, monkeypatch, capsys):
    from common.cli import main

    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    folder = prepare_shards(cfg, case).tokens.folder.parent
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) >= {"tokens/tokens.bin", "tokens/moves.bin", "tokens/index.json", "tokenizer.json"}
    tokens = folder / "tokens" / "tokens.bin"
    good = tokens.read_bytes()
    tokens.write_bytes(good[:100] + bytes([good[100] ^ 0x40]) + good[101:])  # one flipped bit, same size
    with pytest.raises(UserError, match=r"damaged: tokens/tokens.bin does not match its sha256.*--rebuild") as e:
        prepare_shards(cfg, case)
    assert "\n" not in str(e.value)
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "tokens/tokens.bin" in err and "\n" not in err
    tokens.write_bytes(good)

    moves = folder / "tokens" / "moves.bin"
    moves.write_bytes(moves.read_bytes()[:-8])  # truncated
    with pytest.raises(UserError, match="tokens/moves.bin has .* bytes where the manifest says"):
        prepare_shards(cfg, case)
    assert main(["data", "prepare", "--config", str(config), "--rebuild"]) == 0
    assert "moved" in capsys.readouterr().out and same_tokens(
        prepare_shards(cfg, case).tokens, prepare_in_memory(cfg, case).tokens
    )

    # every file is hashed, whatever its size (moves.bin is 920 MB at 10^8 candles); data check too
    good = moves.read_bytes()
    moves.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(UserError, match=r"damaged: tokens/moves.bin does not match its sha256"):
        prepare_shards(cfg, case)
    assert main(["data", "check", "--case", str(case), "--config", str(config)]) == 2
    assert "tokens/moves.bin does not match its sha256" in capsys.readouterr().err
    moves.write_bytes(good)
    good = tokens.read_bytes()
    tokens.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    assert main(["data", "check", "--case", str(case), "--config", str(config)]) == 2
    assert "tokens/tokens.bin does not match its sha256" in capsys.readouterr().err
    tokens.write_bytes(good)
    assert main(["data", "check", "--case", str(case), "--config", str(config)]) in (0, 1)
    assert "files match their sha256 in manifest.json" in capsys.readouterr().out

    edited = dict(json.loads((folder / "manifest.json").read_text()), candles=1)
    (folder / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(UserError, match="manifest.json its own checksum does not match"):
        prepare_shards(cfg, case)


def test_an_unfinished_preparation_of_the_older_layout_is_set_aside(tmp_path):
    """Before private publishing, an unfinished shard was its own folder with work/ inside and no
    manifest: it must not block the rename that publishes."""
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    folder, _ = shard_folder(cfg, case)
    (folder / "work" / "tokens").mkdir(parents=True)
    (folder / "work" / "tokens" / "tokens.bin").write_bytes(b"\0" * 64)
    assert same_tokens(prepare_shards(cfg, case).tokens, prepare_in_memory(cfg, case).tokens)
    assert not (folder / "work").exists()


def test_a_task_that_ends_after_the_shard_is_published_leaves_no_work_folder(tmp_path, monkeypatch, capsys):
    """A clean task that passed the 'published?' check just before another preparer published
    writes into a work folder of its own making; it removes it when it ends, and the next
    preparation removes one left by a task that was killed meanwhile."""
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    folder = prepare_shards(cfg, case).tokens.folder.parent
    work = work_folder(folder)
    assert not work.exists()

    real, calls = shard_stages.published, []

    def late(f):  # the task's first look still sees no shard
        calls.append(f)
        return len(calls) > 1 and real(f)

    monkeypatch.setattr(shard_stages, "published", late)
    shard_stages.prepare_stage(cfg, case, "clean", task=0, tasks=2)
    monkeypatch.undo()
    assert len(calls) > 1 and not work.exists()
    assert f"removed {work}" in capsys.readouterr().out

    (work / "clean").mkdir(parents=True)  # a straggler killed before it could remove its files
    (work / "clean" / "000000.npz").write_bytes(b"x")
    prepare_shards(cfg, case)
    assert not work.exists() and f"removed {work}" in capsys.readouterr().out


def test_the_manifest_names_the_preparer_that_published_and_older_manifests_still_open(tmp_path, monkeypatch):
    """Several preparers race for a shard (array tasks, a resubmission, a training started
    meanwhile): the manifest says which one published it. A manifest without the field (a shard
    published before it) still opens."""
    from common.tokens.shard_manifest import manifest_checksum, verify_shard

    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(k, raising=False)
    prepare_shards(cfg, case)
    folder, _ = shard_folder(cfg, case)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["prepared_by"]["pid"] == os.getpid() and manifest["prepared_by"]["slurm_job"] is None

    # the finish stage as a Slurm job (its own id), then as a task of an array
    array_task = {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}
    for env, want in (({"SLURM_JOB_ID": "44"}, "44"), (array_task, "40_3")):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            assert shard_stages._preparer()["slurm_job"] == want

    older = {k: v for k, v in manifest.items() if k not in ("prepared_by", "manifest_sha256")}
    (folder / "manifest.json").write_text(json.dumps(dict(older, manifest_sha256=manifest_checksum(older))))
    assert verify_shard(folder)["key"] == folder.name
    assert same_tokens(prepare_shards(cfg, case).tokens, prepare_in_memory(cfg, case).tokens)


def test_a_shard_another_preparer_published_meanwhile_is_not_reported_as_ours(tmp_path, monkeypatch, capsys):
    config = make_case(tmp_path)
    cfg, case = load_config(config), config.parent.parent
    monkeypatch.setattr(shard_stages, "_preparer", lambda: {"host": "node7", "pid": 1, "slurm_job": "42_3"})
    prepare_shards(cfg, case)
    out = capsys.readouterr().out
    assert "was published by another preparer ({'host': 'node7', 'pid': 1, 'slurm_job': '42_3'})" in out
    assert "Token shards: prepared" not in out
    monkeypatch.undo()
    config = make_case(tmp_path / "ours")  # published by this process: reported as prepared here
    prepare_shards(load_config(config), config.parent.parent)
    assert "Token shards: prepared" in capsys.readouterr().out


def test_market_context_ids_are_3_more_columns_equal_in_shards_and_in_memory(tmp_path):
    config = make_case(tmp_path)
    cfg, case = load_config(config, ["model.market_context=true"]), config.parent.parent
    shard, memory = prepare_shards(cfg, case), prepare_in_memory(cfg, case)
    assert json.loads((shard.tokens.folder / "index.json").read_text())["feature_columns"] == 6
    for s in shard.tokens.symbols:
        assert shard.tokens.features[s].shape == (len(shard.tokens.tokens[s]), 6)
        np.testing.assert_array_equal(shard.tokens.features[s], memory.tokens.features[s])
    assert all((shard.tokens.features[s][:, 3:] > 0).mean() > 0.5 for s in shard.tokens.symbols)
    # in a different shard from the one without it, whose 3 columns it extends
    plain = prepare_shards(load_config(config, ["model.time_features=true"]), case)
    assert plain.tokens.folder != shard.tokens.folder
    for s in shard.tokens.symbols:
        np.testing.assert_array_equal(shard.tokens.features[s][:, :3], plain.tokens.features[s])
    # model.market_peer: one more column, the same peers in both paths, kept in asset_info.json
    cfg = load_config(config, ["model.market_context=true", "model.market_peer=true"])
    peer, memory = prepare_shards(cfg, case), prepare_in_memory(cfg, case)
    assert peer.tokens.folder not in (shard.tokens.folder, plain.tokens.folder)
    assert json.loads((peer.tokens.folder / "index.json").read_text())["feature_columns"] == 7
    assert peer.info.peers == memory.info.peers and set(peer.info.peers) == set(peer.tokens.symbols)
    assert json.loads((peer.tokens.folder.parent / "asset_info.json").read_text())["peers"] == peer.info.peers
    for s in shard.tokens.symbols:
        np.testing.assert_array_equal(peer.tokens.features[s], memory.tokens.features[s])
        np.testing.assert_array_equal(peer.tokens.features[s][:, :6], shard.tokens.features[s])
        assert (peer.tokens.features[s][:, 6] > 0).mean() > 0.5
