"""Fit a calibration profile (``sim.calibration``) from microbenchmark records.

Each parameter is fitted in the functional form the simulator evaluates, so that the
simulator reproduces the microbenchmarks it was fitted on:

* per-kernel overhead ``o``: the time of a one-element add (``sim.compute`` adds ``o`` per
  forward kernel and ``2 o`` per backward);
* GEMM: ``t = o + F / (P * d / (d + h))`` with ``d = min(m, n, k)`` (``sim.compute``'s shape
  factor); ``(t - o) / F = 1/P + (h/P) / d`` is linear in ``1/d``, solved by least squares on
  relative errors; ``P`` is the achievable FLOP/s, ``h`` the ``gemm_half_dim``;
* attention: the ratio of its achieved FLOP/s (simulator FLOP count) to ``P``, forward and
  backward separately (geometric mean over shapes);
* memory-bound kernels (copy, add, GELU, LayerNorm: what a transformer layer runs besides
  GEMMs and attention): ``t = o + bytes / W`` for read+write bytes, least squares on
  log errors (a geometric mean of the kernels' bandwidths) over tensors of at least 1 MiB;
* collectives, per link tier: latency ``alpha`` (per algorithm step), bandwidth ``B`` and a
  per-call overhead ``c`` (``collective_overhead_s``, which ``sim.costs`` adds to every
  collective) minimising the squared log error of ``Network.collective_time_s + c``
  (ring/tree/pairwise closed forms of ``sim.collectives`` on the real rank placement) against
  every measured op, size and group layout: a log-spaced grid search over ``(alpha, B)``
  refined around the best point, ``c`` by a 1-D search inside (no SciPy needed).

No torch here: this runs anywhere the simulator runs.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

MIN_POINTS = 2


class FitError(ValueError):
    """Not enough (or inconsistent) data to fit a parameter."""


@dataclass(frozen=True, slots=True)
class LineFit:
    """``y = a + b x`` by weighted least squares; ``rms_rel`` the RMS relative residual."""

    a: float
    b: float
    rms_rel: float
    n: int


def weighted_line(x: Sequence[float], y: Sequence[float], *, nonneg_slope: bool = True) -> LineFit:
    """Fit ``y = a + b x`` minimising relative residuals ``(a + b x - y) / y``.

    With ``nonneg_slope`` a negative slope is clamped to 0 and ``a`` refitted (the weighted
    mean), which is the constrained optimum for a two-parameter line.
    """
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(xa) < 1 or len(xa) != len(ya) or np.any(ya <= 0):
        raise FitError("weighted_line needs matching, positive y values")
    w = 1.0 / ya
    if len(xa) >= 2 and np.ptp(xa) > 0:
        A = np.stack([np.ones_like(xa), xa], axis=1) * w[:, None]
        (a, b), *_ = np.linalg.lstsq(A, ya * w, rcond=None)
    else:
        a, b = float(np.sum(w * w * ya) / np.sum(w * w)), 0.0
    if nonneg_slope and b < 0:
        a, b = float(np.sum(w * w * ya) / np.sum(w * w)), 0.0
    res = (a + b * xa - ya) / ya
    return LineFit(float(a), float(b), float(np.sqrt(np.mean(res**2))), len(xa))


def fit_overhead(records: Iterable[dict]) -> float:
    """Seconds per kernel: the time of a one-element add (dispatch + launch, no work)."""
    for r in records:
        if r.get("kind") == "overhead" and r.get("op") == "tiny_add":
            return float(r["time_s"])
    return 0.0


@dataclass(frozen=True, slots=True)
class MatmulFit:
    flops_per_s: float  # P: large-GEMM asymptote
    gemm_half_dim: float  # h
    rms_rel: float
    n: int
    best_flops_per_s: float  # best single measurement


def fit_matmul(records: Iterable[dict], dtype: str, overhead_s: float = 0.0) -> MatmulFit:
    pts = [r for r in records if r.get("kind") == "matmul" and r.get("dtype") == dtype]
    if len(pts) < MIN_POINTS:
        raise FitError(f"need >= {MIN_POINTS} {dtype} matmul measurements, got {len(pts)}")
    # GEMMs that are mostly launch overhead say nothing about the throughput
    busy = [r for r in pts if r["time_s"] > 2 * overhead_s]
    pts = busy if len(busy) >= MIN_POINTS else pts
    d = np.array([min(r["m"], r["n"], r["k"]) for r in pts], dtype=float)
    flops = np.array([r["flops"] for r in pts], dtype=float)
    t = np.array([r["time_s"] for r in pts], dtype=float)
    y = np.maximum(t - overhead_s, 0.5 * t) / flops  # seconds per FLOP
    line = weighted_line(1.0 / d, y)
    if line.a <= 0:  # the shape effect explains everything: no finite asymptote, use the best
        P = float(np.max(flops / t))
        h = 0.0
    else:
        P = 1.0 / line.a
        h = line.b * P
    pred = overhead_s + flops / (P * d / (d + h))
    rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return MatmulFit(P, h, rms, len(pts), float(np.max(flops / t)))


def matmul_rate(flops_per_s: float, half_dim: float, m: int, n: int, k: int) -> float:
    d = min(m, n, k)
    return flops_per_s * d / (d + half_dim)


@dataclass(frozen=True, slots=True)
class AttentionFit:
    fwd_vs_matmul: float
    bwd_vs_matmul: float
    rms_rel: float
    n: int


BWD_FLOP_FACTOR = 2.5  # sim.ops.Op.backward_flop_factor for attention


def fit_attention(records: Iterable[dict], matmul_flops_per_s: float, overhead_s: float = 0.0) -> AttentionFit:
    pts = [r for r in records if r.get("kind") == "attention"]
    if not pts:
        raise FitError("no attention measurements")
    f = np.array([r["flops"] for r in pts], dtype=float)
    tf = np.array([r["fwd_time_s"] for r in pts], dtype=float)
    tb = np.array([r["bwd_time_s"] for r in pts], dtype=float)
    rf = f / np.maximum(tf - overhead_s, 0.5 * tf) / matmul_flops_per_s
    rb = BWD_FLOP_FACTOR * f / np.maximum(tb - 2 * overhead_s, 0.5 * tb) / matmul_flops_per_s
    af = float(np.clip(np.exp(np.mean(np.log(rf))), 1e-3, 1.5))
    ab = float(np.clip(np.exp(np.mean(np.log(rb))), 1e-3, 1.5))
    pf = overhead_s + f / (matmul_flops_per_s * af)
    pb = 2 * overhead_s + BWD_FLOP_FACTOR * f / (matmul_flops_per_s * ab)
    res = np.concatenate([(pf - tf) / tf, (pb - tb) / tb])
    return AttentionFit(af, ab, float(np.sqrt(np.mean(res**2))), len(pts))


@dataclass(frozen=True, slots=True)
class BandwidthFit:
    bytes_per_s: float
    rms_rel: float
    n: int


MEMORY_MIN_BYTES = 1 << 20
"""Memory-bound kernels on tensors below 1 MiB are launch-bound (and cache-resident on CPUs);
the bandwidth is fitted on the larger ones, where training activations live."""


def fit_memory(records: Iterable[dict], overhead_s: float = 0.0) -> BandwidthFit:
    allpts = [r for r in records if r.get("kind") == "memory"]
    pts = [r for r in allpts if r["bytes"] / 2 >= MEMORY_MIN_BYTES] or allpts
    if not pts:
        raise FitError("no memory-bandwidth measurements")
    b = np.array([r["bytes"] for r in pts], dtype=float)
    t = np.array([r["time_s"] for r in pts], dtype=float)
    # least squares on log errors: W is the geometric mean of the per-kernel bandwidths
    w = float(np.exp(np.mean(np.log(b / np.maximum(t - overhead_s, 0.5 * t)))))
    pred = overhead_s + b / w
    return BandwidthFit(w, float(np.sqrt(np.mean(((pred - t) / t) ** 2))), len(pts))


# ---------------------------------------------------------------------- collectives


@dataclass(frozen=True, slots=True)
class LinkFit:
    bytes_per_s: float
    latency_s: float  # per algorithm step (alpha)
    rms_log: float  # RMS of log(predicted / measured)
    n: int
    call_overhead_s: float = 0.0  # per collective call (``collective_overhead_s``)
    measured_over_predicted: dict[str, float] | None = None  # per op, geometric mean


SIM_OP = {"send_recv": "p2p"}


def _probe_cluster(world: int, ranks_per_node: int, *, intra: tuple[float, float], inter: tuple[float, float] | None):
    """A cluster whose scale-up (and NIC) links have the trial parameters."""
    from sim.specs import Cluster, Gpu, Link

    su = Link(id="probe-su", name="probe", kind="scale-up", bytes_per_s_per_direction=intra[0], latency_s=intra[1])
    nic_bw, nic_lat = inter if inter is not None else (intra[0], intra[1])
    nic = Link(id="probe-nic", name="probe", kind="nic", bytes_per_s_per_direction=nic_bw, latency_s=nic_lat)
    gpu = Gpu(id="probe", name="probe", dense_flops_per_s={"bf16": 1e12}, hbm_bytes=1e10, hbm_bytes_per_s=1e10,
              nvlink_bytes_per_s_per_direction=intra[0], nvlink_domain_size=ranks_per_node,
              nvlink_generation="probe-su", pcie_generation=4, tdp_w=1.0, gpus_per_node=ranks_per_node,
              nics_per_node=1, default_nic="probe-nic", matmul_efficiency={"bf16": 1.0}, hbm_efficiency=1.0)
    return Cluster(gpu=gpu, num_gpus=world, nic=nic, gpus_per_node=ranks_per_node, nvlink_domain=ranks_per_node,
                   nics_per_node=1, scale_up=su, topology="fat-tree")


def collective_groups(rec: dict) -> list[list[int]]:
    """All groups of a measured layout (they ran at the same time)."""
    if rec.get("groups"):
        return [[int(x) for x in g] for g in rec["groups"]]
    first = [int(x) for x in rec["ranks"]]
    n, g = int(rec["group_size"]), int(rec["num_groups"])
    layout = rec.get("layout")
    if g == 1:
        return [first]
    if layout in ("tp", "node"):
        return [[i * n + j for j in range(n)] for i in range(g)]
    if layout == "pp":
        return [[2 * i, 2 * i + 1] for i in range(g)]
    stride = first[1] - first[0] if len(first) > 1 else 1
    return [[first[0] + i + j * stride for j in range(n)] for i in range(g)]


def predict_collective(net, rec: dict) -> float:
    """What ``net`` (a ``sim.network.Network``) predicts for one measured collective."""
    op = SIM_OP.get(rec["op"], rec["op"])
    groups = collective_groups(rec)
    concurrent = [tuple(g) for g in groups] if len(groups) > 1 else None
    ranks = (groups[0][0], groups[0][1]) if op == "p2p" else groups[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return net.collective_time_s(op, ranks, rec["message_bytes"], concurrent_groups=concurrent)


def _best_overhead(pred: np.ndarray, meas: np.ndarray, fixed: float | None) -> tuple[float, float]:
    """(RMS log error, per-call overhead c >= 0) minimising it for ``pred + c`` vs ``meas``."""
    lm = np.log(meas)

    def err(c: float) -> float:
        return float(np.sqrt(np.mean((np.log(np.maximum(pred + c, 1e-12)) - lm) ** 2)))

    if fixed is not None:
        return err(fixed), fixed
    cands = [0.0] + list(np.logspace(-7, -1.5, 45))
    errs = [err(c) for c in cands]
    i = int(np.argmin(errs))
    lo, hi = (cands[i - 1] if i > 0 else 0.0), (cands[i + 1] if i + 1 < len(cands) else cands[i] * 2)
    for _ in range(30):  # golden-section refinement inside the bracket
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        if err(a) < err(b):
            hi = b
        else:
            lo = a
    c = 0.5 * (lo + hi)
    return (err(c), c) if err(c) < errs[i] else (errs[i], cands[i])


def _rms_log(params: tuple[float, float], pts: list[dict], world: int, rpn: int, tier: str,
             fixed: tuple[float, float] | None, overhead: float | None) -> tuple[float, float]:
    from sim.network import Network

    bw, lat = math.exp(params[0]), math.exp(params[1])
    if tier == "intra":
        cluster = _probe_cluster(world, rpn, intra=(bw, lat), inter=fixed)
    else:
        assert fixed is not None
        cluster = _probe_cluster(world, rpn, intra=fixed, inter=(bw, lat))
    net = Network(cluster)
    pred = np.array([predict_collective(net, r) for r in pts])
    return _best_overhead(pred, np.array([r["time_s"] for r in pts]), overhead)


def fit_link(records: Iterable[dict], *, tier: str, world: int, ranks_per_node: int,
             fixed: tuple[float, float] | None = None, overhead_s: float | None = None) -> LinkFit:
    """Alpha-beta parameters of one tier, and the per-call overhead, through the simulator's
    collective model: ``t = Network.collective_time_s(alpha, B) + c``.

    ``fixed`` are the (bandwidth, latency) of the other tier when fitting ``inter``;
    ``overhead_s`` fixes ``c`` (fitted on the intra tier, shared by all collectives).
    """
    pts = [r for r in records if r.get("kind") == "collective" and r.get("tier") == tier and r["time_s"] > 0]
    if len(pts) < MIN_POINTS:
        raise FitError(f"need >= {MIN_POINTS} {tier}-node collective measurements, got {len(pts)}")
    # Initial guesses from the raw data: small messages give the latency, large the bandwidth.
    small = min(pts, key=lambda r: r["message_bytes"])
    large = max(pts, key=lambda r: r["message_bytes"])
    lat0 = max(small["time_s"] / 4, 1e-7)
    bw0 = max(large["message_bytes"] / large["time_s"], 1e5)
    best = (math.log(bw0), math.log(lat0))
    best_err, best_c = _rms_log(best, pts, world, ranks_per_node, tier, fixed, overhead_s)
    span = (math.log(100.0), math.log(100.0))
    for _ in range(6):  # coarse-to-fine grid, 9 x 9 per round
        cx, cy = best
        for gx in np.linspace(cx - span[0], cx + span[0], 9):
            for gy in np.linspace(cy - span[1], cy + span[1], 9):
                e, c = _rms_log((gx, gy), pts, world, ranks_per_node, tier, fixed, overhead_s)
                if e < best_err:
                    best, best_err, best_c = (float(gx), float(gy)), e, c
        span = (span[0] / 3.0, span[1] / 3.0)
    bw, lat = math.exp(best[0]), math.exp(best[1])
    from sim.network import Network

    net = Network(_probe_cluster(world, ranks_per_node, intra=(bw, lat) if tier == "intra" else fixed,
                                 inter=(bw, lat) if tier != "intra" else fixed))
    by_op: dict[str, list[float]] = {}
    for r in pts:
        p = predict_collective(net, r) + best_c
        by_op.setdefault(r["op"], []).append(math.log(r["time_s"] / max(p, 1e-12)))
    ratios = {op: math.exp(sum(v) / len(v)) for op, v in sorted(by_op.items())}
    return LinkFit(bw, lat, best_err, len(pts), best_c, ratios)


# ---------------------------------------------------------------------- profile


def _slug(text: str) -> str:
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:60] or "device"


def default_profile_id(env: dict) -> str:
    dev = str(env.get("device_name", env.get("device_type", "device")))
    dev = dev.replace("NVIDIA", "").replace("AMD", "amd").replace("(R)", "").replace("(TM)", "")
    if env.get("device_type") == "cpu":
        words = [w for w in _slug(dev).split("-") if w and w not in ("processor", "cpu")][:3]
        return f"cpu-{'-'.join(words)}-{env.get('host_cores', 1)}c-{env.get('backend', 'gloo')}"
    return f"{_slug(dev)}-x{env.get('local_world_size', 1)}-{env.get('backend', 'nccl')}"


def guess_base_gpu(env: dict) -> str | None:
    """The catalog GPU whose name matches the measured device (``NVIDIA H200`` ->
    ``h200-141gb``), choosing by memory size among variants; None when unsure."""
    if env.get("device_type") != "cuda":
        return None
    from sim.catalog import catalog_records

    words = [w for w in _slug(str(env.get("device_name", ""))).split("-") if any(c.isdigit() for c in w)]
    mem = float(env.get("device_memory_bytes", 0)) / 2**30
    cands = [r for r in catalog_records("gpus")
             if words and all(w in _slug(str(r.get("name", ""))) for w in words[:1])]
    if not cands:
        return None
    return min(cands, key=lambda r: abs(float(r.get("hbm_gib", 0)) - mem))["id"]


def fit_profile(records: list[dict], env: dict, *, profile_id: str | None = None,
                compute_dtype: str | None = None, base_gpu: str | None = None) -> dict[str, Any]:
    """The calibration profile (a plain dict in the ``sim.calibration`` schema).

    ``base_gpu``: a catalog GPU whose data-sheet fields (peaks, memory size, NVLink) are kept,
    the measurements becoming efficiencies (GPU hosts); without it the device's peaks are the
    measured ones (CPU hosts).
    """
    device_type = str(env.get("device_type", "cpu"))
    dtype = compute_dtype or ("fp32" if device_type == "cpu" else "bf16")
    pid = profile_id or default_profile_id(env)
    world = int(env.get("world_size", 1))
    rpn = int(env.get("local_world_size", world))
    over = fit_overhead(records)
    mm = fit_matmul(records, dtype, over)
    att = fit_attention(records, mm.flops_per_s, over)
    mem = fit_memory(records, over)
    intra = inter = None
    try:
        intra = fit_link(records, tier="intra", world=world, ranks_per_node=rpn)
    except FitError:
        intra = None
    if intra is not None:
        try:
            inter = fit_link(records, tier="inter", world=world, ranks_per_node=rpn,
                             fixed=(intra.bytes_per_s, intra.latency_s), overhead_s=intra.call_overhead_s)
        except FitError:
            inter = None
    other_dtypes: dict[str, float] = {}
    for r in records:
        if r.get("kind") == "matmul":
            rate = r["flops"] / r["time_s"]
            other_dtypes[r["dtype"]] = max(other_dtypes.get(r["dtype"], 0.0), rate)

    today = str(env.get("date", datetime.date.today().isoformat()))[:10]
    prov = (f"measured by `planner validate` on {env.get('hostname', '?')} ({env.get('device_name', '?')}), "
            f"torch {env.get('torch', '?')}, {env.get('backend', '?')}, {rpn} rank(s) per host x "
            f"{env.get('threads_per_rank', '?')} thread(s), {today}")
    link_id = f"{pid}-{'loopback' if device_type == 'cpu' else 'scale-up'}"
    links: list[dict[str, Any]] = []
    su_bw = intra.bytes_per_s if intra else 1e9
    su_lat = intra.latency_s if intra else 1e-5
    links.append({
        "id": link_id, "name": f"{env.get('backend', '?')} inside one host ({pid})", "kind": "scale-up",
        "technology": "loopback TCP (gloo)" if device_type == "cpu" else "nvlink/pcie (nccl)",
        "gb_per_s_per_direction": su_bw / 1e9, "latency_us": su_lat * 1e6, "source": prov,
        "notes": ("alpha-beta fit through sim.network over all_reduce/all_gather/reduce_scatter/all_to_all/"
                  "send-recv on TP/DP/PP-like groups" if intra else "not measured (single rank): placeholder"),
    })
    default_nic = "eth-10"
    if inter is not None:
        nic_id = f"{pid}-nic"
        links.append({"id": nic_id, "name": f"{env.get('backend', '?')} between hosts ({pid})", "kind": "nic",
                      "technology": "measured", "gb_per_s_per_direction": inter.bytes_per_s / 1e9,
                      "latency_us": inter.latency_s * 1e6, "source": prov,
                      "notes": "alpha-beta fit through sim.network on cross-node groups"})
        default_nic = nic_id

    base_gpu = base_gpu or guess_base_gpu(env)
    if base_gpu:
        from sim.catalog import catalog_records

        base = next((dict(r) for r in catalog_records("gpus") if r["id"] == base_gpu or base_gpu in (r.get("aliases") or [])), None)
        if base is None:
            raise FitError(f"base_gpu {base_gpu!r} is not in catalogs/gpus.yaml")
        peak = float(base["dense_tflops"].get(dtype, base["dense_tflops"]["bf16"])) * 1e12
        device = {k: v for k, v in base.items() if k not in ("price_source",)}
        device.update({"id": pid, "name": f"{base['name']} (calibrated)", "aliases": [],
                       "matmul_efficiency": {**base.get("matmul_efficiency", {}), "bf16": min(1.0, mm.flops_per_s / peak)},
                       "hbm_efficiency": min(1.0, mem.bytes_per_s / (float(base["hbm_tb_per_s"]) * 1e12)),
                       "nvlink_gb_per_s_per_direction": su_bw / 1e9, "nvlink_generation": link_id,
                       "default_nic": default_nic, "source": prov,
                       "notes": f"catalog record {base_gpu} with measured efficiencies"})
    else:
        host_mem = float(env.get("host_memory_bytes", env.get("device_memory_bytes", 16 * 2**30)))
        device = {
            "id": pid, "name": f"{env.get('device_name', 'cpu')} ({rpn} ranks x {env.get('threads_per_rank', 1)} thread)",
            "vendor": "cpu" if device_type == "cpu" else "nvidia",
            "architecture": device_type,
            # The cost model's training precision is bf16; on this device it runs as `dtype`.
            "dense_tflops": {"bf16": mm.flops_per_s / 1e12,
                             **{d: v / 1e12 for d, v in other_dtypes.items() if d in ("fp32", "fp16", "tf32")}},
            "matmul_efficiency": {"bf16": 1.0},
            "hbm_gib": host_mem / rpn / 2**30 if device_type == "cpu" else host_mem / 2**30,
            "hbm_tb_per_s": mem.bytes_per_s / 1e12, "hbm_efficiency": 1.0,
            "nvlink_gb_per_s_per_direction": su_bw / 1e9, "nvlink_generation": link_id,
            "nvlink_domain_size": rpn, "pcie_generation": 4, "tdp_w": 10.0 * max(1, int(env.get("threads_per_rank", 1))),
            "gpus_per_node": rpn, "nics_per_node": 1, "default_nic": default_nic,
            "price_usd": None, "price_usd_per_hour": None, "source": prov,
            "notes": (f"one rank of a {env.get('host_cores', '?')}-core host running {rpn} ranks: 'peaks' are the "
                      f"fitted large-GEMM asymptote in {dtype} (bf16 key = the training dtype) and the fitted "
                      "memory-bound kernel bandwidth; hbm_gib is host memory per rank; tdp_w a placeholder"),
        }
    profile: dict[str, Any] = {
        "schema_version": 1,
        "id": pid,
        "name": f"{env.get('device_name', '?')} via {env.get('backend', '?')} ({rpn} ranks per host)",
        "source": prov,
        "notes": "fitted from microbenchmarks only (validate/fit.py); workloads are never used to fit",
        "host": {"device_type": device_type, "compute_dtype": dtype, "ranks_per_host": rpn,
                 "host_cores": int(env.get("host_cores", 1)), "threads_per_rank": int(env.get("threads_per_rank", 1)),
                 "num_nodes": int(env.get("num_nodes", 1)), "backend": env.get("backend"),
                 "device_name": env.get("device_name"), "torch": env.get("torch")},
        "device": device,
        "links": links,
        "efficiency": {"attention_fwd_vs_matmul": att.fwd_vs_matmul, "attention_bwd_vs_matmul": att.bwd_vs_matmul,
                       "kernel_overhead_s": over, "gemm_half_dim": mm.gemm_half_dim,
                       "collective_overhead_s": intra.call_overhead_s if intra else 0.0,
                       # ops run on the host itself: its dispatch cost is kernel_overhead_s, no floor
                       **({"host_op_floor_s": 0.0} if device_type == "cpu" else {}),
                       "source": "validate.fit: attention, GEMM shape factor, per-kernel and per-collective "
                                 "overheads"},
        "memory": {"workspace_bytes": 0.0 if device_type == "cpu" else 1.0e9, "fragmentation_fraction": 0.05},
        "fit": {
            "matmul": {"dtype": dtype, "flops_per_s": mm.flops_per_s, "gemm_half_dim": mm.gemm_half_dim,
                       "rms_rel_error": mm.rms_rel, "points": mm.n},
            "attention": {"fwd_vs_matmul": att.fwd_vs_matmul, "bwd_vs_matmul": att.bwd_vs_matmul,
                          "rms_rel_error": att.rms_rel, "points": att.n},
            "memory": {"bytes_per_s": mem.bytes_per_s, "rms_rel_error": mem.rms_rel, "points": mem.n},
            "kernel_overhead_s": over,
            "links": {name: None if f is None else {"bytes_per_s": f.bytes_per_s, "latency_s": f.latency_s,
                                                     "call_overhead_s": f.call_overhead_s,
                                                     "rms_log_error": f.rms_log, "points": f.n,
                                                     "measured_over_predicted_by_op": f.measured_over_predicted}
                      for name, f in (("intra", intra), ("inter", inter))},
        },
        "measured": {"best_matmul_flops_per_s": other_dtypes, "env": {k: v for k, v in env.items() if k != "date"},
                     "date": env.get("date")},
    }
    return profile
