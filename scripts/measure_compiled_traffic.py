#!/usr/bin/env python3
"""Measure the HBM traffic of torchao's float8 casts (of activations, gradients and weights) fused
by torch.compile (inductor) into the compiled block (validate/compiled_traffic.py: inductor's
generated kernels' read and written bytes, the float8 block less the 16-bit one, at four shapes).

Prints the table; ``--write`` stores it as the ``compiled_fp8_casts`` section of
catalogs/efficiency.yaml (read by sim.layers.compute.kernel_efficiency, priced by
sim.layers.ops._with_fp8_casts and sim.layers.compute.fp8_weight_cast_bytes_per_param for
profiles with ``fp8_cast_kernels: inductor``).
tests/test_eager_traffic.py re-measures one producer at small shapes.  Needs torch and torchao
(the ``torch`` extra); about three minutes on 2 CPU cores (it compiles 16 blocks).

    python scripts/measure_compiled_traffic.py [--write]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _measured_section import main  # noqa: E402
from validate.compiled_traffic import measure  # noqa: E402

BEGIN = "# --- measured by scripts/measure_compiled_traffic.py; do not edit by hand ---\n"
END = "# --- end of measured compiled traffic ---\n"
SOURCE = ("bytes read and written by inductor's generated kernels (Scheduler nodes' get_read_write_buffers_sizes, "
          "extern GEMMs excluded) of a compiled block with torchao Float8Linear (recipe tensorwise) less the same "
          "block with nn.Linear, at 4 shapes separating per-token from per-weight terms (validate/compiled_traffic.py); "
          "torch 2.13 CPU, torchao 0.18")


def section(rows: list) -> str:
    lines = [BEGIN,
             "# torchao float8 casts under torch.compile: bytes per element of the GEMM input (forward, backward)\n",
             "# and of its output gradient (backward), by the input's producer (an element-wise kernel the casts\n",
             "# fuse into, or an extern kernel such as attention), and per weight element (forward + backward, per\n",
             "# micro-batch: the weight's amax, cast and transposed cast).\n",
             "compiled_fp8_casts:\n", f"  source: \"{SOURCE}\"\n", "  recipes:\n", "    tensorwise:\n"]
    for r in rows:
        lines.append(f"      {r.producer}: {{input_fwd: {r.input_fwd:.4f}, input_bwd: {r.input_bwd:.4f}, "
                     f"grad_bwd: {r.grad_bwd:.4f}, weight: {r.weight:.4f}}}\n")
    return "".join(lines) + END


if __name__ == "__main__":
    raise SystemExit(main(__doc__, lambda: section(measure()), BEGIN, END))
