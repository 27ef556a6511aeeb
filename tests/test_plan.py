"""`marketgpt plan`: the arithmetic on hand-made figures, the three case configs from the configs
alone (no network: pytest-socket blocks it), and the plan of the shipped sample against what a
real run recorded in data_info.json and training_log.json."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest

import common.data.synthetic as synthetic
from common.cli import main
from common.commands.plan import GPU_RATES, build_plan, gpu_rate, one_gpu, one_gpu_command, plan_of_run
from common.commands.plan_data import data_figures
from common.commands.plan_figures import (
    DataFigures,
    OneGPU,
    Plan,
    Rate,
    asset_windows,
    epoch_windows,
    plan_warnings,
    steps_per_epoch,
)
from common.config import load_config
from common.data.cache import CandleCache
from common.data.loading import load_market_data
from common.data.prepare import prepare_data
from common.model.sizing import meta_model
from common.paths import REPO_ROOT
from common.training.batches import build_windows

CASES = {
    "a": "case_a_full_market/configs/full_market_config.json",
    "b": "case_b_reduced/configs/reduced_config.json",
    "c": "case_c_crypto/configs/crypto_prototype.json",
}
# a model case C's estimated 1.1M hourly candles support (tens of thousands of parameters)
SMALL = ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.d_ff=64"]


def _sets(overrides):
    return [arg for kv in overrides for arg in ("--set", kv)]


def _plan_text(capsys, tmp_path, case: str, overrides=()) -> str:
    # an empty cache folder: the figures come from the config and universe alone, whatever is cached here
    args = ["plan", "--config", str(REPO_ROOT / CASES[case]), "--set", f"data.cache_dir={tmp_path / 'empty'}"]
    assert main(args + _sets(overrides)) == 0
    return capsys.readouterr().out


# --------------------------------------------------------------------------- the arithmetic


def test_windows_and_steps_follow_token_windows():
    assert asset_windows(100, 17, 1) == 84 and asset_windows(100, 17, 2) == 42 and asset_windows(10, 17, 1) == 0
    lengths = {"x": 60, "y": 45}
    ranges = {s: {"train": (0, n), "val": (0, n), "test": (0, n)} for s, n in lengths.items()}
    tokens = {s: np.zeros(n, dtype=np.int64) for s, n in lengths.items()}
    for stride in (1, 3, 7):
        w = build_windows(
            tokens,
            ranges,
            {"x": 0, "y": 1},
            {"x": 0, "y": 0},
            8,
            strides={"train": 1, "val": 8, "test": 8},
            epoch_stride=stride,
        )
        per_asset = [asset_windows(n, 9, 1) for n in lengths.values()]
        assert sum(per_asset) == w.num_windows("train")
        assert epoch_windows(per_asset, stride) == w.epoch_windows("train")
    assert steps_per_epoch(1000, 16, 2, 1, None) == 31
    assert steps_per_epoch(1000, 16, 2, 2, None) == 15
    assert steps_per_epoch(1000, 16, 2, 1, 5) == 5


def _plan(**changes) -> Plan:
    fields = dict(
        data=DataFigures({"train": 1000, "val": 100, "test": 100}, 900, 900, "estimated"),
        parameters=2000,
        context_length=8,
        epochs=5,
        steps_per_epoch=10,
        global_batch=4,
        epoch_stride=1,
        gpus=2,
        gpu_type="a100",
        gpu_rate=Rate(100.0, "test"),
        cpu_rate=Rate(10.0, "test"),
        memory_gb=1.0,
        slurm_time_s=80,
        max_requeues=20,
    )
    fields.update(changes)
    return Plan(**fields)


def test_plan_figures_on_hand_made_numbers():
    plan = _plan()
    assert plan.tokens_per_parameter == 0.5
    assert plan.tokens_per_epoch == 10 * 4 * 8 == 320
    assert plan.times_seen == pytest.approx(5 * 320 / 1000)
    assert plan.epoch_seconds(plan.gpu_rate, 2) == pytest.approx(1.6)
    assert plan.run_seconds == pytest.approx(8.0)
    assert plan.epoch_seconds(plan.cpu_rate) == pytest.approx(32.0)


def test_warnings_on_hand_made_numbers():
    (tokens,) = plan_warnings(_plan(slurm_time_s=70))  # 8 s in 70 s: neither too long nor too short
    assert "0.5 unique training tokens per parameter" in tokens and "data.epoch_stride=" not in tokens
    assert "2x more training candles" in tokens
    (long,) = plan_warnings(_plan(parameters=500, slurm_time_s=3))  # 8 s in 3 s slots
    assert "it will requeue about 2 time(s)" in long and "--set slurm.time=1:00:00" in long
    (short,) = plan_warnings(_plan(parameters=500, slurm_time_s=3600))
    assert "0.2% of slurm.time" in short and "--set slurm.time=1:00:00" in short
    assert plan_warnings(_plan(parameters=500, slurm_time_s=70)) == []


def test_a_market_context_plan_warns_of_an_interval_with_one_series():
    row = {"series": 1, "candles": 10, "train_tokens": 8, "val_tokens": 1, "test_tokens": 1}
    data = DataFigures({"train": 1000, "val": 100, "test": 100}, 900, 900, "exact")
    data.by = {"interval": {"1d": dict(row, series=5), "1h": row}, "category": {}}
    (warning,) = plan_warnings(_plan(data=data, parameters=500, slurm_time_s=70, market_context=True))
    assert "1h has 1:" in warning and "1d" not in warning and "--set model.market_context=false" in warning
    assert plan_warnings(_plan(data=data, parameters=500, slurm_time_s=70)) == []  # the market not read


def _one(tokens_per_s: float) -> OneGPU:
    return OneGPU(Rate(tokens_per_s, "graphs"), "CUDA graphs", 4, 0.5, "sbatch ONE")


def test_one_gpu_with_cuda_graphs_is_advised_only_where_it_beats_the_ddp_job():
    (advice,) = plan_warnings(_plan(parameters=500, slurm_time_s=70, one_gpu=_one(250.0)))
    assert "one a100 with CUDA graphs at batch 4 (as many windows per step as this job)" in advice
    assert "about 250 tokens/s, 1.25x the 200 of 2x a100 under DDP" in advice and "(2 x 100)" in advice
    assert "about 6 s for 5 epochs instead of 8 s" in advice and "about 0.5 GB of GPU memory" in advice
    assert "Submit it on one GPU: sbatch ONE;" in advice and "training.seed" in advice
    for one_gpu_rate, gpus in ((215.0, 2), (150.0, 2), (250.0, 1)):  # within the spread; slower; a one-GPU job
        plan = _plan(parameters=500, slurm_time_s=70, gpus=gpus, one_gpu=_one(one_gpu_rate))
        assert plan_warnings(plan) == []


@pytest.mark.parametrize("case, advised", [("a", False), ("b", True), ("c", True)])
def test_the_plan_says_when_one_gpu_beats_the_case_job(capsys, tmp_path, monkeypatch, case, advised):
    """The case configs as shipped (2 A100s, batch 32 each, compile_mode unset): cases B and C are
    launch-bound enough that one GPU with CUDA graphs at batch 64, the job's 64 windows per step,
    outruns both GPUs without them; case A's model is compute-bound, and DDP pays."""
    monkeypatch.chdir(REPO_ROOT)
    text = _plan_text(capsys, tmp_path, case)
    (advice,) = [line for line in text.splitlines() if line.startswith("WARNING: one a100")] or [None]
    m = load_config(REPO_ROOT / CASES[case]).model
    rates = GPU_RATES[(m.d_model, m.num_layers, m.context_length)]
    assert (rates.graphs_64 > 1.1 * 2 * rates.plain) == advised == (advice is not None)
    if advised:
        assert "with CUDA graphs at batch 64" in advice and "of 2x a100 under DDP" in advice
        assert f"{rates.graphs_64 / (2 * rates.plain):.2f}x" in advice
        script = next((REPO_ROOT / CASES[case]).parent.parent.glob("slurm_scripts/*.sh")).relative_to(REPO_ROOT)
        command = f"sbatch --ntasks-per-node=1 --gres=gpu:a100:1 {script} --set data.cache_dir={tmp_path / 'empty'} "
        assert command + "--set training.batch_size=64;" in advice


def _rate(cfg, flops_per_token, gpus=1):
    return gpu_rate(cfg.model, cfg.training, cfg.slurm.gpu_type, flops_per_token, gpus)


def _one_gpu(cfg, *args):
    return one_gpu(cfg.model, cfg.training, cfg.slurm.gpu_type, *args)


def test_one_gpu_at_its_best_and_its_command(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    config = REPO_ROOT / "case_c_crypto/configs/crypto_multi_interval.json"  # not the script's config
    sets = ["training.compile=false", "slurm.time=1:00:00", "training.batch_size=16"]
    cfg = load_config(config, sets)
    model = meta_model(cfg.model, cfg.data)
    best = _one_gpu(cfg, model.num_parameters(), model.flops_per_token(), 2, config, sets)
    assert best.mode == "CUDA graphs" and best.batch_size == 32  # the job's 2 x 16 windows per step
    assert best.rate.tokens_per_s == pytest.approx(GPU_RATES[(256, 6, 128)].graphs * 312 / 989.5)
    assert best.command == (
        "marketgpt submit --case case_c_crypto --config case_c_crypto/configs/crypto_multi_interval.json "
        "--set slurm.gpus_per_node=1 --set training.batch_size=32 --set training.compile=true"
    )
    assert _one_gpu(cfg, model.num_parameters(), model.flops_per_token(), 1, config) is None  # a one-GPU job
    cfg.training.gradient_checkpointing = True  # no CUDA graphs on one GPU either: plain compile, no advice
    best = _one_gpu(cfg, model.num_parameters(), model.flops_per_token(), 2, config)
    assert (
        best.mode == "plain torch.compile"
        and best.rate.tokens_per_s == _rate(cfg, model.flops_per_token(), 2).tokens_per_s
    )
    assert one_gpu_command(None, ["x.y=a b"], "h100", ["training.batch_size=64"]) == (
        "sbatch --ntasks-per-node=1 --gres=gpu:h100:1 <the case's script> --set 'x.y=a b' --set training.batch_size=64"
    )


def test_the_training_banner_advises_one_gpu_without_a_config_path():
    cfg = load_config(REPO_ROOT / CASES["c"])
    model = meta_model(cfg.model, cfg.data)
    line = plan_of_run(
        cfg,
        {"X": {"train": (0, 500_000), "val": (600_000, 700_000), "test": (800_000, 900_000)}},
        train_windows=499_872,
        epoch_windows=499_872,
        parameters=model.num_parameters(),
        flops_per_token=model.flops_per_token(),
        steps=7_810,
        world_size=2,
    )
    assert "<the case's script> --set training.batch_size=64;" in line


def test_gpu_rate_scales_by_peak_and_by_flops_per_token():
    cfg = load_config(REPO_ROOT / CASES["c"], ["slurm.gpu_type=h100"])
    fpt = meta_model(cfg.model, cfg.data).flops_per_token()
    plain, graphs, graphs_64, table_fpt = GPU_RATES[(256, 6, 128)]
    assert fpt == table_fpt  # the table's FLOPs per token are the case's model's
    assert _rate(cfg, fpt, gpus=2).tokens_per_s == plain  # DDP: plain torch.compile
    one = _rate(cfg, fpt, gpus=1)  # one GPU: CUDA graphs (training.compile_mode=auto)
    assert one.tokens_per_s == graphs and "CUDA graphs, batch 32" in one.label
    cfg.training.batch_size = 64  # the measured batch 64 from there on; plain compile: batch 32's
    assert _rate(cfg, fpt, gpus=1).tokens_per_s == graphs_64 and "batch 64" in _rate(cfg, fpt, gpus=1).label
    assert _rate(cfg, fpt, gpus=2).tokens_per_s == plain
    cfg.training.batch_size = 32
    cfg.training.compile_mode = "default"
    assert _rate(cfg, fpt, gpus=1).tokens_per_s == plain
    cfg.slurm.gpu_type = "a100"
    a100 = _rate(cfg, fpt, gpus=2)
    assert a100.tokens_per_s == pytest.approx(plain * 312 / 989.5)
    assert "estimated as 0.32 H200" in a100.label
    cfg.model.num_layers = 12  # not measured: case C's rate at the same model FLOP/s
    rate = _rate(cfg, fpt * 2, gpus=2)
    assert rate.tokens_per_s == pytest.approx(a100.tokens_per_s / 2) and "estimate" in rate.label
    cfg.model.num_layers = 1  # smaller than any measured: case C's tokens/s (launch-bound, not FLOP-bound)
    assert _rate(cfg, fpt // 100, gpus=2).tokens_per_s == pytest.approx(a100.tokens_per_s)
    cfg.slurm.gpu_type = "abacus"
    assert _rate(cfg, fpt) is None


# --------------------------------------------------------------------------- the case configs


def _tokens_per_parameter(text: str) -> float:
    return float(re.search(r"([\d.]+) unique training tokens per parameter", text).group(1))


@pytest.mark.parametrize(
    "case, low, high, params", [("a", 0.015, 0.04, "88.2M"), ("b", 0.008, 0.03, "26.3M"), ("c", 0.15, 0.3, "5.00M")]
)
def test_case_configs_are_planned_from_the_configs_alone(capsys, tmp_path, case, low, high, params):
    text = _plan_text(capsys, tmp_path, case)
    first = text.splitlines()[0]
    assert "estimated from" in first and "exact" not in text
    assert f"parameters {params}" in text
    assert low < _tokens_per_parameter(text) < high
    assert "time on 2x a100" in text and "per epoch" in text and "time on a CPU" in text
    assert "peak GPU memory: about" in text


def test_case_a_warns_with_suggestions(capsys, tmp_path):
    text = _plan_text(capsys, tmp_path, "a")
    (warning,) = [line for line in text.splitlines() if "tokens per parameter" in line and "WARNING" in line]
    assert "--set model.d_model=" in warning and "more training candles" in warning
    assert "--set data.epoch_stride=64" in warning


def test_no_warning_when_the_data_supports_the_model_and_the_time_fits(capsys, tmp_path):
    text = _plan_text(capsys, tmp_path, "c", ["slurm.time=10:00:00"])  # 4.8 h of training in 10 h
    assert "WARNING: the run" not in text
    text = _plan_text(capsys, tmp_path, "c", SMALL)
    assert _tokens_per_parameter(text) > 1
    assert not [line for line in text.splitlines() if line.startswith("WARNING") and "per parameter" in line]


def test_time_warnings(capsys, tmp_path):
    # about 4.8 h of training (the universe's candles grow by the day; 2 requeues up to 6 h): 2-hour slots
    text = _plan_text(capsys, tmp_path, "c", ["slurm.time=2:00:00"])
    assert "it will requeue about 2 time(s)" in text and "--set slurm.time=" in text
    text = _plan_text(capsys, tmp_path, "c")  # 4.8 h of a 7-day slot
    assert "a shorter --time queues sooner" in text


def test_bad_config_is_one_line_and_exit_2(capsys, tmp_path):
    assert main(["plan", "--config", str(REPO_ROOT / CASES["c"]), "--set", "model.nope=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.nope" in err
    assert main(["plan", "--config", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" in err


# --------------------------------------------------------------------------- against a real run


def test_plan_of_the_sample_matches_a_real_run(capsys, tmp_path):
    case = tmp_path / "case_c_crypto"
    shutil.copytree(REPO_ROOT / "case_c_crypto" / "configs", case / "configs")
    shutil.copy(REPO_ROOT / "case_c_crypto" / "universe.csv", case / "universe.csv")
    config = case / "configs" / "crypto_prototype.json"
    # the whole epoch (no max_steps cap) is a few steps: a large epoch stride and batch
    tiny = [
        "data.source=sample",
        "data.interval=1d",
        "data.universe_counts={}",
        "model.vocab_size=64",
        "model.context_length=16",
        *SMALL,
        "training.batch_size=64",
        "data.epoch_stride=37",
        "training.epochs=1",
        "training.max_steps_per_epoch=null",
        "training.eval_max_batches=1",
        "training.warmup_steps=1",
        "training.device=cpu",
        "training.scorecard_origins=0",
        "training.vol_reversion=false",
        "slurm.gpus_per_node=1",
    ]
    assert main(["train", "--config", str(config)] + _sets(tiny)) == 0
    printed = capsys.readouterr().out
    assert "candles (= tokens) of 13 assets, exact (this run)" in printed
    (run,) = (case / "checkpoints").glob("crypto_prototype_*")
    info = json.loads((run / "data_info.json").read_text())
    log = json.loads((run / "training_log.json").read_text())

    cfg = load_config(config, tiny)
    data = data_figures(cfg, case)
    plan = build_plan(cfg, data)
    assert data.basis == "exact (the shipped sample)"
    assert data.candles == {split: info["totals"][split] for split in ("train", "val", "test")}
    assert data.train_windows == log["windows"]["train"]
    assert plan.steps_per_epoch == log["steps_per_epoch"] > 1
    assert plan.parameters == log["num_parameters"]
    assert plan.global_batch == log["effective_batch_size"]
    steps_line = f"{plan.steps_per_epoch:,} steps of {plan.global_batch} windows"
    assert steps_line in printed
    assert main(["plan", "--config", str(config)] + _sets(tiny)) == 0
    assert steps_line in capsys.readouterr().out


def test_a_run_with_a_bad_slurm_time_still_prints_a_line():
    cfg = load_config(REPO_ROOT / CASES["c"], ["slurm.time=soon"])
    line = plan_of_run(
        cfg,
        {"X": {"train": (0, 500), "val": (600, 700), "test": (800, 900)}},
        train_windows=372,
        epoch_windows=372,
        parameters=1000,
        flops_per_token=6000,
        steps=5,
        world_size=1,
    )
    assert line.startswith("Plan: not available (slurm.time = 'soon'")


def _cache_case(tmp_path):
    case = tmp_path / "case"
    (case / "configs").mkdir(parents=True)
    shutil.copy(REPO_ROOT / CASES["c"], case / "configs" / "c.json")
    (case / "universe.csv").write_text(
        "symbol,source,category,name\nBTC/USDT,ccxt,crypto,Bitcoin\n"
        "ETH/USDT,ccxt,crypto,Ether\nSOL/USDT,ccxt,crypto,Solana\n"
    )
    rng = np.random.default_rng(0)
    for i, symbol in enumerate(("BTC/USDT", "ETH/USDT")):  # SOL/USDT is not cached
        index = pd.date_range("2020-01-01", periods=3000 - 500 * i, freq="1h", tz="UTC", name="timestamp")
        close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, len(index))))
        frame = pd.DataFrame(
            {"open": close, "high": close * 1.01, "low": close * 0.99, "close": close, "volume": 1.0}, index=index
        )
        CandleCache(case / "data").write("ccxt", "1h", symbol, frame, adjusted=False)
    return case


def _no_candle_read(monkeypatch, timestamps: bool = False):
    """Reading a cached candle's prices (or, with timestamps=False, even its timestamps) raises."""

    def refuse(*args, **kwargs):
        raise AssertionError("a candle file was read")

    monkeypatch.setattr(CandleCache, "read", refuse)
    if not timestamps:
        monkeypatch.setattr(CandleCache, "read_times", refuse)


def test_cached_candles_are_counted_from_their_timestamps(tmp_path, capsys, monkeypatch):
    case = _cache_case(tmp_path)
    cfg = load_config(case / "configs" / "c.json", ["data.universe_counts={}"])
    with monkeypatch.context() as m:
        _no_candle_read(m, timestamps=True)
        data = data_figures(cfg, case)
    assert data.basis.startswith("estimated from the timestamps in the cache: 2 of 3 assets (prices not read")
    assert data.assets == 2
    prepared = prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, case))
    assert data.candles["train"] == sum(len(s.train) for s in prepared.splits.values())
    assert data.candles["test"] == sum(len(s.test) for s in prepared.splits.values())
    assert data.train_windows == sum(len(s.train) - 128 for s in prepared.splits.values())
    assert "1 of 3 assets have no 1h candles" in capsys.readouterr().err  # training's own warning


def test_a_prepared_shard_is_planned_and_checked_without_reading_a_candle(tmp_path, capsys, monkeypatch):
    case = _cache_case(tmp_path)
    config, sets = case / "configs" / "c.json", ["--set", "data.universe_counts={}"]
    check = ["data", "check", "--case", str(case), "--config", str(config), *sets]
    assert main(check) == 1  # asset by asset, from the candles
    from_candles = capsys.readouterr().out
    assert main(["data", "prepare", "--config", str(config), *sets]) == 0
    cfg = load_config(config, ["data.universe_counts={}"])
    prepared = prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, case))
    _no_candle_read(monkeypatch)
    data = data_figures(cfg, case)
    assert data.basis.startswith("exact (the prepared token shard ") and data.assets == 2
    for split in ("train", "val", "test"):
        assert data.candles[split] == sum(len(getattr(s, split)) for s in prepared.splits.values())
    capsys.readouterr()
    assert main(check) == 1
    out = capsys.readouterr().out
    # the same report, but for the shard's own line: now prepared, and every byte checked
    assert out.splitlines()[:-1] == from_candles.splitlines()[:-1] and "2 of 3 assets" in out
    assert "SOL/USDT: no candles" in out and "is not prepared yet" in from_candles.splitlines()[-1]
    assert out.splitlines()[-1].endswith("files match their sha256 in manifest.json")


def test_the_synthetic_market_is_planned_from_its_spec_without_generating_it(capsys, tmp_path, monkeypatch):
    spec = 'data.synthetic={"assets": 6, "candles": 3000, "gap_prob": 0.1, "categories": ["crypto", "fx", "us_stock"]}'
    overrides = ["data.source=synthetic", spec, "data.categories=crypto,fx"]
    real = synthetic._asset
    monkeypatch.setattr(synthetic, "_asset", lambda *a: pytest.fail("the plan generated an asset"))
    text = _plan_text(capsys, tmp_path, "c", overrides)
    assert text.splitlines()[0].endswith(
        "candles (= tokens) of 4 assets, estimated from data.synthetic: 6 assets "
        "x 3,000 1h slots from 2018-01-01, gap_prob 0.1 (nothing generated)"
    )
    cfg = load_config(REPO_ROOT / CASES["c"], overrides)
    data = data_figures(cfg, tmp_path)
    monkeypatch.setattr(synthetic, "_asset", real)
    # the estimate against what training makes of the same market: crypto's gaps filled, fx's not
    prepared = prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, tmp_path))
    for split in ("train", "val", "test"):
        exact = sum(len(getattr(s, split)) for s in prepared.splits.values())
        assert data.candles[split] == pytest.approx(exact, rel=0.02), split
    assert data.assets == len(prepared.assets) == 4 and data.categories == 2


# --------------------------------------------------------------------------- the estimate's split

# case A's mix, small: stocks, commodities and emerging markets with long daily histories (about
# 252 trading days a year, as the estimate counts them) and crypto pairs since Binance's opening
# (2017-07-14), every day, all to 2020-01-01
MIX = [
    ("AAPL", "yfinance", "us_stock"),
    ("MSFT", "yfinance", "us_stock"),
    ("SAP.DE", "yfinance", "eu_stock"),
    ("VALE", "yfinance", "emerging"),
    ("GC=F", "yfinance", "commodity"),
    ("BTC/USDT", "ccxt", "crypto"),
    ("ETH/USDT", "ccxt", "crypto"),
]
MIX_SETS = [
    "data.universe_counts={}",
    "data.start_date=2012-01-01",
    "data.end_date=2020-01-01",
    "model.context_length=32",
]


def _mix_case(tmp_path, extra=()):
    """A case of MIX (and `extra`: (symbol, source, category, first day, last day)) with its
    daily candles cached; returns the config."""
    case = tmp_path / "mix"
    (case / "configs").mkdir(parents=True)
    config = case / "configs" / "a.json"
    shutil.copy(REPO_ROOT / CASES["a"], config)
    rows = [(*m, "2012-01-01" if m[1] == "yfinance" else "2017-07-14", "2019-12-31") for m in MIX] + list(extra)
    (case / "universe.csv").write_text(
        "symbol,source,category,name\n" + "".join(f"{r[0]},{r[1]},{r[2]},{r[0]}\n" for r in rows)
    )
    rng = np.random.default_rng(0)
    for symbol, source, _, first, last in rows:
        if source == "ccxt":
            index = pd.date_range(first, last, freq="1D", tz="UTC")
        else:  # weekdays less about one in 29: 252 a year
            days = pd.bdate_range(first, last, tz="UTC")
            index = days[np.arange(len(days)) % 29 != 28]
        close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, len(index))))
        frame = pd.DataFrame(
            {"open": close, "high": close * 1.01, "low": close * 0.99, "close": close, "volume": 1.0},
            index=index.rename("timestamp"),
        )
        CandleCache(case / "data").write(source, "1d", symbol, frame, adjusted=source == "yfinance")
    return config


def test_the_estimate_splits_as_preparation_does(tmp_path, capsys):
    """Nothing cached, the plan splits its estimated histories at the cut dates pooled over every
    asset, as preparation does: per category, its train, val and test candles are those of a
    preparation of the same universe's candles within a few percent. (It once split each series
    on its own ratios: 103 validation candles per crypto pair instead of about 296.)"""
    config = _mix_case(tmp_path)
    estimate = data_figures(
        load_config(config, [*MIX_SETS, f"data.cache_dir={tmp_path / 'empty'}"]), config.parent.parent
    )
    assert estimate.basis.startswith("estimated from the universe")
    assert main(["data", "prepare", "--config", str(config), *_sets(MIX_SETS)]) == 0
    capsys.readouterr()
    exact = data_figures(load_config(config, MIX_SETS), config.parent.parent)
    assert exact.basis.startswith("exact (the prepared token shard")
    assert list(estimate.by["category"]) == list(exact.by["category"])
    for category, counts in exact.by["category"].items():
        for split in ("train", "val", "test"):
            key = f"{split}_tokens"
            assert estimate.by["category"][category][key] == pytest.approx(counts[key], rel=0.04), (category, split)
    assert exact.by["category"]["crypto"]["val_tokens"] > 500  # two pairs: about 296 each


def test_the_estimate_says_that_it_starts_every_ccxt_pair_on_the_exchange_opening(capsys, tmp_path):
    text = _plan_text(capsys, tmp_path, "a")
    assert (
        "  note: the 70 ccxt pairs are estimated from 2017-07-14 (Binance's opening): a pair's own listing date "
        "is known only once its candles are downloaded" in text
    )
    assert "ccxt pairs are estimated" not in _plan_text(capsys, tmp_path, "c")  # from 2018-01-01: all listed


def test_data_prepare_names_what_is_left_out_as_plan_does(tmp_path, capsys):
    """A pair listed too late to train and a stock delisted before the validation cut: `plan` (from
    the cached timestamps) and `data prepare` print the same lines about them."""
    config = _mix_case(
        tmp_path,
        [
            ("SOL/USDT", "ccxt", "crypto", "2019-11-01", "2019-12-31"),
            ("OLD", "yfinance", "us_stock", "2012-01-01", "2016-06-30"),
        ],
    )
    assert main(["plan", "--config", str(config), *_sets(MIX_SETS)]) == 0
    plan = capsys.readouterr().out.splitlines()
    start = plan.index(next(line for line in plan if line.startswith("  Left out: ")))
    end = next(i for i in range(start, len(plan)) if not plan[i].startswith("  "))  # the figures' last lines
    lines = [line[2:] for line in plan[start:end]]
    lines += [line for line in plan if line.startswith("WARNING: ") and "data_info.json" in line]
    assert "Left out: 1 of 9 assets" in lines[0] and any(
        line.startswith("No validation windows in 1 of 8") for line in lines
    )
    # the array's jobs (`data prepare --array N`), run here in turn: the finish job's log says it too
    from common.slurm.prepare_jobs import PrepareJob
    from common.tokens.shard_paths import shard_folder
    from common.tokens.shard_stages import STAGES

    key = shard_folder(load_config(config, MIX_SETS), config.parent.parent)[0].name
    for stage in STAGES:
        PrepareJob(str(config), MIX_SETS, stage, 0, 1, key)()
        if stage != STAGES[-1]:
            capsys.readouterr()
    finish = capsys.readouterr().out.splitlines()
    assert [line for line in finish if not line.startswith("Token shards: ")] == lines

    assert main(["data", "prepare", "--config", str(config), *_sets(MIX_SETS)]) == 0
    prepared = capsys.readouterr().out.splitlines()
    assert [line for line in prepared if not line.startswith("Token shards: ")] == lines


# --------------------------------------------------------------------------- full histories


def test_yahoo_intraday_window_is_said_plainly(capsys, tmp_path):
    text = _plan_text(capsys, tmp_path, "b", ["data.interval=1h"])
    (note,) = [line for line in text.splitlines() if line.startswith("  note:") and "Yahoo" in line]
    assert "Yahoo keeps 1h bars for the last 730 days only: the 80 Yahoo assets start about" in note
    assert "instead of 2005-01-01" in note
    text = _plan_text(capsys, tmp_path, "b", ["data.interval=1m", "data.start_date=max"])
    assert "Yahoo keeps 1m bars for the last 30 days only, 7 days per request" in text
    assert 'instead of the whole history (data.start_date = "max")' in text
    assert "Yahoo keeps" not in _plan_text(capsys, tmp_path, "b")  # daily bars: no window


def test_start_date_max_is_estimated_from_each_source_first_candle(capsys, tmp_path):
    dated = _plan_text(capsys, tmp_path, "c", ["data.start_date=2018-01-01"]).splitlines()[0]
    whole = _plan_text(capsys, tmp_path, "c", ["data.start_date=max"]).splitlines()[0]
    assert "max (ccxt assets from 2017-07-14)" in whole
    train = [float(re.match(r"Plan: ([\d.]+)M train", line).group(1)) for line in (dated, whole)]
    assert train[1] > train[0]  # from binance's opening, before 2018
    b = _plan_text(capsys, tmp_path, "b", ["data.start_date=max"]).splitlines()[0]
    assert "the others from 2000-01-01: their first trades are known once downloaded" in b


# --------------------------------------------------------------------------- the README's excerpt


def readme_plan_excerpt() -> tuple[str, list[str], list[str]]:
    """The README's `marketgpt plan` example: (the day it was printed on, the command's
    arguments, the lines shown)."""
    readme = (REPO_ROOT / "README.md").read_text()
    day = re.search(r"`marketgpt plan --config \.\.\.` .*? as printed on (\d{4}-\d{2}-\d{2})", readme, re.S)
    block = re.search(r"```text\n\$ marketgpt (plan [^\n]*)\n(.*?)\n```", readme, re.S)
    assert day and block, "README.md: the plan excerpt (its day, its ```text block with the command) moved"
    return day.group(1), block.group(1).split(), block.group(2).split("\n")


def excerpt_pattern(lines: list[str]) -> str:
    """A regex the output must match from the start of a line: `...` stands for the rest of a line
    (one character or more), alone on a line for one whole line or more; all else is verbatim."""
    parts = [
        r"(?:[^\n]*\n)+"
        if line.strip() == "..."
        else r"[^\n]+?".join(re.escape(piece) for piece in line.split("...")) + r"\n"
        for line in lines
    ]
    return "^" + "".join(parts)


def test_excerpt_pattern_keeps_elisions_honest():
    out = "a b c\nd e\nf\ng h\n"
    assert re.search(excerpt_pattern(["a ...", "d e", "...", "g h"]), out, re.M)
    assert not re.search(excerpt_pattern(["a ...", "f"]), out, re.M)  # a left-out line needs its `...`
    assert not re.search(excerpt_pattern(["d e ..."]), out, re.M)  # `...` leaves something out
    assert not re.search(excerpt_pattern(["a b", "d e"]), out, re.M)  # a line shown whole is whole


def test_the_readme_plan_excerpt_is_what_the_command_prints(capsys, tmp_path, monkeypatch):
    """README.md's plan example, run as shown on the day it names (case C's universe runs to the
    day of the plan) with an empty cache: every line shown is printed, in order, `...` aside."""
    import common.commands.plan_data as plan_data

    day, args, lines = readme_plan_excerpt()
    real_end = plan_data._end
    monkeypatch.setattr(
        plan_data, "_end", lambda data: real_end(data) if data.end_date else pd.Timestamp(day, tz="UTC")
    )
    args = [str(REPO_ROOT / a) if a.endswith(".json") else a for a in args]
    assert main(args + ["--set", f"data.cache_dir={tmp_path / 'empty'}"]) == 0
    out = capsys.readouterr().out
    assert re.search(excerpt_pattern(lines), out, re.M), f"README.md's plan excerpt differs from:\n{out}"
