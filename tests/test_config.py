"""Strict case configs: good and bad fixture files, overrides, the shipped case files, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import Config, ConfigError, load_config, save_config
from common.paths import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
CASE_CONFIGS = {
    "case_a_full_market": REPO_ROOT / "case_a_full_market/configs/full_market_config.json",
    "case_b_reduced": REPO_ROOT / "case_b_reduced/configs/reduced_config.json",
    "case_c_crypto": REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json",
}

# Each bad fixture and the words its one-line error must contain (besides the file name).
BAD = {
    "unknown_top_key": ["unknown key 'experimnt'", "did you mean 'experiment'"],
    "unknown_model_key": ["unknown key 'model.d_modle'", "did you mean 'model.d_model'"],
    "unknown_section": ["unknown key 'trainig'", "did you mean 'training'"],
    "wrong_type_int": ["'training.batch_size' must be an integer", "string"],
    "wrong_type_bool_for_int": ["'training.epochs' must be an integer", "boolean"],
    "float_for_int": ["'model.num_layers' must be an integer", "6.5"],
    "section_not_object": ["'model' must be an object"],
    "heads_not_divisor": ["'model.d_model' (100) must be divisible by model.num_heads (8)"],
    "ratios_not_one": ["'data.train_ratio'", "must sum to 1", "1.1"],
    "negative_lr": ["'training.learning_rate' must be positive"],
    "zero_batch": ["'training.batch_size' must be positive"],
    "vocab_too_small": ["'model.vocab_size' (8) is too small", "special tokens"],
    "bad_literal": ["'data.source' = 'yahoo' is not one of 'sample', 'download'"],
    "bad_date": ["'data.start_date' = '2020-13-01' is not a date"],
    "bad_quote_currency": ["'data.quote_currency' = 'us dollar' is not a currency code like USD"],
    "purge_too_small": ["'data.purge_gap' (10) must be at least model.context_length (128)"],
    "dropout_one": ["'model.dropout' must be in [0, 1)"],
    "market_mask_without_market": ["'model.market_mask' hides market ids: it needs model.market_context = true"],
    "null_not_allowed": ["'training.epochs' may not be null"],
    "counts_not_int": ["'data.universe_counts.crypto' must be an integer"],
    "not_json": ["not valid JSON", "line 1"],
    "not_object": ["top level must be a JSON object"],
    "files_without_dir": ["'data.files_dir' must name a folder of candle files", "data.source = 'files'"],
    "files_universe_no_category": [
        "'data.default_category' = None must be one of",
        "crypto",
        "data.universe = 'files'",
    ],
    "files_universe_wrong_source": ["'data.universe' = 'files' needs data.source = 'files'"],
    "freeze_too_deep": ["'training.freeze' = 'all_but_last_7': N must be from 1 to model.num_layers (6)"],
    "categories_unknown": ["'data.categories' names unknown category 'stocks'"],
    "synthetic_unknown_key": [
        "'data.synthetic.asets' is not a setting of the synthetic market",
        "did you mean 'assets'",
    ],
    "synthetic_bad_value": ["'data.synthetic.garch_beta' = 0.85 plus garch_alpha must be < 1 (stationary)"],
    "synthetic_wrong_type": ["'data.synthetic.candles' = 'lots' must be an integer"],
    "synthetic_interval": ["'data.synthetic.interval' is not read", "data.interval; set that instead"],
    "synthetic_without_source": ["'data.synthetic' is read only with data.source = 'synthetic' (here 'sample')"],
}


def test_every_bad_fixture_has_an_expectation():
    assert {p.stem for p in (FIXTURES / "bad").glob("*.json")} == set(BAD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_config_names_file_and_key(name):
    path = FIXTURES / "bad" / f"{name}.json"
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    assert "\n" not in message
    for fragment in BAD[name]:
        assert fragment in message


@pytest.mark.parametrize("path", sorted((FIXTURES / "good").glob("*.json")), ids=lambda p: p.stem)
def test_good_configs_load(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)


def test_defaults_fill_what_a_file_leaves_out():
    cfg = load_config(FIXTURES / "good" / "tiny_rope.json")
    assert cfg.model.positional == "rope"
    assert cfg.model.d_model == 32
    assert cfg.training.max_steps_per_epoch is None
    assert cfg.training.gradient_clip == Config().training.gradient_clip
    assert cfg.data.universe_counts == {"crypto": 2}
    assert cfg.tokenizer.shape_bins == 4


# The seed guide's values, exactly.
SEED = {
    "case_a_full_market": dict(
        model=dict(
            vocab_size=4096,
            context_length=512,
            d_model=768,
            num_layers=12,
            num_heads=12,
            d_ff=3072,
            dropout=0.1,
            asset_embed_dim=64,
            category_embed_dim=32,
        ),
        training=dict(batch_size=32, learning_rate=3e-4, epochs=100, early_stopping_patience=15, gradient_clip=1.0),
        data=dict(train_ratio=0.70, val_ratio=0.15, test_ratio=0.15),
    ),
    "case_b_reduced": dict(
        model=dict(
            vocab_size=2048,
            context_length=256,
            d_model=512,
            num_layers=8,
            num_heads=8,
            d_ff=2048,
            dropout=0.1,
            asset_embed_dim=32,
            category_embed_dim=16,
        ),
        training=dict(batch_size=32, learning_rate=5e-4, epochs=100, early_stopping_patience=10, gradient_clip=1.0),
    ),
    "case_c_crypto": dict(
        model=dict(vocab_size=1024, context_length=128, d_model=256, num_layers=6, num_heads=8, d_ff=1024, dropout=0.1),
        training=dict(batch_size=32, learning_rate=3e-4, epochs=50, early_stopping_patience=10, gradient_clip=1.0),
    ),
}


@pytest.mark.parametrize("case", sorted(SEED))
def test_case_configs_hold_the_seed_values(case):
    cfg = load_config(CASE_CONFIGS[case])
    for section, values in SEED[case].items():
        for key, value in values.items():
            assert getattr(getattr(cfg, section), key) == value, f"{case}: {section}.{key}"
    assert cfg.slurm.partition == "long" and cfg.slurm.gpus_per_node == 2
    assert (
        sum(cfg.data.universe_counts.values())
        == {"case_a_full_market": 600, "case_b_reduced": 100, "case_c_crypto": 20}[case]
    )


def test_overrides_are_parsed_to_the_field_type():
    cfg = load_config(
        CASE_CONFIGS["case_c_crypto"],
        [
            "training.batch_size=16",
            "training.learning_rate=1e-3",
            "training.compile=true",
            "data.source=sample",
            "data.end_date=2020-01-01",
            "training.max_steps_per_epoch=null",
            "model.dropout=0",
            "experiment=my run",
        ],
    )
    assert cfg.training.batch_size == 16 and isinstance(cfg.training.batch_size, int)
    assert cfg.training.learning_rate == 1e-3
    assert cfg.training.compile is True
    assert cfg.data.source == "sample"
    assert cfg.data.end_date == "2020-01-01"
    assert cfg.training.max_steps_per_epoch is None
    assert cfg.model.dropout == 0.0 and isinstance(cfg.model.dropout, float)
    assert cfg.experiment == "my run"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("training.batch_sze=16", "did you mean 'training.batch_size'"),
        ("trainig.batch_size=16", "did you mean 'training'"),
        ("training.batch_size=sixteen", "is not an integer"),
        ("training.batch_size=16.5", "must be an integer"),
        ("training.compile=yes", "is not true or false"),
        ("model=3", "is a section"),
        ("training.batch_size", "expected section.key=value"),
        ("training.batch_size=0", "must be positive"),
        ("training.batch_size=__import__('os')", "is not an integer"),
    ],
)
def test_bad_overrides(override, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(CASE_CONFIGS["case_c_crypto"], [override])
    assert fragment in str(err.value)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(CASE_CONFIGS["case_b_reduced"], ["training.epochs=7"])
    save_config(cfg, tmp_path / "config.json")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["training"]["epochs"] == 7 and saved["tokenizer"]["shape_bins"] == cfg.tokenizer.shape_bins
    assert load_config(tmp_path / "config.json") == cfg


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(FIXTURES / "nope.json")


@pytest.mark.parametrize(
    "command,config,overrides,needle",
    [
        ("model-info", "bad", [], "model.d_modle"),
        ("train", "bad", [], "model.d_modle"),
        ("train", "case", ["--set", "training.batch_size=zero"], "training.batch_size"),
    ],
    ids=["model-info", "train", "train --set"],
)
def test_cli_reports_a_bad_config_on_one_line_and_exits_2(command, config, overrides, needle):
    path = {
        "bad": FIXTURES / "bad" / "unknown_model_key.json",
        "case": REPO_ROOT / "case_c_crypto" / "configs" / "crypto_prototype.json",
    }[config]
    proc = subprocess.run(
        [sys.executable, "-m", "common.cli", command, "--config", str(path), *overrides],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr  # the README's promise: 2 for a usage or config error
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"marketgpt {command}: error: ") and needle in lines[0]
    assert str(path) in lines[0] or overrides


def test_start_date_max_is_each_asset_whole_history():
    cfg = load_config(CASE_CONFIGS["case_c_crypto"], ["data.start_date=max", "data.end_date=2024-01-01"])
    assert cfg.data.start_date == "max"
    with pytest.raises(ConfigError, match=r"'data.start_date' = 'maximum' is not a date like 2015-01-31 \(or \"max\""):
        load_config(CASE_CONFIGS["case_c_crypto"], ["data.start_date=maximum"])
    # the synthetic market needs a first slot
    with pytest.raises(ConfigError, match=r"'data.start_date' = 'max' has no first slot for the synthetic market"):
        load_config(CASE_CONFIGS["case_c_crypto"], ["data.source=synthetic", "data.start_date=max"])
