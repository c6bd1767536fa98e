#!/usr/bin/env python3
"""Fit catalogs/uncertainty.yaml (``planner.fitting.uncertainty``) from the leave-one-source-out
comparisons of the development set (``planner check-published --loso``): the calibrated
step-time bias and 80% band per class, their measured leave-one-source-out coverage, the
default memory headroom and the best published MFU per GPU architecture and precision.

Prints the document; ``--write`` stores it (tests/test_uncertainty.py checks that the stored
document is what this computes).  Rerun with ``--write`` after any change that moves the LOSO
figures.

    python scripts/fit_uncertainty.py [--write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.fitting.published import compare_all  # noqa: E402
from planner.fitting.uncertainty import MIN_RUNS, MIN_SOURCES, fit_document  # noqa: E402

HEADER = f"""\
# Calibrated step-time estimate and 80% band (planner/fitting/uncertainty.py), from the leave-one-source-
# out predictions of the development set (catalogs/reference/).  centers: the model's bias
# (median published/predicted - 1) per GPU architecture/framework family, architecture, all;
# spreads: 10th/90th percentiles of the out-of-source deviations per GPU architecture, all.
# Levels need >= {MIN_RUNS} runs from >= {MIN_SOURCES} sources.  coverage: share of published step times
# inside their band, each source scored by the table fitted without it.  memory: the default
# --memory-headroom.  published_mfu: best published MFU per architecture and precision.
# Written by scripts/fit_uncertainty.py --write; do not edit by hand.
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="store the document in catalogs/uncertainty.yaml")
    args = ap.parse_args()
    text = HEADER + yaml.safe_dump(fit_document(compare_all(loso=True)), sort_keys=False)
    if args.write:
        (ROOT / "catalogs" / "uncertainty.yaml").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
