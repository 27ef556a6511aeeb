"""Candles to tokens: the OHLC tokenizer and the per-candle input features."""
