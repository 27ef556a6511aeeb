"""Tiny randomly initialised foundation models, built with each library's own classes and saved to a
folder as a user's download would be (tests only: nothing is fetched)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from common.evaluation.foundation_baselines import QUANTILES


def tiny_chronos(path: Path) -> str:
    """A Chronos-Bolt model of 16 dimensions and one encoder and decoder layer."""
    from chronos.chronos_bolt import ChronosBoltModelForForecasting
    from transformers import T5Config

    cfg = T5Config(
        d_model=16,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        d_kv=8,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=0,
        architectures=["ChronosBoltModelForForecasting"],
        chronos_pipeline_class="ChronosBoltPipeline",
        chronos_config={
            "context_length": 64,
            "prediction_length": 16,
            "input_patch_size": 8,
            "input_patch_stride": 8,
            "quantiles": list(QUANTILES),
            "use_reg_token": True,
        },
    )
    ChronosBoltModelForForecasting(cfg).save_pretrained(path)
    return str(path)


def tiny_chronos2(path: Path) -> str:
    """A Chronos-2 model of 16 dimensions and one layer, with the 13 quantile levels it predicts."""
    from chronos.chronos2.config import Chronos2CoreConfig
    from chronos.chronos2.model import Chronos2Model

    levels = [0.01, 0.05, *QUANTILES, 0.95, 0.99]
    cfg = Chronos2CoreConfig(
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        architectures=["Chronos2Model"],
        chronos_pipeline_class="Chronos2Pipeline",
        chronos_config={
            "context_length": 64,
            "output_patch_size": 8,
            "input_patch_size": 8,
            "input_patch_stride": 8,
            "quantiles": levels,
            "use_reg_token": True,
            "use_arcsinh": True,
            "max_output_patches": 8,
        },
    )
    Chronos2Model(cfg).save_pretrained(path)
    return str(path)


def tiny_timesfm(path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A TimesFM 2.5 model of 32 dimensions and one layer. The library's torch class reads its
    definition from a class attribute: `monkeypatch` swaps it for as long as the caller keeps it,
    since loading the saved weights needs the same shapes."""
    from timesfm.timesfm_2p5 import timesfm_2p5_base as base, timesfm_2p5_torch as tt

    d = base.TimesFM_2p5_200M_Definition()
    layer = dataclasses.replace(d.stacked_transformers.transformer, model_dims=32, hidden_dims=32, num_heads=2)
    tiny = dataclasses.replace(
        d,
        tokenizer=dataclasses.replace(d.tokenizer, hidden_dims=32, output_dims=32),
        stacked_transformers=dataclasses.replace(d.stacked_transformers, num_layers=1, transformer=layer),
        output_projection_point=dataclasses.replace(d.output_projection_point, input_dims=32, hidden_dims=32),
        output_projection_quantiles=dataclasses.replace(d.output_projection_quantiles, input_dims=32, hidden_dims=32),
    )
    monkeypatch.setattr(tt.TimesFM_2p5_200M_torch_module, "config", tiny)
    tt.TimesFM_2p5_200M_torch(torch_compile=False).save_pretrained(path)
    return str(path)
