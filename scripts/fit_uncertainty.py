#!/usr/bin/env python3
"""Fit the uncertainty bands of catalogs/uncertainty.yaml (``planner.uncertainty``) from the
leave-one-source-out residuals of the development set (``planner check-published --loso``).

Prints the table; ``--write`` stores it (tests/test_uncertainty.py checks that the stored table
is what this computes).  Rerun with ``--write`` after any change that moves the LOSO figures.

    python scripts/fit_uncertainty.py [--write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.published import compare_all  # noqa: E402
from planner.uncertainty import MIN_RUNS, fit_table, residual_rows  # noqa: E402

HEADER = f"""\
# Uncertainty bands of predicted step time: 10th/90th percentiles of r = published/predicted - 1
# over the leave-one-source-out predictions of the development set (catalogs/reference/), per
# class family/architecture/mix and its coarser levels (planner/uncertainty.py).  Only levels
# with >= {MIN_RUNS} runs are kept.  Written by scripts/fit_uncertainty.py --write; do not edit by hand.
"""


def table() -> dict:
    rows = residual_rows(compare_all(loso=True))
    return {"schema_version": 1,
            "source": "leave-one-source-out residuals of catalogs/reference/ (planner check-published --loso), "
                      "scripts/fit_uncertainty.py",
            "classes": [{"class": k, **v} for k, v in fit_table(rows).items()]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="store the table in catalogs/uncertainty.yaml")
    args = ap.parse_args()
    doc = table()
    text = HEADER + yaml.safe_dump(doc, sort_keys=False)
    if args.write:
        (ROOT / "catalogs" / "uncertainty.yaml").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
