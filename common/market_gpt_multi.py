"""The seed guide's import path: `from common.market_gpt_multi import MarketGPTMultiAsset`.

It is the same class as `common.model.gpt.MarketGPT` (not a subclass or a copy), so checkpoints
and isinstance checks work whichever name a script uses.
"""

from __future__ import annotations

from common.model.gpt import MarketGPT

__all__ = ["MarketGPTMultiAsset"]

MarketGPTMultiAsset = MarketGPT
