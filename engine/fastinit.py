"""Positional constructors for frozen, slotted dataclasses on hot paths.

A frozen dataclass's ``__init__`` sets every field through ``object.__setattr__`` (keyword arguments,
one call per field): for the replay's per-book and per-intent objects that costs more than the work
done with them. :func:`frozen_maker` returns ``make(*values)`` that builds an object equal to
``cls(**dict(zip(fields, values)))`` by setting the slots directly; defaults are not applied, so every
field must be passed, and classes with ``__post_init__`` are refused (it would be skipped).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def frozen_maker(cls: type[T]) -> Callable[..., T]:
    """``make(v1, ..., vn)`` for every field of ``cls`` in declaration order."""
    if not (dataclasses.is_dataclass(cls) and "__slots__" in cls.__dict__):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__, which a maker would skip")
    names = [f.name for f in dataclasses.fields(cls)]
    env: dict[str, Any] = {"new": object.__new__, "cls": cls}
    env.update({f"set_{n}": cls.__dict__[n].__set__ for n in names})
    body = "\n".join(f"    set_{n}(o, {n})" for n in names)
    src = f"def make({', '.join(names)}):\n    o = new(cls)\n{body}\n    return o\n"
    exec(src, env)  # noqa: S102 - generated from field names of a dataclass, nothing external
    make = env["make"]
    make.__doc__ = f"{cls.__name__} from positional field values (see engine.fastinit)."
    return make
