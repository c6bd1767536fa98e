"""Hardware and model catalogs: ``catalogs/*.yaml`` -> frozen ``sim.data.specs`` objects.

The YAML files keep data-sheet units with the unit in each key (``hbm_gib``,
``dense_tflops``, ``gbit_per_s_per_direction``, ``latency_us``); this module converts them to
SI once (bytes, bytes/s, FLOP/s, seconds) and caches the result per catalog folder.  Every
record carries ``source``; unknown keys are rejected so that a typo cannot silently drop a
number.  Ids and aliases are case-insensitive.  See ``catalogs/README.md`` for the schemas.

Every catalog file is read here: ``load_yaml_records`` for ``{schema_version, records}`` files
(ids unique, ``source`` present), ``catalog_document`` for files of sections; fields are
converted by the one record validator, ``sim.base.records.Record``.

Public API: ``catalog_dir``, ``get_gpu``, ``get_link``, ``get_nic``, ``get_model``,
``has_model``, ``list_gpus``, ``list_links``, ``list_models``, ``catalog_records``,
``catalog_document``, ``load_yaml_records``, ``clear_cache``; the host side of PCIe servers
(``hosts.yaml``, ``servers.yaml``): ``get_host_part``, ``get_cpu``, ``list_host_parts``,
``get_server_design``, ``list_server_designs``, ``default_server_design``.  A cluster of
catalog parts with the entry points' defaults is ``sim.net.clusters.cluster_from_catalog``.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from sim.base.errors import InputError
from sim.data.modelio import model_from_dict, read_structured_file
from sim.base.records import Record
from sim.data.hostspecs import (HOST_PART_KINDS, P2P_MODES, HostCpu, NvmeDrive, PcieMeasurement, PcieSwitchPart,
                           ServerDesign, SwitchSlot)
from sim.data.hardware import FORM_FACTORS, Gpu, Link
from sim.data.specs import PRECISIONS, Model
from sim.base.units import GIB

ENV_VAR = "PLANNER_CATALOG_DIR"
"""Environment variable that points the loader at another catalogs/ folder."""

LINK_KINDS: tuple[str, ...] = ("nic", "scale-up", "pcie", "switch")

_TERA = 1e12
_GIGA = 1e9


def catalog_dir() -> Path:
    """The catalogs/ folder: ``$PLANNER_CATALOG_DIR`` if set, else the project's own."""
    return _resolved_dir(os.environ.get(ENV_VAR) or "")


@functools.lru_cache(maxsize=16)
def _resolved_dir(override: str) -> Path:
    if override:
        return Path(override).expanduser().resolve()
    return (Path(__file__).resolve().parents[2] / "catalogs").resolve()


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

    return _index((r["id"], tuple(r.get("aliases") or ()),
                   model_from_dict(r, where=f"models.yaml:{r['id']}"))
                  for r in _raw(folder, "models.yaml"))


@functools.lru_cache(maxsize=8)
def _nic_index(links: _Index) -> _Index:
    return _index((link.id, link.aliases, link) for link in links.items if link.kind == "nic")


def clear_cache() -> None:
    """Forget every loaded catalog (files are also re-read when their mtime or size changes)."""
    for fn in (_records, _document, _gpu_index, _link_index, _model_index, _nic_index, _host_index, _server_index,
               _resolved_dir):
        fn.cache_clear()


# --------------------------------------------------------------------------- public lookups


def get_gpu(id_or_alias: str) -> Gpu:
    """The GPU with this id or alias (case-insensitive); ``InputError('gpu', ...)`` if unknown."""
    return _lookup(_gpus(str(catalog_dir())), "gpu", "GPU", id_or_alias)


def get_link(id: str) -> Link:
    """Any link (NIC, scale-up fabric, PCIe generation) by id or alias."""
    return _lookup(_links(str(catalog_dir())), "link", "link", id)


def get_nic(id: str) -> Link:
    """A scale-out network adapter (``kind: nic``) by id or alias."""
    index = _links(str(catalog_dir()))
    nics = _nic_index(index)
    if isinstance(id, str) and id.strip().lower() in index.by_name and id.strip().lower() not in nics.by_name:
        link = index.by_name[id.strip().lower()]
        raise InputError("nic", id, f"is a {link.kind} link, not a network adapter; known NICs: {', '.join(nics.ids)}")
    return _lookup(nics, "nic", "NIC", id)


def get_model(id: str) -> Model:
    """A catalog model by id or alias (``sim.data.models.load_model`` also accepts files)."""
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
    "form_factor", "pcie_lanes", "p2p", "nvlink_bridge", "fp32_accumulate_halved",
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
    bf16 = "bf16" in peaks
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
    form = r.text("form_factor", default="sxm", choices=FORM_FACTORS)
    pcie_only = form == "pcie" and not r.has("nvlink_generation")
    if pcie_only:  # a PCIe card without NVLink: scale-up inside its server is PCIe (sim/net/server.py)
        if r.has("nvlink_gb_per_s_per_direction"):
            raise r.fail("nvlink_gb_per_s_per_direction", "needs an nvlink_generation (or null both)")
        gen_id, nvlink_bw = "", 0.0
    else:
        gen = r.text("nvlink_generation")
        gen_link = links.by_name.get(gen.lower())
        if gen_link is None or gen_link.kind != "scale-up":
            raise r.fail("nvlink_generation", "must name a scale-up link in links.yaml")
        gen_id, nvlink_bw = gen_link.id, r.req("nvlink_gb_per_s_per_direction", positive=True) * _GIGA
    bridge_gpus, bridge_bw = 0, 0.0
    if r.has("nvlink_bridge"):
        if form != "pcie":
            raise r.fail("nvlink_bridge", "only PCIe cards have NVLink bridges")
        b = r.mapping("nvlink_bridge", allowed=("gpus", "gb_per_s_per_direction"))
        bridge_gpus = b.integer("gpus", minimum=2)
        bridge_bw = b.req("gb_per_s_per_direction", positive=True) * _GIGA
    pcie = r.integer("pcie_generation")
    price_hour = r.number("price_usd_per_hour", optional=True, positive=True)
    return r.build(
        Gpu, keys=_GPU_FIELD_KEYS,
        id=r.text("id"),
        name=r.text("name"),
        dense_flops_per_s=FrozenDict({p: v * _TERA for p, v in peaks.items()}),
        hbm_bytes=r.req("hbm_gib", positive=True) * GIB,
        hbm_bytes_per_s=r.req("hbm_tb_per_s", positive=True) * _TERA,
        nvlink_bytes_per_s_per_direction=nvlink_bw,
        nvlink_domain_size=r.integer("nvlink_domain_size"),
        nvlink_generation=gen_id,
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
        form_factor=form,
        pcie_lanes=r.integer("pcie_lanes", optional=True, default=16),
        p2p=r.text("p2p", default="pcie", choices=P2P_MODES),
        nvlink_bridge_gpus=bridge_gpus,
        nvlink_bridge_bytes_per_s_per_direction=bridge_bw,
        fp32_accumulate_halved=r.flag("fp32_accumulate_halved"),
        aliases=tuple(a.strip() for a in rec.get("aliases") or ()),
        source=r.text("source"),
        notes=notes,
        bf16_tensor_cores=bf16,
    )


# Gpu fields converted from a gpus.yaml key of another name (sim.base.records.Record.build)
_GPU_FIELD_KEYS = {"dense_flops_per_s": "dense_tflops", "hbm_bytes": "hbm_gib", "hbm_bytes_per_s": "hbm_tb_per_s",
                   "nvlink_bytes_per_s_per_direction": "nvlink_gb_per_s_per_direction",
                   "nvlink_bridge_gpus": "nvlink_bridge", "nvlink_bridge_bytes_per_s_per_direction": "nvlink_bridge"}


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
    return r.build(
        Link, keys={"bytes_per_s_per_direction": "gbit_per_s_per_direction" if has_gbit else "gb_per_s_per_direction",
                    "latency_s": "latency_us"},
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


# --------------------------------------------------------------------------- hosts and servers

_HOST_KEYS: dict[str, frozenset[str]] = {
    "cpu": frozenset({"cores", "base_ghz", "boost_ghz", "sockets_max", "pcie_generation", "pcie_lanes",
                      "memory_channels", "memory_type", "dram_gb_per_s", "stream_triad_gb_per_s", "fp32_tflops",
                      "socket_link", "socket_links", "socket_link_gb_per_s_per_direction", "tdp_w", "price_usd"}),
    "pcie-switch": frozenset({"generation", "lanes", "ports", "latency_ns", "power_w"}),
    "nvme": frozenset({"pcie_generation", "pcie_lanes", "seq_read_gb_per_s", "seq_write_gb_per_s"}),
    "pcie-link": frozenset({"pcie_generation", "lanes", "tool", "host_memory", "system", "p2p_enabled",
                            "allreduce_gpus", "allreduce_bytes"}),
}
_HOST_COMMON = frozenset({"id", "name", "aliases", "kind", "source", "notes"})
# measured quantities of a pcie-link record: GB/s (one direction unless *_bidirectional_*) and us
_MEASURED_RATES = ("h2d", "d2h", "p2p_unidirectional", "p2p_bidirectional", "p2p_unidirectional_p2p_disabled",
                   "p2p_bidirectional_p2p_disabled", "p2p_unidirectional_cross_socket", "allreduce_busbw",
                   "allreduce_busbw_4gpu")
_MEASURED_KEYS = frozenset({f"{m}_gb_per_s" for m in _MEASURED_RATES} | {f"{m}_range_gb_per_s" for m in _MEASURED_RATES}
                           | {"p2p_latency_us", "p2p_latency_p2p_disabled_us"})


def _host_from_record(rec: Mapping[str, Any], path: Path) -> Any:
    kind = rec.get("kind")
    if kind not in HOST_PART_KINDS:
        raise InputError(f"host[{rec['id']}].kind", kind, f"{path.name}: must be one of {', '.join(HOST_PART_KINDS)}")
    allowed = _HOST_COMMON | _HOST_KEYS[kind] | (_MEASURED_KEYS if kind == "pcie-link" else frozenset())
    r = Record(rec, where=f"{kind}[{rec['id']}]", file=path.name, allowed=allowed)
    common = dict(id=r.text("id"), name=r.text("name"), source=r.text("source"), notes=r.text("notes", default=""))
    if kind == "cpu":
        link_bw = r.number("socket_link_gb_per_s_per_direction", optional=True, positive=True)
        price = r.number("price_usd", optional=True, positive=True)
        stream = r.number("stream_triad_gb_per_s", optional=True, positive=True)
        dram = r.req("dram_gb_per_s", positive=True)
        if stream is not None and stream > dram:
            raise r.fail("stream_triad_gb_per_s", f"exceeds the theoretical dram_gb_per_s={dram}")
        return HostCpu(**common, cores=r.integer("cores"), sockets_max=r.integer("sockets_max"),
                       pcie_generation=r.integer("pcie_generation"), pcie_lanes=r.integer("pcie_lanes"),
                       dram_bytes_per_s=dram * _GIGA, stream_bytes_per_s=None if stream is None else stream * _GIGA,
                       fp32_flops_per_s=r.req("fp32_tflops", positive=True) * _TERA,
                       socket_link=r.text("socket_link", default="", choices=("", "upi", "xgmi")),
                       socket_links=r.integer("socket_links", minimum=0, optional=True, default=0),
                       socket_link_bytes_per_s_per_direction=None if link_bw is None else link_bw * _GIGA,
                       tdp_w=r.number("tdp_w", optional=True, positive=True), price_usd=price)
    if kind == "pcie-switch":
        lat = r.number("latency_ns", optional=True, positive=True)
        return PcieSwitchPart(**common, generation=r.integer("generation"), lanes=r.integer("lanes"),
                              ports=r.integer("ports", optional=True), latency_s=None if lat is None else lat * 1e-9,
                              power_w=r.number("power_w", optional=True, positive=True))
    if kind == "nvme":
        return NvmeDrive(**common, pcie_generation=r.integer("pcie_generation"), pcie_lanes=r.integer("pcie_lanes"),
                         read_bytes_per_s=r.req("seq_read_gb_per_s", positive=True) * _GIGA,
                         write_bytes_per_s=r.req("seq_write_gb_per_s", positive=True) * _GIGA)
    values: dict[str, float] = {}
    for m in _MEASURED_RATES:
        point = r.number(f"{m}_gb_per_s", optional=True, positive=True)
        key = f"{m}_range_gb_per_s"
        if rec.get(key) is not None:
            lo_hi = rec[key]
            if (not isinstance(lo_hi, list) or len(lo_hi) != 2 or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in lo_hi)
                    or lo_hi[0] > lo_hi[1]):
                raise r.fail(key, "must be [low, high] in GB/s")
            if point is not None and not lo_hi[0] <= point <= lo_hi[1] * 1.01:
                raise r.fail(key, f"does not bracket {m}_gb_per_s={point}")
            values[f"{m}_low_bytes_per_s"], values[f"{m}_high_bytes_per_s"] = lo_hi[0] * _GIGA, lo_hi[1] * _GIGA
        if point is not None:
            values[f"{m}_bytes_per_s"] = point * _GIGA
    for key in ("p2p_latency_us", "p2p_latency_p2p_disabled_us"):
        if r.has(key):
            values[key[:-3] + "_s"] = r.req(key, positive=True) * 1e-6
    for key in ("allreduce_gpus", "allreduce_bytes"):
        if r.has(key):
            values[key] = float(r.integer(key))
    if not values:
        raise r.fail("kind", "a pcie-link record needs at least one measured rate")
    enabled = rec.get("p2p_enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise r.fail("p2p_enabled", "must be true, false or null")
    if rec.get("host_memory") is not None:
        r.text("host_memory", choices=("pinned", "pageable"))
    return PcieMeasurement(**common, pcie_generation=r.integer("pcie_generation"), lanes=r.integer("lanes"),
                           values=FrozenDict(values), p2p_enabled=enabled, system=r.text("system", default=""),
                           tool=r.text("tool", default=""))


def _hosts(folder: str) -> _Index:
    return _host_index(folder, _stamp(str(Path(folder) / "hosts.yaml")))


@functools.cache
def _host_index(folder: str, *_stamps: tuple[int, int]) -> _Index:
    path = Path(folder) / "hosts.yaml"
    return _index((r["id"], tuple(r.get("aliases") or ()), _host_from_record(r, path))
                  for r in _raw(folder, "hosts.yaml"))


_HOST_TYPES = {"cpu": HostCpu, "pcie-switch": PcieSwitchPart, "nvme": NvmeDrive, "pcie-link": PcieMeasurement}


def get_host_part(id: str, kind: str | None = None) -> Any:
    """A ``catalogs/hosts.yaml`` record (``HostCpu``, ``PcieSwitchPart``, ``NvmeDrive`` or
    ``PcieMeasurement``) by id or alias; ``kind`` restricts the lookup (``cpu``, ...)."""
    if kind is not None and kind not in HOST_PART_KINDS:
        raise InputError("kind", kind, f"must be one of {', '.join(HOST_PART_KINDS)}")
    index = _hosts(str(catalog_dir()))
    if kind is not None:
        index = _index((i, (), p) for i, p in zip(index.ids, index.items) if isinstance(p, _HOST_TYPES[kind]))
    return _lookup(index, kind or "host", kind or "host part", id)


def get_cpu(id: str) -> HostCpu:
    """A CPU of ``catalogs/hosts.yaml``; ``InputError('cpu', ...)`` if unknown."""
    return get_host_part(id, "cpu")


def list_host_parts(kind: str | None = None) -> list[Any]:
    """Every ``hosts.yaml`` record, or those of one kind (cpu, pcie-switch, nvme, pcie-link)."""
    if kind is not None and kind not in HOST_PART_KINDS:
        raise InputError("kind", kind, f"must be one of {', '.join(HOST_PART_KINDS)}")
    return [p for p in _hosts(str(catalog_dir())).items if kind is None or isinstance(p, _HOST_TYPES[kind])]


_SERVER_KEYS = frozenset({
    "id", "name", "aliases", "sockets", "cpu", "num_gpus", "gpu", "pcie_switches", "gpus_on_root_ports",
    "gpu_link", "nics", "nics_on_root_ports", "nvlink_pairs", "host_dram_gib", "nvme_count", "power_w",
    "default_for", "source", "notes",
})


def _socket_map(r: Record, key: str, sockets: int, limit: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    value = r.rec.get(key) or {}
    if not isinstance(value, Mapping):
        raise r.fail(key, "must be a mapping {socket: [indices]}")
    out = []
    for socket, items in value.items():
        if isinstance(socket, bool) or not isinstance(socket, int) or not 0 <= socket < sockets:
            raise r.fail(key, f"socket {socket!r} must be an integer in [0, {sockets})")
        out.append((socket, _indices(r, key, items, limit)))
    return tuple(out)


def _indices(r: Record, key: str, items: object, limit: int) -> tuple[int, ...]:
    if not isinstance(items, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < limit
                                              for i in items):
        raise r.fail(key, f"must list indices in [0, {limit})")
    return tuple(items)


def _server_design_from_record(rec: Mapping[str, Any], path: Path) -> ServerDesign:
    r = Record(rec, where=f"server[{rec['id']}]", file=path.name, allowed=_SERVER_KEYS)
    sockets, n = r.integer("sockets"), r.integer("num_gpus")
    cpu = get_cpu(r.text("cpu"))
    if sockets > cpu.sockets_max:
        raise r.fail("sockets", f"{cpu.id} supports {cpu.sockets_max} socket(s)")
    get_gpu(r.text("gpu"))
    nics = r.mapping("nics", allowed=("count", "ports", "link", "east_west", "north_south"))
    nic_count = nics.integer("count", minimum=0, optional=True)
    ports = nics.integer("ports", optional=True, default=nic_count)
    nic_link = nics.rec.get("link")
    if nic_link is not None:
        nic_link = get_nic(nics.text("link")).id
    nic_limit = max(nic_count or 0, 1)
    raw_switches = rec.get("pcie_switches") or []
    if not isinstance(raw_switches, list):
        raise r.fail("pcie_switches", "must be a list")
    switches = []
    for j, sw in enumerate(raw_switches):
        s = Record(sw, where=f"server[{rec['id']}].pcie_switches[{j}]", file=path.name,
                   allowed=("id", "model", "socket", "gpus", "nics", "uplink_lanes"))
        socket = s.integer("socket", minimum=0)
        if socket >= sockets:
            raise s.fail("socket", f"must be < sockets={sockets}")
        model = s.rec.get("model")
        if model is not None:
            model = get_host_part(s.text("model"), "pcie-switch").id
        switches.append(SwitchSlot(id=s.text("id", default=f"sw{j}"), model=model, socket=socket,
                                   gpus=_indices(s, "gpus", sw.get("gpus") or [], n),
                                   nics=_indices(s, "nics", sw.get("nics") or [], nic_limit),
                                   uplink_lanes=s.integer("uplink_lanes")))
    roots = _socket_map(r, "gpus_on_root_ports", sockets, n)
    wired = [g for sw in switches for g in sw.gpus] + [g for _, gs in roots for g in gs]
    if sorted(wired) != list(range(n)):
        raise r.fail("gpus_on_root_ports", f"every GPU slot 0..{n - 1} must hang off exactly one switch or root port")
    nic_roots = _socket_map(r, "nics_on_root_ports", sockets, nic_limit)
    sites = [k for sw in switches for k in sw.nics] + [k for _, ks in nic_roots for k in ks]
    if len(set(sites)) != len(sites):
        raise r.fail("nics_on_root_ports", "a NIC is wired twice")
    link = r.mapping("gpu_link", allowed=("generation", "lanes", "cabling"))
    gen = link.integer("generation")
    get_link(f"pcie{gen}")
    pairs = tuple(_indices(r, "nvlink_pairs", p, n) for p in (rec.get("nvlink_pairs") or []))
    if any(len(p) < 2 for p in pairs) or len({g for p in pairs for g in p}) != sum(len(p) for p in pairs):
        raise r.fail("nvlink_pairs", "groups of >= 2 distinct GPU slots, each slot in one group")
    dram = r.number("host_dram_gib", optional=True, positive=True)
    default_for = rec.get("default_for") or []
    if not isinstance(default_for, list) or not all(isinstance(k, int) and 1 <= k <= n for k in default_for):
        raise r.fail("default_for", f"must list GPUs-per-node counts in [1, {n}]")
    return ServerDesign(id=r.text("id"), name=r.text("name"), sockets=sockets, cpu=cpu.id, num_gpus=n,
                        gpu=r.text("gpu"), switches=tuple(switches), gpus_on_root_ports=roots,
                        gpu_link_generation=gen, gpu_link_lanes=link.integer("lanes"), nic_count=nic_count,
                        nic_ports=ports or None,
                        nic_link=nic_link, nics_on_root_ports=nic_roots, nvlink_pairs=pairs,
                        host_dram_bytes=None if dram is None else dram * GIB,
                        nvme_count=r.integer("nvme_count", minimum=0, optional=True),
                        power_w=r.number("power_w", optional=True, positive=True), default_for=tuple(default_for),
                        aliases=tuple(a.strip() for a in rec.get("aliases") or ()),
                        source=r.text("source"), notes=r.text("notes", default=""))


def _servers(folder: str) -> _Index:
    stamps = tuple(_stamp(str(Path(folder) / f)) for f in ("servers.yaml", "hosts.yaml", "gpus.yaml", "links.yaml"))
    return _server_index(folder, *stamps)


@functools.cache
def _server_index(folder: str, *_stamps: tuple[int, int]) -> _Index:
    path = Path(folder) / "servers.yaml"
    index = _index((r["id"], tuple(r.get("aliases") or ()), _server_design_from_record(r, path))
                   for r in _raw(folder, "servers.yaml"))
    owners: dict[int, str] = {}
    for design in index.items:
        for k in design.default_for:
            if k in owners:
                raise InputError(f"server[{design.id}].default_for", k,
                                 f"servers.yaml: {owners[k]} is already the default for {k} GPUs")
            owners[k] = design.id
    return index


def get_server_design(id: str) -> ServerDesign:
    """A named PCIe server design of ``catalogs/servers.yaml``; ``InputError('server', ...)``."""
    return _lookup(_servers(str(catalog_dir())), "server", "server design", id)


def list_server_designs() -> list[ServerDesign]:
    return list(_servers(str(catalog_dir())).items)


def default_server_design(gpus_per_node: int) -> ServerDesign | None:
    """The design ``servers.yaml`` names (``default_for``) for PCIe cards at this node size."""
    return next((d for d in list_server_designs() if gpus_per_node in d.default_for), None)
