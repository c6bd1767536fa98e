"""Hardware and model catalogs: ``catalogs/*.yaml`` -> frozen ``sim.specs`` objects.

The YAML files keep data-sheet units with the unit in each key (``hbm_gib``,
``dense_tflops``, ``gbit_per_s_per_direction``, ``latency_us``); this module converts them to
SI once (bytes, bytes/s, FLOP/s, seconds) and caches the result per catalog folder.  Every
record carries ``source``; unknown keys are rejected so that a typo cannot silently drop a
number.  Ids and aliases are case-insensitive.  See ``catalogs/README.md`` for the schemas.

Every catalog file is read here: ``load_yaml_records`` for ``{schema_version, records}`` files
(ids unique, ``source`` present), ``catalog_document`` for files of sections; fields are
converted by the one record validator, ``sim.records.Record``.

Public API: ``catalog_dir``, ``get_gpu``, ``get_link``, ``get_nic``, ``get_model``,
``has_model``, ``list_gpus``, ``list_links``, ``list_models``, ``cluster_from_catalog``, ``catalog_records``,
``catalog_document``, ``load_yaml_records``, ``clear_cache``.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from sim.errors import InputError
from sim.records import Record
from sim.specs import PRECISIONS, TOPOLOGIES, Cluster, Gpu, Link, Model

ENV_VAR = "PLANNER_CATALOG_DIR"
"""Environment variable that points the loader at another catalogs/ folder."""

LINK_KINDS: tuple[str, ...] = ("nic", "scale-up", "pcie", "switch")

_TERA = 1e12
_GIGA = 1e9
_GIB = float(1 << 30)


def catalog_dir() -> Path:
    """The catalogs/ folder: ``$PLANNER_CATALOG_DIR`` if set, else the project's own."""
    return _resolved_dir(os.environ.get(ENV_VAR) or "")


@functools.lru_cache(maxsize=16)
def _resolved_dir(override: str) -> Path:
    if override:
        return Path(override).expanduser().resolve()
    return (Path(__file__).resolve().parent.parent / "catalogs").resolve()


class FrozenDict(dict):
    """A read-only, hashable ``dict`` (so ``Gpu`` objects can be hashed and cached).

    It stays a ``dict`` subclass so ``json.dumps`` and ``dataclasses.asdict`` work on it.
    """

    __slots__ = ()

    def _readonly(self, *args: object, **kwargs: object) -> None:
        raise TypeError("catalog mappings are read-only")

    __setitem__ = __delitem__ = _readonly  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = __ior__ = _readonly  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> "FrozenDict":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "FrozenDict":
        return self

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


# --------------------------------------------------------------------------- raw records


def load_yaml_records(path: str | os.PathLike[str], *, require_id: bool = True,
                      require_source: bool = True) -> list[dict[str, Any]]:
    """Read a catalog file of the form ``{schema_version: 1, records: [ {...}, ... ]}``.

    Checks that each record is a mapping with a unique (case-insensitive, aliases included)
    string ``id`` and a non-empty ``source`` string.  Returns fresh deep copies, so callers
    may mutate them.

    Raises
    ------
    InputError
        Field ``catalog``: missing, unreadable or malformed file, duplicate id, missing source.
    """
    resolved = str(Path(path).expanduser().resolve())
    return list(copy.deepcopy(_records(resolved, _stamp(resolved), require_id, require_source)))


def _stamp(path: str) -> tuple[int, int]:
    """(mtime_ns, size) of a file, so an edited catalog is re-read; (0, -1) if unreadable."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


@functools.cache
def _records(path: str, stamp: tuple[int, int], require_id: bool,
             require_source: bool) -> tuple[dict[str, Any], ...]:
    from sim.modelio import read_structured_file

    doc = read_structured_file(path, field="catalog")
    if isinstance(doc, Mapping):
        records = doc.get("records")
    else:
        records = None
    if not isinstance(records, list):
        raise InputError("catalog", path, "must be a mapping with a 'records' list")
    seen: dict[str, str] = {}
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise InputError("catalog", path, f"record {i} is not a mapping")
        for key in rec:
            if not isinstance(key, str):
                raise InputError("catalog", path, f"record {i} has a non-string key {key!r}")
        ident = rec.get("id")
        label = ident if isinstance(ident, str) else f"#{i}"
        if require_id:
            if not isinstance(ident, str) or not ident.strip():
                raise InputError("catalog", path, f"record {i} needs a non-empty string 'id'")
            aliases = rec.get("aliases") or []
            if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
                raise InputError("catalog", path, f"record {ident}: 'aliases' must be a list of strings")
            for name in (ident, *aliases):
                k = name.strip().lower()
                if k in seen:
                    raise InputError("catalog", path, f"record {ident}: name {name!r} already used by {seen[k]}")
                seen[k] = ident
        if require_source:
            src = rec.get("source")
            if not isinstance(src, str) or not src.strip():
                raise InputError("catalog", path, f"record {label} needs a non-empty 'source'")
        out.append(dict(rec))
    return tuple(out)


def catalog_file(name: str) -> Path:
    """``catalogs/<name>`` of the active catalogs folder."""
    return catalog_dir() / name


def file_version(name: str) -> tuple[str, int, int]:
    """``(path, mtime_ns, size)`` of ``catalogs/<name>``: a cache key for objects built from it,
    so that an edited catalog (or another ``$PLANNER_CATALOG_DIR``) is re-read."""
    path = os.path.join(catalog_dir(), name)
    return (path, *_stamp(path))


def catalog_file_records(name: str) -> list[dict[str, Any]]:
    """The records of ``catalogs/<name>`` (``load_yaml_records``)."""
    return load_yaml_records(catalog_file(name))


def catalog_document(name: str) -> Mapping[str, Any]:
    """The whole YAML document of ``catalogs/<name>`` (for files whose data are sections, not a
    ``records`` list: ``efficiency.yaml``, ``runtime.yaml``, ``frameworks.yaml``,
    ``conventions.yaml``, ...).  Cached, re-read when the file changes; read-only."""
    path = os.path.join(catalog_dir(), name)
    return _document(path, _stamp(path))


@functools.cache
def _document(path: str, stamp: tuple[int, int]) -> Mapping[str, Any]:
    from sim.modelio import read_structured_file

    doc = read_structured_file(path, field="catalog")
    if not isinstance(doc, Mapping):
        raise InputError("catalog", path, "must be a mapping")
    return _freeze(doc)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return FrozenDict({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def catalog_records(kind: str) -> list[dict[str, Any]]:
    """Raw records (data-sheet units, with ``source`` and ``notes``) of one catalog.

    ``kind`` is ``gpus``, ``links``, ``nics`` (links of kind nic), ``models`` (singular forms
    work too) or the stem of any other ``catalogs/*.yaml`` that has a ``records`` list.
    """
    if not isinstance(kind, str):
        raise InputError("catalog", kind, "must be a string")
    k = kind.strip().lower()
    k = {"gpu": "gpus", "link": "links", "nic": "nics", "model": "models"}.get(k, k)
    if k == "nics":
        return [r for r in catalog_records("links") if r.get("kind") == "nic"]
    path = catalog_dir() / f"{k}.yaml"
    if not k or "/" in k or "\\" in k or not path.is_file():
        known = sorted({"gpus", "links", "nics", "models"} | {p.stem for p in catalog_dir().glob("*.yaml")})
        raise InputError("catalog", kind, f"unknown catalog; known: {', '.join(known)}")
    return load_yaml_records(path)


# --------------------------------------------------------------------------- typed index


@dataclass(frozen=True, eq=False)
class _Index:
    items: tuple[Any, ...]  # in file order
    ids: tuple[str, ...]
    by_name: Mapping[str, Any]  # lower-case id or alias -> item


def _index(pairs: Iterable[tuple[str, tuple[str, ...], Any]]) -> _Index:
    items, ids, by_name = [], [], {}
    for ident, aliases, item in pairs:
        items.append(item)
        ids.append(ident)
        for name in (ident, *aliases):
            by_name[name.strip().lower()] = item
    return _Index(tuple(items), tuple(ids), by_name)


def _lookup(index: _Index, field: str, what: str, name: object) -> Any:
    if not isinstance(name, str):
        raise InputError(field, name, f"must be a string naming a {what}")
    item = index.by_name.get(name.strip().lower())
    if item is None:
        key = name.strip().lower()
        close = difflib.get_close_matches(key, list(index.by_name), n=1) if len(key) <= 64 else []
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InputError(field, name, f"unknown {what}{hint}; known: {', '.join(index.ids)}")
    return item


def _raw(folder: str, name: str) -> tuple[dict[str, Any], ...]:
    path = str(Path(folder) / name)
    return _records(path, _stamp(path), True, True)


def _gpus(folder: str) -> _Index:
    return _gpu_index(folder, _stamp(str(Path(folder) / "gpus.yaml")), _stamp(str(Path(folder) / "links.yaml")))


def _links(folder: str) -> _Index:
    return _link_index(folder, _stamp(str(Path(folder) / "links.yaml")))


def _models(folder: str) -> _Index:
    return _model_index(folder, _stamp(str(Path(folder) / "models.yaml")))


@functools.cache
def _gpu_index(folder: str, *_stamps: tuple[int, int]) -> _Index:
    path = Path(folder) / "gpus.yaml"
    links = _links(folder)
    return _index((r["id"], tuple(r.get("aliases") or ()), _gpu_from_record(r, path, links))
                  for r in _raw(folder, "gpus.yaml"))


@functools.cache
def _link_index(folder: str, *_stamps: tuple[int, int]) -> _Index:
    path = Path(folder) / "links.yaml"
    return _index((r["id"], tuple(r.get("aliases") or ()), _link_from_record(r, path))
                  for r in _raw(folder, "links.yaml"))


@functools.cache
def _model_index(folder: str, *_stamps: tuple[int, int]) -> _Index:
    from sim.modelio import model_from_dict

    return _index((r["id"], tuple(r.get("aliases") or ()),
                   model_from_dict(r, where=f"models.yaml:{r['id']}"))
                  for r in _raw(folder, "models.yaml"))


@functools.lru_cache(maxsize=8)
def _nic_index(links: _Index) -> _Index:
    return _index((link.id, link.aliases, link) for link in links.items if link.kind == "nic")


def clear_cache() -> None:
    """Forget every loaded catalog (files are also re-read when their mtime or size changes)."""
    for fn in (_records, _document, _gpu_index, _link_index, _model_index, _nic_index, _resolved_dir):
        fn.cache_clear()


# --------------------------------------------------------------------------- public lookups


def get_gpu(id_or_alias: str) -> Gpu:
    """The GPU with this id or alias (case-insensitive); ``InputError('gpu', ...)`` if unknown."""
    return _lookup(_gpus(str(catalog_dir())), "gpu", "GPU", id_or_alias)


def get_link(id: str) -> Link:
    """Any link (NIC, scale-up fabric, PCIe generation) by id or alias."""
    return _lookup(_links(str(catalog_dir())), "link", "link", id)


def cluster_from_catalog(gpu: str | Gpu, num_gpus: int, *, gpus_per_node: int | None = None,
                         nvlink_domain: int | None = None, nic: str | Link | None = None,
                         nics_per_node: int | None = None, topology: str = "fat-tree",
                         oversubscription: float = 1.0, tree_levels: int = 2, placement: str = "block") -> Cluster:
    """A ``Cluster`` of catalog parts, with the defaults every entry point (CLI, app, published
    runs, tests) uses:

    * ``gpus_per_node``, ``nics_per_node``, ``nic``: the GPU's usual server (``gpus.yaml``);
    * ``nvlink_domain``: ``gpus_per_node`` when that is given, else the larger of the GPU's
      usual domain and its node (a GB200 rack: 72);
    * fewer GPUs than a node: the node (and, unless given, the domain) shrinks to them.
    """
    g = gpu if isinstance(gpu, Gpu) else get_gpu(gpu)
    gpn = gpus_per_node if gpus_per_node is not None else g.gpus_per_node
    if nvlink_domain is not None:
        domain = nvlink_domain
    elif gpus_per_node is not None:
        domain = gpn
    else:
        domain = max(g.nvlink_domain_size, gpn)
    if isinstance(num_gpus, int) and not isinstance(num_gpus, bool) and 1 <= num_gpus < gpn:
        gpn = num_gpus  # a partial node
        domain = min(domain, gpn) if nvlink_domain is None else domain
    link = nic if isinstance(nic, Link) else get_nic(nic if nic is not None else g.default_nic)
    topo = str(topology).lower()
    if topo not in TOPOLOGIES:
        raise InputError("topology", topology, f"must be one of {', '.join(TOPOLOGIES)}")
    return Cluster(gpu=g, num_gpus=num_gpus, nic=link, gpus_per_node=gpn, nvlink_domain=domain,
                   nics_per_node=nics_per_node if nics_per_node is not None else g.nics_per_node,
                   topology=topo, oversubscription=oversubscription, tree_levels=tree_levels,
                   placement=str(placement).lower())


def get_nic(id: str) -> Link:
    """A scale-out network adapter (``kind: nic``) by id or alias."""
    index = _links(str(catalog_dir()))
    nics = _nic_index(index)
    if isinstance(id, str) and id.strip().lower() in index.by_name and id.strip().lower() not in nics.by_name:
        link = index.by_name[id.strip().lower()]
        raise InputError("nic", id, f"is a {link.kind} link, not a network adapter; known NICs: {', '.join(nics.ids)}")
    return _lookup(nics, "nic", "NIC", id)


def get_model(id: str) -> Model:
    """A catalog model by id or alias (``load_model`` also accepts files)."""
    return _lookup(_models(str(catalog_dir())), "model", "model", id)


def has_model(id: str) -> bool:
    """Whether ``id`` names a catalog model (no exception)."""
    return isinstance(id, str) and id.strip().lower() in _models(str(catalog_dir())).by_name


def list_gpus() -> list[Gpu]:
    return list(_gpus(str(catalog_dir())).items)


def list_links(kind: str | None = None) -> list[Link]:
    """All links, or those of one ``kind`` (nic, scale-up, pcie, switch)."""
    if kind is not None and kind not in LINK_KINDS:
        raise InputError("kind", kind, f"must be one of {', '.join(LINK_KINDS)}")
    return [link for link in _links(str(catalog_dir())).items if kind is None or link.kind == kind]


def list_models() -> list[tuple[str, Model]]:
    """``(id, Model)`` pairs in catalog order."""
    index = _models(str(catalog_dir()))
    return list(zip(index.ids, index.items))


# --------------------------------------------------------------------------- converters

_GPU_KEYS = frozenset({
    "id", "name", "aliases", "vendor", "dense_tflops", "hbm_gib", "hbm_tb_per_s",
    "nvlink_gb_per_s_per_direction", "nvlink_generation", "nvlink_domain_size", "pcie_generation",
    "tdp_w", "gpus_per_node", "nics_per_node", "default_nic", "price_usd", "price_usd_per_hour",
    "price_source", "matmul_efficiency", "hbm_efficiency", "architecture", "num_sms", "source", "notes",
})
_LINK_KEYS = frozenset({
    "id", "name", "aliases", "kind", "technology", "gbit_per_s_per_direction", "gb_per_s_per_direction",
    "latency_us", "switch_radix", "switch_model", "price_usd", "switch_price_usd", "power_w", "source",
    "notes",
})


def link_from_record(rec: Mapping[str, Any], *, file: str) -> Link:
    """A ``Link`` from one record in the ``links.yaml`` schema (e.g. a calibration profile's
    measured link), validated like the catalog's own."""
    return _link_from_record(rec, Path(file))


def gpu_from_record(rec: Mapping[str, Any], *, file: str, extra_links: Iterable[Link] = ()) -> Gpu:
    """A ``Gpu`` from one record in the ``gpus.yaml`` schema, its ``default_nic`` and
    ``nvlink_generation`` looked up among the catalog's links and ``extra_links``."""
    base = _links(str(catalog_dir()))
    index = _index([(l.id, l.aliases, l) for l in base.items] + [(l.id, l.aliases, l) for l in extra_links])
    return _gpu_from_record(rec, Path(file), index)


def _gpu_from_record(rec: Mapping[str, Any], path: Path, links: _Index) -> Gpu:
    r = Record(rec, where=f"gpu[{rec['id']}]", file=path.name, allowed=_GPU_KEYS)
    peaks = r.table("dense_tflops", keys=PRECISIONS)
    eff = r.table("matmul_efficiency", keys=PRECISIONS)
    notes = r.text("notes", default="")
    if "bf16" not in peaks and "fp16" in peaks:
        # Pre-Ampere (V100): no bf16 tensor cores; 16-bit mixed precision runs in fp16.
        peaks["bf16"] = peaks["fp16"]
        if "bf16" not in eff and "fp16" in eff:
            eff["bf16"] = eff["fp16"]
        notes = (notes + " " if notes else "") + "[loader: no bf16 tensor cores; bf16 entries = fp16 values]"
    nic = r.text("default_nic")
    nic_link = links.by_name.get(nic.lower())
    if nic_link is None or nic_link.kind != "nic":
        raise r.fail("default_nic", f"must name a NIC in links.yaml; known: "
                                    f"{', '.join(l.id for l in links.items if l.kind == 'nic')}")
    gen = r.text("nvlink_generation")
    gen_link = links.by_name.get(gen.lower())
    if gen_link is None or gen_link.kind != "scale-up":
        raise r.fail("nvlink_generation", "must name a scale-up link in links.yaml")
    pcie = r.integer("pcie_generation")
    price_hour = r.number("price_usd_per_hour", optional=True, positive=True)
    return Gpu(
        id=r.text("id"),
        name=r.text("name"),
        dense_flops_per_s=FrozenDict({p: v * _TERA for p, v in peaks.items()}),
        hbm_bytes=r.req("hbm_gib", positive=True) * _GIB,
        hbm_bytes_per_s=r.req("hbm_tb_per_s", positive=True) * _TERA,
        nvlink_bytes_per_s_per_direction=r.req("nvlink_gb_per_s_per_direction", positive=True) * _GIGA,
        nvlink_domain_size=r.integer("nvlink_domain_size"),
        nvlink_generation=gen_link.id,
        pcie_generation=pcie,
        tdp_w=r.req("tdp_w", positive=True),
        gpus_per_node=r.integer("gpus_per_node"),
        nics_per_node=r.integer("nics_per_node"),
        default_nic=nic_link.id,
        matmul_efficiency=FrozenDict(eff),
        hbm_efficiency=r.req("hbm_efficiency", positive=True),
        price_usd=r.number("price_usd", optional=True, positive=True),
        price_usd_per_hour=price_hour,
        vendor=r.text("vendor", default="nvidia"),
        architecture=r.text("architecture", default=""),
        num_sms=r.integer("num_sms", optional=True),
        aliases=tuple(a.strip() for a in rec.get("aliases") or ()),
        source=r.text("source"),
        notes=notes,
    )


def _link_from_record(rec: Mapping[str, Any], path: Path) -> Link:
    r = Record(rec, where=f"link[{rec['id']}]", file=path.name, allowed=_LINK_KEYS)
    kind = r.text("kind")
    if kind not in LINK_KINDS:
        raise r.fail("kind", f"must be one of {', '.join(LINK_KINDS)}")
    has_gbit = rec.get("gbit_per_s_per_direction") is not None
    has_gbyte = rec.get("gb_per_s_per_direction") is not None
    if has_gbit == has_gbyte:
        raise r.fail("gbit_per_s_per_direction", "give exactly one of gbit_per_s_per_direction (Gb/s) "
                                                 "or gb_per_s_per_direction (GB/s)")
    bw = (r.req("gbit_per_s_per_direction", positive=True) * _GIGA / 8 if has_gbit
          else r.req("gb_per_s_per_direction", positive=True) * _GIGA)
    return Link(
        id=r.text("id"),
        name=r.text("name"),
        kind=kind,
        bytes_per_s_per_direction=bw,
        latency_s=r.req("latency_us") / 1e6,
        technology=r.text("technology", default=""),
        switch_radix=r.integer("switch_radix", minimum=2, optional=True),
        price_usd=r.number("price_usd", optional=True, positive=True),
        switch_price_usd=r.number("switch_price_usd", optional=True, positive=True),
        power_w=r.number("power_w", optional=True, positive=True),
        aliases=tuple(a.strip() for a in rec.get("aliases") or ()),
        source=r.text("source"),
        notes=r.text("notes", default=""),
    )
