"""The schema of a reference row (``catalogs/reference/published_runs.yaml``, ``dev_runs.yaml``),
checked when the rows load, with the same typed getters as every catalog (``sim.base.records``).

A malformed row is an ``InputError`` naming the file, the row id and the field
(``run[<id>].strategy.global_batch``): ``planner.fitting.reference`` then reads the row's values
knowing their types, instead of casting a string, a float or a boolean into a count.  Only the
fields the mapping rules read are typed here; the rest of a row (provenance, notes, figures the
source gives that nothing reads) is free, but any number anywhere in a row must be finite.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from sim.base.errors import InputError
from sim.base.records import MAX_MAGNITUDE, Record

_MODEL_INTS = ("layers", "hidden", "heads", "vocab", "seq_len")
_MODEL_OPTIONAL_INTS = ("kv_heads", "head_dim", "ffn_hidden")
_MOE_INTS = ("num_experts", "top_k", "expert_ffn_hidden")
_MOE_OPTIONAL_INTS = ("shared_experts", "shared_expert_ffn_hidden", "dense_layers")
_MLA_INTS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_STRATEGY_OPTIONAL_INTS = ("tp", "pp", "cp", "dp", "ep", "etp", "vp", "micro_batch", "local_batch", "grad_accum")
_MEASURED_POSITIVE = ("iteration_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "memory_gib_per_gpu")
_MEASURED_FRACTIONS = ("mfu", "hfu")


def check_row(row: Any, *, file: str, index: int) -> None:
    """``InputError`` naming ``file``, the row and the field unless ``row`` has the schema the
    mapping rules read (module docstring)."""
    if not isinstance(row, Mapping):
        raise InputError(f"runs[{index}]", row, f"{file}: must be a mapping")
    rid = row.get("id")
    if not isinstance(rid, str) or not rid.strip():
        raise InputError(f"runs[{index}].id", rid, f"{file}: needs a non-empty string id")
    r = Record(row, where=f"run[{rid}]", file=file)
    _finite(r, row, "")
    if isinstance(row.get("source"), Mapping):
        r.mapping("source").text("repo")
    else:
        r.text("source")
    r.integer("num_gpus")
    r.integer("gpus_per_node", optional=True)
    r.mapping("hardware").text("gpu")
    if row.get("nccl") is not None:
        r.text("nccl")
    m = r.mapping("model")
    m.text("name")
    for k in _MODEL_INTS:
        m.integer(k)
    for k in _MODEL_OPTIONAL_INTS:
        m.integer(k, optional=True)
    if m.has("moe"):
        moe = m.mapping("moe")
        for k in _MOE_INTS:
            moe.integer(k)
        for k in _MOE_OPTIONAL_INTS:
            moe.integer(k, optional=True, minimum=0)
    if m.has("mla"):
        mla = m.mapping("mla")
        for k in _MLA_INTS:
            mla.integer(k, optional=True, minimum=0)
    for k in ("tied_embeddings", "linear_bias", "dropout"):
        if m.has(k):
            m.flag(k)
    if m.has("position_embedding"):
        m.text("position_embedding", choices=("rope", "learned"))
    s = r.mapping("strategy")
    s.integer("global_batch")
    for k in _STRATEGY_OPTIONAL_INTS:
        s.integer(k, optional=True)
    s.integer("zero_stage", optional=True, minimum=0)
    if s.has("sequence_parallel"):
        s.flag("sequence_parallel")
    fsdp = s.rec.get("fsdp")
    if fsdp is not None and not isinstance(fsdp, (bool, str)):
        s.integer("fsdp")
    me = r.mapping("measured")
    for k in _MEASURED_POSITIVE:
        me.number(k, optional=True, positive=True)
    for k in _MEASURED_FRACTIONS:
        me.fraction(k, optional=True)


def _finite(r: Record, value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _finite(r, v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite(r, v, f"{where}[{i}]")
    elif isinstance(value, float) and (not math.isfinite(value) or abs(value) > MAX_MAGNITUDE):
        raise InputError(f"{r.where}.{where}", value, f"{r.file}: must be a finite number")
