"""Storage tiers (``catalogs/storage.yaml``): checkpoint size and write/restore times.

Checkpoint size (whole job): ``P * (b_w + b_o)`` bytes for ``P`` parameters, with bf16 weights
``b_w = 2`` and mixed-precision Adam state ``b_o = 12`` (fp32 master weights, two moments;
Rajbhandari et al. 2020, Sec. 3.1).  Each data-parallel shard owner writes its part, so the
write is spread over all nodes; its time is ``overhead + bytes / min(aggregate, N * per_node)``
(a missing limit is no limit).  Known error: ignores metadata storms and stragglers (real
writes reach 50-80% of the data-sheet bandwidth) and frameworks that also save the data-loader
or RNG state (negligible bytes).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping

from sim.data.catalog import catalog_document, catalog_file_records, file_version
from sim.base.errors import InputError
from sim.base.records import Record
from sim.data.specs import Model

FILE = "storage.yaml"
_GB = 1e9
DEFAULT_STORAGE = "lustre-ddn"


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageTier:
    id: str
    name: str
    kind: str
    write_bytes_per_s_per_node: float | None
    read_bytes_per_s_per_node: float | None
    write_bytes_per_s_aggregate: float | None
    read_bytes_per_s_aggregate: float | None
    fixed_overhead_s: float
    durable: bool
    source: str

    def bytes_per_s(self, num_nodes: int, *, write: bool) -> float:
        """Usable rate for ``num_nodes`` clients: ``min(aggregate, N * per_node)``."""
        per = self.write_bytes_per_s_per_node if write else self.read_bytes_per_s_per_node
        agg = self.write_bytes_per_s_aggregate if write else self.read_bytes_per_s_aggregate
        rate = math.inf
        if per is not None:
            rate = num_nodes * per
        if agg is not None:
            rate = min(rate, agg)
        return rate

    def transfer_s(self, num_bytes: float, num_nodes: int, *, write: bool) -> float:
        return self.fixed_overhead_s + num_bytes / self.bytes_per_s(num_nodes, write=write)


@dataclass(frozen=True, kw_only=True, slots=True)
class Tokenizer:
    id: str
    text_bytes_per_s_per_node: float
    text_bytes_per_token: float
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageCatalog:
    tiers: tuple[StorageTier, ...]
    aliases: dict[str, str]
    tokenizer: Tokenizer
    weight_bytes_per_param: float
    optimizer_bytes_per_param: float

    def get(self, name: str) -> StorageTier:
        if not isinstance(name, str):
            raise InputError("storage", name, "must be a string")
        key = self.aliases.get(name.strip().lower())
        if key is None:
            raise InputError("storage", name, f"unknown storage tier; known: {', '.join(t.id for t in self.tiers)}")
        return next(t for t in self.tiers if t.id == key)


def _gb(r: Record, key: str) -> float | None:
    v = r.number(key, optional=True, positive=True)
    return None if v is None else v * _GB


@functools.cache
def _load(_stamp: object) -> StorageCatalog:
    doc = catalog_document(FILE)
    ck = doc.get("checkpoint")
    if not isinstance(ck, Mapping):
        raise InputError("catalog", FILE, "needs a 'checkpoint' mapping")
    c = Record(ck, where=f"{FILE}:checkpoint")
    tiers, aliases, toks = [], {}, []
    for raw in catalog_file_records(FILE):
        r = Record(raw, where=f"{FILE}:{raw['id']}")
        kind = r.text("kind")
        if kind == "tokenizer":
            toks.append(Tokenizer(id=raw["id"], text_bytes_per_s_per_node=r.req("text_bytes_per_s_per_node", positive=True),
                                  text_bytes_per_token=r.req("text_bytes_per_token", positive=True),
                                  source=r.text("source")))
            continue
        t = StorageTier(id=raw["id"], name=r.text("name", default=raw["id"]), kind=kind,
                        write_bytes_per_s_per_node=_gb(r, "write_gb_per_s_per_node"),
                        read_bytes_per_s_per_node=_gb(r, "read_gb_per_s_per_node"),
                        write_bytes_per_s_aggregate=_gb(r, "write_gb_per_s_aggregate"),
                        read_bytes_per_s_aggregate=_gb(r, "read_gb_per_s_aggregate"),
                        fixed_overhead_s=r.req("fixed_overhead_s"), durable=r.flag("durable", default=True),
                        source=r.text("source"))
        for direction in ("write", "read"):
            if math.isinf(t.bytes_per_s(1, write=direction == "write")):
                raise r.fail(f"{direction}_gb_per_s_per_node", "a tier needs a per-node or an aggregate limit")
        tiers.append(t)
        for name in (t.id, *r.strings("aliases")):
            aliases[name.lower()] = t.id
    if len(toks) != 1:
        raise InputError("catalog", FILE, f"needs exactly one 'tokenizer' record, found {len(toks)}")
    return StorageCatalog(tiers=tuple(tiers), aliases=aliases, tokenizer=toks[0],
                          weight_bytes_per_param=c.req("weight_bytes_per_param"),
                          optimizer_bytes_per_param=c.req("optimizer_bytes_per_param"))


def load_storage() -> StorageCatalog:
    return _load(file_version(FILE))


def checkpoint_bytes(model: Model, catalog: StorageCatalog | None = None) -> float:
    """Bytes of one full training checkpoint (module docstring)."""
    cat = catalog or load_storage()
    return model.num_params * (cat.weight_bytes_per_param + cat.optimizer_bytes_per_param)
