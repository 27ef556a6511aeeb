"""SyntheticSpec: the settings of common.data.synthetic's market, in the config package so the
config (data.synthetic with data.source = "synthetic") checks them as the spec does, without
pandas. The market itself is made in common/data/synthetic.py, which re-exports SyntheticSpec.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from common.errors import UserError
from common.markets import CATEGORIES, INTERVAL_SECONDS

__all__ = ["PROCESSES", "SyntheticSpec", "SyntheticSpecError", "spec_from_dict"]

PROCESSES = ("garch", "rich")


class SyntheticSpecError(UserError):
    """A SyntheticSpec setting that can't be used: `key` names it, `why` says what is wrong."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"SyntheticSpec.{key} {why}")
        self.key, self.why = key, why


@dataclass(frozen=True)
class SyntheticSpec:
    assets: int = 4
    candles: int = 1000  # slots of the time grid per asset (rows: about candles * (1 - gap_prob))
    interval: str = "1d"  # a key of common.markets.INTERVAL_SECONDS
    start: str = "2020-01-01"  # first slot, ISO 8601 (2020-01-01, 2024-03-01 09:30), UTC if naive
    seed: int = 0
    daily_vol: float = 0.02  # sd of a day's log return in the calm regime
    drift: float = 0.0  # mean log return per day
    nu: float = 5.0  # Student-t degrees of freedom (> 2: finite variance)
    garch_alpha: float = 0.08
    garch_beta: float = 0.9  # garch_alpha + garch_beta < 1 (stationary)
    p_stress: float = 0.01  # per candle: calm -> stressed
    p_calm: float = 0.05  # per candle: stressed -> calm
    stress_vol: float = 2.0  # volatility multiplier in the stressed regime
    market_beta: float = 0.5  # loading on the market factor, in [-1, 1]
    seasonality: float = 1.5  # U-shape depth over the day, sub-daily only (0: flat)
    gap_prob: float = 0.0  # chance that a slot has no candle
    categories: tuple[str, ...] = ("us_stock",)  # asset i is of categories[i % len(categories)]
    # "garch": GARCH(1,1)-t, 2 regimes, one factor (common/data/synthetic.py); "rich": long-memory
    # variance, leverage, 3 regimes, jumps, a nonlinear mean, lead-lag (common/data/synthetic_rich.py)
    process: str = "garch"

    def __post_init__(self) -> None:
        checks = [
            ("assets", self.assets >= 1, "must be at least 1"),
            ("candles", self.candles >= 2, "must be at least 2"),
            ("interval", self.interval in INTERVAL_SECONDS, f"must be one of {', '.join(INTERVAL_SECONDS)}"),
            ("daily_vol", self.daily_vol > 0, "must be > 0"),
            ("nu", self.nu > 2, "must be > 2 (the t needs a finite variance)"),
            ("garch_alpha", self.garch_alpha >= 0, "must be >= 0"),
            ("garch_beta", self.garch_beta >= 0, "must be >= 0"),
            ("garch_beta", self.garch_alpha + self.garch_beta < 1, "plus garch_alpha must be < 1 (stationary)"),
            ("p_stress", 0 <= self.p_stress <= 1, "must be in [0, 1]"),
            ("p_calm", 0 <= self.p_calm <= 1, "must be in [0, 1]"),
            ("stress_vol", self.stress_vol > 0, "must be > 0"),
            ("market_beta", -1 <= self.market_beta <= 1, "must be in [-1, 1]"),
            ("seasonality", self.seasonality >= 0, "must be >= 0"),
            ("gap_prob", 0 <= self.gap_prob < 1, "must be in [0, 1)"),
            ("process", self.process in PROCESSES, f"must be one of {', '.join(map(repr, PROCESSES))}"),
            (
                "categories",
                len(self.categories) > 0 and set(self.categories) <= set(CATEGORIES),
                f"must be a non-empty list of {', '.join(CATEGORIES)}",
            ),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise SyntheticSpecError(name, f"= {getattr(self, name)!r} {rule}")
        try:  # ISO 8601 without pandas: the config checks a spec and loads without pandas
            datetime.fromisoformat(self.start.replace("Z", "+00:00"))
        except (ValueError, TypeError, AttributeError):
            raise SyntheticSpecError("start", f"= {self.start!r} is not a timestamp (e.g. 2020-01-01)") from None

    def symbol(self, i: int) -> str:
        """SYN0000, SYN0001, ...: safe as a file name, sorted like the asset index."""
        return f"SYN{i:0{max(4, len(str(self.assets - 1)))}d}"

    def category(self, i: int) -> str:
        """Asset i's category: the categories in turn."""
        return self.categories[i % len(self.categories)]


def spec_from_dict(values: Mapping[str, Any], fixed: Mapping[str, Any] | None = None) -> SyntheticSpec:
    """A spec from JSON values (the config's data.synthetic) plus `fixed` settings the caller sets
    (the config's interval and start). An unknown key, a value of the wrong type or an impossible
    one is a SyntheticSpecError naming the key; a list of categories becomes the tuple."""
    fixed = dict(fixed or {})
    defaults = {f.name: f.default for f in dataclasses.fields(SyntheticSpec) if f.name not in fixed}
    settings: dict[str, Any] = {}
    for key, value in values.items():
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(defaults)}"
            raise SyntheticSpecError(key, f"is not a setting of the synthetic market ({hint})")
        settings[key] = _typed(key, value, defaults[key])
    return SyntheticSpec(**settings, **fixed)


def _typed(key: str, value: Any, default: Any) -> Any:
    """`value` as the type of the field's default (an integral float such as 2e4 counts as an integer)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, tuple):
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        expected = 'a list of strings, e.g. ["crypto", "fx"]'
    elif isinstance(default, float):
        if number:
            return float(value)
        expected = "a number"
    elif isinstance(default, int):
        if number and float(value).is_integer():
            return int(value)
        expected = "an integer"
    else:
        if isinstance(value, str):
            return value
        expected = "a string"
    raise SyntheticSpecError(key, f"= {value!r} must be {expected}")
