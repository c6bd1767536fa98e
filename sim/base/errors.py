"""Errors the core raises.

``InputError`` is bad user input (unknown id, malformed file, a value out of range): the CLI
turns it into one line on stderr and exit status 2.  ``InfeasibleError`` is a plan that
cannot run (degrees that do not divide, ...): the search counts these per ``reason``.
Both are ``ValueError`` subclasses so library callers can catch them together.
"""

from __future__ import annotations

import reprlib
from typing import Any


class InputError(ValueError):
    """A user-supplied value is wrong.  ``field`` and ``value`` name it."""

    def __init__(self, field: str, value: object, message: str) -> None:
        self.field = field
        self.value = value
        self.message = message
        # args are the constructor's, so the error copies and pickles as itself (simpy re-raises
        # a process's exception as ``type(exc)(*exc.args)``, a process pool pickles it)
        super().__init__(field, value, message)

    def __str__(self) -> str:
        return f"{self.field}={_short(self.value)}: {self.message}"


class InfeasibleError(InputError):
    """A plan that cannot be executed, with a machine-readable ``reason``.

    Reasons used by the core: ``indivisible`` (degrees or batch do not divide), ``gpu_count``
    (degrees do not multiply to the GPU count), ``heads`` (tp/cp does not divide heads or
    sequence), ``layers`` (pp*vp does not divide layers), ``experts`` (ep does not divide the
    experts), ``unsupported`` (a combination no framework runs).
    """

    def __init__(self, reason: str, field: str, value: object, message: str) -> None:
        self.reason = reason
        super().__init__(field, value, message)
        self.args = (reason, field, value, message)


def _short(value: object, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, str) else value
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable_value(value: Any) -> Any:
    """``value`` itself if small, else a bounded repr (for error messages)."""
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= 128 else f"<{value.bit_length()}-bit integer>"
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "..."
    try:
        return _REPR.repr(value)
    except Exception:  # e.g. an int too long to print inside a container
        return f"<{type(value).__name__}>"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring, _REPR.maxother = 3, 6, 6, 60, 60
_REPR.maxlong = 40
