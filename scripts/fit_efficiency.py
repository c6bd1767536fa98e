#!/usr/bin/env python3
"""Fit the hardware-efficiency constants of catalogs/efficiency.yaml (``planner.fitting.fit``).

Inputs: NCCL bus-bandwidth curves and Korthikanti et al. 2022 Table 4 (the ``microbenchmarks``
section of catalogs/reference/published_runs.yaml; Table 4 is reported against the fit, not
fitted), the kernel microbenchmarks of catalogs/microbenchmarks/ (GEMM sweeps give the shape
factor) and the vTrain measurements.  No scored run's throughput is used.
Prints the fitted values; ``--write`` stores them in the ``fitted`` block of
catalogs/efficiency.yaml (tests/test_fit_efficiency.py checks that the stored values are what
this computes, so they cannot drift).  ``--exclude korthikanti2022`` shows the fit
leave-one-source-out scoring uses for that source.

    python scripts/fit_efficiency.py [--write] [--exclude SOURCE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.fitting.fit import FIT_SOURCES, fit_all  # noqa: E402

MARKER = "# --- fitted by scripts/fit_efficiency.py; do not edit by hand ---\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="store the fitted values in catalogs/efficiency.yaml")
    ap.add_argument("--exclude", action="append", default=[], choices=sorted(FIT_SOURCES - {"vtrain"}),
                    help="fit without this source's data (leave-one-source-out)")
    args = ap.parse_args()
    if args.write and args.exclude:
        ap.error("--write stores the full fit only")
    fitted = fit_all(frozenset(args.exclude))
    print(yaml.safe_dump(fitted, sort_keys=False))
    if args.write:
        path = ROOT / "catalogs" / "efficiency.yaml"
        head = path.read_text(encoding="utf-8").split(MARKER)[0].rstrip("\n") + "\n"
        path.write_text(head + MARKER + yaml.safe_dump({"fitted": fitted}, sort_keys=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
