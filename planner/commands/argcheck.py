"""Checks every command shares on its flags, and the flag names its errors show.

* ``typed_message``: an error names the flag as the user typed it.  The core names a value by
  its field (``num_gpus``, ``seq-len``, ``trace``); when that field is a flag on the command
  line (``--num-gpus``), or a name a command declares for one of its flags (``jobs`` for
  ``schedule --generate``: ``set_defaults(flag_names={"jobs": "--generate"})``), the message
  shows the flag instead.
* ``check_not_empty``: an empty or blank value is never a valid flag value (an empty
  ``--framework`` used to mean "the default profile", an empty ``--ids`` "every run").
* ``id_list``: a comma-separated list of ids with at least one id.
* ``check_model_flags``: flags that describe a mixture-of-experts model are refused on a
  dense one, rather than accepted and ignored.
"""

from __future__ import annotations

import argparse
from typing import Iterable, Mapping, Sequence

from sim.base.errors import InputError, _short

# Flags that only mean something for a model with experts (--moe-dispatcher, --moe-imbalance).
MOE_FLAGS: tuple[str, ...] = ("moe_dispatcher", "moe_imbalance")


def typed_flags(argv: Sequence[str]) -> dict[str, str]:
    """``{dest: flag}`` for every long option on the command line (``--num-gpus`` and
    ``--num-gpus=8`` both give ``num_gpus -> --num-gpus``)."""
    out: dict[str, str] = {}
    for token in argv:
        if isinstance(token, str) and token.startswith("--") and len(token) > 2:
            flag = token.split("=", 1)[0]
            out.setdefault(flag[2:].replace("-", "_"), flag)
    return out


def flag_for(field: str, argv: Sequence[str], declared: Mapping[str, str] | None = None) -> str | None:
    """The flag the user typed that ``field`` (an ``InputError`` field) names, or None."""
    typed = typed_flags(argv)
    if declared and field in declared and declared[field] in typed.values():
        return declared[field]
    return typed.get(str(field).replace("-", "_"))


def typed_message(exc: InputError, argv: Sequence[str], declared: Mapping[str, str] | None = None) -> str:
    """``exc``'s one-line message with its field shown as the flag typed (module docstring)."""
    flag = flag_for(exc.field, argv, declared)
    if flag is None:
        return str(exc)
    return f"{flag}={_short(exc.value)}: {exc.message}"


def check_not_empty(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """``InputError`` for a flag typed with an empty or blank value (module docstring)."""
    flags = typed_flags(argv)
    for dest, flag in flags.items():
        value = getattr(args, dest, None)
        values: Iterable[object] = value if isinstance(value, list) else (value,)
        for v in values:
            if isinstance(v, str) and not v.strip():
                raise InputError(flag, v, "is empty")


def id_list(field: str, text: str | None) -> list[str] | None:
    """``a,b,c`` as a list of unique ids (None when the flag is absent); an empty list is bad input."""
    if text is None:
        return None
    ids = list(dict.fromkeys(t.strip() for t in str(text).split(",") if t.strip()))
    if not ids:
        raise InputError(field, text, "needs at least one id")
    return ids


def check_model_flags(args: argparse.Namespace, model) -> None:
    """Refuse mixture-of-experts flags on a dense ``model`` (``sim.data.specs.Model``)."""
    if model.moe is not None:
        return
    for dest in MOE_FLAGS:
        value = getattr(args, dest, None)
        if value is not None:
            raise InputError(dest, value, f"applies to mixture-of-experts models; {model.name} has no experts")


def check_applies(args: argparse.Namespace, dest: str, applies: bool, when: str) -> None:
    """Refuse a flag given where it changes nothing (``when``: where it does apply, e.g.
    ``"with --mode local-sgd"``), rather than accept and ignore it."""
    value = getattr(args, dest, None)
    if value is not None and not applies:
        raise InputError(dest, value, f"applies only {when}")
