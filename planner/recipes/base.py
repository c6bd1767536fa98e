"""What every recipe reader returns: a ``Recipe`` (model, framework, strategy settings, cluster,
and every key it read with what it maps to), and the helpers the readers share.

A reader records each key of the recipe as a ``RecipeKey``: ``maps_to`` names the planner field
it sets (``strategy.tp``, ``model.num_layers``, ``cluster.num_gpus``, ``plan.attention``,
``framework``), or is empty when the key is ignored; ``cost`` says whether an ignored key changes
what a step costs (``yes``: the planner does not model it, the prediction may be off; ``no``:
learning rate, paths, logging; ``unknown``: a key the reader has no entry for).  The strategy
is kept as the recipe's settings (``Recipe.settings``, ``Strategy`` field names); the data
parallel degree follows from the GPU count, which the recipe may not state, so
``planner.recipes.resolve`` builds the ``Strategy`` once the cluster is known.

Bad input is an ``InputError`` naming the file, the key and the value (``recipe_error``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sim.base.errors import InputError
from sim.data.specs import Model

COSTS: tuple[str, ...] = ("modelled", "yes", "no", "unknown")
MAX_RECIPE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipeKey:
    """One key of a recipe as read (``key`` as written, ``value`` as given)."""

    key: str
    value: object
    maps_to: str = ""  # planner field(s) it sets; "" = ignored
    cost: str = "modelled"  # COSTS: for ignored keys, whether they change a step's cost
    note: str = ""

    def __post_init__(self) -> None:
        assert self.cost in COSTS, self.cost

    @property
    def ignored(self) -> bool:
        return not self.maps_to

    def as_dict(self) -> dict[str, object]:
        value = self.value if isinstance(self.value, (str, int, float, bool, type(None), list)) else str(self.value)
        return {"key": self.key, "value": value, "maps_to": self.maps_to or None,
                "changes_cost": self.cost if self.ignored else "modelled", "note": self.note}


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """A recipe as the planner reads it (module docstring)."""

    path: str
    format: str  # megatron | nemo | torchtitan | deepspeed
    dialect: str  # which form of the format, e.g. "Megatron-LM launch script (bash)"
    versions: str  # which versions' key names the reader knows
    framework: str  # a profile of catalogs/frameworks.yaml
    settings: dict[str, object]  # Strategy field -> value as the recipe states it (no dp unless stated)
    model: Model | None = None
    model_note: str = ""  # where the model came from
    num_gpus: int | None = None
    gpus_per_node: int | None = None
    plan: dict[str, object] = field(default_factory=dict)  # Plan fields: attention, selective_policy, moe_dispatcher
    keys: tuple[RecipeKey, ...] = ()
    warnings: tuple[str, ...] = ()
    layout: str = ""  # how the recipe states its pipeline split (for the report), "" = default
    dp: int | None = None  # data parallelism the recipe states (torchtitan degrees, DeepSpeed batch)

    @property
    def ignored(self) -> tuple[RecipeKey, ...]:
        return tuple(k for k in self.keys if k.ignored)


def recipe_error(path: str, key: str, value: object, message: str) -> InputError:
    """One line naming the file, the key and the value."""
    return InputError(f"{Path(path).name}: {key}", value, message)


def read_text(path: str) -> str:
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise InputError("recipe", path, f"cannot read: {exc.strerror}") from None
    if not p.is_file():
        raise InputError("recipe", path, "is not a file")
    if size > MAX_RECIPE_BYTES:
        raise InputError("recipe", path, f"is {size} bytes; recipes are at most {MAX_RECIPE_BYTES}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("recipe", path, "is not UTF-8 text") from None


def as_int(path: str, key: str, value: object, *, minimum: int = 1) -> int:
    """An integer setting (``"8"``, ``8``, ``8.0``); ``InputError`` naming file and key otherwise."""
    if isinstance(value, bool):
        raise recipe_error(path, key, value, "must be an integer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"[+-]?\d+", text):
            value = int(text)
        elif re.fullmatch(r"[+-]?\d+(\.0*)?[eE][+]?\d+", text):  # 1e3
            f = float(text)
            value = int(f) if f.is_integer() else f
    if not isinstance(value, int):
        raise recipe_error(path, key, value, "must be an integer")
    if value < minimum:
        raise recipe_error(path, key, value, f"must be >= {minimum}")
    if value > 1 << 40:
        raise recipe_error(path, key, value, "is out of range")
    return value


def as_bool(path: str, key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return value.strip().lower() in ("true", "1", "yes", "on")
    raise recipe_error(path, key, value, "must be true or false")


def as_float(path: str, key: str, value: object) -> float:
    if isinstance(value, bool):
        raise recipe_error(path, key, value, "must be a number")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise recipe_error(path, key, value, "must be a number") from None


def flatten(tree: object, prefix: str = "") -> list[tuple[str, object]]:
    """``a.b.c`` keys of a nested mapping (lists kept as values)."""
    out: list[tuple[str, object]] = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out += flatten(v, key)
            else:
                out.append((key, v))
    return out


def classify(key: str, no_cost: tuple[str, ...], costly: dict[str, str]) -> tuple[str, str]:
    """(cost, note) of an ignored key: ``yes`` with the reason when ``costly`` names it (exact
    key or a ``prefix*`` pattern), ``no`` when a ``no_cost`` pattern matches, else ``unknown``."""
    for pat, why in costly.items():
        if key == pat or (pat.endswith("*") and key.startswith(pat[:-1])):
            return "yes", why
    for pat in no_cost:
        if key == pat or (pat.endswith("*") and key.startswith(pat[:-1])) or \
                (pat.startswith("*") and key.endswith(pat[1:])):
            return "no", ""
    return "unknown", ""
