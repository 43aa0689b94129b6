"""Latency models: time in, nanoseconds out (``models``), named by spec strings (``spec``), replayed as a
live run recorded them (``recorded``), drawn many at once (``batch``). The core delays Laya labels,
Kev answers and orders by them, so they live with it."""
