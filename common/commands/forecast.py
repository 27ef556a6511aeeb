"""`marketgpt forecast`: arguments -> Forecaster -> files in --out and a short table on stdout.

Files (each written atomically, so a failed run leaves no half-written file):
    forecast.parquet, forecast.csv   one row per asset x step (common.forecasting.forecaster.summarize_paths)
    forecast.json                    run, checkpoint sha256, as-of, seed, horizon, samples, sampling
                                     settings, tokenizer version, and each asset's origin
    paths.npz                        with --save-paths: sampled tokens and OHLC paths per asset
                                     (raw samples: --calibrated moves the quantile columns only)
    barrier.csv                      with --barrier +5%,-3%: per asset P(upper first), P(lower first), P(neither)
    drawdown.csv                     with --drawdown: per asset the maximum drawdown's mean, quantiles, P(> x)
                                     (both from the sampled paths: common.forecasting.price_paths)
    fan_<symbol>.png                 one fan chart per asset (history, median, 50% and 90% bands);
    fan_chart.png                    one multi-panel chart instead when there are more than 4 assets
"""

from __future__ import annotations

import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from common.atomic import atomic_path, atomic_savefig, atomic_write_bytes, atomic_write_json, check_writable
from common.errors import UserError
from common.forecasting.calibrated import Calibration, calibrate_table, load_calibration
from common.forecasting.infer import ExportedForecaster
from common.forecasting.price_paths import (
    barrier_outcomes,
    barrier_probabilities,
    drawdown_summary,
    max_drawdown,
    parse_barriers,
)
from common.run.files import BEST_MODEL_PT, CALIBRATION_JSON
from common.tokens.tokenizer import FORMAT_NAME, FORMAT_VERSION

__all__ = ["ForecastRequest", "run_forecast_command", "write_outputs"]

MAX_SINGLE_CHARTS = 4  # above this many assets, one multi-panel chart
_HISTORY_SHOWN = 3  # fan charts show this many horizons of history before the origin


@dataclass(frozen=True)
class ForecastRequest:
    """What `marketgpt forecast` was asked for (the flags' defaults are common.cli's)."""

    run_dirs: Sequence[Path]  # one run, or several: their equal-weight ensemble
    symbols: Optional[Sequence[str]] = None  # None: every asset of the run
    horizon: int = 24
    samples: int = 256
    as_of: Optional[str] = None  # None: each asset's last candle
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: int = 0
    out: Optional[Path] = None  # None: RUN_DIR/forecasts/<as-of>/
    save_paths: bool = False
    device: str = "cpu"
    precision: str = "auto"
    backend: str = "torch"  # or "onnx": run_dirs is one `marketgpt export --format onnx` folder
    calibrated: bool = False  # move the quantile columns by the run's calibration.json (marketgpt calibrate)
    barrier: Optional[str] = None  # "+5%,-3%": P(upper first), P(lower first), P(neither) per asset
    drawdown: bool = False  # the distribution of the maximum drawdown over the horizon per asset
    interval: Optional[str] = None  # which of a run's data.intervals (None: its first)


def run_forecast_command(req: ForecastRequest) -> int:
    """Forecast, write the files into the output folder, print a short table; exit code 0."""
    if req.top_k is not None or req.top_p is not None:
        warn(
            "--top-k/--top-p truncate the model's distribution: every path narrows and the quantile bands "
            "come out overconfident (see docs/forecasting.md)"
        )
    if req.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", req.device):
        raise UserError(f"--device {req.device}: expected cpu, cuda or cuda:N")
    barrier = parse_barriers(req.barrier) if req.barrier is not None else None  # before the model loads
    runs = list(req.run_dirs)
    fc = _forecaster(req, runs)
    fc.check_request(req.horizon, req.samples)  # before any data is read
    calibration = _calibration(req, runs, fc) if req.calibrated else None
    histories = fc.load_history(req.symbols, req.as_of)
    as_of = max(h.candles.index[-1] for h in histories if len(h.candles)) if req.as_of is None else None
    label = pd.Timestamp(req.as_of if req.as_of is not None else as_of)
    name = (
        label.strftime("%Y-%m-%dT%H%M") if len(runs) == 1 else f"ensemble_{len(runs)}_{label.strftime('%Y-%m-%dT%H%M')}"
    )
    if fc.interval != fc.cfg.data.interval:  # a run of several intervals, at another than its first
        name = f"{name}_{fc.interval}"
    out = Path(req.out) if req.out else Path(runs[0]) / "forecasts" / name
    check_writable(out, "--out", "pass --out a folder you can write")
    result = fc.forecast(
        histories,
        req.horizon,
        req.samples,
        seed=req.seed,
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        return_paths=True,
    )
    settings = {
        "backend": req.backend,
        "precision": fc.precision,
        "as_of": req.as_of or "latest",
        "seed": req.seed,
        "horizon": req.horizon,
        "samples": req.samples,
        "temperature": req.temperature,
        "top_k": req.top_k,
        "top_p": req.top_p,
        # each run's volatility reversion (reversion.json's tau; null: its paths as sampled)
        "reversion_tau": fc.reversion_taus(),
    }
    if calibration is not None:
        result.table = calibrate_table(result.table, calibration)
        settings["calibration"] = {
            "file": str(calibration.path),
            "split": "val",
            "dates": calibration.raw.get("dates"),
            "levels": list(calibration.levels),
        }
    written = write_outputs(fc, result, histories, out, settings, save_paths=req.save_paths)
    print(stdout_table(result.table))
    for path, text in write_path_questions(result, out, barrier, req.drawdown):
        written.append(path)
        print(text)
    print(f"Wrote {', '.join(p.name for p in written)} in {out}")
    return 0


def _calibration(req: ForecastRequest, runs: list, fc: Any) -> Calibration:
    """The run's calibration.json, checked against this forecast (one run, its steps, sampling, model)."""
    if len(runs) != 1:
        raise UserError("--calibrated takes one run: a calibration.json is fitted for one model, not an ensemble")
    if req.backend == "onnx" and not (Path(runs[0]) / CALIBRATION_JSON).is_file():
        raise UserError(
            f"--calibrated: {runs[0]} has no calibration.json; copy the run's (marketgpt calibrate "
            "RUN_DIR) into the export folder: it is checked against the export's checkpoint_sha256"
        )
    calibration = load_calibration(runs[0])
    calibration.check_forecast(
        req.horizon, {"temperature": req.temperature, "top_k": req.top_k, "top_p": req.top_p}, fc.checkpoint_sha256
    )
    return calibration


def _forecaster(req: ForecastRequest, runs: list) -> Any:
    """The torch Forecaster (several runs: their ensemble), or onnxruntime over an export folder."""
    if req.backend == "onnx":  # RUN_DIR is a `marketgpt export --format onnx` folder: onnxruntime, no torch
        # the same words as common.distributed.precision (no torch here)
        if req.precision not in ("auto", "fp32", "bf16"):
            raise UserError(f"--precision {req.precision!r}: expected one of auto, fp32, bf16")
        if req.device != "cpu" or len(runs) != 1 or req.precision == "bf16":
            raise UserError(
                "--backend onnx takes one export folder and runs on the CPU in fp32 (no --device, no --precision)"
            )
        fc = ExportedForecaster.from_export(runs[0])
        if req.interval is not None and req.interval != fc.interval:
            raise UserError(
                f"--interval {req.interval}: the export {runs[0]} forecasts {fc.interval} candles only; "
                f"export the run with --interval {req.interval}"
            )
        return fc
    import torch  # lazy: the onnx backend runs without torch

    from common.forecasting.ensemble import forecaster_for  # lazy: imports torch

    if req.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {req.device}: no CUDA GPU is visible here; use --device cpu")
    # several runs: their ensemble
    return forecaster_for(runs, device=req.device, precision=req.precision, interval=req.interval)


def write_outputs(fc: Any, result: Any, histories: list, out: Path, settings: dict, save_paths: bool) -> list[Path]:
    """Write every output file into `out`; returns their paths."""
    table = result.table
    written = [out / "forecast.parquet", out / "forecast.csv", out / "forecast.json"]
    buf = io.BytesIO()
    table.to_parquet(buf, index=False, engine="pyarrow")
    atomic_write_bytes(written[0], buf.getvalue())
    atomic_write_bytes(written[1], table.to_csv(index=False, float_format="%.10g").encode("utf-8"))
    meta = {
        "run": str(fc.run_dir) if fc.run_dir else None,
        "checkpoint": BEST_MODEL_PT,
        "checkpoint_sha256": fc.checkpoint_sha256,
        **settings,
        "tokenizer": {"format": FORMAT_NAME, "version": FORMAT_VERSION, "vocab_size": fc.tokenizer.vocab_size},
        "context_length": fc.cfg.model.context_length,
        "interval": fc.cfg.data.interval,
        "data_source": fc.cfg.data.source,
        **({"ensemble": fc.ensemble} if getattr(fc, "ensemble", None) else {}),
        "origins": [
            {"symbol": o["symbol"], "as_of": o["as_of"].isoformat(), "last_close": o["last_close"]}
            for o in result.origins
        ],
    }
    atomic_write_json(written[2], meta)
    if save_paths:
        written.append(out / "paths.npz")
        with atomic_path(written[-1]) as tmp, open(tmp, "wb") as f:
            np.savez_compressed(
                f,
                symbols=np.array([o["symbol"] for o in result.origins], dtype=str),
                tokens=result.tokens,
                **result.paths,
            )
    written += write_fan_charts(result, histories, out)
    return written


def path_question_tables(
    result: Any, barrier: Optional[tuple[float, float]], drawdown: bool
) -> dict[str, pd.DataFrame]:
    """Per asset, from its sampled paths: the barrier probabilities and/or the maximum drawdown's summary."""
    paths = result.paths
    ohlc = "high" in paths and "low" in paths  # decode_ohlc's candles: touches by the highs and lows
    tables: dict[str, list] = {"barrier": [], "drawdown": []}
    for i, o in enumerate(result.origins):
        close = paths["close"][i]
        hl = {"high": paths["high"][i], "low": paths["low"][i]} if ohlc else {}
        head = {
            "symbol": o["symbol"],
            "as_of": o["as_of"].isoformat(),
            "last_close": o["last_close"],
            "horizon": close.shape[1] - 1,
            "samples": close.shape[0],
            "prices": "high/low" if ohlc else "close",
        }
        if barrier is not None:
            upper, lower = barrier
            probs = barrier_probabilities(barrier_outcomes(close, upper, lower, **hl))
            tables["barrier"].append(
                {
                    **head,
                    "upper": upper,
                    "lower": lower,
                    "upper_price": o["last_close"] * (1 + upper),
                    "lower_price": o["last_close"] * (1 + lower),
                    **probs,
                }
            )
        if drawdown:
            tables["drawdown"].append({**head, **drawdown_summary(max_drawdown(close, **hl))})
    return {k: pd.DataFrame(v) for k, v in tables.items() if v}


def write_path_questions(
    result: Any, out: Path, barrier: Optional[tuple[float, float]], drawdown: bool
) -> list[tuple[Path, str]]:
    """barrier.csv / drawdown.csv in `out`, each with the table printed for it."""
    written = []
    for name, table in path_question_tables(result, barrier, drawdown).items():
        path = out / f"{name}.csv"
        atomic_write_bytes(path, table.to_csv(index=False, float_format="%.10g").encode("utf-8"))
        written.append((path, _barrier_text(table) if name == "barrier" else _drawdown_text(table)))
    return written


def _barrier_text(table: pd.DataFrame) -> str:
    r0 = table.iloc[0]
    lines = [
        f"Barriers {r0.upper:+.2%} / {r0.lower:+.2%} of the last close within {r0.horizon} candles "
        f"(first touch by the candles' {r0.prices}; docs/forecasting.md#path-questions)",
        f"{'symbol':<12} {'upper':>12} {'lower':>12} {'P(upper 1st)':>12} {'P(lower 1st)':>12} {'P(neither)':>10}",
    ]
    for r in table.itertuples():
        lines.append(
            f"{r.symbol:<12} {r.upper_price:>12.6g} {r.lower_price:>12.6g} {r.p_upper_first:>12.3f} "
            f"{r.p_lower_first:>12.3f} {r.p_neither:>10.3f}"
        )
    return "\n".join(lines)


def _drawdown_text(table: pd.DataFrame) -> str:
    r0 = table.iloc[0]
    more = [c for c in table.columns if c.startswith("p_gt_")]
    lines = [
        f"Maximum drawdown within {r0.horizon} candles (from the running peak, by the candles' {r0.prices})",
        f"{'symbol':<12} {'mean':>7} {'p50':>7} {'p90':>7} {'p99':>7} "
        + " ".join(f"{'P(>' + c[5:-3] + '%)':>8}" for c in more),
    ]
    for r in table.itertuples(index=False):
        d = r._asdict()
        lines.append(
            f"{r.symbol:<12} {r.mean:>7.2%} {r.p50:>7.2%} {r.p90:>7.2%} {r.p99:>7.2%} "
            + " ".join(f"{d[c]:>8.3f}" for c in more)
        )
    return "\n".join(lines)


def _safe(symbol: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", symbol).strip("_") or "asset"


def write_fan_charts(result: Any, histories: list, out: Path) -> list[Path]:
    """History, median and the 50% / 90% bands: one PNG per asset, or one multi-panel PNG."""
    import matplotlib  # lazy, as the other chart writers: Agg is chosen here, before pyplot loads

    matplotlib.use("Agg")  # before pyplot: no display on compute nodes
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use

    table = result.table
    n = len(histories)
    single = n <= MAX_SINGLE_CHARTS
    groups = [[i] for i in range(n)] if single else [list(range(n))]
    written = []
    for group in groups:
        cols = 1 if single else min(4, n)
        rows = 1 if single else -(-n // cols)
        fig, axes = plt.subplots(
            rows, cols, figsize=(8 if single else 4 * cols, 4.5 if single else 3 * rows), squeeze=False
        )
        for ax in axes.ravel()[len(group) :]:
            ax.set_visible(False)
        for ax, i in zip(axes.ravel(), group):
            h = histories[i]
            part = table.iloc[i * (len(table) // n) : (i + 1) * (len(table) // n)]
            shown = h.candles["close"].iloc[-_HISTORY_SHOWN * len(part) :]
            last = pd.DatetimeIndex([h.candles.index[-1]])
            x = last.append(pd.DatetimeIndex(part["timestamp"]))
            start = part["last_close"].iloc[0]
            band = lambda col, start=start, part=part: np.concatenate([[start], part[col].to_numpy()])  # noqa: E731
            ax.plot(shown.index, shown.to_numpy(), color="black", lw=1, label="history")
            ax.fill_between(x, band("p5"), band("p95"), color="#1f77b4", alpha=0.2, lw=0, label="90% band")
            ax.fill_between(x, band("p25"), band("p75"), color="#1f77b4", alpha=0.4, lw=0, label="50% band")
            ax.plot(x, band("p50"), color="#1f77b4", lw=1.5, label="median")
            ax.set_title(f"{h.symbol} from {h.candles.index[-1]:%Y-%m-%d %H:%M} UTC", fontsize=10)
            ax.tick_params(labelsize=8)
            ax.tick_params(axis="x", rotation=30)
        axes.ravel()[0].legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        target = out / (f"fan_{_safe(histories[group[0]].symbol)}.png" if single else "fan_chart.png")
        try:
            atomic_savefig(fig, target)
        finally:
            plt.close(fig)
        written.append(target)
    return written


def stdout_table(table: pd.DataFrame) -> str:
    """Per asset, the first and the last step: when, P5 / P50 / P95 of the close, P(up)."""
    rows = table.groupby("symbol", sort=False).nth([0, -1])
    lines = [
        f"{'symbol':<12} {'step':>4} {'timestamp':<17} {'last close':>12} {'P5':>12} {'P50':>12} "
        f"{'P95':>12} {'P(up)':>6}"
    ]
    for r in rows.itertuples():
        lines.append(
            f"{r.symbol:<12} {r.step:>4} {pd.Timestamp(r.timestamp):%Y-%m-%d %H:%M} {r.last_close:>12.6g} "
            f"{r.p5:>12.6g} {r.p50:>12.6g} {r.p95:>12.6g} {r.p_up:>6.2f}"
        )
    return "\n".join(lines)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
