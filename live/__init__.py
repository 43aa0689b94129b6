"""Live mode: the replay engine on a real-time clock, fed by Bitget's WebSockets, trading on paper or
through Bitget's signed REST API, recording everything into a session and run that replay."""

import engine  # noqa: F401 - first: what engine/__init__.py sets holds before any library loads
