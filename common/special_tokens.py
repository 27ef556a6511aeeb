"""The special token ids at the bottom of every vocabulary. No dependencies, so the config
check, the model and the trainer can use them without importing the tokenizer (numpy, pandas)."""

from __future__ import annotations

PAD_TOKEN = 0  # padding, never a target
MISSING_TOKEN = 1  # a candle that is NaN or absent
BOS_TOKEN = 2  # sequence start: the first candles of a series, before a move can be measured
NUM_SPECIAL_TOKENS = 3
