"""The one JSON writer of the project: every ``--json`` output and every JSON file it writes.

JSON (RFC 8259) has no NaN or Infinity; Python's ``json`` module writes them anyway, and
``jq``, JavaScript's ``JSON.parse`` and most other readers then refuse the whole document.
``to_jsonable`` turns a result into plain JSON values once, the same way everywhere:

* a non-finite float (NaN, +-inf: "not measured", "unbounded", "no plan") becomes ``null``;
* numpy scalars and arrays become Python numbers and lists, tuples and sets become lists,
  mapping keys become strings, dataclasses become their fields, paths their text;
* anything else is written as its ``str`` (an id-like object), never raising mid-output.

``dumps`` then serialises with ``allow_nan=False``, so a non-finite number that slipped past
the conversion fails loudly here instead of producing invalid JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any


def to_jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values (module docstring)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    item = getattr(obj, "item", None)  # numpy scalar
    if callable(item) and getattr(obj, "shape", None) == ():
        return to_jsonable(item())
    tolist = getattr(obj, "tolist", None)  # numpy array
    if callable(tolist):
        return to_jsonable(tolist())
    return str(obj)


def dumps(obj: Any, *, indent: int | None = 2, compact: bool = False) -> str:
    """Strict JSON text of ``obj`` (never NaN/Infinity); ``compact``: no spaces, no indent."""
    if compact:
        return json.dumps(to_jsonable(obj), allow_nan=False, separators=(",", ":"))
    return json.dumps(to_jsonable(obj), allow_nan=False, indent=indent)


def print_json(obj: Any) -> None:
    """Print ``obj`` as strict JSON on stdout (every command's ``--json``)."""
    print(dumps(obj))
