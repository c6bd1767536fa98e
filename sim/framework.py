"""Framework profiles (``catalogs/frameworks.yaml``): mechanisms a training stack switches on.

A profile fixes the attention kernel family (FlashAttention or a materialised score
matrix), whether data-parallel gradient reduction overlaps backward, and whether element-wise
kernels are fused by a compiler.  ``apply_framework`` gives the ``Plan`` fields the cost model reads;
the strategy's ``dp_overlap`` comes from the profile too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.errors import InputError


@dataclass(frozen=True, kw_only=True, slots=True)
class Framework:
    id: str
    name: str
    attention: str  # flash | flash2 | unfused
    dp_overlap: bool
    eager_elementwise: bool
    selective_recompute: str  # attention | op
    grad_accumulation: str = "fused"  # fused | fp32_main_grad | autograd (runtime.yaml)
    fsdp_copies: bool = False  # FSDP2 packing around ZeRO-3 collectives (runtime.yaml)
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""


@functools.cache
def _frameworks() -> dict[str, Framework]:
    import yaml

    from sim.catalog import catalog_dir

    with open(catalog_dir() / "frameworks.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    out: dict[str, Framework] = {}
    for rec in data["frameworks"]:
        fw = Framework(id=rec["id"], name=rec["name"], attention=rec["attention"],
                       dp_overlap=bool(rec["dp_overlap"]), eager_elementwise=rec["elementwise"] == "eager",
                       selective_recompute=rec.get("selective_recompute", "attention"),
                       grad_accumulation=rec.get("grad_accumulation", "fused"),
                       fsdp_copies=bool(rec.get("fsdp_copies", False)),
                       aliases=tuple(rec.get("aliases", ())), source=rec.get("source", ""),
                       notes=rec.get("notes", ""))
        for key in (fw.id, *fw.aliases):
            out[key.lower()] = fw
    return out


def get_framework(name: str) -> Framework:
    table = _frameworks()
    fw = table.get(str(name).lower())
    if fw is None:
        known = sorted({f.id for f in table.values()})
        raise InputError("framework", name, f"unknown framework; known: {', '.join(known)}")
    return fw


def apply_framework(plan_kwargs: dict, fw: Framework) -> dict:
    """Plan keyword arguments for ``fw`` (attention kernel, element-wise fusion, policy)."""
    return {**plan_kwargs, "attention": fw.attention, "eager_elementwise": fw.eager_elementwise,
            "selective_policy": fw.selective_recompute, "grad_accumulation": fw.grad_accumulation,
            "fsdp_copies": fw.fsdp_copies}


def list_frameworks() -> list[Framework]:
    seen: dict[str, Framework] = {}
    for fw in _frameworks().values():
        seen.setdefault(fw.id, fw)
    return list(seen.values())
