"""Judging a model: token metrics and baselines, the price-space scorecard, backtest, report."""
