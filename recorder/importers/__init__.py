"""Importers of real recorded market data into dualhub sessions (Binance USD-M raw feed, Bitget v1)."""
