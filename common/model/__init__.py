"""The network: MarketGPT, its output heads, KV-cache sampling and its size and memory."""
