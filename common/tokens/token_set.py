"""TokenSet: what a run trains and is tested on, and its folder of memory-mapped arrays.

A token folder (a run's `tokens/`, or the `tokens/` of a prepared shard in the data cache):

    index.json     format and version, symbols (asset-id order), each asset's candle count and
                   split ranges, the dtypes and the sha256 of each array file; read first, so a
                   folder from another version fails with one clear line
    tokens.bin     (N,) every asset's tokens, concatenated in symbol order (int16)
    moves.bin      (N,) float64, the actual normalized move of each candle (NaN where undefined)
    features.bin   (N, C) int16 time and volume ids, with model.time_features / volume_input; C is
                   index.json's feature_columns: 3, or 4 with model.vol_level_input (absent: 3)

N is the corpus' candle count. Opened, the arrays are memory maps: a process holds in RAM only
the pages it reads, and any number of runs and ranks share the page cache. The files are never
written after the folder is published (a folder appears whole, by rename), so a run folder may
hard-link them from the shard it was prepared from instead of copying.
Opening a folder checks every array file against its sha256 in index.json, once per process
(common/tokens/shard_manifest.file_sha256): a resume, a requeue and every rank read only verified
bytes, and a run's hard links to a shard already hashed cost nothing. Folders written before the
checksums are checked by size.
A run made before token folders has `tokens.npz`, which TokenSet.load still reads.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from common.atomic import atomic_folder, atomic_write_json
from common.errors import UserError
from common.tokens.shard_manifest import Hasher, file_sha256, remember_sha256

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "SPLITS", "TokenSet", "read_index", "token_path", "write_index"]

FORMAT_NAME = "marketgpt-tokens"
FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
# features.bin's columns where index.json has no feature_columns (written before the vol-level
# column): common.tokens.features.NUM_FEATURES, not imported so that opening tokens loads no pandas
BASE_FEATURE_COLUMNS = 3
_ARRAYS = {
    "tokens": ("tokens.bin", np.int16),
    "moves": ("moves.bin", np.float64),
    "features": ("features.bin", np.int16),
}


def token_path(run_dir: Path) -> Path:
    """The run's token set: its `tokens/` folder, or `tokens.npz` in a run made before them."""
    folder = Path(run_dir) / "tokens"
    return folder if folder.is_dir() or not (Path(run_dir) / "tokens.npz").is_file() else Path(run_dir) / "tokens.npz"


@dataclass
class TokenSet:
    """Per asset (in asset-id order) its tokens, the actual normalized move of each candle (NaN
    where undefined) and its split ranges; the per-asset arrays are views of one flat array."""

    symbols: list[str]
    tokens: dict[str, np.ndarray]
    moves: dict[str, np.ndarray]
    ranges: dict[str, dict[str, tuple[int, int]]]
    # model.time_features / volume_input / vol_level_input: (n, 3 or 4) ids per candle (common/tokens/features.py)
    features: Optional[dict[str, np.ndarray]] = None
    folder: Optional[Path] = field(default=None, compare=False)  # the token folder it was opened from
    # opened from a folder: the memory maps the per-asset arrays are views of
    mapped: Optional[dict[str, np.ndarray]] = field(default=None, compare=False, repr=False)

    def flat(self) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """(tokens, features): every asset's arrays end to end in symbol order; the memory maps
        themselves when the set was opened from a folder (no copy)."""
        if self.mapped is not None:
            return self.mapped["tokens"], self.mapped.get("features")
        tokens = np.concatenate([self.tokens[s] for s in self.symbols])
        features = None if self.features is None else np.concatenate([self.features[s] for s in self.symbols])
        return tokens, features

    def save(self, path: Path) -> None:
        """Publish the set as the token folder `path`, whole or not at all (a temporary folder
        renamed into place). A set opened from a folder is hard-linked from it (copied where the
        two lie on different filesystems): its files are never written again."""
        with atomic_folder(path) as tmp:
            if self.folder is None:
                self._write(tmp)
                return
            for name in ["index.json", *(f for f, _ in _ARRAYS.values())]:
                if (self.folder / name).is_file():
                    _link_or_copy(self.folder / name, tmp / name)

    def _write(self, folder: Path) -> None:
        lengths = [len(self.tokens[s]) for s in self.symbols]
        arrays = {"tokens": self.tokens, "moves": self.moves, **({"features": self.features} if self.features else {})}
        sha256 = {}
        for name, per_asset in arrays.items():
            file, dtype = _ARRAYS[name]
            hasher = Hasher()
            with open(folder / file, "wb") as f:
                for s in self.symbols:
                    hasher.write(f, np.ascontiguousarray(per_asset[s], dtype=dtype).tobytes())
            remember_sha256(folder / file, hasher.entry())
            sha256[file] = hasher.entry()["sha256"]
        columns = _columns(self.features)
        write_index(folder, self.symbols, lengths, self.ranges, self.features is not None, sha256, columns)

    @classmethod
    def load(cls, path: Path) -> "TokenSet":
        """A token folder (memory-mapped) or a legacy tokens.npz; a UserError if unreadable."""
        path = Path(path)
        if path.suffix == ".npz":
            return _load_npz(path)
        index = read_index(path)
        symbols, lengths = index["symbols"], index["lengths"]
        bounds = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        n = int(bounds[-1])
        arrays = {}
        for name, (file, dtype) in _ARRAYS.items():
            if name == "features" and not index["features"]:
                continue
            shape = (n, int(index.get("feature_columns", BASE_FEATURE_COLUMNS))) if name == "features" else (n,)
            arrays[name] = _open_array(path / file, dtype, shape, index.get("sha256", {}).get(file))
        return cls(
            symbols=symbols,
            tokens=_views(arrays["tokens"], symbols, bounds),
            moves=_views(arrays["moves"], symbols, bounds),
            ranges={
                s: {split: (int(r[j][0]), int(r[j][1])) for j, split in enumerate(SPLITS)}
                for s, r in zip(symbols, index["ranges"])
            },
            features=_views(arrays["features"], symbols, bounds) if "features" in arrays else None,
            folder=path,
            mapped=arrays,
        )


def _views(flat: np.ndarray, symbols: list[str], bounds: np.ndarray) -> dict[str, np.ndarray]:
    return {s: flat[bounds[i] : bounds[i + 1]] for i, s in enumerate(symbols)}


def _open_array(file: Path, dtype: type, shape: tuple[int, ...], sha256: Optional[str]) -> np.ndarray:
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    try:
        size = file.stat().st_size
    except OSError:
        raise UserError(
            f"{file} is missing: the token folder {file.parent} is incomplete; start a new run "
            "(or prepare the data again)"
        ) from None
    if size != expected:
        raise UserError(
            f"{file} has {size} bytes where its index.json says {expected}: the token folder is "
            "damaged; start a new run (or delete the folder and prepare the data again)"
        )
    if sha256 is not None and file_sha256(file)["sha256"] != sha256:
        raise UserError(
            f"{file} does not match its sha256 in {file.parent / 'index.json'} (changed on disk): the token "
            "folder is damaged. A run's tokens/ are hard links to the token shard it was prepared from, so "
            "the shard is damaged too: `marketgpt data check --config ...` names it, `marketgpt data prepare "
            "--rebuild` with the run's --config and --set rebuilds it; then start a new run"
        )
    if expected == 0:
        return np.zeros(shape, dtype)
    # copy-on-write: torch may wrap it without a read-only warning; nothing is ever written back
    return np.memmap(file, dtype=dtype, mode="c", shape=shape)


def write_index(
    folder: Path,
    symbols: list[str],
    lengths: list[int],
    ranges: dict[str, dict[str, tuple[int, int]]],
    features: bool,
    sha256: dict[str, str],
    feature_columns: int = BASE_FEATURE_COLUMNS,
) -> None:
    """The token folder's index.json (its arrays already written; sha256: file name -> hex digest).
    feature_columns: features.bin's columns (an index written before the vol-level column has none: 3)."""
    atomic_write_json(
        folder / "index.json",
        {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "candles": int(sum(lengths)),
            "symbols": list(symbols),
            "lengths": [int(n) for n in lengths],
            "ranges": [[list(map(int, ranges[s][split])) for split in SPLITS] for s in symbols],
            "dtypes": {"tokens": "int16", "moves": "float64", "features": "int16"},
            "features": bool(features),
            "sha256": dict(sha256),
            "feature_columns": int(feature_columns),
        },
    )


def read_index(folder: Path) -> dict:
    """index.json of a token folder, checked to be of this code's format and version."""
    file = Path(folder) / "index.json"
    try:
        index = json.loads(file.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{folder} is not a token folder (no index.json): it is incomplete; start a new run "
            "(or prepare the data again)"
        ) from None
    except (OSError, ValueError) as e:
        raise UserError(f"{file}: cannot read it ({e}); the token folder is damaged") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT_NAME:
        raise UserError(f"{file}: not a MarketGPT token folder")
    if index.get("version") != FORMAT_VERSION:
        raise UserError(
            f"{folder} was written in token format version {index.get('version')!r}; this code reads "
            f"version {FORMAT_VERSION}: prepare the data again (delete the folder) or use the code "
            "version that wrote it"
        )
    return index


def _columns(features: Optional[dict[str, np.ndarray]]) -> int:
    """The feature arrays' column count (BASE_FEATURE_COLUMNS when there are none to look at)."""
    first = next(iter((features or {}).values()), None)
    return BASE_FEATURE_COLUMNS if first is None else int(first.shape[1])


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)


def _load_npz(path: Path) -> TokenSet:
    try:
        with np.load(path, allow_pickle=False) as z:
            symbols = [str(s) for s in z["symbols"]]
            bounds = np.concatenate([[0], np.cumsum(z["lengths"])])
            tokens, moves, ranges = z["tokens"], z["moves"], z["ranges"]
            features = z["features"] if "features" in z.files else None
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{path}: cannot read the run's token set ({e}); the run folder is incomplete") from None
    return TokenSet(
        symbols=symbols,
        tokens={s: tokens[bounds[i] : bounds[i + 1]] for i, s in enumerate(symbols)},
        moves={s: moves[bounds[i] : bounds[i + 1]] for i, s in enumerate(symbols)},
        ranges={
            s: {split: (int(ranges[i, j, 0]), int(ranges[i, j, 1])) for j, split in enumerate(SPLITS)}
            for i, s in enumerate(symbols)
        },
        features=(
            {s: features[bounds[i] : bounds[i + 1]] for i, s in enumerate(symbols)} if features is not None else None
        ),
    )
