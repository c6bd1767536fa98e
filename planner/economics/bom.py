"""Bill of materials and capital cost of a cluster: GPUs, servers, and the scale-out network.

The network part is derived from the fabric the simulator itself uses
(``sim.net.topology.topology_metrics``): switches by level and radix, scale-out cables by tier,
NICs.  Pricing rules (each an approximation, documented in docs/economics.md):

* **Switches** are priced per port: a switch of radix ``r`` costs ``r x (record price /
  record radix)``, so a 1-level ``star`` or ``tree`` top switch with more ports than one box
  is priced as a modular chassis of the same per-port cost.
* **Cables.** Every cable in ``cables_by_tier`` is one link at the NIC rate.  NIC-to-leaf
  links are copper (DAC) -- leaves sit at the top of the rack -- except in a
  ``rail-optimized`` fabric, whose rail leaves serve many racks (optical).  Leaf-spine and
  higher tiers are optical (two transceivers plus fibre).  Mesh/torus neighbour links are
  copper.  A NIC-leaf link counts once per NIC (the topology's count).
* **NICs**: one adapter per scale-out NIC (``topology_metrics.num_nics``).
* **Servers**: GPUs at their purchase price plus the non-GPU part of each node
  (``prices.yaml`` ``server`` records).  Scale-up fabrics (NVSwitch, NVL72 switch trays) are
  inside the server/rack price.
* Storage, front-end (management) networks, racks, cooling plant and buildings are not
  counted (see docs/economics.md for why and what they add).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.data.hardware import Cluster
from sim.net.topology import topology_metrics

from planner.economics.prices import PriceBook, PriceQuote

_TIER_MEDIA = {"nic-leaf": "dac", "leaf-spine": "optical", "spine-core": "optical", "node-node": "dac"}


@dataclass(frozen=True, kw_only=True, slots=True)
class BomItem:
    """One line of the bill: ``quantity`` x ``unit_price_usd``; ``power_w`` for all of them."""

    category: str  # gpu | server | nic | switch | link
    item: str
    quantity: int
    unit_price_usd: float
    power_w: float
    price_source: str
    estimate: bool

    @property
    def total_usd(self) -> float:
        return self.quantity * self.unit_price_usd

    def as_dict(self) -> dict[str, object]:
        return {"category": self.category, "item": self.item, "quantity": self.quantity,
                "unit_price_usd": self.unit_price_usd, "total_usd": self.total_usd, "power_w": self.power_w,
                "price_source": self.price_source, "estimate": self.estimate}


@dataclass(frozen=True, kw_only=True, slots=True)
class Bom:
    items: tuple[BomItem, ...]
    num_switches: int
    num_cables: int
    num_nics: int
    warnings: tuple[str, ...] = field(default=())

    def total_usd(self, *categories: str) -> float:
        return sum(i.total_usd for i in self.items if not categories or i.category in categories)

    @property
    def network_capex_usd(self) -> float:
        """Scale-out network: NICs, switches, cables and optics."""
        return self.total_usd("nic", "switch", "link")

    @property
    def network_power_w(self) -> float:
        """Switches and optics (NIC power is inside the host power of the server records)."""
        return sum(i.power_w for i in self.items if i.category in ("switch", "link"))


def _tier_media(topology: str, tier: str) -> str:
    if tier == "nic-leaf" and topology == "rail-optimized":
        return "optical"
    return _TIER_MEDIA.get(tier, "optical")


def network_bom(cluster: Cluster, prices: PriceBook) -> list[BomItem]:
    """NICs, switches and links of ``cluster``'s scale-out fabric (module docstring rules)."""
    if cluster.num_nodes <= 1:
        return []  # one node: NVLink/PCIe only, no scale-out fabric to buy
    m = topology_metrics(cluster)
    nic = cluster.nic
    items: list[BomItem] = []
    if m.num_nics:
        a = prices.adapter_for(nic)
        items.append(BomItem(category="nic", item=f"{nic.id} adapter", quantity=m.num_nics,
                             unit_price_usd=a.price_usd, power_w=a.power_w * m.num_nics,
                             price_source=f"prices.yaml:{a.id}", estimate=a.estimate))
    if m.switches_by_radix:
        sw = prices.switch_for(nic)
        for radix, count in sorted(m.switches_by_radix.items()):
            if count <= 0:
                continue
            items.append(BomItem(category="switch", item=f"{radix}-port {nic.id} switch", quantity=count,
                                 unit_price_usd=sw.price_usd_per_port * radix,
                                 power_w=sw.power_w_per_port * radix * count,
                                 price_source=f"prices.yaml:{sw.id}", estimate=sw.estimate))
    for tier, count in m.cables_by_tier.items():
        if count <= 0:
            continue
        media = _tier_media(cluster.topology, tier)
        lp = prices.link_for(nic.bytes_per_s_per_direction, media)
        items.append(BomItem(category="link", item=f"{tier} {media} link", quantity=count,
                             unit_price_usd=lp.price_usd_per_link, power_w=lp.power_w_per_link * count,
                             price_source=f"prices.yaml:{lp.id}", estimate=lp.estimate))
    return items


def cluster_bom(cluster: Cluster, prices: PriceBook, gpu_price: PriceQuote) -> Bom:
    """Whole-cluster bill: GPUs, servers (non-GPU part) and the scale-out network.

    A single-node cluster (no switch, no cable) has no scale-out network at all.
    """
    warnings: list[str] = []
    server = prices.server_for(cluster.gpu)
    if server.default:
        warnings.append(f"no server record for {cluster.gpu.id}: non-GPU node cost and host power use "
                        f"the default assumption (prices.yaml:{server.id})")
    items = [
        BomItem(category="gpu", item=cluster.gpu.id, quantity=cluster.num_gpus, unit_price_usd=gpu_price.value,
                power_w=0.0, price_source=gpu_price.source, estimate=gpu_price.estimate),
        BomItem(category="server", item=f"{cluster.gpu.id} node (non-GPU part)", quantity=cluster.num_nodes,
                unit_price_usd=server.non_gpu_price_usd_per_node, power_w=0.0,
                price_source=f"prices.yaml:{server.id}", estimate=server.estimate),
    ]
    net = network_bom(cluster, prices)
    m = topology_metrics(cluster)
    if m.exceeds_radix:
        warnings.append(f"the {cluster.topology} fabric needs more ports than one {m.switches_by_radix} switch "
                        f"level offers; priced per port as a chassis")
    return Bom(items=tuple(items + net), num_switches=m.num_switches, num_cables=m.num_cables,
               num_nics=m.num_nics, warnings=tuple(warnings))
