"""Failure rates per component (``catalogs/failures.yaml``) and a cluster's MTBF.

Each component's rate is its published interruption count divided by the exposure of the
observation (units x seconds), i.e. a constant-rate (exponential) model per unit:
``lambda_c = count_c / (units_c * T_obs)``.  A cluster with ``n_c`` units of each kind fails
as a Poisson process of rate ``Lambda = sum_c n_c * lambda_c``, so ``MTBF = 1 / Lambda``
(whole cluster, any interruption).  Units come from the same fabric the simulator uses
(``sim.net.topology.topology_metrics``: NICs and scale-out cables; a single node has none).

Known error: the only per-category public log is Llama 3's (16,384 H100, 54 days); rates
differ by GPU generation, operator, burn-in and software maturity (the paper itself notes
infant-mortality effects).  Treat MTBF as +-2x.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping

from sim.data.catalog import catalog_document, catalog_file_records, file_version
from sim.base.errors import InputError
from sim.base.records import Record
from sim.data.hardware import Cluster
from sim.net.topology import topology_metrics

FILE = "failures.yaml"
UNITS = ("gpu", "node", "nic", "cable")
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentRate:
    id: str
    per: str  # gpu | node | nic | cable
    needs_node: bool  # the failed node must be swapped out before the job restarts
    rate_per_s: float  # per unit
    count: int  # published interruptions behind the rate
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class FailureModel:
    components: tuple[ComponentRate, ...]
    restart_s: float
    repair_s: float
    reconfigure_s: float  # a planned elastic resize (planner schedule)
    spare_fraction: float
    observation: str

    def component(self, cid: str) -> ComponentRate:
        for c in self.components:
            if c.id == cid:
                return c
        raise InputError("component", cid, f"unknown; known: {', '.join(c.id for c in self.components)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterRates:
    """Failure rates of one cluster, per second (whole cluster unless named per node)."""

    units: dict[str, int]
    by_component: dict[str, float]
    needs_node: dict[str, bool]

    @property
    def total_per_s(self) -> float:
        return sum(self.by_component.values())

    @property
    def mtbf_s(self) -> float:
        return 1.0 / self.total_per_s if self.total_per_s > 0 else float("inf")

    @property
    def failures_per_day(self) -> float:
        return self.total_per_s * SECONDS_PER_DAY

    @property
    def node_loss_fraction(self) -> float:
        """Share of failures that take a node out (needs a spare or a repair)."""
        tot = self.total_per_s
        return sum(r for c, r in self.by_component.items() if self.needs_node[c]) / tot if tot else 0.0


@functools.cache
def _load(_stamp: object) -> FailureModel:
    doc = catalog_document(FILE)
    obs = doc.get("observation")
    if not isinstance(obs, Mapping):
        raise InputError("catalog", FILE, "needs an 'observation' mapping")
    o = Record(obs, where=f"{FILE}:observation")
    exposure = {"gpu": o.req("num_gpus", positive=True), "node": o.req("num_nodes", positive=True),
                "nic": o.req("num_nics", positive=True), "cable": o.req("num_cables", positive=True)}
    seconds = o.req("days", positive=True) * SECONDS_PER_DAY
    comps = []
    for raw in catalog_file_records(FILE):
        r = Record(raw, where=f"{FILE}:{raw['id']}")
        per = r.text("per")
        if per not in UNITS:
            raise r.fail("per", f"must be one of {', '.join(UNITS)}")
        count = r.integer("count", minimum=0)
        comps.append(ComponentRate(id=raw["id"], per=per, needs_node=r.flag("needs_node"),
                                   rate_per_s=count / (exposure[per] * seconds), count=count,
                                   source=r.text("source")))
    rec = doc.get("recovery")
    if not isinstance(rec, Mapping):
        raise InputError("catalog", FILE, "needs a 'recovery' mapping")
    rv = Record(rec, where=f"{FILE}:recovery")
    return FailureModel(components=tuple(comps), restart_s=rv.req("restart_s"), repair_s=rv.req("repair_s"), reconfigure_s=rv.req("reconfigure_s"),
                        spare_fraction=rv.fraction("spare_fraction"), observation=o.text("source"))


def load_failure_model() -> FailureModel:
    """The failure model of the active catalogs folder (cached per file version)."""
    return _load(file_version(FILE))


def cluster_units(cluster: Cluster) -> dict[str, int]:
    """How many of each failing unit ``cluster`` has (scale-out parts only with >1 node)."""
    units = {"gpu": cluster.num_gpus, "node": cluster.num_nodes, "nic": 0, "cable": 0}
    if cluster.num_nodes > 1:
        m = topology_metrics(cluster)
        units["nic"], units["cable"] = m.num_nics, m.num_cables
    return units


def rates_for_units(units: dict[str, int], model: FailureModel) -> ClusterRates:
    return ClusterRates(units=dict(units),
                        by_component={c.id: c.rate_per_s * units[c.per] for c in model.components},
                        needs_node={c.id: c.needs_node for c in model.components})


def cluster_rates(cluster: Cluster, model: FailureModel | None = None) -> ClusterRates:
    """Failure rates of ``cluster`` (module docstring)."""
    return rates_for_units(cluster_units(cluster), model or load_failure_model())
