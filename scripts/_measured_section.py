"""Store a measured table as a delimited section of a hand-written catalog file (the
``scripts/measure_*.py`` writers): replace the section between its ``begin`` and ``end`` marker
lines, or insert it before ``anchor`` the first time."""

from __future__ import annotations

import re
from pathlib import Path


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
