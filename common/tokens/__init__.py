"""Candles to tokens: the OHLC tokenizer, the per-candle input features, the ids a run embeds
(ids.py: asset_info.json as `RunInfo`) and the token shards a run's tokens come from."""
