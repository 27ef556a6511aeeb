"""Market data: universes, sources (yfinance, ccxt, the shipped sample), the parquet cache,
loading, and cleaning + time splits.

Modules are imported where used (`from common.data.prepare import prepare_data`), so importing
this package stays cheap and never touches the network.
"""

__all__: list[str] = []
