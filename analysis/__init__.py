"""Reading a finished run: the DuckDB views over its event files (``views.sql``), the report's checks
and queries (``report``), the tear sheet, the portfolio section with its lead and hedge-ratio fit, the
HTML report, the sweep plot and the console report (``console``, over all of them)."""

import engine  # noqa: F401 - first: what engine/__init__.py sets holds before any library loads
