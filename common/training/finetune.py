"""Fine-tuning: a new run that starts from a trained run's weights (training.init_from).

    marketgpt train --config case_c_crypto/configs/crypto_prototype.json \\
        --init-from case_a_full_market/checkpoints/full_market_20260101_120000 \\
        --set data.categories=crypto --set training.learning_rate=1e-4 --set training.freeze=embeddings

- The parent's tokenizer is reused (token ids must mean the same candles), so the vocabulary,
  the tokenizer section and the model's shape must match the parent's; anything else is refused
  with the key and both values.
- Every weight is copied except the asset and category embeddings, which are matched by name:
  an asset the parent knew keeps its row; a new asset starts from the mean row of its category's
  assets in the parent; a category the parent never saw keeps its fresh init (so do its assets).
  A run of several intervals (data.intervals) matches its interval embedding's rows by interval
  name too: an interval the parent trained on with an embedding keeps its row; every other row
  starts at zero (a one-interval parent has no interval embedding: all rows start at zero, so the
  new run first forecasts every interval as the parent forecast its own).
- training.freeze: "none", "embeddings" (every nn.Embedding: tokens, positions, assets,
  categories; the token embedding is tied to the output head, so the head stays too), or
  "all_but_last_N" (only the last N blocks, the final norm and the head train). Frozen
  parameters have requires_grad False: no gradient, and the optimizer never sees them, so no
  weight decay either. The setting is applied on resume too; the parent init is not.
- Lineage (parent run, checkpoint, its SHA-256, what was copied) goes to config.json under
  "_lineage" and to training_log.json under "lineage".
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from common.atomic import atomic_write_json, read_json
from common.config import config_to_dict, load_config
from common.errors import UserError
from common.run.checkpoint import checkpoint_files, load_checkpoint, unwrap_state_dict
from common.run.files import ASSET_INFO_JSON, BEST_MODEL_PT, CONFIG_JSON, TOKENIZER_JSON
from common.tokens.ids import RunInfo

if TYPE_CHECKING:  # the model module imports pandas, kept out of the training start-up
    from common.model.gpt import MarketGPT

__all__ = ["Parent", "apply_freeze", "check_parent_fits", "init_from_parent", "record_lineage", "resolve_parent"]

_ALL_BUT_LAST = re.compile(r"^all_but_last_(\d+)$")
# matched by name, not copied whole
_EMBEDDING_KEYS = ("asset_emb.weight", "category_emb.weight", "interval_emb.weight")
# model keys that may differ from the parent: they change no weight's shape or meaning
_FREE_MODEL_KEYS = ("dropout",)


@dataclass(frozen=True)
class Parent:
    run_dir: Path
    checkpoint: Path
    config: dict  # the parent's config.json, every key filled (a key it predates at its default)

    @functools.cached_property
    def sha256(self) -> str:
        """The checkpoint's digest, read only when the lineage is written (it can be gigabytes)."""
        return _sha256(self.checkpoint)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_parent(path: str | Path) -> Parent:
    """A run folder (its best_model.pt, else its newest checkpoint) or one checkpoint file."""
    path = Path(path).expanduser()
    if path.is_dir():
        run_dir = path
        best = run_dir / BEST_MODEL_PT
        files = checkpoint_files(run_dir)
        checkpoint = best if best.is_file() else files[-1] if files else None
        if checkpoint is None:
            raise UserError(
                f"--init-from {path}: the run folder has no best_model.pt and no checkpoint yet; "
                "fine-tune from a run that has trained at least one epoch"
            )
    elif path.is_file():
        run_dir, checkpoint = path.parent, path
    else:
        raise UserError(f"--init-from {path}: no such run folder or checkpoint file")
    for name in (CONFIG_JSON, TOKENIZER_JSON, ASSET_INFO_JSON):
        if not (run_dir / name).is_file():
            raise UserError(
                f"--init-from {path}: {run_dir} lacks {name}; the parent must be a run folder "
                "made by `marketgpt train` (or a checkpoint inside one)"
            )
    config = config_to_dict(load_config(run_dir / CONFIG_JSON))
    return Parent(run_dir=run_dir.resolve(), checkpoint=checkpoint.resolve(), config=config)


def check_parent_fits(cfg_dict: dict, parent: Parent) -> None:
    """The new run must read tokens the parent's way and have the parent's shapes."""
    theirs = parent.config
    for key, value in cfg_dict["tokenizer"].items():
        if key in theirs.get("tokenizer", {}) and theirs["tokenizer"][key] != value:
            raise UserError(
                f"--init-from {parent.run_dir}: tokenizer.{key} = {value!r}, the parent's is "
                f"{theirs['tokenizer'][key]!r}; fine-tuning keeps the parent's tokenizer, since token "
                "ids must mean the same candles: drop that --set (a refit tokenizer needs a new run)"
            )
    mine, parents = cfg_dict["model"], theirs.get("model", {})
    if mine["vocab_size"] != parents.get("vocab_size"):
        raise UserError(
            f"--init-from {parent.run_dir}: model.vocab_size = {mine['vocab_size']}, the parent's "
            f"tokenizer has {parents.get('vocab_size')} ids; fine-tuning keeps the parent's tokenizer, "
            "since token ids must mean the same candles: use the parent's vocab_size"
        )
    for key, value in mine.items():
        if key in parents and key not in _FREE_MODEL_KEYS and parents[key] != value:
            raise UserError(
                f"--init-from {parent.run_dir}: model.{key} = {value!r}, the parent's is {parents[key]!r}; "
                "the weights only fit the parent's model shape: use the parent's model section"
            )


def _parent_state(parent: Parent) -> dict[str, torch.Tensor]:
    state = load_checkpoint(parent.checkpoint)
    if not isinstance(state, dict) or "model" not in state:
        raise UserError(f"--init-from {parent.checkpoint}: not a MarketGPT checkpoint (no model weights)")
    return unwrap_state_dict(state["model"])


def _load_body(model: "MarketGPT", state: dict[str, torch.Tensor], parent: Parent) -> None:
    """Load every parent weight but the asset and category embeddings into `model`; a UserError
    names the keys that are missing, unexpected or of another shape."""
    own = model.state_dict()
    body = {k: v for k, v in state.items() if k not in _EMBEDDING_KEYS}
    missing = sorted(set(own) - set(body) - set(_EMBEDDING_KEYS))
    unexpected = sorted(set(body) - set(own))
    wrong = sorted(k for k in body if k in own and body[k].shape != own[k].shape)
    if missing or unexpected or wrong:
        what = "; ".join(
            f"{name}: {', '.join(keys[:3])}"
            for name, keys in (("missing", missing), ("unexpected", unexpected), ("other shape", wrong))
            if keys
        )
        raise UserError(f"--init-from {parent.checkpoint}: the weights do not fit this model ({what})")
    model.load_state_dict(body, strict=False)


@torch.no_grad()
def init_from_parent(model: "MarketGPT", parent: Parent, info: RunInfo) -> dict[str, Any]:
    """Copy the parent's weights into `model` (info: the new run's ids); returns the lineage."""
    state = _parent_state(parent)
    _load_body(model, state, parent)

    theirs = RunInfo.read(parent.run_dir / ASSET_INFO_JSON, fix="--init-from needs an intact parent run")
    their_assets = {r.symbol: r for r in theirs.assets}
    their_cats = theirs.categories
    old_assets, old_cats = state["asset_emb.weight"], state["category_emb.weight"]
    assets, cats = model.asset_emb.weight, model.category_emb.weight
    copied: dict[str, list] = {
        "assets": [],
        "assets_from_category_mean": [],
        "assets_fresh": [],
        "categories": [],
        "categories_fresh": [],
    }
    for name, new_id in info.categories.items():
        if name in their_cats:
            cats[new_id] = old_cats[their_cats[name]]
            copied["categories"].append(name)
        else:
            copied["categories_fresh"].append(name)
    for rec in info.assets:
        old = their_assets.get(rec.symbol)
        if old is not None:
            assets[rec.id] = old_assets[old.id]
            copied["assets"].append(rec.symbol)
            continue
        peers = [r.id for r in theirs.assets if r.category == rec.category]
        if peers:
            assets[rec.id] = old_assets[peers].mean(dim=0)
            copied["assets_from_category_mean"].append(rec.symbol)
        else:
            copied["assets_fresh"].append(rec.symbol)
    interval_emb = getattr(model, "interval_emb", None)
    if interval_emb is not None:
        _copy_intervals(
            interval_emb.weight,
            state.get("interval_emb.weight"),
            list(theirs.intervals),
            list(info.intervals),
            copied,
        )
    return {
        "parent_run": str(parent.run_dir),
        "checkpoint": str(parent.checkpoint),
        "checkpoint_sha256": parent.sha256,
        "tokenizer": str(parent.run_dir / TOKENIZER_JSON),
        "weights": "all, except asset and category embeddings (matched by name)",
        **copied,
    }


def _copy_intervals(
    rows: torch.Tensor,
    old: torch.Tensor | None,
    their_intervals: list[str],
    intervals: list[str],
    copied: dict[str, list],
) -> None:
    """The interval embedding's rows: the parent's row of the same interval, else zero."""
    copied["intervals"], copied["intervals_zero"] = [], []
    for new_id, interval in enumerate(intervals):
        if old is not None and interval in their_intervals:
            rows[new_id] = old[their_intervals.index(interval)]
            copied["intervals"].append(interval)
        else:
            rows[new_id] = 0.0
            copied["intervals_zero"].append(interval)


def apply_freeze(model: "MarketGPT", spec: str) -> list[str]:
    """Set requires_grad per training.freeze; returns the frozen parameter names."""
    if spec == "none":
        return []
    if spec == "embeddings":
        frozen = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    else:
        match = _ALL_BUT_LAST.match(spec)
        assert match is not None  # the config checks training.freeze
        n = int(match.group(1))
        trainable = [
            *model.blocks[-n:],
            model.ln_f,
            *(m for m in (getattr(model, "lm_head", None), getattr(model, "head", None)) if m is not None),
        ]
        keep = {id(p) for m in trainable for p in m.parameters()}  # a tied token embedding is the head's
        frozen = {id(p) for p in model.parameters() if id(p) not in keep}
    names = []
    for name, p in model.named_parameters():
        if id(p) in frozen:
            p.requires_grad_(False)
            names.append(name)
    return names


def record_lineage(run_dir: Path, lineage: dict[str, Any]) -> None:
    """config.json gains "_lineage" (load_config skips "_" keys, so resuming reads it as before)."""
    config = read_json(run_dir / CONFIG_JSON)
    config["_lineage"] = lineage
    atomic_write_json(run_dir / CONFIG_JSON, config)
