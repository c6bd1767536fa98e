"""Unit constants and the one formatter of durations the reports share (``fmt_s``).

Catalog values are converted to SI units once at load (``sim.data.catalog``); what is left in code is
the binary unit that memory is reported in."""

from __future__ import annotations

GIB = float(1 << 30)
"""Bytes in a gibibyte (memory is reported in GiB, as ``nvidia-smi`` and PyTorch do)."""


def fmt_s(t: float, *, ms_digits: int = 2) -> str:
    """A duration as every report prints it: ``1.25 h`` from an hour, ``20.117 s`` from a second,
    else milliseconds with ``ms_digits`` decimals (``812.40 ms``; explanations use 1)."""
    if t >= 3600:
        return f"{t / 3600:.2f} h"
    if t >= 1:
        return f"{t:.3f} s"
    return f"{t * 1e3:.{ms_digits}f} ms"
