"""Forecaster: a trained run's torch model behind the forecasting path of common.forecasting.core.

    fc = Forecaster.from_run("case_c_crypto/checkpoints/crypto_prototype_20240601_120000")
    histories = fc.load_history(["BTC/USDT", "ETH/USDT"], as_of="2024-06-01T00:00")
    result = fc.forecast(histories, horizon=24, samples=256, seed=0, return_paths=True)

from_run reads a run folder (best_model.pt), from_pretrained a `marketgpt export --format hf`
folder (safetensors, no pickle); sample_tokens draws token paths with the KV cache
(common.model.sampling), every origin and sample in one batch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model

from common.config import Config, load_config
from common.distributed.precision import autocast, inference_precision
from common.errors import UserError
from common.forecasting.core import ForecasterCore
from common.model.gpt import MarketGPT
from common.model.sampling import SamplingSettings, sample_paths
from common.run.checkpoint import load_checkpoint, unwrap_state_dict
from common.run.files import ASSET_INFO_JSON, BEST_MODEL_PT, CONFIG_JSON, TOKENIZER_JSON
from common.run.folder import Run
from common.tokens.ids import RunInfo
from common.tokens.tokenizer import OHLCTokenizer

__all__ = ["PRETRAINED_FILES", "Forecaster"]

# what from_pretrained needs of a model folder (`marketgpt export --format hf` also writes README.md, model_card.json)
PRETRAINED_FILES = ("model.safetensors", CONFIG_JSON, TOKENIZER_JSON, ASSET_INFO_JSON)


class Forecaster(ForecasterCore):
    """A trained model, its tokenizer and asset ids: `from_run(run_dir)`, then `forecast(...)`."""

    def __init__(
        self,
        model: MarketGPT,
        tokenizer: OHLCTokenizer,
        info: RunInfo,
        cfg: Config,
        run_dir: Optional[Path] = None,
        checkpoint_sha256: Optional[str] = None,
        volume_edges: Optional[Sequence[float]] = None,
        precision: str = "fp32",
        interval: Optional[str] = None,
    ) -> None:
        super().__init__(tokenizer, info, cfg, run_dir, checkpoint_sha256, volume_edges, interval)
        self.model = model.eval()
        self.precision = precision  # "fp32" or "bf16" (autocast): common.distributed.precision.inference_precision
        self.device = next(model.parameters()).device

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_run(
        cls,
        run_dir: Union[str, Path],
        device: Union[str, torch.device, None] = None,
        precision: str = "auto",
        interval: Optional[str] = None,
    ) -> "Forecaster":
        """The run's best model (best_model.pt), tokenizer, asset ids and config (a model folder of
        `marketgpt export --format hf` instead: from_pretrained). precision:
        "auto" (bf16 for a run trained in bf16 on a device with bf16 in hardware, else fp32),
        "fp32" or "bf16". interval: which of the run's intervals to forecast (None: its first; one
        it did not train on is a UserError)."""
        if (Path(run_dir) / PRETRAINED_FILES[0]).is_file() and not (Path(run_dir) / BEST_MODEL_PT).exists():
            return cls.from_pretrained(
                run_dir, device=device, precision=precision, interval=interval
            )  # an hf export folder
        run = Run.open(run_dir)
        run_dir, cfg, info = run.path, run.cfg, run.info
        interval, interval_id = info.interval(cfg.data.interval, interval)
        device = torch.device(device) if device is not None else torch.device("cpu")
        precision = inference_precision(precision, run.log().precision, device)
        best = load_checkpoint(run.best_model, map_location=device)
        model = MarketGPT.for_run(cfg.model, info)
        model.default_interval = interval_id
        try:
            model.load_state_dict(unwrap_state_dict(best["model"]))
        except (KeyError, RuntimeError) as e:
            raise UserError(f"{run.best_model} does not fit the run's config.json ({str(e).splitlines()[0]})") from None
        sha = hashlib.sha256(run.best_model.read_bytes()).hexdigest()
        # training stores the fitted volume edges in data_info.json
        edges = run.data_info().get("volume_edges") if cfg.model.reads_features else None
        if cfg.model.volume_input and edges is None:
            raise UserError(
                f"{run_dir}: model.volume_input is on but data_info.json has no volume_edges (the run "
                "predates storing them), so its volume ids cannot be rebuilt; retrain the run"
            )
        fc = cls(
            model.to(device),
            run.tokenizer,
            info,
            cfg,
            run_dir=run_dir,
            checkpoint_sha256=sha,
            volume_edges=edges,
            precision=precision,
            interval=interval,
        )
        return fc

    @classmethod
    def from_pretrained(
        cls,
        folder: Union[str, Path],
        device: Union[str, torch.device, None] = None,
        precision: str = "auto",
        interval: Optional[str] = None,
    ) -> "Forecaster":
        """A model folder (`marketgpt export RUN_DIR --format hf`): model.safetensors, config.json,
        tokenizer.json and asset_info.json, without the run folder and without pickle (JSON and
        safetensors only). precision as in from_run (the training precision is in the weights' header)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise UserError(f"{folder}: no such folder; pass a `marketgpt export --format hf` folder")
        missing = [name for name in PRETRAINED_FILES if not (folder / name).is_file()]
        if missing:
            raise UserError(f"{folder}: missing {', '.join(missing)}; is it a `marketgpt export --format hf` folder?")
        cfg = load_config(folder / CONFIG_JSON)
        tokenizer = OHLCTokenizer.load(folder / TOKENIZER_JSON)
        info = RunInfo.read(folder / ASSET_INFO_JSON, fix="export the run again")
        model = MarketGPT.for_run(cfg.model, info)
        weights = folder / PRETRAINED_FILES[0]
        interval, model.default_interval = info.interval(cfg.data.interval, interval)
        device = torch.device(device) if device is not None else torch.device("cpu")
        try:
            with safe_open(str(weights), framework="pt") as f:
                meta = f.metadata() or {}
            load_model(model, str(weights), strict=True, device=str(device))
            edges = json.loads(meta["volume_edges"]) if "volume_edges" in meta else None
        except (SafetensorError, OSError, ValueError) as e:  # a damaged file; a header that is not JSON
            raise UserError(
                f"{weights}: cannot be read as safetensors ({type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0]}); export the run again"
            ) from None
        except RuntimeError as e:  # missing, unexpected or misshapen tensors: torch's lines after its heading
            detail = " ".join(line.strip() for line in str(e).splitlines()[1:] or [str(e)])
            raise UserError(
                f"{weights} does not fit {folder / CONFIG_JSON} / asset_info.json "
                f"({detail[:300]}{'...' if len(detail) > 300 else ''})"
            ) from None
        if cfg.model.volume_input and edges is None:
            raise UserError(
                f"{weights}: model.volume_input is on but its header has no volume_edges; export the run again"
            )
        precision = inference_precision(precision, meta.get("training_precision"), device)
        fc = cls(
            model.to(device),
            tokenizer,
            info,
            cfg,
            run_dir=folder,
            checkpoint_sha256=meta.get("checkpoint_sha256"),
            volume_edges=edges,
            precision=precision,
            interval=interval,
        )
        return fc

    def sample_tokens(
        self,
        contexts: np.ndarray,
        asset_ids: np.ndarray,
        category_ids: np.ndarray,
        settings: SamplingSettings,
        features: Optional[np.ndarray] = None,
        path_features: Optional[np.ndarray] = None,
        uniforms: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        """(N, samples, horizon) token ids continuing contexts (N, L), drawn from the torch model."""
        dev = torch.device(self.device)
        with autocast(self.precision, dev):  # bf16: matmuls and the KV cache in bf16, sampling in fp32
            return (
                sample_paths(
                    self.model,
                    torch.as_tensor(contexts, device=dev),
                    torch.as_tensor(asset_ids, device=dev),
                    torch.as_tensor(category_ids, device=dev),
                    settings,
                    banned=torch.as_tensor(self.banned_ids(), device=dev),
                    features=None if features is None else torch.as_tensor(features, device=dev),
                    path_features=None if path_features is None else torch.as_tensor(path_features, device=dev),
                    uniforms=None if uniforms is None else torch.as_tensor(uniforms, device=dev),
                )
                .cpu()
                .numpy()
            )
