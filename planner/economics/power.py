"""Cluster power at the simulated utilisation, and energy.

Model (parameters in ``catalogs/prices.yaml`` ``power_model``; the two GPU fractions are
assumptions, see the record's notes):

* **GPU.**  ``P_gpu = P_idle + (TDP - P_idle) * a`` with ``P_idle = idle_fraction * TDP``
  and activity ``a = f_c + w * (1 - f_c)``, where ``f_c = compute_s / step_time_s`` is the
  share of the simulated step the GPU computes (``StepResult.breakdown``) and ``w``
  (``gpu_wait_fraction``) the share of the dynamic range it still draws while it waits on
  exposed communication, a pipeline bubble or the optimizer.  So ``P_idle <= P_gpu <= TDP``;
  compute phases run at TDP (DGX SuperPOD design guide; Epoch AI's 700 W at 70% MFU on an
  H100).  Known error: real draw during GEMMs can sit 5-15% under TDP with power capping or
  clock throttling, and memory-bound kernels draw less; +-15% per GPU.
* **Host** (CPUs, DRAM, NVSwitches, fans, NICs, PSU losses): ``host_power_w_per_node``
  (maximum system power minus the GPUs' TDP, ``server`` records) times
  ``host_load_fraction`` (Barroso et al.: servers average ~75% of peak).
* **Network**: switches (typical power, per port of the radix used) and optics per link
  (``bom.network_bom``).
* **Facility**: IT power times the PUE.  ``power_w`` (what the grid supplies) is the
  facility power; energy is ``power_w * time``.  During failure recovery the cluster is
  assumed to keep drawing the training power (an upper bound; idle GPUs draw less).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engines.result import StepResult
from sim.data.hardware import Cluster

from planner.economics.bom import Bom
from planner.economics.prices import PowerModel, PriceBook

JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True, kw_only=True, slots=True)
class PowerBreakdown:
    gpu_w_each: float
    gpu_activity: float  # a in the module docstring, in [w, 1]
    gpus_w: float
    hosts_w: float
    network_w: float
    pue: float

    @property
    def it_w(self) -> float:
        return self.gpus_w + self.hosts_w + self.network_w

    @property
    def facility_w(self) -> float:
        return self.it_w * self.pue

    def as_dict(self) -> dict[str, float]:
        return {"gpu_w_each": self.gpu_w_each, "gpu_activity": self.gpu_activity, "gpus_w": self.gpus_w,
                "hosts_w": self.hosts_w, "network_w": self.network_w, "it_w": self.it_w, "pue": self.pue,
                "facility_w": self.facility_w}


def gpu_power_w(tdp_w: float, compute_fraction: float, model: PowerModel) -> tuple[float, float]:
    """``(P_gpu, activity)`` of one GPU that computes ``compute_fraction`` of the time."""
    f = min(1.0, max(0.0, compute_fraction))
    activity = f + model.gpu_wait_fraction * (1.0 - f)
    idle = model.gpu_idle_fraction_of_tdp * tdp_w
    return idle + (tdp_w - idle) * activity, activity


def cluster_power(cluster: Cluster, step: StepResult, bom: Bom, prices: PriceBook, *,
                  pue: float | None = None) -> PowerBreakdown:
    """Power of ``cluster`` running the simulated ``step`` (module docstring model)."""
    model = prices.power
    frac = step.breakdown.compute_s / step.step_time_s if step.step_time_s > 0 else 1.0
    each, activity = gpu_power_w(cluster.gpu.tdp_w, frac, model)
    server = prices.server_for(cluster.gpu)
    hosts = cluster.num_nodes * server.host_power_w_per_node * model.host_load_fraction
    return PowerBreakdown(gpu_w_each=each, gpu_activity=activity, gpus_w=each * cluster.num_gpus, hosts_w=hosts,
                          network_w=bom.network_power_w, pue=model.pue if pue is None else pue)


def energy_kwh(power_w: float, seconds: float) -> float:
    return power_w * seconds / JOULES_PER_KWH
