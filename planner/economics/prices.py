"""``catalogs/prices.yaml`` -> a frozen ``PriceBook`` (USD, W, bytes/s; converted once).

Lookups fail loudly: a NIC without a switch or adapter price, or a link rate above every
cable record, is an ``InputError`` that names the id and the file.  GPU prices come from
``gpus.yaml`` first and from ``prices.yaml`` ``gpu_price`` records (estimates) second; the
result says which (``PriceQuote.source``).  See docs/economics.md for the schema.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.data.catalog import catalog_file_records, file_version
from sim.base.errors import InputError
from sim.base.records import Record
from sim.data.hardware import Gpu, Link

FILE = "prices.yaml"
_KINDS = ("switch", "nic_adapter", "link_media", "server", "gpu_price", "power_model", "electricity", "finance")
SECONDS_PER_YEAR = 365.25 * 86400.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SwitchPrice:
    id: str
    nics: tuple[str, ...]
    radix: int
    price_usd: float
    power_w: float
    estimate: bool
    source: str

    @property
    def price_usd_per_port(self) -> float:
        return self.price_usd / self.radix

    @property
    def power_w_per_port(self) -> float:
        return self.power_w / self.radix


@dataclass(frozen=True, kw_only=True, slots=True)
class AdapterPrice:
    id: str
    nics: tuple[str, ...]
    price_usd: float
    power_w: float
    estimate: bool
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkPrice:
    id: str
    media: str  # dac | optical
    max_bytes_per_s: float
    price_usd_per_link: float
    power_w_per_link: float
    estimate: bool
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerPrice:
    id: str
    gpus: tuple[str, ...]
    non_gpu_price_usd_per_node: float
    host_power_w_per_node: float
    default: bool
    estimate: bool
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PowerModel:
    """Parameters of ``planner.economics.power`` (see its docstring for the model)."""

    gpu_idle_fraction_of_tdp: float
    gpu_wait_fraction: float
    host_load_fraction: float
    pue: float
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PriceQuote:
    """A price with where it came from (``gpus.yaml``, ``prices.yaml:<id>`` or ``flag``)."""

    value: float
    source: str
    estimate: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class PriceBook:
    switches: tuple[SwitchPrice, ...]
    adapters: tuple[AdapterPrice, ...]
    links: tuple[LinkPrice, ...]
    servers: tuple[ServerPrice, ...]
    gpu_prices: dict[str, tuple[float | None, float | None, bool, str]]
    power: PowerModel
    usd_per_kwh: float
    electricity_source: str
    amortization_s: float
    finance_source: str

    # ---------------------------------------------------------------- lookups
    def switch_for(self, nic: Link) -> SwitchPrice:
        for s in self.switches:
            if nic.id.lower() in s.nics:
                return s
        raise InputError("nic", nic.id, f"has no switch price in {FILE} (add a 'switch' record listing it)")

    def adapter_for(self, nic: Link) -> AdapterPrice:
        for a in self.adapters:
            if nic.id.lower() in a.nics:
                return a
        raise InputError("nic", nic.id, f"has no adapter price in {FILE} (add a 'nic_adapter' record listing it)")

    def link_for(self, bytes_per_s: float, media: str) -> LinkPrice:
        """The cheapest-rated ``media`` record whose rate covers ``bytes_per_s``."""
        fits = sorted((l for l in self.links if l.media == media and l.max_bytes_per_s >= bytes_per_s * (1 - 1e-9)),
                      key=lambda l: l.max_bytes_per_s)
        if not fits:
            raise InputError("link", f"{media}@{bytes_per_s * 8 / 1e9:g}Gb/s",
                             f"no '{media}' link_media record in {FILE} covers this rate")
        return fits[0]

    def server_for(self, gpu: Gpu) -> ServerPrice:
        for s in self.servers:
            if gpu.id.lower() in s.gpus:
                return s
        for s in self.servers:
            if s.default:
                return s
        raise InputError("gpu", gpu.id, f"has no server record in {FILE} and there is no default one")

    def gpu_price(self, gpu: Gpu, override_usd: float | None = None) -> PriceQuote | None:
        """Purchase price of one GPU: flag, then ``gpus.yaml``, then a ``gpu_price`` record."""
        if override_usd is not None:
            return PriceQuote(value=override_usd, source="--gpu-price-usd", estimate=False)
        if gpu.price_usd is not None:
            return PriceQuote(value=gpu.price_usd, source="gpus.yaml", estimate=False)
        rec = self.gpu_prices.get(gpu.id.lower())
        if rec is not None and rec[0] is not None:
            return PriceQuote(value=rec[0], source=f"{FILE}:{rec[3]}", estimate=rec[2])
        return None

    def gpu_hourly(self, gpu: Gpu, override_usd: float | None = None) -> PriceQuote | None:
        """On-demand rent of one GPU-hour: flag, then ``gpus.yaml``, then ``gpu_price``."""
        if override_usd is not None:
            return PriceQuote(value=override_usd, source="--usd-per-gpu-hour", estimate=False)
        if gpu.price_usd_per_hour is not None:
            return PriceQuote(value=gpu.price_usd_per_hour, source="gpus.yaml", estimate=False)
        rec = self.gpu_prices.get(gpu.id.lower())
        if rec is not None and rec[1] is not None:
            return PriceQuote(value=rec[1], source=f"{FILE}:{rec[3]}", estimate=rec[2])
        return None


def _one(kind: str, items: list, where: str) -> object:
    if len(items) != 1:
        raise InputError("catalog", where, f"needs exactly one '{kind}' record, found {len(items)}")
    return items[0]


@functools.cache
def _load(_version: tuple[str, int, int]) -> PriceBook:
    recs = catalog_file_records(FILE)
    switches, adapters, links, servers, power, elec, fin = [], [], [], [], [], [], []
    gpu_prices: dict[str, tuple[float | None, float | None, bool, str]] = {}
    for raw in recs:
        r = Record(raw, where=f"{FILE}:{raw['id']}")
        kind = r.text("kind")
        if kind not in _KINDS:
            raise r.fail("kind", f"must be one of {', '.join(_KINDS)}")
        est = r.flag("estimate")
        src = r.text("source")
        if kind == "switch":
            radix = r.integer("radix", minimum=2)
            if radix < 2:
                raise r.fail("radix", "must be >= 2")
            switches.append(SwitchPrice(id=raw["id"], nics=r.strings("nics"), radix=radix,
                                        price_usd=r.req("price_usd"), power_w=r.req("power_w"),
                                        estimate=est, source=src))
        elif kind == "nic_adapter":
            adapters.append(AdapterPrice(id=raw["id"], nics=r.strings("nics"), price_usd=r.req("price_usd"),
                                         power_w=r.req("power_w"), estimate=est, source=src))
        elif kind == "link_media":
            media = r.text("media")
            if media not in ("dac", "optical"):
                raise r.fail("media", "must be dac or optical")
            links.append(LinkPrice(id=raw["id"], media=media,
                                   max_bytes_per_s=r.req("gbit_per_s", positive=True) * 1e9 / 8,
                                   price_usd_per_link=r.req("price_usd_per_link"),
                                   power_w_per_link=r.req("power_w_per_link"), estimate=est, source=src))
        elif kind == "server":
            servers.append(ServerPrice(id=raw["id"], gpus=r.strings("gpus"),
                                       non_gpu_price_usd_per_node=r.req("non_gpu_price_usd_per_node"),
                                       host_power_w_per_node=r.req("host_power_w_per_node"),
                                       default=r.flag("default"), estimate=est, source=src))
        elif kind == "gpu_price":
            gpu_prices[r.text("gpu").lower()] = (r.number("price_usd", optional=True, positive=True),
                                                 r.number("price_usd_per_hour", optional=True, positive=True),
                                                 est, raw["id"])
        elif kind == "power_model":
            pue = r.req("pue")
            if not 1.0 <= pue <= 3.0:
                raise r.fail("pue", "must be in [1, 3]")
            power.append(PowerModel(gpu_idle_fraction_of_tdp=r.fraction("gpu_idle_fraction_of_tdp"),
                                    gpu_wait_fraction=r.fraction("gpu_wait_fraction"),
                                    host_load_fraction=r.fraction("host_load_fraction"), pue=pue, source=src))
        elif kind == "electricity":
            elec.append((r.req("usd_per_kwh"), src))
        else:
            fin.append((r.req("amortization_years", positive=True), src))
    usd_per_kwh, esrc = _one("electricity", elec, FILE)  # type: ignore[misc]
    years, fsrc = _one("finance", fin, FILE)  # type: ignore[misc]
    return PriceBook(switches=tuple(switches), adapters=tuple(adapters), links=tuple(links),
                     servers=tuple(servers), gpu_prices=gpu_prices,
                     power=_one("power_model", power, FILE),  # type: ignore[arg-type]
                     usd_per_kwh=usd_per_kwh, electricity_source=esrc,
                     amortization_s=years * SECONDS_PER_YEAR, finance_source=fsrc)


def load_prices() -> PriceBook:
    """The price book of the active catalogs folder (cached; re-read when the file changes)."""
    return _load(file_version(FILE))
