"""Kernel efficiencies fitted from the microbenchmarks in ``catalogs/microbenchmarks/``.

Three fits, each from kernel-level data only (no training run), stored by
``scripts/fit_efficiency.py`` in the ``fitted`` block of ``catalogs/efficiency.yaml``:

* **Sustained GEMM fraction per architecture and precision** (``fit_gemm_per_architecture``):
  Transformer Engine's per-layer GEMM profile (``benchmarks/gemm/benchmark_gemm.py``: the 12
  GEMMs of one transformer layer, fprop/dgrad/wgrad, at training shapes) on B300 and H200 NVL,
  as a fraction of the data-sheet peak, over the GPU's best-case fraction (mamf-finder's
  brute-force shape search, ``gpus.yaml`` ``matmul_efficiency``).  That ratio is what a
  training run's fixed shapes keep of the best case; applied to every GPU of the architecture.
  Known error: one shape family (M = 15,872 tokens, K = 4,096 or 16,384); the H200 NVL runs at
  600 W and lower clocks than an SXM part (its own data-sheet peak is used).
* **GEMM shape factor** (``fit_gemm_half_dim``): ``d / (d + d_half)`` with ``d`` the narrowest
  of M, N, K, fitted on XLA's H100 (sm_90) and B200 bf16 matmul tables over the GEMMs whose two
  other sides are the sweep's largest (4096) and whose narrow side is >= 512: H100 162, B200 333,
  i.e. 62.4 and 63.3 in A100 units once scaled by dense FLOP/s per SM (the model's scaling,
  ``sim.layers.compute.scaled_half_dim``, checked by the 2x per-SM step between the two; B200's
  fp8 column gives 688, 2.07x its bf16, as the fp8 peak predicts).  The per-architecture
  fractions above take this factor out of each profiled GEMM.  Known error: a narrow K costs
  more than a narrow M or N (short main loop: 0.69 vs 0.83 of the 4096 cube at 512 on H100),
  one curve for both (5-6% rms in log time); below 512 the fall is steeper (wave quantisation).
* **fp8 recipe costs** (``fit_fp8_recipes``): the same profile with quantization inside the
  timed loop (autocast, what training does) and without (pre-quantized inputs): the
  difference is the quantization (amax, scale, cast and transpose of x, W and dy); over the
  elements it touches, ``sum(M*K + K*N + M*N)``, at the GPU's achievable HBM rate it is an
  effective number of bytes per element.  The GEMM-only rate of a recipe relative to the
  per-tensor-scaled kernel comes from the pre-quantized times.  Assumptions, stated where
  they apply: delayed scaling's GEMM is the per-tensor kernel (TE only times it in autocast);
  Hopper block scaling quantizes at current scaling's cost (TE cannot pre-quantize it).
* **Memory-bound kernels' achieved bandwidth** (``fit_memory_kernels``): Liger-Kernel's
  benchmarks of normalisation, rotary, SwiGLU and cross-entropy kernels, fused and eager, on
  A100 and H100 (``microbenchmarks/elementwise.yaml``): the bytes each kernel must move (counted
  from its code) over its time, as a fraction of the GPU's STREAM-like rate
  (``hbm_bytes_per_s * hbm_efficiency``); the median per class and pass.  ``eager``: eager aten
  kernels (Hugging Face RMSNorm, torch SwiGLU, torch and Megatron unfused cross-entropy):
  0.80 forward, 0.62 backward.  ``fused_loss``: Megatron-Core's fused cross-entropy (its native
  jit-fused implementation) over the bytes the simulator's fused loss op counts: 0.31 forward
  (it runs ~3x the time of a one-pass kernel), 0.84 backward.  Known error: the eager class
  spans kernels of 0.53-0.99 of STREAM.  Not used: the fused classes' own fractions (norm
  kernels 0.64 forward, 0.23 backward with the weight-gradient reduction; pointwise 0.86 / 0.62;
  ``torch.compile`` 0.50 / 0.21), which would price Korthikanti et al.'s Table 4 layer (2022
  Megatron's apex and nvFuser kernels on A100) 20% slower in backward than it ran.
* **Attention efficiency vs sequence length** (``fit_attention_curves``): per architecture and
  kernel family (``flash``: cuDNN fused attention / the vendor's best kernel, ``flash2``:
  FlashAttention-2), causal, head dim 128, bf16, forward and backward fractions of the dense
  bf16 peak from the FlashAttention-3 paper's figures, NVIDIA cudnn-frontend's benchmark CSVs
  and HipKittens' AITER runs, fitted as ``f_max * s / (s + s_half)`` (``sim.base.fitting``): a
  fixed cost per query block (load Q, write O and the softmax statistics) against work that
  grows with the key length.  Points below ``MIN_ATTENTION_SEQ`` are left out: at batch 1 they
  are launch-bound microseconds (B200 cuDNN at 512 tokens: 3% of peak), not what a training
  step's kernels see.  Known error: head dims other than 128 (64: ~10-25% slower) and
  sequence lengths beyond 64k (cuDNN drops 5-10% from its peak there) are not modelled.
  The default curves take every measurement (the current libraries); an older library a
  framework profile ships (``ATTENTION_LIBRARY_DATA``: cuDNN <= 9.13 on Blackwell, 14-27% slower
  at 8k tokens than 9.17 on the same GB300) is fitted on its own measurements
  (``fit_attention_curves_by_library``, ``Plan.attention_library``).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping

from sim.data.catalog import catalog_document, get_gpu, get_nic
from sim.base.fitting import fit_saturating, fit_scalar
from sim.layers.compute import scaled_half_dim, shape_factor


def _entries(name: str) -> dict[str, Mapping[str, Any]]:
    doc = catalog_document(f"microbenchmarks/{name}.yaml")
    out = {e["id"]: e for e in doc["entries"]}
    for e in doc.get("quantization_overheads") or ():
        out[e["id"]] = e
    return out


# Which benchmark speaks for which architecture, and the catalog GPU whose best-case (mamf)
# fraction it is compared with.
TRAINING_SHAPE_GEMMS = {"hopper": ("te-gemm-profiling-h200nvl", "h200-141gb"),
                        "blackwell": ("te-gemm-profiling-b300", "b300-288gb")}


def _layer_elements(entry: Mapping[str, Any]) -> float:
    return float(sum(m * k + k * n + m * n for m, k, n in entry["layer_gemm_shapes_mkn"]))


def _device(entry: Mapping[str, Any], gpu_id: str) -> tuple[dict[str, float], float]:
    """(dense peak FLOP/s per precision, achievable HBM bytes/s) of the benchmarked device: its
    own data-sheet values when it is not a catalog GPU (H200 NVL), else the catalog's."""
    gpu = get_gpu(gpu_id)
    if "device_peak_dense_tflops" in entry:
        peaks = {k: float(v) * 1e12 for k, v in entry["device_peak_dense_tflops"].items()}
        hbm = float(entry["device_hbm_tb_per_s"]) * 1e12 * gpu.hbm_efficiency
    else:
        peaks = {p: gpu.peak_flops_per_s(p) for p in ("bf16", "fp8")}
        hbm = gpu.hbm_bytes_per_s * gpu.hbm_efficiency
    return peaks, hbm


def _layer_ms(entry: Mapping[str, Any], mode: str, key: str) -> float | None:
    row = (entry.get(f"per_layer_12_gemms_{mode}") or {}).get(key)
    return None if row is None else float(row["ms"])


# GEMM sweeps that time one narrow dimension against two large ones (a training GEMM: tokens x
# hidden with one narrow side), the catalog GPU each speaks for and its throughput key.
SHAPE_GEMMS = {"xla-matmul-perf-table-sm90-bf16": ("h100-80gb", "tflops"),
               "xla-matmul-perf-table-b200": ("b200-180gb", "bf16_tflops")}
# Narrow dimensions below this are left out of the shape fit: a training GEMM's narrowest side
# (h/TP, the FFN shard, tokens per expert) is rarely below it, and there the tile under-fill the
# curve describes gives way to a wave-quantised cliff (256 wide: half the 4096 rate on H100).
MIN_SHAPE_DIM = 512


def fit_gemm_half_dim(reference_flops_per_sm: float) -> dict[str, Any]:
    """The GEMM shape factor's half dimension (``sim.layers.compute.matmul_efficiency``:
    ``d / (d + d_half)``, ``d`` the smallest of M, N, K) from GEMM microbenchmarks, not layer
    timings: on each sweep of ``SHAPE_GEMMS``, the GEMMs whose two other dimensions are the
    sweep's largest (4096) and whose narrow one is at least ``MIN_SHAPE_DIM``, as a fraction of
    the largest cube, fitted in log error.  Each GPU's half dimension is stated in the reference
    GPU's units (``gemm_reference_flops_per_sm``, A100: the model scales it by dense bf16 FLOP/s
    per SM, ``sim.layers.compute.scaled_half_dim``); the fitted value is their mean, and the two
    GPUs' agreement is the check of that scaling (H100 and B200 differ 2x in FLOP/s per SM)."""
    mb = _entries("gemm")
    by_gpu: dict[str, dict[str, float]] = {}
    for entry_id, (gpu_id, key) in SHAPE_GEMMS.items():
        pts = {(int(p["m"]), int(p["n"]), int(p["k"])): float(p[key]) for p in mb[entry_id]["points"]}
        big = max(max(shape) for shape in pts)
        ref = pts[(big, big, big)]
        narrow = [(min(shape), t / ref) for shape, t in pts.items()
                  if sorted(shape)[1] == big and min(shape) >= MIN_SHAPE_DIM]

        def loss(h: float) -> float:
            return sum((math.log(r) - math.log(shape_factor(d, h) / shape_factor(big, h))) ** 2 for d, r in narrow)

        half, err = fit_scalar(loss, [float(x) for x in range(0, 2049)])
        gpu = get_gpu(gpu_id)
        units = half / scaled_half_dim(1.0, gpu.peak_flops_per_s("bf16"), gpu.num_sms, reference_flops_per_sm)
        by_gpu[gpu_id] = {"half_dim": half, "reference_units": round(units, 1),
                          "rms_log_error": round(math.sqrt(err / len(narrow)), 4), "points": len(narrow)}
    return {"gemm_half_dim": round(statistics.fmean(v["reference_units"] for v in by_gpu.values()), 1),
            "by_gpu": by_gpu}


def fit_gemm_per_architecture(half_dim: float, reference_flops_per_sm: float) -> dict[str, dict[str, float]]:
    """``{architecture: {precision: sustained fraction of the best case}}`` (module docstring),
    with the shape factor of ``half_dim`` (reference units) taken out of each of the profiled
    layer's GEMMs, so that the model times that layer as measured."""
    mb = _entries("gemm")
    out: dict[str, dict[str, float]] = {}
    for arch, (entry_id, gpu_id) in TRAINING_SHAPE_GEMMS.items():
        e = mb[entry_id]
        peaks, _ = _device(e, gpu_id)
        best = get_gpu(gpu_id).matmul_efficiency
        sms = get_gpu(gpu_id).num_sms
        bf16_ms = statistics.fmean(t for t in (_layer_ms(e, "autocast", "bf16"), _layer_ms(e, "prequantized", "bf16"))
                                   if t is not None)
        fp8_ms = _layer_ms(e, "prequantized", "fp8_current_scaling")  # the per-tensor GEMM kernel alone
        fracs = {}
        for prec, ms in (("bf16", bf16_ms), ("fp8", fp8_ms)):
            h = scaled_half_dim(half_dim, peaks[prec], sms, reference_flops_per_sm)
            # flops each GEMM would take at full shape efficiency: sum of flops / shape factor
            shaped = sum(6.0 * m * k * n / shape_factor(min(m, k, n), h) for m, k, n in e["layer_gemm_shapes_mkn"])
            fracs[prec] = round(shaped / (ms * 1e-3) / peaks[prec] / best[prec], 4)
        out[arch] = fracs
    return out


def fit_fp8_recipes() -> dict[str, dict[str, float]]:
    """``{recipe: {quantize_bytes_per_element, gemm_rate}}`` (module docstring), averaged over
    the GPUs that measured the recipe."""
    mb = _entries("gemm")
    q: dict[str, list[float]] = {}
    rate: dict[str, list[float]] = {}
    for _, (entry_id, gpu_id) in TRAINING_SHAPE_GEMMS.items():
        e = mb[entry_id]
        _, hbm = _device(e, gpu_id)
        elems = _layer_elements(e)
        kernel = _layer_ms(e, "prequantized", "fp8_current_scaling")  # per-tensor GEMM, no quantization
        current = _layer_ms(e, "autocast", "fp8_current_scaling")
        over_current = current - kernel

        def add(recipe: str, overhead_ms: float, gemm_ms: float) -> None:
            q.setdefault(recipe, []).append(overhead_ms * 1e-3 * hbm / elems)
            rate.setdefault(recipe, []).append(kernel / gemm_ms)

        add("tensorwise", over_current, kernel)
        delayed = _layer_ms(e, "autocast", "fp8_delayed_scaling")
        if delayed is not None:  # TE times delayed scaling only in autocast: its GEMM is the per-tensor kernel
            add("delayed", delayed - kernel, kernel)
        mx_auto, mx_pre = _layer_ms(e, "autocast", "mxfp8"), _layer_ms(e, "prequantized", "mxfp8")
        if mx_auto is not None and mx_pre is not None:
            add("mxfp8", mx_auto - mx_pre, mx_pre)
        block = _layer_ms(e, "autocast", "fp8_block_scaling_1x128_128x128")
        if block is not None:  # not pre-quantizable on Hopper: quantized at current scaling's cost
            add("blockwise", over_current, block - over_current)
    return {r: {"quantize_bytes_per_element": round(statistics.fmean(q[r]), 3),
                "gemm_rate": round(statistics.fmean(rate[r]), 4)} for r in sorted(q)}


def fit_memory_kernels() -> dict[str, Any]:
    """``{class: {fwd, bwd, iqr_*, points_*}}``: the median achieved fraction of the STREAM rate,
    per pass, of ``eager`` aten kernels and of ``fused_loss`` (Megatron-Core's fused
    cross-entropy, over the bytes the simulator's fused loss op counts) (module docstring)."""
    doc = catalog_document("microbenchmarks/elementwise.yaml")
    got: dict[tuple[str, str], list[float]] = {}
    for entry in doc["entries"]:
        for p in entry["points"]:
            gpu = get_gpu(p["gpu"])
            rate = float(p["bytes_per_element"]) * float(p["elements"]) / (float(p["ms"]) * 1e-3)
            got.setdefault((p["class"], p["pass"]), []).append(rate / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency))
    out: dict[str, Any] = {}
    for cls in ("eager", "fused_loss"):
        row: dict[str, Any] = {}
        for ps in ("fwd", "bwd"):
            v = got[(cls, ps)]
            q = statistics.quantiles(v, n=4)
            row[ps] = round(statistics.median(v), 4)
            row[f"iqr_{ps}"] = [round(q[0], 3), round(q[2], 3)]
            row[f"points_{ps}"] = len(v)
        out[cls] = row
    return out


# (architecture, kernel family) -> the measurements that speak for it: (entry id, selector).
ATTENTION_DATA: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("hopper", "flash"): (("fa3-paper-h100-fwd-bf16", "panel:128:true:cudnn"),
                          ("cudnn-frontend-h200-2024", "versions:cudnn_bf16"),
                          ("cudnn-frontend-h200-9-19-llama", "series:bfloat16:top_left")),
    ("hopper", "flash2"): (("fa3-paper-h100-fwd-bf16", "panel:128:true:fa2"),
                           ("cudnn-frontend-h200-2024", "versions:pytorch_sdpa")),
    ("blackwell", "flash"): (("cudnn-frontend-b200-cudnn9.10", "backend:pyt_cudnn"),
                             ("cudnn-frontend-b200-cudnn9.13-bf16", "backend:pyt_cudnn"),
                             ("cudnn-frontend-gb200-cudnn9.17-bf16", "backend:cudnn_fe"),
                             ("cudnn-frontend-gb200-9-22-llama", "series:bfloat16:top_left")),
    ("blackwell", "flash2"): (("cudnn-frontend-b200-cudnn9.10", "backend:pyt_flash_attention"),
                              ("cudnn-frontend-b200-cudnn9.10", "backend:flash_attention"),
                              ("cudnn-frontend-b200-cudnn9.13-bf16", "backend:pyt_flash_attention"),
                              ("cudnn-frontend-b200-cudnn9.13-bf16", "backend:flash_attention"),
                              ("cudnn-frontend-gb200-cudnn9.17-bf16", "backend:pyt_flash_attention")),
    ("cdna4", "flash"): (("hipkittens-mi355x-attention", "aiter:mha_causal"),),
    ("cdna4", "flash2"): (("hipkittens-mi355x-attention", "aiter:mha_causal"),),
}


def _attention_points(entry: Mapping[str, Any], selector: str) -> Iterable[tuple[float, str, float]]:
    """``(seq_len, "fwd" | "bwd", TFLOP/s)`` of one dataset (causal, head dim 128, bf16)."""
    kind, *arg = selector.split(":")
    if kind == "panel":  # FlashAttention-3 Fig. 5 panels: forward only
        hdim, causal, kernel = int(arg[0]), arg[1] == "true", arg[2]
        for p in entry["panels"]:
            if p["head_dim"] == hdim and bool(p["causal"]) == causal:
                for s, v in zip(p["seq_len"], p["tflops_by_kernel"][kernel]):
                    if v is not None:
                        yield float(s), "fwd", float(v)
    elif kind == "versions":  # cudnn-frontend 2024 CSVs: causal rows of every version
        for version in entry["versions"]:
            for row in version["commit_data"]:
                if row["causal"] and row["head_dim"] == 128:
                    for pass_ in ("fwd", "bwd"):
                        v = row.get(f"{arg[0]}_{pass_}")
                        if v is not None:
                            yield float(row["seq_len"]), pass_, float(v)
    elif kind == "backend":  # cudnn-frontend training sweeps: one series per backend
        for row in entry["series"][arg[0]]:
            for pass_ in ("fwd", "bwd"):
                v = row.get(f"{pass_}_tflops")
                if v is not None:
                    yield float(row["seq_len"]), pass_, float(v)
    elif kind == "series":  # cudnn-frontend 2026 results: dtype x mask series
        for series in entry["series"]:
            if series["dtype"] == arg[0] and series["mask"] == arg[1]:
                for row in series["points"]:
                    for pass_ in ("fwd", "bwd"):
                        yield float(row["seq_len"]), pass_, float(row[f"{pass_}_tflops"])
    elif kind == "aiter":  # HipKittens JSONs: AITER reference kernels
        for pass_ in ("fwd", "bwd"):
            for row in entry["series"][f"{pass_}_{arg[0]}"]:
                yield float(row["seq_len"]), pass_, float(row["aiter_tflops"])
    else:
        raise ValueError(selector)


MIN_ATTENTION_SEQ = 2048


# Attention kernels of an older library release, for the framework profiles that shipped it
# (frameworks.yaml attention_library, Plan.attention_library): the measurements taken with it.
# cuDNN <= 9.13 on Blackwell: on the same GB300, cuDNN 9.17 runs causal bf16 hdim-128 attention
# 27% faster forward and 14% faster backward at 8k tokens than 9.13.1 (attention.yaml
# cudnn-frontend-gb300-cudnn9.13-bf16 vs -cudnn9.17-bf16); the B200 runs of cuDNN 9.10 and 9.13
# agree with each other, so they stand for the 2025 containers (NGC PyTorch 25.09: cuDNN 9.13.1).
ATTENTION_LIBRARY_DATA: dict[str, dict[tuple[str, str], tuple[tuple[str, str], ...]]] = {
    "cudnn-9.13": {("blackwell", "flash"): (("cudnn-frontend-b200-cudnn9.10", "backend:pyt_cudnn"),
                                            ("cudnn-frontend-b200-cudnn9.13-bf16", "backend:pyt_cudnn"))},
}


def fit_attention_curves_by_library() -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """``{library: {architecture: {kernel: curve}}}`` (``fit_attention_curves`` over each
    library's measurements, ``ATTENTION_LIBRARY_DATA``)."""
    return {lib: fit_attention_curves(data) for lib, data in ATTENTION_LIBRARY_DATA.items()}


def fit_attention_curves(data: Mapping[tuple[str, str], tuple[tuple[str, str], ...]] | None = None
                         ) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``{architecture: {kernel: {"fwd": [f_max, s_half], "bwd": [...], "rms_rel_error": ...}}}``
    from ``data`` (default ``ATTENTION_DATA``: every measurement, the current libraries)."""
    mb = _entries("attention")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (arch, kernel), datasets in (ATTENTION_DATA if data is None else data).items():
        pts: dict[str, list[tuple[float, float]]] = {"fwd": [], "bwd": []}
        for entry_id, selector in datasets:
            e = mb[entry_id]
            peak = get_gpu(str(e["gpu"]).split()[0]).peak_flops_per_s("bf16")
            for s, pass_, tflops in _attention_points(e, selector):
                if s >= MIN_ATTENTION_SEQ:
                    pts[pass_].append((s, tflops * 1e12 / peak))
        fit: dict[str, Any] = {}
        for pass_, xy in pts.items():
            f_max, s_half, rms = fit_saturating([s for s, _ in xy], [f for _, f in xy])
            fit[pass_] = [round(f_max, 4), round(s_half, 1)]
            fit[f"{pass_}_rms_rel_error"] = round(rms, 3)
            fit[f"{pass_}_points"] = len(xy)
        out.setdefault(arch, {})[kernel] = fit
    return out


def fit_deepep_dispatch() -> dict[str, float]:
    """DeepEP normal (training) kernels' achieved bandwidth per tier as a fraction of the
    nominal per-direction link rate of the catalog records the entry names: intranode over its
    GPU's NVLink (H800: 200 GB/s each way), internode over its NIC (one CX7 400 Gb/s InfiniBand
    NDR port per GPU, ``ib-ndr-400``), median of dispatch and combine over the README's points
    of the latest V1 version (``moe_kernels.yaml`` ``deepep-v1-normal-h800``).

    The README's bytes include the traffic that never crosses the tier: its tests count a
    token once per destination *node including its own* (``tests/test_internode.py``:
    ``rdma_idx = topk_idx // (num_experts // num_nodes)``, ``inplace_unique``,
    ``num_rdma_token_sent = rdma_idx.ne(-1).sum()``) and intranode every received token
    including the rank's own (``tests/test_intranode.py``: ``recv_x.numel() * 2``).  Their
    routing (random scores, group-limited top-k) treats the source's own node or rank like any
    other, so ``(n - 1)/n`` of the counted bytes cross the tier, ``n`` the nodes (internode) or
    ranks (intranode) of the point; that share of the README rate is what the link carried,
    and what ``sim.cost.costs.moe_dispatch_s`` divides the remote bytes by.  Known error: H800
    only; EP 16 (two nodes) reaches half the NIC rate of EP 32-64 (0.43 against 0.86-0.89), which
    the median leaves out."""
    e = _entries("moe_kernels")["deepep-v1-normal-h800"]
    points = e["versions"][-1]["points"]
    gpu = get_gpu(e["gpu"])
    gpn = int(e["gpus_per_node"])
    rates = {"scale-up": gpu.nvlink_bytes_per_s_per_direction, "scale-out": get_nic(e["nic"]).bytes_per_s_per_direction}
    out = {}
    for tier, name in (("scale-up", "nvlink"), ("scale-out", "rdma")):
        got = []
        for p in points:
            if p["tier"] != name:
                continue
            n = p["ep"] if name == "nvlink" else p["ep"] // gpn
            crossing = (n - 1) / n
            got += [p[k] * 1e9 * crossing / rates[tier] for k in ("dispatch_gbps", "combine_gbps")]
        out[tier] = round(statistics.median(got), 4)
    return out


RING_ENTRY = "ring-flash-attention-zigzag-8gpu"


def fit_ring_attention() -> dict[str, Any]:
    """Per-step overhead of load-balanced ring attention relative to the full kernel, fitted from
    ring-flash-attention's benchmark (``attention.yaml`` ``ring-flash-attention-zigzag-8gpu``).

    Model: a ring of ``c`` steps over chunks of ``t`` local tokens takes
    ``1 + (c - 1)/c * delta * t_ref / t`` times the kernel time of the same work: every step
    after the first adds a merge of the partial output by log-sum-exp (forward) or an fp32
    accumulation of dQ and the rotating dK/dV (backward) and splits the kernel, costs linear in
    ``t`` against kernel work quadratic in it.  ``delta`` per architecture and pass from the
    zigzag ring at ``c = 8``, ``t_ref = 8192``: forward from the forward-only ratio, backward from
    the forward+backward ratio less the forward part (the flash kernel's own forward/backward
    split).  Known error: one ring degree and chunk size per GPU; the 1/t scaling is assumed."""
    e = _entries("attention")[RING_ENTRY]
    c, t_ref = int(e["ring_degree"]), float(e["local_tokens"])
    out: dict[str, Any] = {"reference_local_tokens": t_ref}
    for sysm in e["systems"]:
        flash, ring = sysm["flash_iter_per_s"], sysm["zigzag_ring_iter_per_s"]
        t_f0, t_fb0 = 1.0 / flash["fwd"], 1.0 / flash["fwd_bwd"]  # one GPU's chunk, full kernel
        t_f, t_fb = 1.0 / (c * ring["fwd"]), 1.0 / (c * ring["fwd_bwd"])  # the ring, per chunk of work
        r_f = t_f / t_f0
        r_b = (t_fb - t_f) / (t_fb0 - t_f0)
        out[sysm["architecture"]] = {"fwd": round((r_f - 1) * c / (c - 1), 4), "bwd": round((r_b - 1) * c / (c - 1), 4)}
    return out


# Long-running GEMM sweeps (cuBLASLt after 10,000 warm-up iterations: the GPU at its sustained,
# thermally settled clock) paired with mamf-finder's short bursts (50 warm-up, 100 timed) on the
# same GPU and precision.
SUSTAINED_SWEEPS = ("azure-cublaslt-fp16-a100", "azure-cublaslt-fp8-h100", "azure-cublaslt-fp8-h200",
                    "azure-cublaslt-fp8-fp4-gb200")


def _rate_class(dtype: str) -> str:
    """A GEMM measurement's tensor-core rate class from its ``dtype`` text: fp8, or 16-bit named
    bf16 (fp16 and bf16 share the tensor-core rate of every GPU in the catalog, so a 16-bit sweep
    pairs with mamf-finder's bf16 burst)."""
    return "fp8" if "fp8" in dtype else "bf16"


def _cuda_version(text: str) -> tuple[int, int] | None:
    import re

    hit = re.search(r"CUDA (\d+)\.(\d+)", text) or re.search(r"cu(\d{2})(\d)", text)
    return (int(hit.group(1)), int(hit.group(2))) if hit else None


def fit_sustained_clock() -> dict[str, Any]:
    """Sustained-over-burst GEMM rate per architecture: the best large-GEMM rate of a sweep run
    after 10,000 warm-up iterations over mamf-finder's best short-burst rate on the same GPU and
    tensor-core rate (``gemm.yaml``; a 16-bit sweep with the bf16 burst, ``_rate_class``),
    where both ran the same CUDA major version within two minor versions (a later cuBLAS is a
    different library, not a different clock).  Under sustained
    load the GPU settles at a lower clock than in a 150-iteration burst (power and temperature
    limits); the burst rates are what ``matmul_efficiency`` and the kernel curves were measured
    at.  Mean over the pairs of an architecture; architectures without a same-era pair: none
    (treated as 1).  Known error: the sweep's square shapes are not mamf's searched best shape
    (biases the ratio low by a shape effect); one pair per GPU, Ampere's 16-bit, the others fp8."""
    mb = _entries("gemm")
    mamf = {(p["gpu"], _rate_class(str(p["dtype"]))): p for p in mb["mamf-finder-best-shape"]["points"]}
    pairs: dict[str, float] = {}
    by_arch: dict[str, list[float]] = {}
    for entry_id in SUSTAINED_SWEEPS:
        e = mb[entry_id]
        gpu_id = str(e["gpu"]).split()[0]
        burst = mamf.get((gpu_id, _rate_class(str(e.get("dtype", "fp8")))))  # the GB200 entry: fp8 and fp4 lists
        points = e.get("points") or e.get("fp8") or []
        if burst is None or not points:
            continue
        v_sweep, v_burst = _cuda_version(str(e.get("software", ""))), _cuda_version(str(burst.get("torch", "")))
        if v_sweep is None or v_burst is None or v_sweep[0] != v_burst[0] or abs(v_sweep[1] - v_burst[1]) > 2:
            continue
        ratio = max(float(p["tflops"]) for p in points) / float(burst["tflops"])
        pairs[gpu_id] = round(ratio, 4)
        by_arch.setdefault(get_gpu(gpu_id).architecture, []).append(ratio)
    return {"per_architecture": {a: round(statistics.fmean(v), 4) for a, v in by_arch.items()}, "pairs": pairs}

