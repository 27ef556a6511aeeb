"""MarketGPT: GPT-style transformers on tokenized market candles.

Modules, each one thing: config (typed case configs), tokenizer (OHLC -> tokens), model
(the transformer), data (universes, sources, cache, sample, cleaning and splits), and the
training, evaluation, distributed and Slurm pieces built on them.
"""
__version__ = "0.1.0"
