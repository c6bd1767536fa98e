"""Errors the core raises.

``InputError`` is bad user input (unknown id, malformed file, a value out of range): the CLI
turns it into one line on stderr and exit status 2.  ``InfeasibleError`` is a plan that
cannot run (degrees that do not divide, ...): the search counts these per ``reason``.
Both are ``ValueError`` subclasses so library callers can catch them together.
"""

from __future__ import annotations


class InputError(ValueError):
    """A user-supplied value is wrong.  ``field`` and ``value`` name it."""

    def __init__(self, field: str, value: object, message: str) -> None:
        self.field = field
        self.value = value
        self.message = message
        super().__init__(f"{field}={_short(value)}: {message}")


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


def _short(value: object, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, str) else value
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
