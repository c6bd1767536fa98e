"""Unit constants and the one formatter of durations the reports share.

Catalog values are converted to SI units once at load (``sim.catalog``); what is left in code is
the binary unit that memory is reported in."""

from __future__ import annotations

GIB = float(1 << 30)
"""Bytes in a gibibyte (memory is reported in GiB, as ``nvidia-smi`` and PyTorch do)."""
