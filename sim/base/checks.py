"""Value checks shared by the frozen specs (``sim.data.specs``, ``sim.data.hostspecs``): each raises an
``InputError`` naming the field and the value."""

from __future__ import annotations

import math

from sim.base.errors import InputError

# Limits that catch typos and overflow, not hardware: far above anything built today.
MAX_DIM = 1 << 24


def positive_int(name: str, value: object, *, limit: int = MAX_DIM) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(name, value, "must be an integer")
    if value < 1:
        raise InputError(name, value, "must be >= 1")
    if value > limit:
        raise InputError(name, value, f"must be <= {limit}")


def positive_float(name: str, value: object, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(name, value, "must be a number")
    if not math.isfinite(value):
        raise InputError(name, value, "must be finite")
    if value < 0 or (value == 0 and not allow_zero):
        raise InputError(name, value, "must be > 0" if not allow_zero else "must be >= 0")


def choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(name, value, f"must be one of {', '.join(choices)}")
