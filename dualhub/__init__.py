import engine  # noqa: F401 - first: what engine/__init__.py sets holds before any library loads
