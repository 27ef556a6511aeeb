"""data.source = "synthetic": data.synthetic checked as the spec checks it, candles made only when
looked up (a spy on the generator), data.categories without generating anything, and a tiny
training run on it end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import common.data.synthetic as synthetic
from common.cli import main
from common.config import ConfigError, load_config
from common.config.synthetic import SyntheticSpecError, spec_from_dict
from common.data.loading import load_market_data
from common.data.synthetic import SyntheticSpec, generate_asset, synthetic_spec
from common.errors import UserError
from common.paths import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
CASE_C = REPO_ROOT / "case_c_crypto" / "configs" / "crypto_prototype.json"


def _cfg(synthetic: str, *more: str):
    return load_config(CASE_C, ["data.source=synthetic", f"data.synthetic={synthetic}", *more])


# --------------------------------------------------------------------------- the config


def test_the_spec_is_data_synthetic_at_the_configs_interval_and_start():
    spec = synthetic_spec(load_config(FIXTURES / "good" / "synthetic.json").data)
    assert spec == SyntheticSpec(
        assets=3, candles=20_000, interval="1h", start="2024-01-01", gap_prob=0.05, categories=("crypto", "fx")
    )
    assert isinstance(spec.candles, int)  # 2e4 in the JSON
    # the documented command line (docs/data.md)
    spec = synthetic_spec(_cfg('{"assets": 50, "candles": 20000}').data)
    assert (spec.assets, spec.candles, spec.interval, spec.start) == (50, 20_000, "1h", "2018-01-01")
    assert synthetic_spec(load_config(CASE_C, ["data.source=synthetic"]).data) == SyntheticSpec(
        interval="1h", start="2018-01-01"
    )


@pytest.mark.parametrize(
    "synthetic, more, fragment",
    [
        (
            '{"asets": 5}',
            [],
            "'data.synthetic.asets' is not a setting of the synthetic market (did you mean 'assets'?)",
        ),
        ('{"nu": 2}', [], "'data.synthetic.nu' = 2.0 must be > 2 (the t needs a finite variance)"),
        (
            '{"categories": ["moon"]}',
            [],
            "'data.synthetic.categories' = ('moon',) must be a non-empty list of us_stock",
        ),
        ('{"categories": "crypto"}', [], "'data.synthetic.categories' = 'crypto' must be a list of strings"),
        ('{"seed": true}', [], "'data.synthetic.seed' = True must be an integer"),
        (
            '{"start": "2020-01-01"}',
            [],
            "'data.synthetic.start' is not read: the synthetic market's start is data.start_date",
        ),
        ('{"assets": 5}', ["data.source=sample"], "'data.synthetic' is read only with data.source = 'synthetic'"),
        ("{assets: 5}", [], "'data.synthetic' must be an object, got text that is not JSON '{assets: 5}'"),
    ],
)
def test_bad_synthetic_settings_name_the_key(synthetic, more, fragment):
    with pytest.raises(ConfigError) as err:
        _cfg(synthetic, *more)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_spec_from_dict_types_values_and_names_the_unknown_key():
    spec = spec_from_dict({"assets": 2.0, "nu": 6, "categories": ["fx"]}, {"interval": "4h"})
    assert spec == SyntheticSpec(assets=2, nu=6.0, categories=("fx",), interval="4h")
    assert isinstance(spec.assets, int) and isinstance(spec.nu, float)
    with pytest.raises(SyntheticSpecError, match=r"SyntheticSpec.zzz is not a setting .*valid keys: assets, ") as err:
        spec_from_dict({"zzz": 1})
    assert err.value.key == "zzz"
    with pytest.raises(SyntheticSpecError, match="SyntheticSpec.interval is not a setting"):  # the caller sets it
        spec_from_dict({"interval": "1h"}, {"interval": "1d"})
    with pytest.raises(SyntheticSpecError, match="SyntheticSpec.assets = 1.5 must be an integer"):
        spec_from_dict({"assets": 1.5})


def test_the_config_loads_without_pandas():
    """data.synthetic is checked by the spec, which lives on the root floor without pandas."""
    code = (
        f"import sys\nfrom common.config import load_config\n"
        f"load_config({str(FIXTURES / 'good' / 'synthetic.json')!r})\nprint('pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "False"


# --------------------------------------------------------------------------- lazy candles


@pytest.fixture
def made(monkeypatch) -> list[int]:
    """The asset indices generated, in order (a spy on the generator of one asset)."""
    calls: list[int] = []
    real = synthetic._asset

    def spy(spec, i, market):
        calls.append(i)
        return real(spec, i, market)

    monkeypatch.setattr(synthetic, "_asset", spy)
    return calls


def test_candles_are_made_only_when_looked_up(made):
    cfg = _cfg('{"assets": 5, "candles": 300, "gap_prob": 0.1, "categories": ["crypto", "fx"], "seed": 3}')
    market = load_market_data(cfg.data, REPO_ROOT / "case_c_crypto")
    assert [(a.symbol, a.source, a.category) for a in market.assets] == [
        ("SYN0000", "synthetic", "crypto"),
        ("SYN0001", "synthetic", "fx"),
        ("SYN0002", "synthetic", "crypto"),
        ("SYN0003", "synthetic", "fx"),
        ("SYN0004", "synthetic", "crypto"),
    ]
    assert market.interval == "1h"
    assert len(market.candles) == 5 and list(market.candles) == [a.symbol for a in market.assets]
    assert "SYN0003" in market.candles and "SYN0009" not in market.candles
    assert made == []  # listing, counting and `in` generate nothing
    frame = market.candles["SYN0003"]
    assert made == [3]
    market.candles["SYN0003"]
    assert made == [3, 3]  # not kept: looked up again, made again
    pd.testing.assert_frame_equal(frame, generate_asset(synthetic_spec(cfg.data), 3).candles)
    assert frame.index[0] == pd.Timestamp("2018-01-01", tz="UTC")  # data.start_date
    with pytest.raises(KeyError):
        market.candles["SYN0009"]
    with pytest.raises(TypeError):
        market.candles["SYN0000"] = frame  # read-only


def test_data_categories_keep_the_candles_lazy(made):
    cfg = _cfg('{"assets": 5, "candles": 300, "categories": ["crypto", "fx"]}', "data.categories=fx")
    market = load_market_data(cfg.data, REPO_ROOT / "case_c_crypto")
    assert [a.symbol for a in market.assets] == list(market.candles) == ["SYN0001", "SYN0003"]
    assert made == [] and "SYN0000" not in market.candles
    market.candles["SYN0001"]
    assert made == [1]
    with pytest.raises(UserError, match="no asset of commodity"):
        load_market_data(
            _cfg('{"assets": 2, "categories": ["crypto", "fx"]}', "data.categories=commodity").data,
            REPO_ROOT / "case_c_crypto",
        )


# --------------------------------------------------------------------------- training on it


TINY = {
    "experiment": "syn",
    "model": {
        "vocab_size": 64,
        "context_length": 8,
        "d_model": 32,
        "num_layers": 1,
        "num_heads": 2,
        "d_ff": 64,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
    },
    "training": {
        "batch_size": 8,
        "epochs": 1,
        "max_steps_per_epoch": 2,
        "eval_max_batches": 1,
        "warmup_steps": 1,
        "device": "cpu",
        "scorecard_origins": 0,
        "vol_reversion": False,
    },
    "data": {
        "source": "synthetic",
        "interval": "4h",
        "start_date": "2022-01-01",
        "synthetic": {"assets": 3, "candles": 400, "categories": ["crypto", "us_stock"], "gap_prob": 0.05},
    },
}


def test_train_on_the_synthetic_market_end_to_end(tmp_path):
    config = tmp_path / "case" / "configs" / "syn.json"  # a case folder with no universe file
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(TINY))
    assert main(["train", "--config", str(config)]) == 0
    (run,) = (tmp_path / "case" / "checkpoints").glob("syn_*")
    info = json.loads((run / "data_info.json").read_text())
    assert info["source"] == "synthetic" and sorted(info["assets"]) == ["SYN0000", "SYN0001", "SYN0002"]
    assert info["assets"]["SYN0000"]["gaps_filled"] > 0  # crypto: its gaps are filled, as for real crypto
    assets = json.loads((run / "asset_info.json").read_text())["assets"]
    assert [(a["source"], a["category"]) for a in assets] == [
        ("synthetic", "crypto"),
        ("synthetic", "us_stock"),
        ("synthetic", "crypto"),
    ]
    saved = json.loads((run / "config.json").read_text())
    assert saved["data"]["synthetic"]["categories"] == ["crypto", "us_stock"]
    assert (run / "test_results.json").is_file()
