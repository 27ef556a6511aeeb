"""The seed guide's import path: `from common.tokenizer import OHLCTokenizer`.

The tokenizer lives in `common.tokens.tokenizer`; this name is kept for users' scripts.
"""

from __future__ import annotations

from common.tokens.tokenizer import OHLCTokenizer

__all__ = ["OHLCTokenizer"]
