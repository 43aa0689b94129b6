"""The Binance USD-M importer under its original module name (callers import it from here)."""

from recorder.importers.binance import BinanceBookBuilder, import_binance_usdm, iter_lines

__all__ = ["BinanceBookBuilder", "import_binance_usdm", "iter_lines"]
