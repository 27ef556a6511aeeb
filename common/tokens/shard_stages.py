"""Building a token shard in stages, each a plain function a Slurm array task can run
(common.slurm.prepare_jobs) and each skipping what a killed try already finished:
  1. clean   read, clean and gap-fill each asset (common.data.cleaning.clean_asset) and keep
             its candles in <key>.work/clean/<i>.npz
  2. fit     the cuts from the pooled timestamps alone (common.data.prepare.split_data), then
             the tokenizer (and the volume edges) on the train ranges only, asset by asset
  3. encode  each asset's tokens, moves (and time and volume ids) in <key>.work/encoded/<j>.npz
  4. finish  the token folder streamed from those files, hashed as it is written, then the
             run files and manifest.json, all in a private folder published by one rename
             (with model.market_context, the cross-section first, from every asset's moves)
Memory holds one asset's candles at a time (with model.market_context, the finish stage holds
every asset's close times, moves and volatility levels: 24 bytes a candle, under 4 GB at 110M;
bench/results/2026-12-05-market-memory). The tokens equal those of the in-memory path
(common.tokens.corpus.prepare_in_memory) bit for bit."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, TextIO

import numpy as np
import pandas as pd

from common.atomic import atomic_path, atomic_write_json, publish_folder, read_json
from common.config import Config, DataConfig
from common.data.cleaning import COLUMNS, clean_asset, real_rows
from common.data.loading import load_market_data
from common.data.market_data import LazyFrames
from common.data.prepare import split_data
from common.errors import UserError
from common.markets import interval_step
from common.run.files import ASSET_INFO_JSON, DATA_INFO_JSON, TOKENIZER_JSON
from common.tokens.corpus import encode_asset, fit_tokenizer, fit_volume, ranges_of, wants_features
from common.tokens.features import feature_columns
from common.tokens.ids import RunInfo
from common.tokens.market_context import MarketContext, SeriesMoves, check_cross_section, series_moves
from common.tokens.shard_manifest import Hasher, file_sha256, manifest_checksum, remember_sha256
from common.tokens.shard_paths import published, shard_folder, work_folder
from common.tokens.token_set import write_index
from common.tokens.tokenizer import OHLCTokenizer

__all__ = ["STAGES", "prepare_stage", "remove_leftover_work"]

STAGES = ("clean", "fit", "encode", "finish")


def prepare_stage(
    cfg: Config,
    case_dir: Path,
    stage: str,
    task: int = 0,
    tasks: int = 1,
    parent: Optional[Path] = None,
    out: Optional[TextIO] = None,
) -> None:
    """One stage of preparing the config's shard, as task `task` of `tasks`: "clean" and "encode"
    take the assets i with i % tasks == task (the elements of a Slurm job array, each writing
    its own assets' files and ranges); "fit" and "finish" run once, after every task of the
    stage before. Every stage skips what an earlier, killed try already finished."""
    out = out or sys.stdout
    folder, inputs = shard_folder(cfg, case_dir, parent)
    if stage not in STAGES:
        raise UserError(f"unknown preparation stage {stage!r}; expected one of {', '.join(STAGES)}")
    if published(folder):
        return
    _set_aside_unfinished(folder)
    work = work_folder(folder)
    try:
        work.mkdir(parents=True, exist_ok=True)
        if not (work / "inputs.json").is_file():
            atomic_write_json(work / "inputs.json", inputs)
        if stage == "clean":
            _clean_stage(cfg.data, case_dir, work, task, tasks, out)
        elif stage == "fit":
            _fit_stage(cfg, case_dir, work, parent, out)
        elif stage == "encode":
            _encode_stage(work, task, tasks, out)
        else:
            _finish_stage(folder, inputs, out)
    except (OSError, UserError) as e:
        if published(folder):  # another preparer finished first (and removed the work folder)
            print(
                f"Token shards: {folder} was published by another preparer; the {stage} stage has nothing left to do",
                file=out,
                flush=True,
            )
            remove_leftover_work(folder, out)
            return
        if isinstance(e, UserError):
            raise
        raise _write_error(folder, e) from None
    # a task that started before another preparer published (and removed the work folder) wrote
    # its files into a work folder of its own making: nothing reads them
    remove_leftover_work(folder, out)


def remove_leftover_work(folder: Path, out: TextIO) -> None:
    """Remove the work folder of a published shard (a straggling task's files), with a line."""
    work = work_folder(folder)
    if published(folder) and work.exists():
        shutil.rmtree(work, ignore_errors=True)
        print(f"Token shards: removed {work}, left by a task that ended after the shard was published", file=out)


def _set_aside_unfinished(folder: Path) -> None:
    """A shard folder without a manifest is an unfinished preparation of the layout before
    private publishing (its work/ inside): moved out of the way of the rename that publishes."""
    if folder.is_dir() and not published(folder):
        aside = folder.with_name(f".{folder.name}.{os.getpid()}.unfinished")
        with contextlib.suppress(OSError):  # another preparer moved it first
            os.rename(folder, aside)
            shutil.rmtree(aside, ignore_errors=True)


class _Cleaned(Mapping[str, np.ndarray]):
    """The clean stage's output on disk: symbol -> the timestamps (or, via frame(), the candles)
    of each cleaned asset, read from work/clean/<i>.npz when asked for."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def __getitem__(self, symbol: str) -> np.ndarray:
        with np.load(self.files[symbol]) as z:
            return z["ts"]

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def real(self) -> LazyFrames:
        """symbol -> the timestamps of its real candles (not the rows fill_gaps added), read on access."""

        def load(symbol: str) -> np.ndarray:
            with np.load(self.files[symbol]) as z:
                return z["ts"][z["real"]]

        return LazyFrames(list(self.files), load)

    def frame(self, symbol: str) -> pd.DataFrame:
        with np.load(self.files[symbol]) as z:
            ts, values = z["ts"], z["values"]
        index = pd.DatetimeIndex(ts.view("datetime64[ns]"), name="timestamp").tz_localize("UTC")
        return pd.DataFrame({c: values[:, i] for i, c in enumerate(COLUMNS)}, index=index)


def _progress(out: TextIO, what: str, done: int, total: int) -> None:
    if done == total or done % max(1, total // 10) == 0:
        print(f"Token shards: {what} {done}/{total} assets", file=out, flush=True)


def _clean_stage(d: DataConfig, case_dir: Path, work: Path, task: int, tasks: int, out: TextIO) -> None:
    """Read, clean and gap-fill this task's assets, each kept in work/clean/<i>.npz."""
    market = load_market_data(d, case_dir)  # lazy: an asset is read when its turn comes
    (work / "clean").mkdir(exist_ok=True)
    mine = [i for i in range(len(market.assets)) if i % tasks == task]
    if task == 0:
        print(
            f"Token shards: preparing {work.parent / work.stem} from {len(market.assets)} assets ({d.source}, "
            f"{', '.join(d.run_intervals())}); a killed preparation continues on the next run",
            file=out,
            flush=True,
        )
    for k, i in enumerate(mine, 1):
        file = work / "clean" / f"{i:06d}.npz"
        if not file.is_file():
            s = market.assets[i].symbol
            step = interval_step(market.interval_of(s))  # a series' own interval (data.intervals)
            frame, record, why = clean_asset(
                market.assets[i], market.candles[s], step, reader_fixes=market.fixes.get(s), file=market.files.get(s)
            )
            if frame is None:
                ts, values, real = np.zeros(0, np.int64), np.zeros((0, len(COLUMNS))), np.zeros(0, bool)
            else:
                ts, values, real = frame.index.asi8, frame[list(COLUMNS)].to_numpy(np.float64), real_rows(frame)
            meta = json.dumps({"symbol": s, "record": record, "why": why})
            with atomic_path(file) as tmp, open(tmp, "wb") as f:
                np.savez(f, ts=ts, values=values, real=real, meta=np.array(meta))
        _progress(out, "cleaned", k, len(mine))


def _cleaned(d: DataConfig, case_dir: Path, work: Path) -> tuple[list, str, _Cleaned, dict, dict, dict]:
    """Every asset's clean-stage output: (universe, interval, cleaned, records, dropped, series intervals)."""
    market = load_market_data(d, case_dir)
    files, records, dropped = {}, {}, {}
    for i, asset in enumerate(market.assets):
        file = work / "clean" / f"{i:06d}.npz"
        if not file.is_file():
            raise UserError(
                f"{asset.symbol} (asset {i}) was not cleaned: run the clean stage for every task "
                "first (or prepare without --array)"
            )
        with np.load(file) as z:
            meta = json.loads(str(z["meta"]))
            if meta["symbol"] != asset.symbol:
                raise UserError(f"{file} holds {meta['symbol']}, not {asset.symbol}: delete {work} and run again")
            records[asset.symbol] = meta["record"]
            if meta["why"] is not None:
                dropped[asset.symbol] = meta["why"]
                continue
        files[asset.symbol] = file
    return market.assets, market.interval, _Cleaned(files), records, dropped, market.series_intervals


def _fit_stage(cfg: Config, case_dir: Path, work: Path, parent: Optional[Path], out: TextIO) -> None:
    """Split by time from the stamps alone, fit the tokenizer (and volume edges) on the train
    ranges only; work/split.json, written last, says it is done."""
    if (work / "split.json").is_file():
        return
    universe, interval, cleaned, records, dropped, series_intervals = _cleaned(cfg.data, case_dir, work)
    # every asset's stamps and candles are read from work/clean/ when the split or the fit needs
    # them, never all at once: memory holds one asset, the day counts of the cuts and the fit's sample
    prepared = split_data(
        cfg.data,
        cfg.model.context_length,
        universe,
        interval,
        cleaned,
        cleaned.real(),
        records,
        dropped,
        LazyFrames(list(cleaned), cleaned.frame),
    )
    tokenizer = fit_tokenizer(cfg.tokenizer, cfg.model.vocab_size, prepared, parent)
    edges = fit_volume(prepared) if wants_features(cfg.model) else None
    symbols = [a.symbol for a in prepared.assets]
    lengths = [len(cleaned[s]) for s in symbols]
    # two fits of one shard (a resubmitted array, a training run meanwhile) write the same files,
    # each by a rename: an encode task reads one whole version or the other
    tokenizer.save(work / TOKENIZER_JSON)
    atomic_write_json(
        work / "split.json",
        {
            "symbols": symbols,
            "files": [cleaned.files[s].name for s in symbols],
            "lengths": lengths,
            "ranges": {s: ranges_of(prepared, s) for s in symbols},
            "interval": interval,
            "volume_edges": edges,
            "vol_level": cfg.model.vol_level_input,  # a 4th feature column (absent in older work folders)
            "market_context": cfg.model.market_context,  # 3 more, from every asset (finish stage)
            "market_peer": cfg.model.reads_peer,  # 1 more, each asset's fitted peer's (finish stage)
            "info": prepared.info,
            "asset_info": RunInfo.of_assets(prepared.assets, cfg.data.intervals).to_json(),
            "series_intervals": series_intervals,
        },
    )
    print(
        f"Token shards: split {sum(lengths):,} candles of {len(symbols)} assets; tokenizer fitted on the train split",
        file=out,
        flush=True,
    )


def _split(work: Path) -> dict:
    if not (work / "split.json").is_file():
        raise UserError(f"{work.parent / work.stem}: the fit stage has not run: run it after every clean task")
    return read_json(work / "split.json")


def _encode_stage(work: Path, task: int, tasks: int, out: TextIO) -> None:
    """Encode this task's assets, each into work/encoded/<j>.npz (its tokens, moves, time and
    volume ids and clip counts), written under a temp name and renamed: present means whole."""
    split = _split(work)
    tokenizer = OHLCTokenizer.load(work / TOKENIZER_JSON)
    edges = split["volume_edges"]
    cleaned = _Cleaned({s: work / "clean" / f for s, f in zip(split["symbols"], split["files"])})
    (work / "encoded").mkdir(exist_ok=True)
    mine = [j for j in range(len(split["symbols"])) if j % tasks == task]
    for k, j in enumerate(mine, 1):
        done = work / "encoded" / f"{j:06d}.npz"
        if not done.is_file():
            s = split["symbols"][j]
            tokenizer.reset_clip_counts()  # this asset's own counts, summed by the finish stage
            interval = split.get("series_intervals", {}).get(s, split["interval"])
            toks, moves, features = encode_asset(
                tokenizer, cleaned.frame(s), s, interval, edges, bool(split.get("vol_level", False))
            )
            if len(toks) != split["lengths"][j]:
                raise UserError(
                    f"{s}: {len(toks)} tokens where the fit stage counted {split['lengths'][j]}; "
                    f"delete {work} and prepare again"
                )
            arrays: dict[str, Any] = {
                "tokens": toks.astype(np.int16),
                "moves": moves.astype(np.float64),
                "clip_counts": np.array(json.dumps(dict(tokenizer.clip_counts))),
            }
            if features is not None:
                arrays["features"] = features.astype(np.int16)
            if split.get("market_context", False):  # what the finish stage's cross-section reads
                ms = series_moves(tokenizer, cleaned.frame(s), interval, moves)
                arrays.update(stamps=ms.stamps, level=ms.level)
            with atomic_path(done) as tmp, open(tmp, "wb") as f:
                np.savez(f, **arrays)
        _progress(out, "encoded", k, len(mine))


def _finish_stage(folder: Path, inputs: dict, out: TextIO) -> None:
    """Publish: the token folder, the run files and manifest.json (every file's sha256) written
    into a private folder, renamed to the shard's name; then the work folder is removed."""
    work = work_folder(folder)
    split = _split(work)
    symbols = split["symbols"]
    parts = [work / "encoded" / f"{j:06d}.npz" for j in range(len(symbols))]
    missing = [s for s, part in zip(symbols, parts) if not part.is_file()]
    if missing:
        raise UserError(
            f"{len(missing)} assets are not encoded yet (e.g. {missing[0]}): run the encode stage for every task first"
        )
    private = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".publish", dir=folder.parent))
    try:
        (private / "tokens").mkdir()
        asset_info = split["asset_info"]
        market = None
        if split.get("market_context", False):
            market, peers = _market_context(split, parts)
            if peers is not None:
                asset_info = RunInfo.from_json(asset_info)
                asset_info = dataclasses.replace(asset_info, peers=peers).to_json()
        files, counts = _write_tokens(private / "tokens", parts, split["volume_edges"] is not None, market)
        sha256 = {name.removeprefix("tokens/"): entry["sha256"] for name, entry in files.items()}
        peer = bool(split.get("market_peer", False))
        columns = feature_columns(bool(split.get("vol_level", False)), market is not None, peer)
        with_features = split["volume_edges"] is not None
        write_index(private / "tokens", symbols, split["lengths"], split["ranges"], with_features, sha256, columns)
        tokenizer = OHLCTokenizer.load(work / TOKENIZER_JSON)  # its clip counts: a parent's, or zero
        tokenizer.clip_counts = {
            k: tokenizer.clip_counts.get(k, 0) + counts.get(k, 0)
            for k in dict.fromkeys([*tokenizer.clip_counts, *counts])
        }
        data_info = dict(split["info"], tokenizer_clip_counts=tokenizer.clip_counts)
        if split["volume_edges"] is not None:
            data_info["volume_edges"] = split["volume_edges"]
        tokenizer.save(private / TOKENIZER_JSON)
        atomic_write_json(private / ASSET_INFO_JSON, asset_info)
        atomic_write_json(private / DATA_INFO_JSON, data_info)
        for name in ("tokens/index.json", TOKENIZER_JSON, ASSET_INFO_JSON, DATA_INFO_JSON):
            files[name] = file_sha256(private / name)
        manifest = {
            "key": folder.name,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "assets": len(symbols),
            "candles": int(sum(split["lengths"])),
            "prepared_by": _preparer(),
            "inputs": inputs,
            "files": files,
        }
        atomic_write_json(private / "manifest.json", dict(manifest, manifest_sha256=manifest_checksum(manifest)))
        won = publish_folder(private, folder)
    finally:
        shutil.rmtree(private, ignore_errors=True)  # gone after a rename; ours alone otherwise
    if not won:
        print(
            f"Token shards: {folder} was published by another preparer meanwhile; ours is discarded",
            file=out,
            flush=True,
        )
    shutil.rmtree(work, ignore_errors=True)


def _preparer() -> dict:
    """Who publishes: the host, the process and its Slurm job (an array task's own id), so a
    shard raced for by several preparers says which one won."""
    env = os.environ
    job = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID")
    task = env.get("SLURM_ARRAY_TASK_ID")
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": f"{job}_{task}" if job and task else job}


def _market_context(split: dict, parts: list[Path]) -> tuple[list[np.ndarray], Optional[dict[str, str]]]:
    """(each asset's market-context ids, model.market_context; with model.market_peer the peers
    fitted on the train split and their column), from every asset's moves and levels, read one
    asset at a time (the context keeps 24 bytes a candle)."""
    intervals = {s: split.get("series_intervals", {}).get(s, split["interval"]) for s in split["symbols"]}
    check_cross_section(intervals)

    def series() -> Iterator[tuple[str, SeriesMoves]]:
        for s, part in zip(split["symbols"], parts):
            with np.load(part) as z:
                yield s, SeriesMoves(intervals[s], z["stamps"], z["moves"], z["level"])

    context = MarketContext(series())
    train = {s: int(split["ranges"][s]["train"][1]) for s in split["symbols"]}  # the train split: candles [0, stop)
    peers = context.fit_peers(train) if split.get("market_peer", False) else None
    return [context.own_ids(s, peers).astype(np.int16) for s in split["symbols"]], peers


def _write_tokens(
    tokens: Path, parts: list[Path], with_features: bool, market: Optional[list[np.ndarray]] = None
) -> tuple[dict, dict]:
    """The token arrays streamed from each asset's encoded file, hashed as they are written:
    ({"tokens/<file>": {"bytes", "sha256"}}, the summed clip counts). market: each asset's
    market-context ids, appended to its feature ids."""
    names = {"tokens": "tokens.bin", "moves": "moves.bin", **({"features": "features.bin"} if with_features else {})}
    hashers = {k: Hasher() for k in names}
    counts: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        handles = {k: stack.enter_context(open(tokens / name, "wb")) for k, name in names.items()}
        for j, part in enumerate(parts):
            with np.load(part) as z:
                for k in names:
                    array = z[k] if k != "features" or market is None else np.concatenate([z[k], market[j]], axis=1)
                    hashers[k].write(handles[k], np.ascontiguousarray(array).tobytes())
                for k, n in json.loads(str(z["clip_counts"])).items():
                    counts[k] = counts.get(k, 0) + n
        for f in handles.values():
            f.flush()
            os.fsync(f.fileno())
    for k, name in names.items():  # hashed as written: the open after publishing reads them no more
        remember_sha256(tokens / name, hashers[k].entry())
    return {f"tokens/{name}": hashers[k].entry() for k, name in names.items()}, counts


def _write_error(folder: Path, e: OSError) -> UserError:
    why = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return UserError(
        f"cannot write the token shard {folder} ({why}): free space there, or set data.cache_dir "
        "to a larger filesystem, or data.shards = false to prepare in memory; a rerun continues "
        "where this one stopped"
    )
