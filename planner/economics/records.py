"""Typed access to economics catalog records, with errors that name file, record and key.

The economics catalogs (``prices.yaml``, ``failures.yaml``, ``storage.yaml``) use the core's
``{schema_version, records}`` layout and are read with ``sim.catalog.load_yaml_records`` (which
checks ids and ``source``).  This module converts one record's fields once, at load, and
turns any malformed value into an ``InputError`` naming ``<file>:<id>.<key>``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from sim.catalog import catalog_dir, load_yaml_records
from sim.errors import InputError
from sim.modelio import read_structured_file


def catalog_path(name: str) -> Path:
    """``catalogs/<name>`` (honours ``$PLANNER_CATALOG_DIR`` like the core catalogs)."""
    return catalog_dir() / name


def load_records(name: str) -> list[dict[str, Any]]:
    """Records of ``catalogs/<name>`` (ids unique, ``source`` present)."""
    return load_yaml_records(catalog_path(name))


def load_document(name: str) -> Mapping[str, Any]:
    """The whole YAML document of ``catalogs/<name>`` (for sections beside ``records``)."""
    doc = read_structured_file(catalog_path(name), field="catalog")
    if not isinstance(doc, Mapping):
        raise InputError("catalog", str(catalog_path(name)), "must be a mapping")
    return doc


class Rec:
    """One raw record with typed getters; ``where`` is ``file:id`` for error messages."""

    def __init__(self, rec: Mapping[str, Any], where: str) -> None:
        self.rec = rec
        self.where = where

    def fail(self, key: str, message: str) -> InputError:
        return InputError(f"{self.where}.{key}", self.rec.get(key), message)

    def number(self, key: str, *, optional: bool = False, allow_zero: bool = True,
               default: float | None = None) -> float | None:
        value = self.rec.get(key)
        if value is None:
            if optional:
                return default
            raise self.fail(key, "missing required key")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, "must be a finite number")
        if value < 0 or (value == 0 and not allow_zero):
            raise self.fail(key, "must be > 0" if not allow_zero else "must be >= 0")
        return float(value)

    def req(self, key: str, *, allow_zero: bool = True) -> float:
        v = self.number(key, allow_zero=allow_zero)
        assert v is not None
        return v

    def fraction(self, key: str) -> float:
        v = self.req(key)
        if v > 1:
            raise self.fail(key, "must be a fraction in [0, 1]")
        return v

    def integer(self, key: str) -> int:
        value = self.rec.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(key, "must be an integer >= 0")
        return value

    def text(self, key: str, *, default: str | None = None) -> str:
        value = self.rec.get(key)
        if value is None:
            if default is None:
                raise self.fail(key, "missing required key")
            return default
        if not isinstance(value, str):
            raise self.fail(key, "must be a string")
        return value.strip()

    def flag(self, key: str, *, default: bool = False) -> bool:
        value = self.rec.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "must be true or false")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.rec.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "must be a list of strings")
        return tuple(v.strip().lower() for v in value)
