"""The one fitting procedure: every fitted constant of ``catalogs/efficiency.yaml`` (``fitted``).

``fit_all()`` fits, in order (each step uses the ones before it):

1. **collectives** from NCCL all-reduce bus-bandwidth curves (``published_runs.yaml``
   ``microbenchmarks``): NVLink large-message efficiency per generation, scale-out efficiency,
   the fixed cost of a collective call, and the per-tier size curves (``sim.base.fitting``);
2. **kernels** from ``catalogs/microbenchmarks/`` (``planner.fitting.fit_kernels``): the sustained GEMM
   fraction per architecture, the fp8 recipes' quantization cost, the achieved bandwidth of
   memory-bound (normalisation and element-wise) kernels, attention efficiency vs
   sequence length, the per-step overhead of ring (context-parallel) attention, the sustained-over-
   burst compute rate (long-running GEMM sweeps against mamf-finder's bursts);
3. **GEMM shape factor** from GEMM sweeps (XLA's H100 and B200 matmul tables:
   ``fit_kernels.fit_gemm_half_dim``), which the per-architecture fractions of step 2 are
   corrected by; then the **fallback sustained fraction** (GPUs without a training-shape GEMM
   benchmark, i.e. Ampere) from half of the vTrain multi-node rows, and the **host dispatch
   floor** from a quarter of the vTrain single-node rows, alternately until both stop moving.
   Korthikanti et al. 2022 Table 4's per-layer timings are reported against the result, not fitted.

Data sources carry the key a reference run of the same source is scored under
(``planner.fitting.reference.source_of``): Table 4 is ``korthikanti2022``, the vTrain rows ``vtrain``.
``fit_all(exclude={S})`` refits without source ``S``'s data, which is what leave-one-source-
out scoring (``planner.fitting.published``) does before predicting S's runs (Table 4 feeds no
fitted value since the shape factor comes from GEMM sweeps).

Known error: each step is a least-squares or grid fit of a few parameters; their residuals
are stored next to the values (``max_rel_error_*``, ``rms_rel_error``, ``*_median_abs_error_*``).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Mapping

from sim.data.catalog import catalog_document, get_gpu, get_nic
from sim.net.clusters import cluster_from_catalog
from sim.layers.compute import KernelEfficiency, kernel_efficiency
from sim.net.netefficiency import network_kwargs
from sim.base.fitting import fit_ring_all_reduce, fit_scalar, parse_size
from sim.net.network import Network, SizeCurve

from planner.fitting.fit_kernels import (fit_attention_curves, fit_attention_curves_by_library, fit_deepep_dispatch,
                                         fit_fp8_recipes, fit_gemm_half_dim, fit_gemm_per_architecture,
                                         fit_memory_kernels, fit_ring_attention, fit_sustained_clock)
from planner.fitting.vtrain import load_vtrain

# Source keys of the training-run data the fit reads (planner.fitting.reference.source_of names the same).
TABLE4_SOURCE = "korthikanti2022"
VTRAIN_SOURCE = "vtrain"
FIT_SOURCES = frozenset({TABLE4_SOURCE, VTRAIN_SOURCE})


def microbenchmarks() -> Mapping[str, Any]:
    return catalog_document("reference/published_runs.yaml")["microbenchmarks"]


def _a100_curve(mb: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(e for e in mb["allreduce_busbw"]["entries"]
                if "A100" in e["system"] and "busbw_GBps_by_payload_bytes" in e)


def _node(gpu: str, n: int, nic: str) -> Any:
    return cluster_from_catalog(get_gpu(gpu), n, gpus_per_node=8, nic=get_nic(nic), nics_per_node=8)


def _nvlink_bytes_per_s(gpu: str) -> float:
    rate = get_gpu(gpu).nvlink_bytes_per_s_per_direction
    assert rate, gpu  # the fit's systems are NVSwitch servers
    return rate


def fit_scale_up(mb: Mapping[str, Any]) -> dict:
    """Scale-up (NVLink/NVSwitch) ring efficiency and per-step latency."""
    a100 = _a100_curve(mb)
    sizes = [float(k) for k in a100["busbw_GBps_by_payload_bytes"]]
    bus = [v * 1e9 for v in a100["busbw_GBps_by_payload_bytes"].values()]
    ab = fit_ring_all_reduce(sizes, bus, 8)
    # large-message level: the size curve (fit_size_curves) carries everything below it
    # over the catalog's NVLink rate per direction of the system's GPU
    effs = {"a100-nvlink3": max(bus) / _nvlink_bytes_per_s("a100-80gb")}
    for e in mb["allreduce_busbw"]["entries"]:  # large-message ring (NVLS off), 8 GPUs
        if e.get("busbw_GBps_nvls_off") and "H200" in e["system"]:
            effs["h200-nvlink4"] = e["busbw_GBps_nvls_off"]["8"] * 1e9 / _nvlink_bytes_per_s("h200-141gb")
        if e.get("busbw_GBps_nvls_off") and "B200" in e["system"]:
            effs["b200-nvlink5"] = e["busbw_GBps_nvls_off"]["8"] * 1e9 / _nvlink_bytes_per_s("b200-180gb")
    # NVLink SHARP (NVLS): NCCL's default all-reduce on NVSwitch systems against the ring
    # (NCCL_NVLS_ENABLE=0), per generation and group size (the switch reduces in-network)
    nvls = {}
    for e in mb["allreduce_busbw"]["entries"]:
        on, off = e.get("busbw_GBps_default"), e.get("busbw_GBps_nvls_off")
        gen = "nvlink4" if "H200" in e.get("system", "") else ("nvlink5" if "B200" in e.get("system", "") else None)
        if on and off and gen:
            nvls[gen] = {int(n): round(max(1.0, on[n] / off[n]), 4) for n in on if n in off}
    return {"bandwidth_efficiency": round(statistics.median(effs.values()), 4),
            "step_latency_s": float(f"{ab.step_latency_s:.3g}"),
            "per_generation": {k: round(v, 4) for k, v in effs.items()},
            "nvls_all_reduce_gain": nvls,
            "max_rel_error_a100_curve": round(ab.max_rel_error, 3)}


def fit_scale_out(mb: Mapping[str, Any], scale_up_eff: float) -> dict:
    """Scale-out efficiency: measured multi-node bus bandwidth over what our own network model
    gives at efficiency 1 for the same cluster (largest message, bandwidth-bound)."""
    ratios = {}
    for e in mb["allreduce_busbw"]["entries"]:
        if "busbw_GBps_4nodes_by_payload" in e:
            gpu, curve = "b200-180gb", e["busbw_GBps_4nodes_by_payload"]
        elif "p5en" in e["system"] and "busbw_GBps" in e:
            gpu, curve = "h200-141gb", {e["payload"]: e["busbw_GBps"]}
        else:
            continue
        size_key = max(curve, key=parse_size)
        size = parse_size(size_key)
        cl = _node(gpu, 32, "efa-400")
        t = Network(cl, bandwidth_efficiency={"scale-up": scale_up_eff}).collective_time_s(
            "all_reduce", tuple(range(32)), size, algorithm="ring")
        half = Network(cl, bandwidth_efficiency={"scale-up": scale_up_eff, "scale-out": 0.5})
        if half.collective_time_s("all_reduce", tuple(range(32)), size, algorithm="ring") <= t * 1.01:
            continue  # the scale-up tier binds this ring in our model: it says nothing about scale-out
        ratios[f"{gpu}-efa-4nodes"] = curve[size_key] * 1e9 / (size * 2 * 31 / 32 / t)
    # The smallest ratio is the NIC-bound one: a system whose ring our model limits on the
    # NVLink legs of PXN routing (ratio > 1) says nothing about the NICs.
    return {"bandwidth_efficiency": round(min(1.0, min(ratios.values())), 4),
            "per_system": {k: round(v, 4) for k, v in ratios.items()}}


def collective_overhead(mb: Mapping[str, Any], fitted: Mapping[str, Any]) -> float:
    """Fixed cost of one collective call (NCCL launch and synchronisation): the A100 8-GPU
    all-reduce time at the smallest measured size minus our network model's time for it."""
    a100 = _a100_curve(mb)
    size, bus = min((float(k), v * 1e9) for k, v in a100["busbw_GBps_by_payload_bytes"].items())
    measured = size * 2 * 7 / 8 / bus
    net = Network(_node("a100-80gb", 8, "ib-hdr-200"),
                  bandwidth_efficiency={"scale-up": fitted["scale_up"]["per_generation"]["a100-nvlink3"]})
    model = net.collective_time_s("all_reduce", tuple(range(8)), size, algorithm="ring")
    return float(f"{max(0.0, measured - model):.3g}")


def _size_curve_points(system: Network, ranks: tuple, curve: Mapping, overhead_s: float) -> list[list[float]]:
    """``[[chunk_bytes, fraction], ...]`` that make ``system``'s ring all-reduce (large-message
    efficiency set, no size curve) reproduce a measured bus-bandwidth ``curve``: at each size
    the model's bandwidth term over the measured time less the model's fixed terms."""
    n = len(ranks)
    pts = []
    for key, busbw in curve.items():
        size = parse_size(key)
        measured = size * 2 * (n - 1) / n / (busbw * 1e9)
        fixed = system.collective_time_s("all_reduce", ranks, 1.0, algorithm="ring")
        bw_term = system.collective_time_s("all_reduce", ranks, size, algorithm="ring") - fixed
        left = measured - fixed - overhead_s
        frac = 1.0 if left <= bw_term else bw_term / left
        pts.append([size / n, max(0.005, min(1.0, frac))])
    pts.sort()
    # A bigger message is never faster: chunk / fraction may not drop between points.
    for i in range(1, len(pts)):
        pts[i][1] = min(pts[i][1], pts[i - 1][1] * pts[i][0] / pts[i - 1][0])
    return [[float(f"{c:.6g}"), round(f, 4)] for c, f in pts]


def fit_size_curves(mb: Mapping[str, Any], fitted: Mapping[str, Any]) -> dict:
    """Fraction of the large-message bandwidth reached per chunk size, per tier: scale-up from
    the 8x A100 curve (32 KiB-16 GiB), scale-out from the 4-node x 8 B200 EFA curve.  The chunk
    is what one rank moves per ring step, ``S/n``, so the curve carries to other group sizes."""
    ov = fitted["collective_overhead_s"]
    per_gen = fitted["scale_up"]["per_generation"]
    up = Network(_node("a100-80gb", 8, "ib-hdr-200"), bandwidth_efficiency={"scale-up": per_gen["a100-nvlink3"]})
    out = {"scale-up": _size_curve_points(up, tuple(range(8)), _a100_curve(mb)["busbw_GBps_by_payload_bytes"], ov)}
    b200 = next(e for e in mb["allreduce_busbw"]["entries"] if "busbw_GBps_4nodes_by_payload" in e)
    so = Network(_node("b200-180gb", 32, "efa-400"),
                 bandwidth_efficiency={"scale-up": per_gen["b200-nvlink5"],
                                       "scale-out": fitted["scale_out"]["bandwidth_efficiency"]})
    out["scale-out"] = _size_curve_points(so, tuple(range(32)), b200["busbw_GBps_4nodes_by_payload"], ov)
    return out


_TABLE4_SETTINGS = {"baseline, no recompute": (False, "none"), "sequence parallelism": (True, "none"),
                    "baseline with (full) recompute": (False, "full"), "selective recompute": (False, "selective"),
                    "selective + sequence": (True, "selective")}


class _Table4:
    """Korthikanti et al. Table 4 in our model: one 22B layer on 8 A100 (TP 8) in each of the
    five recompute / SP settings.  The network and plans depend only on the fitted collective
    constants, so they are built once per fit; each evaluation costs one layer
    (``sim.cost.costs.layer_cost``, what ``step_costs`` gives every layer)."""

    def __init__(self, mb: Mapping[str, Any], fitted: Mapping[str, Any]) -> None:
        from sim.cost.plan import Plan
        from sim.data.specs import Model, Strategy

        model = Model(name="gpt-22b", num_layers=48, hidden_size=6144, num_attention_heads=64,
                      ffn_hidden_size=24576, vocab_size=51200, tied_embeddings=True)
        self.net = Network(_node("a100-80gb", 8, "ib-hdr-200"),
                           bandwidth_efficiency={"scale-up": fitted["scale_up"]["per_generation"]["a100-nvlink3"]},
                           size_curves={t: SizeCurve(p) for t, p in fitted.get("size_curves", {}).items()})
        self.rows = mb["layer_level_timings"]["entries"]
        self.plans = {name: Plan(model=model, cluster=self.net.cluster, attention="unfused",
                                 strategy=Strategy(tp=8, mbs=4, gbs=4, seq_len=2048, sp=sp, recompute=rc))
                      for name, (sp, rc) in _TABLE4_SETTINGS.items()}

    def layer_ms(self, eff: KernelEfficiency, setting: str) -> tuple[float, float]:
        """Forward and backward ms of the layer in ``setting``."""
        from sim.cost.costs import layer_cost, plan_layer_ops
        from sim.layers.stages import layer_params

        plan = self.plans[setting]
        s = plan.strategy
        c = layer_cost(plan, self.net, plan_layer_ops(plan, s, eff, moe=False), eff,
                       layer_params(plan.model, s, moe=False).total)
        return ((c.fwd_s + c.exposed_tp_fwd_s) * 1e3, (c.bwd_s + c.recompute_s + c.exposed_tp_bwd_s) * 1e3)

    def rms(self, eff: KernelEfficiency) -> float:
        err = []
        for r in self.rows:
            f, b = self.layer_ms(eff, r["experiment"])
            err += [(f / r["forward_ms"] - 1) ** 2, (b / r["backward_ms"] - 1) ** 2]
        return (sum(err) / len(err)) ** 0.5


def _networks(fitted: Mapping[str, Any], rows) -> list[Network]:
    """One calibrated network per row (built once: collective costs are cached per network)."""
    return [Network(r.plan.cluster, **network_kwargs(r.plan.cluster.gpu.nvlink_generation, fitted))  # type: ignore[arg-type]
            for r in rows]


def _vtrain_median_error(eff: KernelEfficiency, rows, nets: list[Network]) -> float:
    from sim.engines.analytic import analytic_step

    return statistics.median(abs(analytic_step(r.plan, net=n, eff=eff).step_time_s / r.measured_step_time_s - 1)
                             for r, n in zip(rows, nets))


def fit_gemm(mb: Mapping[str, Any], fitted: Mapping[str, Any], base: KernelEfficiency) -> dict:
    """The fallback sustained fraction ``s`` of GEMMs on GPUs without a training-shape benchmark
    (``eff = matmul_efficiency * s * d / (d + d_half)``), with ``d_half`` from the GEMM sweeps
    (``base``, ``planner.fitting.fit_kernels.fit_gemm_half_dim``): the grid value minimising the
    step-time error over the even-numbered multi-node vTrain rows (A100, h/TP 192-6,144); the odd
    rows stay held out.  Korthikanti et al. Table 4's per-layer timings (one GEMM family, h/TP =
    768) are reported against the result (``rms_rel_error``, ``predicted_fwd_bwd_ms``), not fitted:
    layer timings fold every other mechanism of the layer into a GEMM constant."""
    rows = load_vtrain("multi")
    fit_rows, held_out = rows[0::2], rows[1::2]
    fit_nets, held_nets = _networks(fitted, fit_rows), _networks(fitted, held_out)
    t4 = _Table4(mb, fitted)
    grid = [round(0.80 + 0.01 * k, 2) for k in range(21)]
    s, err = fit_scalar(lambda x: _vtrain_median_error(replace(base, gemm_sustained_fraction=x), fit_rows, fit_nets),
                        grid)
    eff = replace(base, gemm_sustained_fraction=s)
    table = {r["experiment"]: [round(v, 2) for v in t4.layer_ms(eff, r["experiment"])] for r in t4.rows}
    return {"gemm_half_dim": eff.gemm_half_dim, "gemm_sustained_fraction": s, "rms_rel_error": round(t4.rms(eff), 4),
            "vtrain_multi_fit_rows": len(fit_rows), "vtrain_multi_median_abs_error_fit": round(err, 4),
            "vtrain_multi_median_abs_error_held_out": round(_vtrain_median_error(eff, held_out, held_nets), 4),
            "predicted_fwd_bwd_ms": table}


def fit_host_op_floor(fitted: Mapping[str, Any], base: KernelEfficiency, every: int = 4) -> dict:
    """Host-side floor per op from the vTrain single-node rows (small models, where dispatch
    binds): the grid value minimising the median relative step-time error."""
    rows = load_vtrain("single")[::every]
    nets = _networks(fitted, rows)
    best, err = fit_scalar(lambda us: _vtrain_median_error(replace(base, host_op_floor_s=us * 1e-6), rows, nets),
                           [float(x) for x in range(30, 95, 5)])
    return {"host_op_floor_s": round(best * 1e-6, 9), "median_abs_error_single_node": round(err, 4), "rows_used": len(rows)}


def fit_all(exclude: frozenset[str] | set[str] = frozenset()) -> dict:
    """Every fitted constant (module docstring), without the data of the sources in ``exclude``."""
    if VTRAIN_SOURCE in exclude:
        raise ValueError("the vTrain rows are the only data for the GEMM growth and the host floor")
    mb = microbenchmarks()
    out: dict = {"scale_up": fit_scale_up(mb)}
    out["scale_out"] = fit_scale_out(mb, out["scale_up"]["bandwidth_efficiency"])
    out["collective_overhead_s"] = collective_overhead(mb, out)
    out["size_curves"] = fit_size_curves(mb, out)
    out["fp8_recipes"] = fit_fp8_recipes()
    out["memory_kernels"] = fit_memory_kernels()
    out["attention_curves"] = fit_attention_curves()
    out["attention_curves_by_library"] = fit_attention_curves_by_library()
    out["deepep_dispatch"] = fit_deepep_dispatch()
    out["ring_attention"] = fit_ring_attention()
    out["sustained_clock"] = fit_sustained_clock()
    reference = kernel_efficiency(None).gemm_reference_flops_per_sm
    shape = fit_gemm_half_dim(reference)
    per_arch = fit_gemm_per_architecture(shape["gemm_half_dim"], reference)
    # The sustained fraction and the host floor interact (a floored op hides its GEMM), so they
    # are fitted alternately from the catalog defaults until both stop moving.
    start = {k: out[k] for k in ("collective_overhead_s", "fp8_recipes", "memory_kernels", "attention_curves",
                                 "sustained_clock")}
    start["gemm"] = {"gemm_half_dim": shape["gemm_half_dim"], "per_architecture": per_arch}
    base = kernel_efficiency(start)
    floor = 0.0
    for _ in range(4):
        out["gemm"] = fit_gemm(mb, out, replace(base, host_op_floor_s=floor))
        out["gemm"]["shape_by_gpu"] = shape["by_gpu"]
        out["gemm"]["per_architecture"] = per_arch
        out["host"] = fit_host_op_floor(out, replace(base, gemm_sustained_fraction=out["gemm"]["gemm_sustained_fraction"]))
        if out["host"]["host_op_floor_s"] == floor:
            break
        floor = out["host"]["host_op_floor_s"]
    if exclude:
        out["excluded_sources"] = sorted(exclude)
    return out
