"""Total cost of ownership and time/energy/cost to train a token budget.

* **Token budget.**  ``tokens`` defaults to ``tokens_per_param * N`` with 20 tokens per
  parameter, the compute-optimal ratio of Hoffmann et al. (2022), "Training Compute-Optimal
  Large Language Models" (Chinchilla), Sec. 3 and Table 3 (~20 tokens/parameter); ``N`` is
  the total parameter count (for MoE models this is a choice: DeepSeek-V3 used ~22 tokens
  per total parameter).
* **Time.**  ``time_to_train_ideal_s = tokens / tokens_per_s`` of the calibrated estimate of the
  step (``planner.fitting.uncertainty``; ``time_to_train_s_low``/``_high`` and the cost's scale with its
  80% band: every cost here is proportional to the wall time);
  ``time_to_train_s`` divides by the analytic goodput (``planner.economics.goodput``: Daly's
  expected wall time with failures at the Young interval) unless failures are ignored.
* **Capital cost** (``capex_usd``): GPUs + servers + scale-out network (``bom``).
* **Owned cost to train** (``cost_to_train_usd`` with ``pricing='owned'``): straight-line
  depreciation of the capex over the amortisation period for the wall time used, plus energy
  (``facility power * time * USD/kWh``), plus an optional facility rent per kW of IT power.
  No cost of capital, staff, storage or software.
* **Cloud alternative**: ``num_gpus * hours * USD per GPU-hour`` (on-demand list prices in
  ``gpus.yaml``; reserved capacity is typically 30-60% cheaper).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.data.conventions import conventions
from sim.base.errors import InputError
from sim.engines.run import RunChoices
from sim.data.hardware import Cluster
from sim.data.specs import Model, Strategy

from planner.economics.bom import Bom, cluster_bom
from planner.economics.goodput import GoodputReport, goodput_report
from planner.economics.power import PowerBreakdown, cluster_power, energy_kwh
from planner.economics.prices import PriceBook, PriceQuote, load_prices
from planner.economics.storage import DEFAULT_STORAGE
from planner.economics.strategy import ChosenPlan, choose_plan

PRICINGS = ("owned", "cloud")
UNPRICED_GPU = PriceQuote(value=0.0, source="unknown (cloud pricing only)", estimate=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class TcoOptions:
    tokens: float | None = None
    tokens_per_param: float | None = None  # None: catalogs/conventions.yaml (Chinchilla, 20)
    pricing: str = "owned"
    usd_per_kwh: float | None = None
    pue: float | None = None
    amortization_years: float | None = None
    gpu_price_usd: float | None = None
    usd_per_gpu_hour: float | None = None
    facility_usd_per_kw_month: float = 0.0
    include_failures: bool = True
    storage: str = DEFAULT_STORAGE

    def __post_init__(self) -> None:
        if self.pricing not in PRICINGS:
            raise InputError("pricing", self.pricing, f"must be one of {', '.join(PRICINGS)}")
        for name in ("tokens", "usd_per_kwh", "amortization_years", "gpu_price_usd", "usd_per_gpu_hour"):
            v = getattr(self, name)
            if v is not None and not (0 < v < 1e30):
                raise InputError(name.replace("_", "-"), v, "must be a positive finite number")
        if self.tokens_per_param is not None and not (0 < self.tokens_per_param < 1e9):
            raise InputError("tokens-per-param", self.tokens_per_param, "must be a positive finite number")
        if self.pue is not None and not 1.0 <= self.pue <= 3.0:
            raise InputError("pue", self.pue, "must be in [1, 3]")
        if not 0 <= self.facility_usd_per_kw_month < 1e9:
            raise InputError("facility-usd-per-kw-month", self.facility_usd_per_kw_month, "must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class TcoResult:
    model: str
    cluster: Cluster
    plan: ChosenPlan
    tokens: float
    time_to_train_ideal_s: float
    time_to_train_s: float
    goodput: float
    goodput_report: GoodputReport | None
    bom: Bom
    power: PowerBreakdown
    energy_kwh: float
    usd_per_kwh: float
    amortization_s: float
    capex_usd: float
    owned_cost_usd: float | None
    cloud_cost_usd: float | None
    cost_to_train_usd: float
    pricing: str
    cost_breakdown: dict[str, float]
    usd_per_gpu_hour: float | None
    warnings: tuple[str, ...] = field(default=())

    @property
    def network_capex_usd(self) -> float:
        return self.bom.network_capex_usd

    def as_dict(self) -> dict[str, object]:
        r, o = self.plan.result, self.plan.out
        lo, hi = self.plan.band_factors()
        return {
            "model": self.model, "gpu": self.cluster.gpu.id, "num_gpus": self.cluster.num_gpus,
            "num_nodes": self.cluster.num_nodes, "nic": self.cluster.nic.id, "topology": self.cluster.topology,
            "oversubscription": self.cluster.oversubscription,
            "strategy": self.plan.strategy.to_string(), "strategy_source": self.plan.source,
            "framework": o.get("framework"),
            "step_time_s": self.plan.step_time_s, "step_time_s_low": o["step_time_s_low"],
            "step_time_s_high": o["step_time_s_high"], "model_step_time_s": r.step_time_s,
            "uncertainty": o.get("uncertainty"),
            "tokens_per_s": self.plan.tokens_per_s, "mfu": o["mfu"], "memory_peak_bytes": r.memory_peak_bytes,
            "fits_memory": r.fits_memory,
            "tokens": self.tokens, "time_to_train_ideal_s": self.time_to_train_ideal_s,
            "time_to_train_s": self.time_to_train_s, "time_to_train_days": self.time_to_train_s / 86400.0,
            "time_to_train_s_low": self.time_to_train_s * lo, "time_to_train_s_high": self.time_to_train_s * hi,
            "goodput": self.goodput,
            "cost_to_train_usd": self.cost_to_train_usd, "pricing": self.pricing,
            "cost_to_train_usd_low": self.cost_to_train_usd * lo, "cost_to_train_usd_high": self.cost_to_train_usd * hi,
            "owned_cost_to_train_usd": self.owned_cost_usd, "cloud_cost_to_train_usd": self.cloud_cost_usd,
            "usd_per_gpu_hour": self.usd_per_gpu_hour, "cost_breakdown": dict(self.cost_breakdown),
            "capex_usd": self.capex_usd, "network_capex_usd": self.network_capex_usd,
            "capex_breakdown": {"gpus_usd": self.bom.total_usd("gpu"), "servers_usd": self.bom.total_usd("server"),
                                "nics_usd": self.bom.total_usd("nic"), "switches_usd": self.bom.total_usd("switch"),
                                "links_usd": self.bom.total_usd("link")},
            "network_bom": [i.as_dict() for i in self.bom.items if i.category in ("nic", "switch", "link")],
            "num_switches": self.bom.num_switches, "num_cables": self.bom.num_cables,
            "power_w": self.power.facility_w, "power": self.power.as_dict(),
            "energy_kwh": self.energy_kwh, "usd_per_kwh": self.usd_per_kwh,
            "amortization_years": self.amortization_s / (365.25 * 86400.0),
            "goodput_detail": self.goodput_report.as_dict() if self.goodput_report else None,
            "warnings": list(self.warnings),
        }


def token_budget(model: Model, options: TcoOptions) -> float:
    """``options.tokens`` or ``tokens_per_param * num_params`` (Chinchilla, module docstring)."""
    if options.tokens is not None:
        return options.tokens
    per = options.tokens_per_param if options.tokens_per_param is not None else conventions().tokens_per_parameter
    return per * model.num_params


def compute_tco(model: Model, cluster: Cluster, *, strategy: str | Strategy | None = None, gbs: int | None = None,
                seq_len: int | None = None, options: TcoOptions | None = None, prices: PriceBook | None = None,
                plan: ChosenPlan | None = None, choices: RunChoices | None = None) -> TcoResult:
    """Cost, power, energy and time to train ``model`` on ``cluster`` (module docstring)."""
    opt = options or TcoOptions()
    pb = prices or load_prices()
    plan = plan or choose_plan(model, cluster, strategy=strategy, gbs=gbs, seq_len=seq_len, choices=choices)
    r = plan.result
    warnings = list(r.warnings)
    if not r.fits_memory:
        warnings.append("the costed plan does not fit in GPU memory")
    tokens = token_budget(model, opt)
    ideal = tokens / plan.tokens_per_s  # the estimate to plan with (planner.fitting.uncertainty)

    gp_report = goodput_report(model, cluster, storage=opt.storage) if opt.include_failures else None
    gp = gp_report.goodput if gp_report else 1.0
    if gp <= 0:
        raise InputError("storage", opt.storage, "goodput is zero: checkpoints cannot keep up with failures")
    wall = ideal / gp

    gpu_q = pb.gpu_price(cluster.gpu, opt.gpu_price_usd)
    hourly_q = pb.gpu_hourly(cluster.gpu, opt.usd_per_gpu_hour)
    if gpu_q is None and (opt.pricing == "owned" or hourly_q is None):
        raise InputError("gpu-price-usd", None, f"{cluster.gpu.id} has no purchase price in gpus.yaml or prices.yaml; "
                                                "give --gpu-price-usd (and/or --usd-per-gpu-hour with --pricing cloud)")
    if gpu_q is not None and gpu_q.estimate:
        warnings.append(f"GPU price {gpu_q.value:,.0f} USD is an estimate ({gpu_q.source})")
    bom = cluster_bom(cluster, pb, gpu_q if gpu_q is not None else UNPRICED_GPU)
    warnings.extend(bom.warnings)
    power = cluster_power(cluster, r, bom, pb, pue=opt.pue)
    kwh = energy_kwh(power.facility_w, wall)
    usd_kwh = opt.usd_per_kwh if opt.usd_per_kwh is not None else pb.usd_per_kwh
    amort_s = opt.amortization_years * 365.25 * 86400.0 if opt.amortization_years else pb.amortization_s

    capex = bom.total_usd() if gpu_q is not None else float("nan")
    owned = None
    breakdown: dict[str, float] = {}
    if gpu_q is not None:
        depreciation = capex * wall / amort_s
        energy_cost = kwh * usd_kwh
        facility = opt.facility_usd_per_kw_month * power.it_w / 1e3 * wall / (30.4375 * 86400.0)
        owned = depreciation + energy_cost + facility
        breakdown = {"depreciation_usd": depreciation, "energy_usd": energy_cost, "facility_usd": facility}
        if wall > amort_s:
            warnings.append("training takes longer than the amortisation period")
    cloud = cluster.num_gpus * wall / 3600.0 * hourly_q.value if hourly_q is not None else None
    if opt.pricing == "cloud":
        if cloud is None:
            raise InputError("usd-per-gpu-hour", None, f"{cluster.gpu.id} has no hourly price; give --usd-per-gpu-hour")
        cost = cloud
    else:
        assert owned is not None
        cost = owned
    return TcoResult(model=model.name, cluster=cluster, plan=plan, tokens=tokens, time_to_train_ideal_s=ideal,
                     time_to_train_s=wall, goodput=gp, goodput_report=gp_report, bom=bom, power=power,
                     energy_kwh=kwh, usd_per_kwh=usd_kwh, amortization_s=amort_s, capex_usd=capex,
                     owned_cost_usd=owned, cloud_cost_usd=cloud, cost_to_train_usd=cost, pricing=opt.pricing,
                     cost_breakdown=breakdown, usd_per_gpu_hour=hourly_q.value if hourly_q else None,
                     warnings=tuple(dict.fromkeys(warnings)))
