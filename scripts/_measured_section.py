"""Store a measured table as a delimited section of a hand-written catalog file (the
``scripts/measure_*.py`` writers): replace the section between its ``begin`` and ``end`` marker
lines, or insert it before ``anchor`` the first time; ``main`` is the writers' command line."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Callable

EFFICIENCY = Path(__file__).resolve().parents[1] / "catalogs" / "efficiency.yaml"
FITTED_BLOCK = "# --- fitted by scripts/fit_efficiency.py"


def store_section(path: Path, text: str, begin: str, end: str, anchor: str) -> None:
    """Write ``text`` (starting with ``begin``, ending with ``end``) into ``path``."""
    doc = path.read_text(encoding="utf-8")
    if begin in doc:
        doc = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: text, doc, flags=re.S)
    else:
        if anchor not in doc:
            raise SystemExit(f"{path}: no line {anchor.strip()!r} to insert the section before")
        doc = doc.replace(anchor, text + anchor, 1)
    path.write_text(doc, encoding="utf-8")


def main(description: str, table: Callable[[], str], begin: str, end: str) -> int:
    """Print the measured ``table`` (a section from ``begin`` to ``end``); with ``--write`` store
    it in catalogs/efficiency.yaml (the first time before the fitted block)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--write", action="store_true", help="store the table in catalogs/efficiency.yaml")
    args = ap.parse_args()
    text = table()
    print(text, end="")
    if args.write:
        store_section(EFFICIENCY, text, begin, end, FITTED_BLOCK)
    return 0
