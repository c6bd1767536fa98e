#!/usr/bin/env python3
"""Measure eager PyTorch's HBM traffic of each element-wise code variant (validate/eager_traffic.py:
forward and autograd backward bytes counted per aten call, over the fused op's forward bytes).

Prints the table; ``--write`` stores it as the ``eager_traffic`` section of
catalogs/efficiency.yaml (read by sim.layers.compute.op_time).  tests/test_eager_traffic.py
re-measures and checks that the stored values are what this computes.  Needs torch (the
``torch`` extra); runs on CPU in a few seconds.

    python scripts/measure_eager_traffic.py [--write]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _measured_section import main  # noqa: E402
from validate.eager_traffic import measure  # noqa: E402

BEGIN = "# --- measured by scripts/measure_eager_traffic.py; do not edit by hand ---\n"
END = "# --- end of measured eager traffic ---\n"
SOURCE = ("aten calls of each code variant counted under a TorchDispatchMode, forward and "
          "torch.autograd.backward (validate/eager_traffic.py; PyTorch tools/autograd/derivatives.yaml "
          "formulas), torch 2.13 CPU; per-variant code sources in the module docstring")


def section(rows: list) -> str:
    lines = [BEGIN,
             "# Eager element-wise traffic: (forward, backward) bytes of each code variant run as one kernel\n",
             "# per aten op, over the bytes of the fused forward kernel sim/layers/ops.py counts (fused_op).\n",
             "eager_traffic:\n", f"  source: \"{SOURCE}\"\n", "  kernels:\n"]
    for r in rows:
        lines.append(f"    {r.kernel}: {{fwd: {r.fwd:.4f}, bwd: {r.bwd:.4f}, fused_op: {r.fused_op}}}\n")
    return "".join(lines) + END


if __name__ == "__main__":
    raise SystemExit(main(__doc__, lambda: section(measure()), BEGIN, END))
