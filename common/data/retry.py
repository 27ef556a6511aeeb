"""How a download asks again after a failure, shared by the Yahoo and ccxt adapters: one frozen
object instead of the same three keyword arguments threaded through every call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """At most `max_retries` retries after the first attempt, waiting base_delay_s, 2x, 4x, ...

    Each source keeps its own defaults (common.data.yahoo.YAHOO_RETRY, common.data.crypto.CCXT_RETRY);
    `sleep` is how the download waits (between attempts and between paced calls); tests pass a recorder.
    """

    max_retries: int
    base_delay_s: float
    sleep: Callable[[float], None] = time.sleep
