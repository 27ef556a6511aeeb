"""OHLC candle tokenizer (being written: see issue 2)."""
from __future__ import annotations

# Special tokens sit at the bottom of every vocabulary.
PAD_TOKEN = 0  # padding, never a target
MISSING_TOKEN = 1  # a candle that is NaN or absent
BOS_TOKEN = 2  # sequence start: the first candles of a series, before a move can be measured
NUM_SPECIAL_TOKENS = 3
