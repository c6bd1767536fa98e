"""Framework profiles (``catalogs/frameworks.yaml``): mechanisms a training stack switches on.

A profile fixes the attention kernel family (FlashAttention or a materialised score
matrix), whether data-parallel gradient reduction overlaps backward, and whether element-wise
kernels are fused by a compiler.  ``apply_framework`` gives the ``Plan`` fields the cost model reads;
the strategy's ``dp_overlap`` comes from the profile too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.catalog import catalog_document
from sim.errors import InputError
from sim.plan import ATTENTION_IMPLS, GRAD_ACCUMULATION, LOSS_IMPLS, SELECTIVE_POLICIES
from sim.records import Record


FAMILIES: tuple[str, ...] = ("megatron", "fsdp", "xla")


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
    loss: str = "upcast"  # upcast | inplace | fused (runtime.yaml loss)
    # What the framework's recipes switch on when a run does not say (the profile's source):
    sequence_parallel_default: bool = False  # SP with tp > 1
    tp_overlap_default: bool = False  # pipelined TP communication overlap with tp > 1 and SP
    zero_default: int = 0  # ZeRO stage without a stated one (1: a distributed optimizer by default)
    fp8_weight_cache: bool = False  # fp8 weights cast once per step, not per micro-batch
    family: str = "megatron"  # megatron | fsdp | xla: the class uncertainty bands are kept by
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""


_KEYS = ("id", "name", "aliases", "attention", "dp_overlap", "elementwise", "selective_recompute",
         "grad_accumulation", "fsdp_copies", "loss", "sequence_parallel_default", "tp_overlap_default", "zero_default", "fp8_weight_cache", "family", "source", "notes")


@functools.cache
def _frameworks() -> dict[str, Framework]:
    doc = catalog_document("frameworks.yaml")
    out: dict[str, Framework] = {}
    for raw in doc["frameworks"]:
        r = Record(raw, where=f"framework[{raw.get('id')}]", file="frameworks.yaml", allowed=_KEYS)
        fw = Framework(id=r.text("id"), name=r.text("name"), attention=r.text("attention", choices=ATTENTION_IMPLS),
                       dp_overlap=r.flag("dp_overlap"),
                       eager_elementwise=r.text("elementwise", choices=("fused", "eager")) == "eager",
                       selective_recompute=r.text("selective_recompute", default="attention", choices=SELECTIVE_POLICIES),
                       grad_accumulation=r.text("grad_accumulation", default="fused", choices=GRAD_ACCUMULATION),
                       fsdp_copies=r.flag("fsdp_copies"), loss=r.text("loss", default="upcast", choices=LOSS_IMPLS),
                       sequence_parallel_default=r.flag("sequence_parallel_default"),
                       tp_overlap_default=r.flag("tp_overlap_default"),
                       zero_default=r.integer("zero_default", minimum=0, optional=True, default=0),
                       fp8_weight_cache=r.flag("fp8_weight_cache"),
                       family=r.text("family", choices=FAMILIES),
                       aliases=r.strings("aliases", lower=False),
                       source=r.text("source"), notes=r.text("notes", default=""))
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
            "fsdp_copies": fw.fsdp_copies, "loss": fw.loss, "fp8_weight_cache": fw.fp8_weight_cache}


def list_frameworks() -> list[Framework]:
    seen: dict[str, Framework] = {}
    for fw in _frameworks().values():
        seen.setdefault(fw.id, fw)
    return list(seen.values())
