"""model_card.json and the README.md of an export (common.forecasting.export): what the model is,
what it learned from (the data cut-off) and how good it is, for machines and for people."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Optional

from common.atomic import read_json_or_empty
from common.paths import REPO_ROOT
from common.run.files import CONFIG_JSON, DATA_INFO_JSON, SCORECARD_JSON, TEST_RESULTS_JSON

__all__ = ["data_cutoff_of", "model_card", "model_card_markdown", "parent_run_of"]


def data_cutoff_of(data_info: dict) -> Optional[str]:
    """The latest test_start over the run's eras (data_info.json): the model learned from, or was
    selected on, no candle from then on. None when data_info.json has no split cuts."""
    cuts = [
        data_info.get("split_cuts", {}).get("test_start"),
        *(era.get("test_start") for era in data_info.get("split_eras", [])),
    ]
    return max((c for c in cuts if c), default=None)  # ISO 8601 in UTC: text order is time order


def parent_run_of(run_dir: Path) -> str:
    """The run folder as model_card.json names it: relative to the repository when inside it
    (case_c_crypto/checkpoints/<run>), else its name. Never an absolute path, which would be
    wrong once the export is moved or shared and would show the exporting machine's layout."""
    run = Path(run_dir).resolve()
    return run.relative_to(REPO_ROOT).as_posix() if run.is_relative_to(REPO_ROOT) else run.name


def model_card(run_dir: Path, fc: Any, export: dict[str, Any], parity: float) -> dict:
    """What the export is (`export`: format, file, kv_cache, step_file, opset, torch_version, from
    common.forecasting.export), what it was trained on, and how good it is (when the run was scored)."""
    data_info = read_json_or_empty(run_dir / DATA_INFO_JSON)
    card = read_json_or_empty(run_dir / SCORECARD_JSON)
    results = read_json_or_empty(run_dir / TEST_RESULTS_JSON)
    cuts = data_info.get("split_cuts", {})
    cfg = fc.cfg
    return {
        "format": export["format"],
        "file": export["file"],
        "inputs": {
            "tokens": "int64 (batch, length), 1 <= length <= context_length",
            "asset_ids": "int64 (batch,), asset_info.json's ids",
            "category_ids": "int64 (batch,), asset_info.json's category ids",
            **(
                {"features": "int64 (batch, length, columns): each candle's ids (common/tokens/features.py)"}
                if cfg.model.reads_features
                else {}
            ),
        },
        # the fitted volume-bin edges a model with candle ids needs for its volume column
        "volume_edges": fc.volume_edges if cfg.model.reads_features else None,
        "outputs": {"logits": "float32 (batch, vocab_size): the next token after the last position"},
        "kv_cache": export["kv_cache"],  # ONNX: model_step.onnx continues model.onnx's keys and values
        "step_file": export["step_file"],
        "opset": export["opset"],
        "context_length": cfg.model.context_length,
        "vocab_size": cfg.model.vocab_size,
        "parameter_count": fc.model.num_parameters(),
        "interval": fc.interval,
        "data_source": cfg.data.source,
        # the model learned from candles before val_start; the best epoch was chosen on candles before test_start
        "training_data_cutoff": cuts.get("val_start"),
        "validation_end": cuts.get("test_start"),
        "data_cutoff": data_cutoff_of(data_info),  # every era's (marketgpt benchmark's leakage rule)
        "universe": list(fc.symbols),
        "parent_run": parent_run_of(run_dir),
        "checkpoint_sha256": fc.checkpoint_sha256,
        "best_epoch": results.get("best_epoch"),
        "test_loss": results.get("test_loss"),
        "scorecard_headline": card.get("headline"),
        "parity_max_abs_diff": parity,
        "exported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": export["torch_version"],
    }


def _headline_text(headline: Optional[dict]) -> Optional[str]:
    """scorecard.json's headline as its verdict line reads: `H=1: CRPS skill vs garch +2.1% [0.8, 3.4] (beats)`."""
    if headline is None:
        return None  # no scorecard
    try:
        lo, hi = headline["ci95"]
        return (
            f"H={headline['horizon']}: CRPS skill vs {headline['baseline']} {100 * headline['value']:+.1f}% "
            f"[{100 * lo:.1f}, {100 * hi:.1f}] ({headline['verdict']})"
        )
    except (TypeError, KeyError, ValueError):
        return None  # no scorecard, or one of another shape: the card says it was not scored


def _number(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def model_card_markdown(card: dict, run_dir: Path, max_symbols: int = 50) -> str:
    """README.md of an hf model folder: the model card in a model hub's form (YAML front matter,
    then what the model is, its data, how good it is, intended use and limits), from model_card.json."""
    cfg = read_json_or_empty(run_dir / CONFIG_JSON)
    name = cfg.get("experiment") or run_dir.name
    lines = [
        *_intro_lines(card, name),
        *_training_data_lines(card, max_symbols),
        *_evaluation_lines(card, run_dir),
        *_limits_lines(card),
        *_files_lines(card),
    ]
    return "\n".join(lines)


def _intro_lines(card: dict, name: str) -> list[str]:
    """The YAML front matter, what the model is and how to load it."""
    universe = card["universe"]
    return [
        "---",
        "library_name: marketgpt",
        "pipeline_tag: time-series-forecasting",
        "tags: [time-series, forecasting, finance, ohlc, gpt]",
        "---",
        "",
        f"# {name}",
        "",
        f"A MarketGPT model: a decoder-only transformer over tokenized OHLC candles ({card['interval']} bars), "
        f"{card['parameter_count']:,} parameters, context of {card['context_length']} candles, conditioned on the "
        "asset. It samples future candle paths, which give quantile bands of the close and P(up).",
        "",
        "## Use",
        "",
        "```python",
        "from common.forecasting.forecaster import Forecaster",
        "",
        'fc = Forecaster.from_pretrained("THIS_FOLDER")   # JSON and safetensors only, no pickle',
        f'result = fc.forecast(fc.load_history(["{universe[0]}"]), horizon=24, samples=256, seed=0)',
        "```",
        "",
        f"or `marketgpt forecast THIS_FOLDER --symbols {universe[0]}` (the MarketGPT package).",
        "",
    ]


def _training_data_lines(card: dict, max_symbols: int) -> list[str]:
    """## Training data: the source, the cut-off dates and the universe (its first `max_symbols` assets)."""
    universe = card["universe"]
    shown = ", ".join(universe[:max_symbols]) + (
        f", ... ({len(universe)} in all)" if len(universe) > max_symbols else ""
    )
    return [
        "## Training data",
        "",
        f"- source: `{card['data_source']}`, interval `{card['interval']}`",
        f"- data cut-off: the model learned from candles before **{card['training_data_cutoff']}**; its best epoch "
        f"was chosen on candles before {card['validation_end']}; later candles are the test split",
        f"- universe ({len(universe)} assets, asset_info.json's ids): {shown}",
        "",
    ]


def _evaluation_lines(card: dict, run_dir: Path) -> list[str]:
    """## Evaluation: the scorecard's headline and verdicts (or that it was not scored) and the test loss."""
    headline = _headline_text(card["scorecard_headline"])
    verdicts = read_json_or_empty(run_dir / SCORECARD_JSON).get("verdicts") or []
    score = (
        [
            f"Scorecard headline (walk-forward over the test split, CRPS skill against the best price "
            f"baseline at the shortest horizon, 95% interval): **{headline}**",
            "",
        ]
        + [f"- {line}" for line in verdicts]
        if headline
        else [
            "Not scored: this run has no scorecard.json (`marketgpt scorecard RUN_DIR`, then export again). "
            "Judge no forecast of it before it is scored."
        ]
    )
    return [
        "## Evaluation",
        "",
        *score,
        "",
        f"Test loss (token cross-entropy): {_number(card['test_loss'])}; best epoch: {card['best_epoch']}.",
        "",
    ]


def _limits_lines(card: dict) -> list[str]:
    """## Intended use and ## Limits."""
    return [
        "## Intended use",
        "",
        "Research on probabilistic forecasts of the assets above at this interval: quantile bands, P(up) and "
        "sampled paths, compared against price baselines (random walk, bootstrap, GARCH) with the scorecard.",
        "",
        "## Limits",
        "",
        "- Not investment advice and not a trading system.",
        "- It knows only the assets of its universe; another asset needs a new training run.",
        f"- Its weights learned from nothing after {card['training_data_cutoff']} (its epoch was chosen on candles "
        f"up to {card['validation_end']}): a market that changes after that is outside what it learned.",
        "- Bands come from sampled paths; `top_k` / `top_p` narrow them and make them overconfident.",
        "- Exchange holidays are not known: a forecast's calendar puts a bar on them.",
        "",
    ]


def _files_lines(card: dict) -> list[str]:
    """## Files: what the folder holds, and where it was exported from."""
    return [
        "## Files",
        "",
        "| file | what |",
        "|---|---|",
        "| `model.safetensors` | the weights (safetensors); header metadata: parent checkpoint sha256, training "
        "precision, volume edges |",
        "| `config.json` | the training run's config (model shape, data, training) |",
        "| `tokenizer.json` | the fitted OHLC tokenizer: candles to token ids and back |",
        "| `asset_info.json` | asset and category ids |",
        "| `model_card.json` | this card as data |",
        "",
        f"Exported {card['exported_at']} from checkpoint sha256 `{card['checkpoint_sha256']}` "
        f"with torch {card['torch_version']}.",
        "",
    ]
