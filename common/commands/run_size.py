"""What a new run decides and says about its size before it trains: the shape model.size = "auto"
takes from a sweep's fit, how many training candles each candle id gets, and the train split's
token counts a factorized head starts from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, TextIO

import numpy as np
import torch

from common.commands.plan_figures import MIN_TOKENS_PER_PARAMETER
from common.config import DataConfig, ModelConfig
from common.errors import UserError
from common.model.scaling_fit import corpus_of, load_size_fit, size_advice
from common.tokens.ids import RunInfo
from common.tokens.token_set import TokenSet

__all__ = ["MIN_CANDLES_PER_ID", "auto_size", "train_token_counts", "vocabulary_line"]


def auto_size(m: ModelConfig, d: DataConfig, tokens: TokenSet, info: RunInfo, out: Optional[TextIO]) -> Optional[dict]:
    """model.size = "auto": set the shape the scaling fit suggests for the run's training candles
    (common/model/scaling_fit.py) in `m` and return the choice for training_log.json; else None."""
    if m.size != "auto":
        return None
    if not m.size_fit:
        raise UserError(
            "model.size = 'auto' needs model.size_fit: the sweep.json of `marketgpt sweep` on this corpus; "
            "or set model.size=null and the shape yourself"
        )
    fit = load_size_fit(Path(m.size_fit), corpus_of(m, d))
    train = sum(int(r["train"][1]) - int(r["train"][0]) for r in tokens.ranges.values())
    advice = size_advice(
        m, d, train, fit, info.num_assets, info.num_categories, min_tokens_per_parameter=MIN_TOKENS_PER_PARAMETER
    )
    choice = advice["shape"]
    if choice is None:
        raise UserError(f"model.size = 'auto': {advice['text']}; set the shape yourself (model.size=null)")
    m.d_model, m.num_layers, m.num_heads, m.d_ff = (choice[k] for k in ("d_model", "num_layers", "num_heads", "d_ff"))
    print(
        f"model.size = auto: d_model {m.d_model}, num_layers {m.num_layers}, num_heads {m.num_heads}, d_ff {m.d_ff} "
        f"({choice['parameters']:,} parameters): {choice['why']}",
        file=out,
    )
    return choice


def train_token_counts(tokens: TokenSet, vocab_size: int) -> torch.Tensor:
    """(V,) occurrences of each token id in the train split of every asset."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for symbol, toks in tokens.tokens.items():
        b, e = tokens.ranges[symbol]["train"]
        counts += torch.bincount(torch.from_numpy(np.asarray(toks[b:e], dtype=np.int64)), minlength=vocab_size).double()
    return counts


# fewer training candles per candle id than this: the vocabulary is too fine for the data
MIN_CANDLES_PER_ID = 100


def vocabulary_line(tokenizer: Any, tokens: TokenSet) -> str:
    """How many training candles each used candle id gets, with a hint when that is few."""
    candles = sum(int(r["train"][1]) - int(r["train"][0]) for r in tokens.ranges.values())
    ids = tokenizer.ret_bins * tokenizer.shape_bins
    per_id = candles / ids
    line = (
        f"Vocabulary: {ids:,} candle ids ({tokenizer.ret_bins} move x {tokenizer.shape_bins} shape bins) for "
        f"{candles:,} training candles: {per_id:.1f} candles per id"
    )
    if per_id < MIN_CANDLES_PER_ID:
        fewer = max(2, min(tokenizer.ret_bins - 1, candles // (MIN_CANDLES_PER_ID * tokenizer.shape_bins)))
        line += (
            f" (too fine for this data: --set tokenizer.ret_bins={fewer} gives about {MIN_CANDLES_PER_ID}; "
            "see docs/generalization.md)"
        )
    return line
