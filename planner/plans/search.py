"""Enumerate the strategy space, prune it, and time every surviving candidate.

The space (``SearchSpace``) is every combination of

* a *layout*: ``tp, cp, pp`` (all divisors of the GPU count, within caps), ``dp`` (what is
  left), ``ep`` (divisors of the expert count, MoE models only) and ``precision`` (bf16, fp16
  on GPUs without bf16 tensor cores; others only when the space lists them);
* micro-batch size (powers of two), sequence parallelism (with ``tp > 1``), recomputation
  (``none|selective|full``), ZeRO stage (0-3; only 0 when there is no data parallelism to shard
  over) and a pipeline schedule with its ``vp`` (``1f1b``, ``gpipe``, ``zero-bubble`` with any
  ``vp``, ``interleaved`` with ``vp >= 2``; just ``1f1b`` without pipelining);
* with ``layouts`` (a framework that runs Megatron-Core's pipeline layouts), for each ``(pp, vp)``
  the default split cannot interleave, the balanced pipeline layouts of ``sim.data.layout``, each a
  layout of its own with that one ``vp`` (``planner.plans.recommend`` searches them around its best
  layouts only: a layout is priced by running the interleaved schedule, ``sim.cost.interleave``);
* offload (``none``, ``optimizer``, ``params`` by default; ``activations`` and combinations when
  asked), each with the ZeRO stages it runs with (``sim.cost.plan.check_offload``: optimizer with
  1-3, params with 3; without data parallelism the lowest such stage), on ``offload_device``.

Pruning happens in this order, and every rejected combination is counted under the reason
``sim.cost.plan.check_feasible`` gives (``heads``, ``indivisible``, ``layers``, ``experts``,
``unsupported``, ...), ``batch`` (the global batch is not divisible by ``mbs * dp``) or ``oom``
(``sim.cost.memory.memory_breakdown`` exceeds the GPU's memory), ``host_oom`` (the offloaded bytes
exceed the node's host DRAM or NVMe) or ``offload_unneeded`` (an offload point whose plan
without offload fits: offloading cannot make it faster, ``planner.plans.fastmodel``).  A layout that fails a check
rejects all its combinations at once under that reason (so a combination that would fail two
checks is counted once, under the layout's).  Survivors are timed with
``planner.plans.fastmodel.FastModel``, which equals ``sim.engines.analytic.simulate_analytic``; a layout
where nothing fits in memory is never timed.
"""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from sim.net.network import Network
from sim.layers.compute import KernelEfficiency
from sim.base.errors import InfeasibleError, InputError
from sim.net.placement import group_shape
from sim.data.layout import balanced_layout
from sim.cost.plan import check_feasible, check_offload, vp_split
from sim.data.hardware import Cluster
from sim.data.specs import (OFFLOAD_DEVICES, OFFLOADS, RECOMPUTES, SCHEDULES, TRAIN_PRECISIONS, Model, Strategy,
                            offload_flags)
from sim.layers.stages import stage_layers

from planner import progress
from planner.plans.fastmodel import FastModel, Grid, Layout

REASON_BATCH = "batch"
REASON_OOM = "oom"
REASON_HOST_OOM = "host_oom"
REASON_OFFLOAD_UNNEEDED = "offload_unneeded"


def divisors(n: int) -> list[int]:
    """Sorted divisors of ``n``."""
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """Which values each dimension may take.  ``None`` means "all sensible values" (see the
    module docstring and the ``max_*`` caps); a tuple restricts the dimension to those values."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    # expert tensor parallelism: None = tp and 1 (MoE parallel folding); () = tp only
    etp: tuple[int, ...] | None = None
    vp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] | None = None
    zero: tuple[int, ...] = (0, 1, 2, 3)
    sp: tuple[bool, ...] = (False, True)
    recompute: tuple[str, ...] = RECOMPUTES
    schedule: tuple[str, ...] = SCHEDULES
    precision: tuple[str, ...] | None = None
    fp8_recipe: str = "delayed"  # the recipe fp8 candidates use (sim.data.specs.FP8_RECIPES)
    offload: tuple[str, ...] = ("none", "optimizer", "params")
    offload_device: tuple[str, ...] = ("cpu",)
    # partial recomputation (Megatron --recompute-method block --recompute-num-layers N) next to
    # recompute=full: None = N at a quarter, half and three quarters of a stage's layers; () = none
    recompute_layers: tuple[int, ...] | None = None
    # partial activation offload (Megatron-Core --cpu-offloading-num-layers N) next to every
    # offload entry that moves activations, on layouts without pipelining and plans without
    # recomputation (Megatron-Core's rule, sim.cost.framework): None = N at a quarter, half and three
    # quarters of the layers; () = none (recommend sets it for profiles without partial_offload)
    offload_layers: tuple[int, ...] | None = None
    # pipeline layouts (sim.data.layout) for the (pp, vp) pairs the default split cannot interleave:
    # the framework must run Megatron-Core's --pipeline-model-parallel-layout (recommend sets it);
    # ``layouts_only`` evaluates just those (recommend's refinement around its best layouts)
    layouts: bool = False
    layouts_only: bool = False
    max_tp: int = 64
    max_cp: int = 16
    max_vp: int = 8
    max_mbs: int = 16

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "ep", "etp", "vp", "mbs"):
            values = getattr(self, name)
            if values is None or (name == "etp" and values == ()):
                continue
            if not values:
                raise InputError(name, values, "needs at least one value")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise InputError(name, v, "must be a positive integer")
        for name in ("max_tp", "max_cp", "max_vp", "max_mbs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(name, v, "must be a positive integer")
        for name, choices in (("zero", (0, 1, 2, 3)), ("sp", (False, True)), ("recompute", RECOMPUTES),
                              ("schedule", SCHEDULES), ("offload", OFFLOADS), ("offload_device", OFFLOAD_DEVICES)):
            values = getattr(self, name)
            if not values:
                raise InputError(name, values, "needs at least one value")
            for v in values:
                if v not in choices or (name == "zero" and isinstance(v, bool)):
                    raise InputError(name, v, f"must be one of {', '.join(map(str, choices))}")
        if self.precision is not None:
            if not self.precision:
                raise InputError("precision", self.precision, "needs at least one value")
            for v in self.precision:
                if v not in TRAIN_PRECISIONS:
                    raise InputError("precision", v, f"must be one of {', '.join(TRAIN_PRECISIONS)}")

    def precisions(self, cluster: Cluster) -> tuple[str, ...]:
        """The precisions searched: those asked for, else the GPU's default training precision
        (bf16; fp16 where it has no bf16 tensor cores): fp8 changes numerics and is searched
        only when asked for."""
        if self.precision is not None:
            return self.precision
        return (cluster.gpu.default_precision,)

    def replace(self, **changes: object) -> "SearchSpace":
        from dataclasses import replace

        return replace(self, **changes)


@dataclass(slots=True)
class Candidates:
    """Every timed candidate that fits: parallel arrays plus the layouts/grids to decode them."""

    layouts: list[Layout]
    grids: list[Grid]
    layout_id: np.ndarray
    flat_index: np.ndarray
    step_time_s: np.ndarray
    memory_device_bytes: np.ndarray

    def __len__(self) -> int:
        return int(self.step_time_s.size)

    def strategy(self, i: int, *, gbs: int, seq_len: int, dp_overlap: bool = True,
                 fp8_recipe: str = "delayed") -> Strategy:
        lid = int(self.layout_id[i])
        s = self.grids[lid].strategy(self.layouts[lid], int(self.flat_index[i]), gbs=gbs, seq_len=seq_len)
        return s.with_(dp_overlap=dp_overlap, fp8_recipe=fp8_recipe)


@dataclass(slots=True)
class SearchResult:
    model: Model
    cluster: Cluster
    gbs: int
    seq_len: int
    candidates: Candidates
    considered: int
    rejected: Counter
    search_time_s: float
    fastmodel: FastModel
    layouts_timed: int = 0
    closest_oom: tuple[float, Strategy] | None = None  # smallest peak memory among plans that do not fit
    # smallest host memory per node among offloading plans that fit the GPU but not the host
    closest_host_oom: tuple[float, Strategy] | None = None
    framework: str | None = None  # the framework profile whose mechanisms it priced (planner.plans.recommend)

    @property
    def evaluated(self) -> int:
        return len(self.candidates)

    def strategy(self, i: int) -> Strategy:
        return self.candidates.strategy(i, gbs=self.gbs, seq_len=self.seq_len,
                                        dp_overlap=self.fastmodel.dp_overlap, fp8_recipe=self.fastmodel.fp8_recipe)


def _check_restrictions(model: Model, cluster: Cluster, space: SearchSpace) -> None:
    """Restrictions that leave nothing to search are input errors, named by their flag."""
    n = cluster.num_gpus
    for dim in ("tp", "pp", "cp"):
        values = getattr(space, dim)
        if values is not None and not any(n % v == 0 for v in values):
            raise InputError(dim, ",".join(map(str, values)), f"no value divides num_gpus={n}")
    if space.tp is not None and tuple(space.sp) == (True,) and set(space.tp) == {1}:
        raise InputError("sp", 1, "sequence parallelism needs tp > 1, and only tp=1 is allowed")
    if space.pp is not None and set(space.pp) == {1} and space.vp is not None and 1 not in space.vp:
        raise InputError("vp", ",".join(map(str, space.vp)), "interleaving needs pp > 1, and only pp=1 is allowed")


def _etps(model: Model, space: SearchSpace, tp: int, ep: int) -> tuple[int | None, ...]:
    """Expert tensor-parallel degrees of a layout (``None``: the attention's tp).  By default an
    MoE layout with tp > 1 is also tried with etp = 1 (Megatron-Core's usual folding: experts
    unsplit, the tp ranks join expert parallelism); ``--etp`` lists them."""
    if model.moe is None or (ep == 1 and space.etp is None) or space.etp == ():
        return (None,)
    if space.etp is None:
        return (None, 1) if tp > 1 else (None,)
    return tuple(dict.fromkeys(None if e == tp else e for e in space.etp if tp % e == 0))


def _pipeline_layouts(model: Model, space: SearchSpace, pp: int, uneven_vp: bool) -> list[tuple[str, ...]]:
    """Layouts tried for ``pp`` (``SearchSpace.layouts``): for every interleaving depth the
    default split cannot run evenly (``sim.cost.plan.vp_split``), the balanced layouts of
    ``sim.data.layout.balanced_layout`` (the embedding and loss counted as a layer each, and not)."""
    if not space.layouts or pp == 1 or uneven_vp or "interleaved" not in space.schedule:
        return []
    out: list[tuple[str, ...]] = []
    for vp, sched in _pipes(space, pp):
        if sched != "interleaved" or pp * vp > model.num_layers + 2:
            continue
        probe = Strategy(pp=pp, vp=vp, schedule="interleaved", gbs=pp, dp=1)
        if vp_split(model, probe) is not None:
            continue
        for count_ends in (True, False):
            lay = balanced_layout(model.num_layers, pp, vp, count_ends=count_ends)
            if lay is not None and lay not in out:
                out.append(lay)
    return out


def _layouts(model: Model, cluster: Cluster, space: SearchSpace, uneven_vp: bool = False) -> list[Layout]:
    _check_restrictions(model, cluster, space)
    n = cluster.num_gpus
    out = []
    tps = [t for t in divisors(n) if t <= space.max_tp] if space.tp is None else [t for t in space.tp if n % t == 0]
    eps = (1,)
    if model.moe is not None:
        eps = tuple(space.ep) if space.ep is not None else tuple(e for e in divisors(model.moe.num_experts) if e <= n)
    elif space.ep is not None and any(e > 1 for e in space.ep):
        eps = tuple(space.ep)  # let check_feasible say why (no experts)
    for precision in space.precisions(cluster):
        for tp in tps:
            rest = n // tp
            cps = [c for c in divisors(rest) if c <= space.max_cp] if space.cp is None else \
                [c for c in space.cp if rest % c == 0]
            for cp in cps:
                rest2 = rest // cp
                pps = divisors(rest2) if space.pp is None else [p for p in space.pp if rest2 % p == 0]
                for pp in pps:
                    if space.pp is None and pp > model.num_layers:
                        continue  # beyond the layer count: not a candidate at all
                    dp = rest2 // pp
                    for ep in eps:
                        for etp in _etps(model, space, tp, ep):
                            if not space.layouts_only:
                                out.append(Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, precision=precision, etp=etp))
                            for lay in _pipeline_layouts(model, space, pp, uneven_vp):
                                out.append(Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, precision=precision, etp=etp,
                                                  pipeline_layout=lay))
    return out


def _pipes(space: SearchSpace, pp: int) -> list[tuple[int, str]]:
    if pp == 1:
        return [(1, "1f1b")]
    vps = list(space.vp) if space.vp is not None else list(range(2, space.max_vp + 1))
    vps = [v for v in vps if v > 1]
    out: list[tuple[int, str]] = []
    for sched in space.schedule:
        if sched in ("1f1b", "gpipe"):
            out.append((1, sched))
        elif sched == "zero-bubble":
            out += [(1, sched)] + [(v, sched) for v in vps]
        elif sched == "interleaved":
            out += [(v, sched) for v in vps]
    if space.vp is not None and 1 not in space.vp:
        out = [(v, s) for v, s in out if v > 1]
    return out


@dataclass(slots=True)
class _Chunk:
    """What evaluating some layouts produced (merged in layout order by ``search``)."""

    considered: int
    rejected: Counter
    timed: list[tuple[int, Layout, Grid, np.ndarray, np.ndarray, np.ndarray]]  # (order, ..., flat, time, peak)
    closest: tuple[float, Strategy] | None
    closest_host: tuple[float, Strategy] | None = None


def _evaluate_layouts(fm: FastModel, space: SearchSpace, work: list[tuple[int, Layout]]) -> _Chunk:
    model, cluster, gbs, seq_len = fm.model, fm.cluster, fm.gbs, fm.seq_len
    rejected: Counter = Counter()
    considered = 0
    timed = []
    pipe_cache: dict[tuple, str | None] = {}
    mbs_raw = tuple(space.mbs) if space.mbs is not None else \
        tuple(1 << k for k in range(int(math.log2(space.max_mbs)) + 1))
    closest: tuple[float, Strategy] | None = None
    closest_host: tuple[float, Strategy] | None = None

    for n_done, (order, lay) in enumerate(work):
        progress.tick("searching", n_done, len(work), "layouts")
        sps = tuple(sorted(set(space.sp))) if lay.tp > 1 else ((False,) if False in space.sp else ())
        folded = lay.etp is not None and lay.etp != lay.tp
        if folded:  # expert tensor parallelism other than tp needs SP (check_feasible)
            sps = tuple(v for v in sps if v)
        if not sps:
            continue  # sp=1 only was asked for and tp=1 cannot use it: not a candidate
        zeros, offs, devs = _zero_entries(space, min(2, lay.dp * lay.cp))
        if not zeros:
            continue  # offload modes whose ZeRO stages the space leaves out: not candidates
        zeros, offs, devs, off_layers = _partial_offload(model, fm, space, lay, zeros, offs, devs)
        rcs = tuple(dict.fromkeys(space.recompute))
        rc_layers: tuple[int | None, ...] = ()
        if "full" in rcs and space.recompute_layers != ():
            per_stage = min(len(ls) for ls in stage_layers(model, fm.representative(lay)))
            ns = space.recompute_layers if space.recompute_layers is not None else \
                sorted({max(1, round(per_stage * f)) for f in (0.25, 0.5, 0.75)})
            ns = tuple(n for n in ns if n < per_stage)
            if ns:
                rc_layers = (None,) * len(rcs) + ns
                rcs = rcs + ("full",) * len(ns)
        pipes = _pipes(space, lay.pp) if lay.pipeline_layout is None else [(lay.layout_vp or 1, "interleaved")]
        if not pipes:
            continue
        inner = len(sps) * len(rcs) * len(zeros)
        total = len(mbs_raw) * inner * len(pipes)
        considered += total
        # Layout-level feasibility (everything check_feasible tests that vp/gbs do not change).
        try:
            rep = fm.representative(lay, sp=folded)
            check_feasible(model, cluster, rep)
            if lay.ep > 1:
                group_shape(rep, "ep")
        except InfeasibleError as exc:
            rejected[exc.reason] += total
            continue
        mbs_ok = []
        for mbs in mbs_raw:
            if gbs % (mbs * lay.dp):
                rejected[REASON_BATCH] += inner * len(pipes)
            else:
                mbs_ok.append(mbs)
        if not mbs_ok:
            continue
        pipe_ok = []
        for mbs in mbs_ok:
            m = gbs // (mbs * lay.dp)
            row = []
            for vp, sched in pipes:
                key = (lay.pp, vp, sched, m, lay.pipeline_layout)
                if key not in pipe_cache:
                    try:
                        check_feasible(model, cluster, Strategy(
                            tp=lay.tp, pp=lay.pp, dp=lay.dp, cp=lay.cp, ep=lay.ep, vp=vp, mbs=mbs, gbs=gbs,
                            seq_len=seq_len, precision=lay.precision, schedule=sched,
                            pipeline_layout=lay.pipeline_layout),
                            uneven_vp=fm.probe.uneven_vp)
                        pipe_cache[key] = None
                    except InfeasibleError as exc:
                        pipe_cache[key] = exc.reason
                reason = pipe_cache[key]
                if reason is not None:
                    rejected[reason] += inner
                row.append(reason is None)
            pipe_ok.append(tuple(row))
        if not any(any(r) for r in pipe_ok):
            continue
        grid = Grid(mbs=tuple(mbs_ok), sp=sps, recompute=rcs, zero=zeros, pipes=tuple(pipes), pipe_ok=tuple(pipe_ok),
                    offload=offs, offload_device=devs, recompute_layers=rc_layers, offload_layers=off_layers)
        if rc_layers:  # partial recomputation deeper than a model chunk (sim.cost.plan.check_feasible)
            for row in pipe_ok:
                for (vp, _), ok in zip(pipes, row):
                    if ok:
                        deep = sum(1 for n in rc_layers if n is not None and n > max(1, per_stage // vp))
                        rejected["layers"] += deep * len(sps) * len(zeros)
        if off_layers:  # partial activation offload with recomputation (sim.cost.framework: Megatron-Core refuses it)
            n_partial = sum(1 for n in off_layers if n is not None)
            n_recomputing = sum(1 for rc in rcs if rc != "none")
            n_ok = sum(ok for row in pipe_ok for ok in row)
            rejected["framework"] += n_partial * n_recomputing * len(sps) * n_ok
        ev = fm.evaluate(lay, grid)
        n_valid = int(ev.valid.sum())
        n_fit = int(ev.fits.sum())
        unfit = ev.valid & ~ev.fits
        n_dom = n_host = 0
        if ev.dominated is not None:
            n_dom = int((ev.valid & ev.dominated).sum())
            unfit = unfit & ~ev.dominated
            n_host = int((unfit & ev.fits_gpu).sum())
        for reason, n in ((REASON_OFFLOAD_UNNEEDED, n_dom), (REASON_HOST_OOM, n_host),
                          (REASON_OOM, n_valid - n_fit - n_dom - n_host)):
            if n:
                rejected[reason] += n
        if n_host and ev.host_bytes_per_node is not None:
            hb = np.where(unfit & ev.fits_gpu, ev.host_bytes_per_node, np.inf).ravel()
            j = int(np.argmin(hb))
            if closest_host is None or hb[j] < closest_host[0]:
                closest_host = (float(hb[j]), grid.strategy(lay, j, gbs=gbs, seq_len=seq_len))
        gpu_unfit = unfit & ~ev.fits_gpu if ev.fits_gpu is not None else unfit  # the GPU is the blocker
        if gpu_unfit.any():
            over = np.where(gpu_unfit, ev.memory_device_bytes, np.inf).ravel()
            j = int(np.argmin(over))
            if closest is None or over[j] < closest[0]:
                closest = (float(over[j]), grid.strategy(lay, j, gbs=gbs, seq_len=seq_len))
        if ev.step_time_s is None or n_fit == 0:
            continue
        flat = np.flatnonzero(ev.fits.ravel())
        timed.append((order, lay, grid, flat.astype(np.int64), ev.step_time_s.ravel()[flat],
                      ev.memory_device_bytes.ravel()[flat]))
    return _Chunk(considered=considered, rejected=rejected, timed=timed, closest=closest, closest_host=closest_host)


@functools.lru_cache(maxsize=64)
def _zero_entries(space: SearchSpace, dpcp: int) -> tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]:
    """The grid's Z axis: (ZeRO stage, offload, device) entries, parallel tuples.  Without
    offload every stage of the space (only the lowest without data parallelism: they hold the
    same); each offload mode with the stages it runs with (``sim.cost.plan.check_offload``; without
    data parallelism the lowest such stage)."""
    zeros: list[int] = []
    offs: list[str] = []
    devs: list[str] = []
    stages = tuple(sorted(set(space.zero)))
    for off in dict.fromkeys(space.offload):
        for dev in (("cpu",) if off == "none" else tuple(dict.fromkeys(space.offload_device))):
            ok = []
            for z in stages:
                try:
                    check_offload(Strategy(dp=2, gbs=2, zero=z, offload=off, offload_device=dev))
                except InputError:
                    continue
                ok.append(z)
            if off == "none" and dev == "cpu" and "none" in space.offload:
                ok = list(stages)
            if dpcp == 1:
                ok = ok[:1]
            for z in ok:
                zeros.append(z)
                offs.append(off)
                devs.append(dev)
    return tuple(zeros), tuple(offs), tuple(devs)


def _partial_offload(model: Model, fm: FastModel, space: SearchSpace, lay: Layout, zeros: tuple[int, ...],
                     offs: tuple[str, ...], devs: tuple[str, ...]) -> tuple[tuple, tuple, tuple, tuple]:
    """The Z axis with partial activation offload (``SearchSpace.offload_layers``): every entry
    that offloads activations again with each N below the stage's layers, N in
    ``Grid.offload_layers`` (empty when there is none).  Megatron-Core runs it without pipelining
    and without recomputation (``TransformerConfig.__post_init__``): only ``pp == 1`` layouts,
    and only where the space has ``recompute=none``."""
    if space.offload_layers == () or lay.pp > 1 or "none" not in space.recompute:
        return zeros, offs, devs, ()
    acts = [z for z, off in enumerate(offs) if offload_flags(off)[2]]
    if not acts:
        return zeros, offs, devs, ()
    layers = min(len(ls) for ls in stage_layers(model, fm.representative(lay)))
    ns = space.offload_layers if space.offload_layers is not None else \
        sorted({max(1, round(layers * f)) for f in (0.25, 0.5, 0.75)})
    ns = tuple(n for n in ns if n < layers)
    if not ns:
        return zeros, offs, devs, ()
    extra = [(z, n) for z in acts for n in ns]
    return (zeros + tuple(zeros[z] for z, _ in extra), offs + tuple(offs[z] for z, _ in extra),
            devs + tuple(devs[z] for z, _ in extra), (None,) * len(zeros) + tuple(n for _, n in extra))


_FORKED: tuple[FastModel, SearchSpace] | None = None  # set before forking workers


def _work_in_child(work: list[tuple[int, Layout]]) -> _Chunk:
    assert _FORKED is not None
    with progress.silenced():  # the parent reports as groups finish
        return _evaluate_layouts(_FORKED[0], _FORKED[1], work)


def default_workers(cluster: Cluster) -> int:
    """Processes for a search: the network model dominates on big clusters (routing every flow
    of 10^4 GPUs per group shape), so those use every core; small ones stay in-process."""
    if cluster.num_gpus < 4096 or "fork" not in mp.get_all_start_methods():
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


def _parallel(fm: FastModel, space: SearchSpace, layouts: list[Layout], workers: int) -> list[_Chunk]:
    """Split layouts over forked processes: one task per data-parallel group shape (its layouts
    route the same network shape once), handed to whichever process is free; results in
    task order, so they do not depend on which process ran what."""
    global _FORKED
    groups: dict[tuple[int, int], list[tuple[int, Layout]]] = {}
    for order, lay in enumerate(layouts):
        groups.setdefault((lay.tp, lay.dp * lay.cp), []).append((order, lay))
    tasks = sorted(groups.values(), key=len, reverse=True)  # the longest first: less idle at the end
    _FORKED = (fm, space)
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as pool:
            futures = {pool.submit(_work_in_child, t): len(t) for t in tasks}
            done = 0
            for f in as_completed(futures):
                done += futures[f]
                progress.tick("searching", done, len(layouts), "layouts")
            return [f.result() for f in futures]
    finally:
        _FORKED = None


def search(model: Model, cluster: Cluster, *, gbs: int, seq_len: int, space: SearchSpace | None = None,
           plan_kwargs: Mapping[str, object] | None = None, dp_overlap: bool = True,
           net: Network | None = None, eff: KernelEfficiency | None = None,
           workers: int | None = None, memory_limit_bytes: float | None = None,
           share: FastModel | None = None) -> SearchResult:
    """Enumerate, prune and time the strategy space (module docstring).  ``workers``: processes
    (default ``default_workers``); results do not depend on it.  ``memory_limit_bytes``: the
    most a plan's peak may use (default the GPU's memory; ``planner.plans.recommend`` keeps a
    headroom free).  ``share``: the fast model of an earlier search of the same model, cluster,
    batch and framework settings, whose network and cached pieces this one reuses."""
    t0 = time.perf_counter()
    space = space or SearchSpace()
    if isinstance(gbs, bool) or not isinstance(gbs, int) or gbs < 1:
        raise InputError("gbs", gbs, "must be a positive integer")
    fm = FastModel(model, cluster, gbs=gbs, seq_len=seq_len, plan_kwargs=plan_kwargs, dp_overlap=dp_overlap,
                   net=net, eff=eff, fp8_recipe=space.fp8_recipe, memory_limit_bytes=memory_limit_bytes, share=share)
    layouts = _layouts(model, cluster, space, uneven_vp=fm.probe.uneven_vp)
    progress.start("searching")
    workers = default_workers(cluster) if workers is None else workers
    if workers > 1 and len(layouts) > 1:
        chunks = _parallel(fm, space, layouts, min(workers, len(layouts)))
    else:
        chunks = [_evaluate_layouts(fm, space, list(enumerate(layouts)))]

    rejected: Counter = Counter()
    closest: tuple[float, Strategy] | None = None
    closest_host: tuple[float, Strategy] | None = None
    for ch in chunks:
        rejected.update(ch.rejected)
        if ch.closest is not None and (closest is None or ch.closest[0] < closest[0]):
            closest = ch.closest
        if ch.closest_host is not None and (closest_host is None or ch.closest_host[0] < closest_host[0]):
            closest_host = ch.closest_host
    timed = sorted((t for ch in chunks for t in ch.timed), key=lambda t: t[0])

    def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    cands = Candidates(layouts=[t[1] for t in timed], grids=[t[2] for t in timed],
                       layout_id=cat([np.full(t[3].size, i, dtype=np.int32) for i, t in enumerate(timed)], np.int32),
                       flat_index=cat([t[3] for t in timed], np.int64), step_time_s=cat([t[4] for t in timed], float),
                       memory_device_bytes=cat([t[5] for t in timed], float))
    return SearchResult(model=model, cluster=cluster, gbs=gbs, seq_len=seq_len, candidates=cands,
                        considered=sum(ch.considered for ch in chunks), rejected=rejected,
                        search_time_s=time.perf_counter() - t0, fastmodel=fm, layouts_timed=len(timed),
                        closest_oom=closest, closest_host_oom=closest_host)
