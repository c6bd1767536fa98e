"""When nothing fits: the changes that make some plan fit, each verified by re-running the search.

``suggest_fixes`` tries one change at a time (more host memory when offloading is blocked by
it, ZeRO-3, offloading, full recomputation, free tp/pp/cp, micro-batch 1, a smaller or larger
batch, fewer or more GPUs, a GPU with more memory) with the framework profiles of the settings
and reports each change that produces a fitting plan, with the plan ``recommend`` would pick
(``simplest_best``).  Called by ``planner.plans.recommend.recommend``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sim.data.catalog import list_gpus
from sim.base.errors import InputError
from sim.cost.framework import get_framework
from sim.cost.offload import host_spec, with_host
from sim.data.hardware import Cluster
from sim.data.specs import Model
from sim.base.units import GIB

from planner.exports import launchable
from planner.plans.recommend import Settings, _tie_key, cluster_with_gpus, estimate_band, framework_space
from planner.plans.search import SearchResult, SearchSpace, search


def simplest_best(r: SearchResult, num_layers: int, tie_tolerance: float = 1e-3) -> int | None:
    """The candidate of ``r`` that ``recommend`` would pick by throughput: of the plans its
    framework runs and its export format states (``r.framework``; ``planner.plans.recommend.exports``),
    the simplest of those within ``tie_tolerance`` of the fastest; None when there is none."""
    t = r.candidates.step_time_s
    caps = get_framework(r.framework).capabilities if r.framework is not None else None
    fm = r.fastmodel
    best = None
    for i in np.argsort(t, kind="stable")[:5000]:
        s = r.strategy(int(i))
        if caps is not None and (caps.refusal(s) is not None or not launchable(fm.plan(s), r.framework)):
            continue
        best = float(t[i])
        break
    if best is None:
        return None
    tied = [int(i) for i in np.flatnonzero(t <= best * (1 + tie_tolerance))]
    tied = [i for i in sorted(tied, key=lambda i: float(t[i]))[:5000]
            if caps is None or (caps.refusal(r.strategy(i)) is None and launchable(fm.plan(r.strategy(i)), r.framework))]
    return int(min(tied, key=lambda i: (_tie_key(r.strategy(i), num_layers), float(t[i]))))


def suggest_fixes(model: Model, cluster: Cluster, *, gbs: int, seq_len: int, space: SearchSpace,
                  settings: Settings, max_factor: int = 8, rejected_batch: bool = False,
                  memory_limit_bytes: float | None = None, host_need_bytes: float = 0.0) -> list[dict[str, object]]:
    """Changes that make some plan fit, each verified by re-running the search with every
    framework profile of ``settings`` (the one whose simplest best plan has the lowest calibrated
    estimate is reported, as ``recommend`` would rank it).  With ``rejected_batch`` (the
    batch did not divide) a larger batch and fewer GPUs are tried too; with ``host_need_bytes``
    (offloaded plans fit the GPU but need that much of the node's host memory) more host memory
    is tried first."""
    tries: list[tuple[str, str, dict]] = []
    if host_need_bytes:  # offloaded plans fit the GPU but not the node's host memory
        have = host_spec(cluster).host_dram_bytes
        for k in (1.0, 2.0):
            gib = 64 * math.ceil(max(host_need_bytes * k, have * 2) / GIB / 64)
            tries.append(("host_memory", f"more host memory per node: {gib:,} GiB (--host-dram-gib {gib})",
                          {"cluster": lambda gib=gib: with_host(cluster, host_dram_bytes=gib * GIB)}))
    if 3 not in space.zero:
        tries.append(("zero", "allow ZeRO-3 / FSDP (shard weights, gradients and optimizer states)",
                      {"space": space.replace(zero=(0, 1, 2, 3))}))
    if not {"optimizer", "params"} <= set(space.offload):
        tries.append(("offload", "allow offloading optimizer states (and parameters) to host memory",
                      {"space": space.replace(offload=tuple(dict.fromkeys(space.offload + ("none", "optimizer",
                                                                                            "params"))))}))
    if "full" not in space.recompute:
        tries.append(("recompute", "allow full activation recomputation",
                      {"space": space.replace(recompute=tuple(space.recompute) + ("full",))}))
    if any(getattr(space, d) is not None for d in ("tp", "pp", "cp")):
        tries.append(("model_parallel", "let the search choose tp, pp and cp",
                      {"space": space.replace(tp=None, pp=None, cp=None)}))
    if space.mbs is not None and 1 not in space.mbs:
        tries.append(("mbs", "allow micro-batch 1", {"space": space.replace(mbs=tuple(space.mbs) + (1,))}))
    smaller = sorted({b for b in (1 << (gbs.bit_length() - 1), gbs // 2) if 0 < b < gbs}, reverse=True)
    for b in smaller:
        tries.append(("gbs", f"a smaller global batch: gbs={b}", {"gbs": b}))
    if rejected_batch:
        for k in (2, 4, 8):
            tries.append(("gbs_larger", f"a larger global batch: gbs={gbs * k}", {"gbs": gbs * k}))
        for k in (2, 4, 8):
            n = cluster.num_gpus // k
            if n >= 1 and cluster.num_gpus % k == 0:
                tries.append(("fewer_gpus", f"fewer GPUs: {n}", {"cluster": lambda n=n: cluster_with_gpus(cluster, n)}))
    k = 2
    while k <= max_factor:
        n = cluster.num_gpus * k
        tries.append(("num_gpus", f"more GPUs: {n}", {"cluster": lambda n=n: cluster_with_gpus(cluster, n)}))
        k *= 2
    bigger = sorted((g for g in list_gpus() if g.hbm_bytes > cluster.gpu.hbm_bytes
                     and g.form_factor == cluster.gpu.form_factor), key=lambda g: g.hbm_bytes)
    for g in bigger[:2]:
        tries.append(("gpu", f"a GPU with more memory: {g.id} ({g.hbm_bytes / GIB:.0f} GiB)",
                      {"cluster": lambda g=g: replace(cluster, gpu=g)}))

    fraction = 1.0 if memory_limit_bytes is None else memory_limit_bytes / cluster.gpu.hbm_bytes
    out: list[dict[str, object]] = []
    done: set[str] = set()
    for kind, text, change in tries:
        if kind in done:
            continue
        try:
            cl = change["cluster"]() if "cluster" in change else cluster
        except InputError:
            continue  # e.g. more GPUs than a cluster may have: not a suggestion
        found = []  # (calibrated estimate, profile order, framework, search, candidate) per profile that fits
        for order, fw in enumerate(settings.profiles):
            try:
                fspace = framework_space(change.get("space", space), fw.id, cl)
                r = search(model, cl, gbs=change.get("gbs", gbs), seq_len=seq_len, space=fspace,
                           plan_kwargs=settings.plan_kwargs(fw), dp_overlap=fw.dp_overlap,
                           memory_limit_bytes=fraction * cl.gpu.hbm_bytes)
            except InputError:
                continue
            r.framework = fw.id
            j = simplest_best(r, model.num_layers) if r.evaluated else None
            if j is not None:
                est = estimate_band(fw.id, cl).estimate(float(r.candidates.step_time_s[j]))
                found.append((est, order, fw, r, j))
        if not found:
            continue
        est, _, fw, r, j = min(found, key=lambda f: f[:2])  # the profile recommend would pick first
        done.add(kind)
        out.append({"change": kind, "what": text, "verified": True, "framework": fw.id,
                    "num_gpus": r.cluster.num_gpus, "gpu": r.cluster.gpu.id, "gbs": r.gbs,
                    "best_strategy": r.strategy(j).to_string(), "step_time_s": est,
                    "model_step_time_s": float(r.candidates.step_time_s[j]),
                    "memory_device_bytes": float(r.candidates.memory_device_bytes[j]),
                    "candidates_evaluated": r.evaluated})
    return out
