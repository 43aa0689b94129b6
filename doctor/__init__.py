"""``dualhub doctor``'s checks: can this machine run the stack, and what to do where it cannot.

:func:`run_all` returns one :class:`Check` per row (``ok``/``warn``/``fail``, evidence, fix), grouped by
area: ONNX Runtime (:mod:`.onnx`), GPU (:mod:`.gpu`), Laya (:mod:`.laya`), Kev (:mod:`.kev`), the exchange
(:mod:`.exchange`) and the machine (:mod:`.machine`). Nothing here raises for a problem it finds.
"""

import engine  # noqa: F401 - first: what engine/__init__.py sets holds before any library loads
from doctor.checks import Check, DoctorConfig, exit_code, summary, worst
from doctor.run import run_all

__all__ = ["Check", "DoctorConfig", "exit_code", "run_all", "summary", "worst"]
