"""Assemble a calibration profile (the ``sim.cost.calibration`` schema) from microbenchmark records.

``fit_profile`` runs the compute fits (``validate.fit``) and the link fits
(``validate.fit_links``) and writes what was measured, and only that:

* a link record per *measured* tier; a tier without measurements (one rank per node: no
  intra-node link; one node: no NIC) gets no record, and the simulator keeps the catalog's
  link for it (the base GPU's NVLink, the catalog NIC), never a placeholder;
* on a GPU whose catalog record is known (``guess_base_gpu`` from torch's device name and
  memory size, or ``--base-gpu``), the record keeps its data-sheet peaks and the measurements
  become its efficiencies; otherwise (CPU hosts, GPUs the catalog lacks) the device's peaks are
  the measured ones;
* ``memory``: on a GPU the cuBLAS workspace the microbenchmarks measured (allocated through the
  caching allocator, as the simulator's ``workspace_bytes`` counts it) and, as information, the
  device memory outside the allocator (CUDA context, NCCL buffers); the fragmentation stays the
  catalog's;
* ``host``: how and with what it was measured, torch, CUDA, cuDNN and NCCL versions and the
  TF32 settings included (also in the file's comment header, ``profile_header``), and the
  host-side rates measured (``validate.fit_host``): ``host_mem_bytes_per_s`` and the
  host<->device copies ``{h2d,d2h}_{pinned,pageable}_{bytes_per_s,latency_s}``, each only when
  measured (``fit.host`` says why a missing one is missing).

No torch here.
"""

from __future__ import annotations

import datetime
from typing import Any

from validate.fit import FitError, fit_attention, fit_host_floor, fit_matmul, fit_memory, fit_overhead
from validate.fit_host import fit_host
from validate.fit_links import LinkFit, Machine, fit_links


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
    nodes = int(env.get("num_nodes", 1) or 1)
    return f"{_slug(dev)}-x{env.get('local_world_size', 1)}{f'-{nodes}n' if nodes > 1 else ''}-{env.get('backend', 'nccl')}"


def _tokens(text: str) -> list[str]:
    return [w for w in _slug(text).split("-") if w]


def _form_factor(tokens: list[str]) -> str:
    """``pcie`` for PCIe cards (``PCIe``, and the ``NVL`` dual-card boards), else ``sxm``."""
    return "pcie" if "pcie" in tokens or "nvl" in tokens else "sxm"


def guess_base_gpu(env: dict) -> str | None:
    """The catalog GPU torch's device name names (``NVIDIA H200`` -> ``h200-141gb``): same
    model token, same form factor (a PCIe card never maps to an SXM record), memory size
    within 12%; None when no record fits (then pass ``--base-gpu``, or the profile keeps
    the measured peaks)."""
    if env.get("device_type") != "cuda":
        return None
    from sim.data.catalog import catalog_records

    toks = _tokens(str(env.get("device_name", "")).replace("-", " "))
    model = next((t for t in toks if t != "nvidia" and any(c.isdigit() for c in t) and any(c.isalpha() for c in t)
                  and not t.endswith("gb")), None)
    if model is None:
        return None
    form = _form_factor(toks)
    cands = []
    for r in catalog_records("gpus"):
        rt = _tokens(str(r.get("name", "")))
        if model in rt and _form_factor(rt) == form:
            cands.append(r)
    mem = float(env.get("device_memory_bytes", 0) or 0) / 2**30
    if mem > 0:
        cands = [r for r in cands if abs(float(r.get("hbm_gib", 0)) - mem) <= 0.12 * float(r.get("hbm_gib", 1))]
        return min(cands, key=lambda r: abs(float(r.get("hbm_gib", 0)) - mem))["id"] if cands else None
    return cands[0]["id"] if len(cands) == 1 else None


def _base_record(base_gpu: str) -> dict:
    from sim.data.catalog import catalog_records

    base = next((dict(r) for r in catalog_records("gpus")
                 if r["id"] == base_gpu or base_gpu in (r.get("aliases") or [])), None)
    if base is None:
        raise FitError(f"base_gpu {base_gpu!r} is not in catalogs/gpus.yaml")
    return base


def _link_fit_record(f: LinkFit | None) -> dict | None:
    if f is None:
        return None
    return {"bytes_per_s": f.bytes_per_s, "latency_s": f.latency_s, "call_overhead_s": f.call_overhead_s,
            "rms_log_error": f.rms_log, "points": f.n, "layouts": list(f.layouts),
            "measured_over_predicted_by_op": f.measured_over_predicted}


def _memory_section(records: list[dict], device_type: str) -> dict[str, float]:
    if device_type == "cpu":
        return {"workspace_bytes": 0.0, "fragmentation_fraction": 0.05}
    rec = next((r for r in records if r.get("kind") == "device_memory"), None)
    if rec is None:
        return {}
    return {"workspace_bytes": float(rec["allocated_after_compute_bytes"]),
            "outside_allocator_bytes": float(rec["outside_allocator_after_comm_bytes"]),
            "nccl_bytes": max(0.0, float(rec["outside_allocator_after_comm_bytes"])
                              - float(rec["outside_allocator_before_comm_bytes"]))}


def software_line(env: dict) -> str:
    """torch / CUDA / NCCL versions and TF32 settings, one line (the profile header)."""
    tf32 = env.get("tf32") or {}
    tf = (f"TF32 matmul {'on' if tf32.get('matmul_allow_tf32') else 'off'}, cuDNN TF32 "
          f"{'on' if tf32.get('cudnn_allow_tf32') else 'off'}, float32_matmul_precision "
          f"{tf32.get('float32_matmul_precision', '?')}") if tf32 else "TF32 settings not recorded"
    return (f"torch {env.get('torch', '?')}, CUDA {env.get('cuda') or 'none'}, cuDNN {env.get('cudnn') or 'none'}, "
            f"NCCL {env.get('nccl') or 'none'}; {tf}")


def profile_header(profile: dict[str, Any], suite: str) -> str:
    """The comment block at the top of a written profile."""
    host = profile.get("host", {})
    return (f"Calibration profile {profile['id']} (schema: sim/cost/calibration.py, docs/validate.md).\n"
            f"Fitted from the {suite} microbenchmark suite only; {profile['source']}.\n"
            f"Software: {software_line(host)}.\n"
            "Regenerate: planner validate all" + (" --quick" if suite == "quick" else "") + " --install")


def fit_profile(records: list[dict], env: dict, *, profile_id: str | None = None,
                compute_dtype: str | None = None, base_gpu: str | None = None) -> dict[str, Any]:
    """The calibration profile (a plain dict in the ``sim.cost.calibration`` schema); module
    docstring.  Raises ``FitError`` when the compute measurements cannot be fitted."""
    device_type = str(env.get("device_type", "cpu"))
    dtype = compute_dtype or ("fp32" if device_type == "cpu" else "bf16")
    pid = profile_id or default_profile_id(env)
    world = int(env.get("world_size", 1))
    rpn = int(env.get("local_world_size", world))
    over = fit_overhead(records)
    floor = fit_host_floor(records, over) if device_type == "cuda" else 0.0
    mem = fit_memory(records, over, floor)
    mm = fit_matmul(records, dtype, over, floor, mem.bytes_per_s)
    att = fit_attention(records, mm.flops_per_s, over, floor, mem.bytes_per_s)
    base_id = base_gpu or guess_base_gpu(env)
    base = _base_record(base_id) if base_id else None
    machine = Machine(world=world, ranks_per_node=rpn,
                      nics_per_node=int(base["nics_per_node"]) if base else 1,
                      pcie_generation=int(base["pcie_generation"]) if base else 5)
    intra, inter = fit_links(records, machine)
    host_keys, host_fit = fit_host(records)
    best_by_dtype: dict[str, float] = {}
    for r in records:
        if r.get("kind") == "matmul":
            best_by_dtype[r["dtype"]] = max(best_by_dtype.get(r["dtype"], 0.0), r["flops"] / r["time_s"])

    today = str(env.get("date", datetime.date.today().isoformat()))[:10]
    prov = (f"measured by `planner validate` on {env.get('hostname', '?')} ({env.get('device_name', '?')}), "
            f"torch {env.get('torch', '?')}, {env.get('backend', '?')}, {rpn} rank(s) per host x "
            f"{env.get('threads_per_rank', '?')} thread(s) x {env.get('num_nodes', 1)} node(s), {today}")
    links: list[dict[str, Any]] = []
    su_id = f"{pid}-{'loopback' if device_type == 'cpu' else 'scale-up'}"
    if intra is not None:
        links.append({
            "id": su_id, "name": f"{env.get('backend', '?')} inside one host ({pid})", "kind": "scale-up",
            "technology": "loopback TCP (gloo)" if device_type == "cpu" else "nvlink/pcie (nccl)",
            "gb_per_s_per_direction": intra.bytes_per_s / 1e9, "latency_us": intra.latency_s * 1e6, "source": prov,
            "notes": "alpha-beta fit through sim.net.network on the layouts " + ", ".join(intra.layouts)})
    nic_id = f"{pid}-nic"
    if inter is not None:
        links.append({"id": nic_id, "name": f"{env.get('backend', '?')} between hosts ({pid})", "kind": "nic",
                      "technology": "measured", "gb_per_s_per_direction": inter.bytes_per_s / 1e9,
                      "latency_us": inter.latency_s * 1e6, "source": prov,
                      "notes": f"per rank's NIC; alpha-beta fit through sim.net.network on the layouts "
                               f"{', '.join(inter.layouts)} ({machine.probe_nics} NIC(s) per node in the probe)"})
    scale_up = {"nvlink_gb_per_s_per_direction": intra.bytes_per_s / 1e9, "nvlink_generation": su_id} if intra else {}
    if base is not None:
        peak = float(base["dense_tflops"].get(dtype, base["dense_tflops"]["bf16"])) * 1e12
        device = {k: v for k, v in base.items() if k not in ("price_source",)}
        device.update({"id": pid, "name": f"{base['name']} (calibrated)", "aliases": [],
                       "matmul_efficiency": {**base.get("matmul_efficiency", {}), "bf16": min(1.0, mm.flops_per_s / peak)},
                       "hbm_efficiency": min(1.0, mem.bytes_per_s / (float(base["hbm_tb_per_s"]) * 1e12)),
                       **scale_up, "default_nic": nic_id if inter else base["default_nic"], "source": prov,
                       "notes": f"catalog record {base_id} with measured efficiencies"
                                + ("" if intra else "; scale-up link not measured: the catalog's")
                                + ("" if inter else "; NIC not measured: the catalog's")})
    else:
        host_mem = float(env.get("host_memory_bytes", env.get("device_memory_bytes", 16 * 2**30)))
        device = {
            "id": pid, "name": f"{env.get('device_name', 'cpu')} ({rpn} ranks x {env.get('threads_per_rank', 1)} thread)",
            "vendor": "cpu" if device_type == "cpu" else "nvidia", "architecture": device_type,
            # The cost model's training precision is bf16; on this device it runs as `dtype`.
            "dense_tflops": {"bf16": mm.flops_per_s / 1e12,
                             **{d: v / 1e12 for d, v in best_by_dtype.items() if d in ("fp32", "fp16", "tf32")}},
            "matmul_efficiency": {"bf16": 1.0},
            "hbm_gib": host_mem / rpn / 2**30 if device_type == "cpu" else host_mem / 2**30,
            "hbm_tb_per_s": mem.bytes_per_s / 1e12, "hbm_efficiency": 1.0, **scale_up,
            "nvlink_domain_size": rpn, "pcie_generation": 4, "tdp_w": 10.0 * max(1, int(env.get("threads_per_rank", 1))),
            "gpus_per_node": rpn, "nics_per_node": 1, "default_nic": nic_id if inter else "eth-10",
            "price_usd": None, "price_usd_per_hour": None, "source": prov,
            "notes": (f"one rank of a {env.get('host_cores', '?')}-core host running {rpn} ranks: 'peaks' are the "
                      f"fitted large-GEMM asymptote in {dtype} (bf16 key = the training dtype) and the fitted "
                      "memory-bound kernel bandwidth; hbm_gib is host memory per rank; tdp_w a placeholder"
                      + ("" if intra else "; no scale-up link measured (one rank per host)")),
        }
    versions = {k: env.get(k) for k in ("torch", "cuda", "cudnn", "nccl", "tf32", "device_capability")}
    return {
        "schema_version": 1, "id": pid,
        "name": f"{env.get('device_name', '?')} via {env.get('backend', '?')} ({rpn} ranks per host)",
        "source": prov,
        "notes": "fitted from microbenchmarks only (validate/fit.py, fit_links.py); workloads are never used to fit",
        "host": {"device_type": device_type, "compute_dtype": dtype, "ranks_per_host": rpn,
                 "host_cores": int(env.get("host_cores", 1)), "threads_per_rank": int(env.get("threads_per_rank", 1)),
                 "num_nodes": int(env.get("num_nodes", 1)), "backend": env.get("backend"),
                 "device_name": env.get("device_name"), "base_gpu": base_id, **versions, **host_keys},
        "device": device,
        "links": links,
        "efficiency": {"attention_fwd_vs_matmul": att.fwd_vs_matmul, "attention_bwd_vs_matmul": att.bwd_vs_matmul,
                       "kernel_overhead_s": over, "gemm_half_dim": mm.gemm_half_dim, "host_op_floor_s": floor,
                       **({"collective_overhead_s": (intra or inter).call_overhead_s} if (intra or inter) else {}),
                       "source": "validate.fit: attention, GEMM shape factor, per-kernel overhead, host floor; "
                                 "validate.fit_links: per-collective overhead"},
        "memory": _memory_section(records, device_type),
        "fit": {
            "matmul": {"dtype": dtype, "flops_per_s": mm.flops_per_s, "gemm_half_dim": mm.gemm_half_dim,
                       "rms_rel_error": mm.rms_rel, "points": mm.n, "bound_points": mm.bound_points},
            "attention": {"fwd_vs_matmul": att.fwd_vs_matmul, "bwd_vs_matmul": att.bwd_vs_matmul,
                          "rms_rel_error": att.rms_rel, "points": att.n, "bound_points": att.bound_points},
            "memory": {"bytes_per_s": mem.bytes_per_s, "rms_rel_error": mem.rms_rel, "points": mem.n,
                       "bound_points": mem.bound_points},
            "kernel_overhead_s": over, "host_op_floor_s": floor,
            "links": {"intra": _link_fit_record(intra), "inter": _link_fit_record(inter)},
            "host": host_fit,
        },
        "measured": {"best_matmul_flops_per_s": best_by_dtype, "env": {k: v for k, v in env.items() if k != "date"},
                     "date": env.get("date")},
    }
