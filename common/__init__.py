"""MarketGPT: GPT-style transformers on tokenized market candles.

Packages as floors, each importing only the floors below it (docs/architecture.md):
root (errors, atomic, paths, markets, config) -> data, tokens -> model -> distributed ->
training -> forecasting -> evaluation -> commands -> cluster, with cli/ on top.
"""

__version__ = "0.1.0"
