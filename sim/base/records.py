"""The one validator of catalog records: typed getters whose errors name file, record and key.

Every YAML catalog (``catalogs/*.yaml``: hardware, models, efficiency, runtime, frameworks,
conventions, prices, failures, storage, ...) is read by ``sim.data.catalog`` and each record's fields
are converted here, once, at load.  A malformed value is an ``InputError`` whose field is
``<kind>[<id>].<key>`` and whose message starts with the file name, so a typo in a catalog is
reported as one line naming what to fix.  Bounds are stated by the caller (``positive``,
``minimum``): there is no per-file convention to remember.

The value a user wrote is what an error names, never a number derived from it: a number is
finite and below ``MAX_MAGNITUDE`` in its own unit, so no unit conversion (TB/s to bytes/s)
can overflow, and ``build`` constructs a spec from a record, reporting a check the spec makes
on a converted field (``hbm_bytes_per_s``) against the record key it came from (``hbm_tb_per_s``)
and the record's file.  Profiles measured by ``planner validate`` (``sim.cost.calibration``) and
the reference rows go through the same checks.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Iterable, Mapping

from sim.base.errors import InputError, printable_value

# Largest magnitude of a number in a record, in the record's own unit: far above any hardware,
# price or count, small enough that scaling by 2^40 (bytes per TiB) stays finite.
MAX_MAGNITUDE = 1e18


class Record:
    """Typed access to one raw record.  ``where`` names it (``gpu[a100-80gb]``), ``file`` is the
    catalog's file name; ``allowed`` (when given) rejects unknown keys, so a misspelt key
    cannot silently drop a number."""

    def __init__(self, rec: Mapping[str, Any], *, where: str, file: str = "",
                 allowed: Iterable[str] | None = None) -> None:
        if not isinstance(rec, Mapping):
            raise InputError(where, printable_value(rec), f"{file}: must be a mapping")
        self.rec, self.where, self.file = rec, where, file
        if allowed is not None:
            allowed = frozenset(allowed)
            for key in rec:
                if key not in allowed:
                    close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
                    hint = f" (did you mean {close[0]}?)" if close else ""
                    raise self.fail(str(key), f"unknown key{hint}")

    def fail(self, key: str, message: str) -> InputError:
        prefix = f"{self.file}: " if self.file else ""
        return InputError(f"{self.where}.{key}", printable_value(self.rec.get(key)), prefix + message)

    def has(self, key: str) -> bool:
        return self.rec.get(key) is not None

    def number(self, key: str, *, optional: bool = False, default: float | None = None,
               positive: bool = False, signed: bool = False) -> float | None:
        """A finite number, ``>= 0`` (``> 0`` when ``positive``, any sign when ``signed``);
        ``default`` when absent and ``optional``."""
        value = self.rec.get(key)
        if value is None:
            if optional:
                return default
            raise self.fail(key, "missing required key")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, "must be a finite number")
        if abs(value) > MAX_MAGNITUDE:
            raise self.fail(key, f"must be a number of magnitude at most {MAX_MAGNITUDE:g}")
        if (value < 0 and not signed) or (positive and value <= 0):
            raise self.fail(key, "must be > 0" if positive else "must be >= 0")
        return float(value)

    def req(self, key: str, *, positive: bool = False) -> float:
        """A required ``number``."""
        v = self.number(key, positive=positive)
        assert v is not None
        return v

    def fraction(self, key: str, *, optional: bool = False, default: float | None = None) -> float | None:
        v = self.number(key, optional=optional, default=default)
        if v is not None and v > 1:
            raise self.fail(key, "must be a fraction in [0, 1]")
        return v

    def integer(self, key: str, *, minimum: int = 1, optional: bool = False,
                default: int | None = None) -> int | None:
        """An integer ``>= minimum``; ``default`` when absent and ``optional``."""
        value = self.rec.get(key)
        if value is None and optional:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum}")
        if value > MAX_MAGNITUDE:
            raise self.fail(key, f"must be at most {MAX_MAGNITUDE:g}")
        return value

    def text(self, key: str, *, default: str | None = None, choices: Iterable[str] | None = None) -> str:
        value = self.rec.get(key)
        if value is None:
            if default is None:
                raise self.fail(key, "missing required key")
            return default
        if not isinstance(value, str):
            raise self.fail(key, "must be a string")
        value = value.strip()
        if choices is not None and value not in tuple(choices):
            raise self.fail(key, f"must be one of {', '.join(choices)}")
        return value

    def flag(self, key: str, *, default: bool = False) -> bool:
        value = self.rec.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, "must be true or false")
        return value

    def strings(self, key: str, *, lower: bool = True) -> tuple[str, ...]:
        value = self.rec.get(key) or []
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "must be a list of strings")
        return tuple(v.strip().lower() if lower else v.strip() for v in value)

    def table(self, key: str, *, keys: Iterable[str], optional: bool = False) -> dict[str, float]:
        """A non-empty mapping of names in ``keys`` to positive numbers."""
        value = self.rec.get(key)
        if value is None and optional:
            return {}
        known = tuple(keys)
        if not isinstance(value, Mapping) or not value:
            raise self.fail(key, f"must be a mapping of ({', '.join(known)}) to a number")
        out = {}
        for k, v in value.items():
            sub = Record(value, where=f"{self.where}.{key}", file=self.file)
            if k not in known:
                raise sub.fail(str(k), f"unknown key; known: {', '.join(known)}")
            out[str(k)] = sub.req(str(k), positive=True)
        return out

    def build(self, cls: type, *, keys: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
        """``cls(**kwargs)``, with a check the spec makes reported against this record: the
        field it names (``gpu[x].hbm_bytes_per_s``, ``link[y].bytes_per_s_per_direction``) is
        mapped to the record key it was converted from (``keys``: ``{"hbm_bytes_per_s":
        "hbm_tb_per_s"}``; unmapped fields are their own key), the value shown is the one in
        the record, and the message starts with the file name."""
        try:
            return cls(**kwargs)
        except InputError as exc:
            field = str(exc.field)
            for prefix in (self.where + ".", self.where.split("[")[0] + "."):
                if field.startswith(prefix):
                    field = field[len(prefix):]
                    break
            head, _, rest = field.partition(".")
            key = (keys or {}).get(head, head)
            value: Any = self.rec.get(key, exc.value)
            for part in rest.split(".") if rest else ():
                value = value.get(part, exc.value) if isinstance(value, Mapping) else exc.value
            prefix = f"{self.file}: " if self.file else ""
            raise InputError(f"{self.where}.{key}" + (f".{rest}" if rest else ""), printable_value(value),
                             prefix + exc.message) from None

    def mapping(self, key: str, *, allowed: Iterable[str] | None = None) -> "Record":
        """A nested mapping as a ``Record`` (``where`` extended by ``key``)."""
        value = self.rec.get(key)
        if not isinstance(value, Mapping):
            raise self.fail(key, "must be a mapping")
        return Record(value, where=f"{self.where}.{key}", file=self.file, allowed=allowed)
