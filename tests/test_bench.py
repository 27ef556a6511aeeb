"""The benchmark command runs end to end and writes its table and JSON (at toy sizes: nothing
here times anything), and the plain reference GPT of bench_train is a working GPT."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from common.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
from bench_train import RefGPT  # noqa: E402
from run_all import BENCHMARKS  # noqa: E402


@pytest.mark.slow
def test_run_all_smoke_writes_the_table_and_the_json(tmp_path):
    out = tmp_path / "results.json"
    # every benchmark but bench_forecast.py, whose smoke run test_forecast.py checks
    only = ",".join(name for name in BENCHMARKS if name != "forecast")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "run_all.py"),
            "--smoke",
            "--threads",
            "1",
            "--only",
            only,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["machine"]["nproc"] >= 1 and report["machine"]["torch"]
    bench = report["benchmarks"]
    for name in ("train", "checkpoint", "tokenizer", "data", "corpus", "verify", "export", "scorecard"):
        assert bench[name]["status"] == "ok", bench[name]
    assert bench["slurm"]["status"] == "skipped" and bench["slurm"]["note"]
    values = {(r["benchmark"], r["figure"]): r["value"] for r in report["rows"]}
    for key in [
        ("Training throughput, case C", "MarketGPT / reference tokens/s"),
        ("Hardware utilization, case C", "model FLOP/s / torch.mm peak"),
        ("Data path", "batch gather / train step tokens/s"),
        ("Checkpoint save, case C", "atomic / plain torch.save, cost to training"),
        ("Timer checkpoint", "cost / interval"),
        ("Tokenizer fit + encode", "seconds"),
        ("Load + clean + split", "peak RSS"),
        ("Corpus preparation", "seconds"),
        ("Batch assembly", "tokens/s, one core"),
        ("verify", "hash rate per rank"),
    ]:
        assert values[key] is not None and values[key] > 0, key
    train = bench["train"]["figures"]["cases"]["C"]
    assert train["flops_per_token"] == 32_300_544  # case C: 6 x 5.0M weights + attention at T = 128
    assert train["round_seconds"]["marketgpt"] and train["round_seconds"]["reference"]
    assert "Training throughput, case C" in proc.stdout and f"wrote {out}" in proc.stdout


def test_reference_gpt_learns_and_ties_its_head():
    torch.manual_seed(0)
    ref = RefGPT(vocab=16, T=8, C=32, n_layer=2, n_head=4, d_ff=64, p=0.0)
    assert ref.head.weight is ref.wte.weight
    x = torch.randint(0, 16, (4, 8))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    first = ref(x, y).item()
    for _ in range(60):
        loss = ref(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 2.0 and loss.item() < 0.5 * first
    # causal: changing the last token leaves the earlier positions' loss terms alone
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % 16
    ref.eval()
    with torch.no_grad():
        h1 = ref.ln_f(ref.blocks[1](ref.blocks[0](ref.wte(x) + ref.wpe(torch.arange(8)))))
        h2 = ref.ln_f(ref.blocks[1](ref.blocks[0](ref.wte(x2) + ref.wpe(torch.arange(8)))))
    assert torch.allclose(h1[:, :-1], h2[:, :-1]) and not torch.allclose(h1[:, -1], h2[:, -1])


# bench_slurm.py runs in tests/test_slurm_integration.py, alongside that module's jobs (its
# waits for the queue and the requeue hold overlap theirs).


def test_quickstart_trains_with_the_documented_small_data_settings():
    # quickstart.sh is what a newcomer runs; bench_generalization.py measured those settings: the same list
    import shlex

    from common.config import load_config

    from bench_generalization import SMALL_DATA

    words = shlex.split(
        (REPO_ROOT / "quickstart.sh").read_text().split("-m common.cli train", 1)[1].split('"$@"')[0], comments=True
    )
    quick = {words[i + 1] for i, w in enumerate(words) if w == "--set"}
    bench_only = {
        "training.scorecard_origins=0",
        "training.vol_reversion=false",
        "training.log_every_steps=1000",
    }  # a bench's, not a newcomer's
    assert set(SMALL_DATA) - bench_only == quick - {'experiment="quickstart"', "training.log_every_steps=10"}
    config = REPO_ROOT / "case_c_crypto" / "configs" / "crypto_prototype.json"
    assert f"--config {config.relative_to(REPO_ROOT)}" in (REPO_ROOT / "quickstart.sh").read_text()
    load_config(config, sorted(quick))  # every override is a valid key and value


def test_bench_recipe_pairs_each_variant_with_the_base_of_its_seed():
    from bench_recipe import summarize

    def run(variant, seed, nll, curve):
        return {"variant": variant, "seed": seed, "val_nll": nll, "epoch_val_loss": curve, "tokens_per_epoch": 100}

    runs = [
        run("base", 0, 5.0, [5.3, 5.1, 5.0]),
        run("base", 1, 5.2, [5.4, 5.3, 5.2]),
        run("swiglu", 0, 4.9, [5.2, 4.95, 4.9]),  # reaches seed 0's best (5.0) in epoch 2
        run("swiglu", 1, 5.1, [5.3, 5.15, 5.1]),  # seed 1's best (5.2) in epoch 2
        run("rope", 0, 5.05, [5.3, 5.2, 5.05]),  # never reaches 5.0
        run("rope", 1, 5.3, [5.4, 5.35, 5.3]),
    ]
    rows = {r["variant"]: r for r in summarize(runs)}
    assert rows["base"]["delta"] == 0 and not rows["base"]["pays"]
    assert rows["swiglu"]["delta"] == pytest.approx(-0.1) and rows["swiglu"]["tokens_to_base_best"] == 200
    assert rows["swiglu"]["ci95"][0] == pytest.approx(rows["swiglu"]["ci95"][1])  # equal deltas: no spread
    assert rows["rope"]["delta"] == pytest.approx(0.075) and rows["rope"]["tokens_to_base_best"] is None
    assert not rows["rope"]["pays"]


def test_bench_generalization_ablation_pairs_each_seed_off_and_on(monkeypatch, tmp_path):
    """--ablate: per seed one training without and one with the setting, the same seed; the
    paired difference with a Student-t interval; the pairs so far written after each pair."""
    import bench_generalization

    calls = []

    def fake_run(splits, overrides=(), keep=None):
        calls.append(list(overrides))
        on = "model.vol_level_input=true" in overrides
        seed = int(next(o for o in overrides if o.startswith("training.seed=")).split("=")[1])
        loss = 5.0 + seed / 10 - (0.01 * (seed + 1) if on else 0.0)
        return {
            "val": {"loss": {"model": loss, "unigram": 5.3}},
            "best_epoch": 3,
            "wall_s": 1.0,
            "loadavg_1m": [0.0, 0.0],
        }

    monkeypatch.setattr(bench_generalization, "run", fake_run)
    res = bench_generalization.ablate("model.vol_level_input=true", [0, 1, 2], ["x=1"], tmp_path / "a.json")
    assert calls[:2] == [["x=1", "training.seed=0"], ["x=1", "training.seed=0", "model.vol_level_input=true"]]
    assert [p["seed"] for p in res["pairs"]] == [0, 1, 2]
    d = res["diff"]  # differences -0.01, -0.02, -0.03: mean -0.02, sd 0.01, t(0.975, 2) = 4.303
    assert d["mean"] == pytest.approx(-0.02) and d["n"] == 3
    assert d["ci95"] == pytest.approx([-0.02 - 4.3027 * 0.01 / 3**0.5, -0.02 + 4.3027 * 0.01 / 3**0.5], rel=1e-4)
    assert len(json.loads((tmp_path / "a.json").read_text())["pairs"]) == 3
    # several settings are switched on together, in the "on" training only
    calls.clear()
    both = bench_generalization.ablate(["model.vol_level_input=true", "model.rope=1"], [0, 1], [])
    assert calls[:2] == [["training.seed=0"], ["training.seed=0", "model.vol_level_input=true", "model.rope=1"]]
    assert both["setting"] == "model.vol_level_input=true model.rope=1"


def test_bench_spread_scales_the_same_draws_around_their_median():
    from bench_spread import GRID, _scaled_forecasters

    calls = []

    def raw(histories, horizon, n, seed):
        calls.append(seed)
        return np.random.default_rng(seed).standard_normal((len(histories), n, horizon)) + 0.3

    fcs = _scaled_forecasters(raw)
    assert list(fcs)[0] == "s1" and sorted(fcs) == sorted(f"s{s:g}" for s in GRID)
    histories = ["a", "b"]
    x = fcs["s1"](histories, 3, 50, 7)
    for s in (s for s in GRID if s != 1.0):
        out = fcs[f"s{s:g}"](histories, 3, 50, 99)  # the scaled ones read the raw draws, not their seed
        np.testing.assert_allclose(np.median(out, axis=1), np.median(x, axis=1))
        np.testing.assert_allclose(out.std(axis=1), s * x.std(axis=1))
    assert calls == [7]


def test_bench_spread_reverts_the_variance_to_the_long_run_level_step_by_step():
    from common.evaluation.vol_reversion import TAUS
    from common.forecasting.forecast_io import History
    from common.forecasting.reversion import LONG_RUN, Reversion, long_run_variance

    from bench_spread import REVERSION, _scaled_forecasters

    rng = np.random.default_rng(0)
    histories = []
    for vol in (0.01, 0.03):  # a calm and a turbulent asset, each with history beyond LONG_RUN
        close = np.exp(np.cumsum(rng.normal(0, vol, LONG_RUN + 300)))
        close[10] = np.nan  # a gap row is skipped
        frame = pd.DataFrame({"open": close, "high": close, "low": close, "close": close})
        histories.append(History("A", frame))
    late = np.diff(np.log(histories[1].candles["close"].to_numpy()[-LONG_RUN - 1 :]))
    closes = [h.candles["close"].to_numpy() for h in histories]
    assert long_run_variance(closes[1]) == pytest.approx(np.var(late))  # the last LONG_RUN returns only

    def raw(histories, horizon, n, seed):  # 0.02 a step: too wide for the calm asset, too narrow for the other
        steps = np.random.default_rng(seed).normal(0.001, 0.02, (len(histories), n, horizon))
        return np.cumsum(steps, axis=2)

    fcs = _scaled_forecasters(raw, revert=True)
    assert list(fcs)[0] == "s1" and sorted(fcs)[1:] == sorted(f"w{w:g}" for w in REVERSION if w)
    x = fcs["s1"](histories, 4, 400, 3)
    v_long = np.array([long_run_variance(c) for c in closes])
    for w in (w for w in REVERSION if w):
        out = fcs[f"w{w:g}"](histories, 4, 400, 99)  # the same draws, rescaled around their median
        np.testing.assert_allclose(np.median(out, axis=1), np.median(x, axis=1))
        for k in range(4):
            want = (1 - w) * x[:, :, k].var(axis=1) + w * (k + 1) * v_long
            np.testing.assert_allclose(out[:, :, k].var(axis=1), want, rtol=1e-9)
    # pulled to its level: the calm asset's spread narrows, the turbulent one's widens
    assert out[0].std() < x[0].std() and out[1].std() > x[1].std()
    # --fitted: the run's own pull, W_k = k / (k + tau), on the same draws
    fitted = _scaled_forecasters(raw, fitted=Reversion(10.0))
    assert list(fitted) == ["s1", "fitted"]
    x = fitted["s1"](histories, 4, 400, 3)
    out = fitted["fitted"](histories, 4, 400, 99)
    w = np.arange(1, 5) / (np.arange(1, 5) + 10.0)
    np.testing.assert_allclose(out.var(axis=1), (1 - w) * x.var(axis=1) + w * np.arange(1, 5) * v_long[:, None])
    # --long-run: each tau with each window's long-run variance, on the same draws
    grid = _scaled_forecasters(raw, long_runs=(100, LONG_RUN))
    assert len(grid) == 1 + 2 * len(TAUS) and "tau10_lr100" not in grid and "tau25_lr100" in grid
    x = grid["s1"](histories, 4, 400, 3)
    v_short = np.array([np.var(np.diff(np.log(c[-101:]))) for c in closes])
    w = np.arange(1, 5) / (np.arange(1, 5) + 25.0)
    for name, v in (("tau25_lr100", v_short), (f"tau25_lr{LONG_RUN}", v_long)):
        out = grid[name](histories, 4, 400, 99)
        np.testing.assert_allclose(out.var(axis=1), (1 - w) * x.var(axis=1) + w * np.arange(1, 5) * v[:, None])


def test_bench_spread_compares_runs_on_the_same_origins_and_refuses_others():
    from bench_spread import compare

    rng = np.random.default_rng(0)
    dates = np.repeat(np.arange(40), 3).tolist()

    def runs(scale):
        def split():
            return {"dates": dates, "crps": (scale * rng.uniform(1, 2, len(dates))).tolist()}

        return {"runs": [{"horizons": {"1": {"val": split(), "test": split()}}} for _ in range(3)]}

    a, b = runs(0.9), runs(1.0)
    r = compare(a, b, n_boot=100)["1"]["val"]
    assert len(r["pairs"]) == 3 and 0.0 < r["mean"] < 0.2 and r["t95"][0] <= r["mean"] <= r["t95"][1]
    assert r["pooled"]["ci95"][0] <= r["pooled"]["value"] <= r["pooled"]["ci95"][1]
    assert compare(b, b, n_boot=10)["1"]["test"]["mean"] == 0.0
    b["runs"][1]["horizons"]["1"]["test"]["dates"] = dates[::-1]
    with pytest.raises(SystemExit, match="origins differ"):
        compare(a, b)


def test_bench_pool_mixes_the_model_s_and_a_baseline_s_own_draws_by_weight():
    """Through forecast_all as the bench calls it: a model of paths (+1 a step) and a baseline of
    H-step returns (-1 a step, called per horizon); the pool at weight w holds round(w n) of the
    model's draws and the rest of the baseline's, at every horizon; w 0 and 1 are each side alone."""
    import pandas as pd

    from common.evaluation import walk_forward
    from common.evaluation.asset_series import AssetSeries

    from bench_pool import WEIGHTS, pooled_forecasters

    stamps = pd.date_range("2024-01-01", periods=60, freq="D")
    closes = pd.DataFrame({"close": 100 * np.exp(np.cumsum(np.full(60, 0.01)))}, index=stamps)
    series = [AssetSeries(s, "crypto", closes, train=range(0, 15), test=range(20, 60)) for s in ("A", "B")]
    o = walk_forward.all_origins(series, {s.symbol: np.arange(20, 50, 5) for s in series}, [1, 3])
    baseline_calls = []

    def model(histories, horizon, n, seed):
        return np.broadcast_to(np.arange(1.0, horizon + 1), (len(histories), n, horizon)).copy()

    def baseline(histories, horizon, n, seed):
        baseline_calls.append(horizon)
        return np.full((len(histories), n), -float(horizon))

    fcs = pooled_forecasters(model, {"b": baseline})
    assert list(fcs)[:2] == ["model", "b"] and len(fcs) == 2 + len(WEIGHTS)
    stats, _ = walk_forward.forecast_all(series, o, fcs, [1, 3], 10, 0, lambda m: None)
    assert set(baseline_calls) == {1, 3}  # the pools did not call it again
    for h in (1, 3):
        for w in WEIGHTS:
            k = round(w * 10)
            np.testing.assert_allclose(stats[h][f"b@{w:g}"]["mean"], h * (k - (10 - k)) / 10)
        np.testing.assert_array_equal(stats[h]["b@0"]["crps"], stats[h]["b"]["crps"])
        np.testing.assert_array_equal(stats[h]["b@1"]["crps"], stats[h]["model"]["crps"])


def test_bench_pool_summary_is_each_run_s_pool_over_the_best_baseline():
    from bench_pool import summary

    def run(pool, best):
        test = {"dates": [0, 1], "pool_crps": [pool, pool], "best_crps": [best, best]}
        return {"horizons": {"1": {"chosen_pool": "log_har@0.5", "test": test}}}

    r = summary([run(0.9, 1.0), run(0.8, 1.0), run(1.0, 1.0)])["1"]
    assert r["skills"] == pytest.approx([0.1, 0.2, 0.0]) and r["mean"] == pytest.approx(0.1) and r["n"] == 3
    assert r["ci95"][0] < 0.1 < r["ci95"][1]
    with pytest.raises(SystemExit, match="two or more"):
        summary([run(0.9, 1.0)])
