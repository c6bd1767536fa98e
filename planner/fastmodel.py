"""Step time and peak memory of many candidate strategies at once, equal to the analytic model.

``simulate_analytic`` (``sim.analytic``) costs about a millisecond per plan, mostly Python
overhead that repeats across candidates.  This module evaluates a whole *layout* (fixed
``num_gpus, tp, cp, pp, dp, ep, precision``) over a grid of the remaining choices
(micro-batch x sequence parallelism x recomputation x ZeRO stage x pipeline schedule/vp) with
numpy, from pieces that are computed once and cached:

* per layer and micro-batch (depends on ``tp, cp, ep, mbs, sp, recompute, precision``): the
  ``LayerCost`` of ``sim.costs`` (``_layer_cost`` on the ``sim.ops.layer_ops``), the
  embedding/head op times (``sim.compute.ops_time``), the saved activations
  (``sim.memory.activation_bytes_per_layer``);
* per pipeline stage *class* (depends on ``tp, ep, pp``): stages with the same number of
  layers, MoE layers and first/last role cost the same, so only the first stage of each class
  is evaluated (the others finish earlier and hold fewer in-flight micro-batches; see
  ``_Stages``), with ``sim.memory.stage_params``;
* per data-parallel group shape: the gradient/parameter collectives of
  ``sim.collectives.Network`` (its own cache makes repeated shapes cheap).

The composition (stage sums, FSDP prefetch exposure, the closed-form pipeline schedules and
the end-of-step tail) mirrors ``sim.costs.step_costs`` and ``sim.analytic.simulate_analytic``
term by term; ``tests/test_recommend_fastmodel.py`` checks it against ``simulate_analytic``
(step time) and ``sim.memory.memory_breakdown`` (peak bytes) to 1e-9 relative on random
candidates, and ``planner.recommend`` re-checks the plans it reports at run time.  Anything
calibrated in the leaf functions (kernel efficiencies, collectives, runtime constants) flows
through unchanged.  Known difference: sums of identical layers are ``n * x`` instead of ``n``
additions (relative error ~1e-15).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from sim import costs as _costs
from sim.collectives import Network
from sim.compute import KernelEfficiency, default_efficiency, ops_time
from sim.memory import (LOSS_BYTES_PER_LOGIT, StageParams, activation_bytes_per_layer, default_runtime,
                        inflight_microbatches, model_has_dropout, model_state_bytes, stage_layers, stage_params)
from sim.ops import embedding_ops, head_ops, layer_ops
from sim.plan import Plan
from sim.specs import Cluster, Model, Strategy



def default_network(cluster: Cluster) -> Network:
    """The network ``sim.simulate.simulate`` prices collectives on (calibrated efficiency)."""
    make = getattr(_costs, "default_network", None)
    return make(cluster) if make is not None else Network(cluster)


def _accepted(fn: Callable, kwargs: Mapping[str, object]) -> dict[str, object]:
    """The entries of ``kwargs`` that ``fn`` takes as keywords (and that are set)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params and v is not None}


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """The outer loop of the search: degrees that fix the rank placement, and the precision."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    precision: str

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp


@dataclass(frozen=True, kw_only=True, slots=True)
class Grid:
    """The inner choices evaluated together for one layout (all combinations).

    ``pipes`` are ``(vp, schedule)`` pairs.  ``pipe_ok[i][k]`` says whether pipe ``k`` is
    feasible with micro-batch ``mbs[i]`` (the interleaved schedule needs the micro-batch count
    divisible by ``pp``).
    """

    mbs: tuple[int, ...]
    sp: tuple[bool, ...]
    recompute: tuple[str, ...]
    zero: tuple[int, ...]
    pipes: tuple[tuple[int, str], ...]
    pipe_ok: tuple[tuple[bool, ...], ...]

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (len(self.mbs), len(self.sp), len(self.recompute), len(self.zero), len(self.pipes))

    def strategy(self, layout: Layout, flat_index: int, *, gbs: int, seq_len: int) -> Strategy:
        i, j, k, z, q = np.unravel_index(int(flat_index), self.shape)
        vp, schedule = self.pipes[q]
        return Strategy(tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp, ep=layout.ep, vp=vp,
                        mbs=self.mbs[i], gbs=gbs, seq_len=seq_len, zero=self.zero[z], sp=self.sp[j],
                        recompute=self.recompute[k], precision=layout.precision, schedule=schedule)


@dataclass(frozen=True, slots=True)
class LayoutEval:
    """Arrays of ``Grid.shape``: ``valid`` (feasible), ``memory_peak_bytes`` (NaN where not
    valid), ``fits``; ``step_time_s`` is None when nothing fits (timing skipped)."""

    valid: np.ndarray
    memory_peak_bytes: np.ndarray
    fits: np.ndarray
    step_time_s: np.ndarray | None


@dataclass(frozen=True, slots=True)
class _LayerTerms:
    fwd: float
    bwd: float
    rc: float
    ex_f: float  # exposed TP + CP + EP communication, forward
    ex_b: float


@dataclass(frozen=True, slots=True)
class _TimeTerms:
    """Per-micro-batch times that depend on (tp, cp, ep, mbs, sp, recompute, precision)."""

    dense: _LayerTerms
    moe: _LayerTerms | None
    emb_f: float
    emb_b: float
    head_f: float
    head_b: float


@dataclass(frozen=True, slots=True)
class _ActTerms:
    """Saved activation bytes per layer (same key as ``_TimeTerms``)."""

    dense: float
    moe: float
    full_extra: float  # full recomputation: one layer's activations live during its recompute


@dataclass(frozen=True, slots=True)
class _StageClass:
    n_layers: int
    n_moe: int
    first: bool
    last: bool
    index: int  # first stage of this class
    count: int  # stages of this class
    before: tuple[int, ...]  # stages of each class (by class order) before ``index``
    dense_params: float
    expert_params: float
    layers: tuple[int, ...]


class FastModel:
    """Cached, vectorised ``simulate_analytic`` + ``memory_breakdown`` for one model, cluster,
    global batch and sequence length (module docstring)."""

    def __init__(self, model: Model, cluster: Cluster, *, gbs: int, seq_len: int,
                 plan_kwargs: Mapping[str, object] | None = None, dp_overlap: bool = True,
                 net: Network | None = None, eff: KernelEfficiency | None = None) -> None:
        self.model, self.cluster = model, cluster
        self.gbs, self.seq_len = gbs, seq_len
        self.plan_kwargs = dict(plan_kwargs or {})
        self.dp_overlap = dp_overlap
        # A probe plan validates the keyword arguments and gives the fields the cost model reads.
        probe = Plan(model=model, cluster=cluster, strategy=self._probe_strategy(), **self.plan_kwargs)
        self.attention = probe.attention
        self.eager_elementwise = bool(getattr(probe, "eager_elementwise", False))
        self.grad_accumulation = getattr(probe, "grad_accumulation", "fused")
        self.fsdp_copies = bool(getattr(probe, "fsdp_copies", False))
        self._act_kwargs = _accepted(activation_bytes_per_layer, {
            "attention": probe.attention, "selective_policy": getattr(probe, "selective_policy", None)})
        self._net = net  # built on first use: routing tables of a huge cluster cost seconds
        self.eff = eff or default_efficiency()
        self.comm = _costs.default_comm_runtime()
        self.mem_rt = default_runtime()
        self._act: dict[tuple, _ActTerms] = {}
        self._time: dict[tuple, _TimeTerms] = {}
        self._stages: dict[tuple, tuple[_StageClass, ...]] = {}
        self._coll: dict[tuple, float] = {}
        self._inflight: dict[tuple, float] = {}

    @property
    def net(self) -> Network:
        if self._net is None:
            self._net = default_network(self.cluster)
        return self._net

    # ------------------------------------------------------------------ cached pieces

    def _probe_strategy(self) -> Strategy:
        n = self.cluster.num_gpus
        return Strategy(dp=n, gbs=n, seq_len=self.seq_len)

    def plan(self, strategy: Strategy) -> Plan:
        """The ``Plan`` of ``strategy`` with this model's settings (what ``simulate`` would get)."""
        return Plan(model=self.model, cluster=self.cluster, strategy=strategy, **self.plan_kwargs)

    def representative(self, layout: Layout, *, mbs: int = 1, sp: bool = False, recompute: str = "none",
                       zero: int = 0, vp: int = 1, schedule: str = "1f1b") -> Strategy:
        """A valid ``Strategy`` of this layout (the global batch replaced by one that divides)."""
        m = max(1, self.gbs // (mbs * layout.dp))
        return Strategy(tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp, ep=layout.ep, vp=vp, mbs=mbs,
                        gbs=mbs * layout.dp * m, seq_len=self.seq_len, zero=zero, sp=sp, recompute=recompute,
                        precision=layout.precision, schedule=schedule, dp_overlap=self.dp_overlap)

    def _micro_strategy(self, key: tuple) -> Strategy:
        tp, cp, ep, mbs, sp, recompute, precision = key
        dp = self.cluster.num_gpus // (tp * cp)
        return Strategy(tp=tp, cp=cp, ep=ep, dp=dp, pp=1, mbs=mbs, gbs=mbs * dp, seq_len=self.seq_len, sp=sp,
                        recompute=recompute, precision=precision, dp_overlap=self.dp_overlap)

    def act_terms(self, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str, precision: str) -> _ActTerms:
        key = (tp, cp, ep, mbs, sp, recompute, precision)
        got = self._act.get(key)
        if got is None:
            model, s = self.model, self._micro_strategy(key)
            full_extra = 0.0
            kw = self._act_kwargs
            if recompute == "full":
                # as sim.memory.memory_breakdown: the recomputed layer's activations, default policy
                full_extra = activation_bytes_per_layer(model, s.with_(recompute="none"), attention=self.attention,
                                                        moe=model.moe is not None)
            got = _ActTerms(
                dense=activation_bytes_per_layer(model, s, moe=False, **kw),
                moe=activation_bytes_per_layer(model, s, moe=True, **kw) if model.moe else 0.0,
                full_extra=full_extra)
            self._act[key] = got
        return got

    def time_terms(self, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str, precision: str) -> _TimeTerms:
        key = (tp, cp, ep, mbs, sp, recompute, precision)
        got = self._time.get(key)
        if got is not None:
            return got
        model, gpu, s = self.model, self.cluster.gpu, self._micro_strategy(key)
        plan = self.plan(s)

        def terms(moe: bool) -> _LayerTerms:
            lc = _costs._layer_cost(plan, self.net, layer_ops(model, s, moe=moe, attention=self.attention),
                                    self.eff, 0.0)
            return _LayerTerms(fwd=lc.fwd_s, bwd=lc.bwd_s, rc=lc.recompute_s,
                               ex_f=lc.exposed_tp_fwd_s + lc.exposed_cp_fwd_s + lc.exposed_ep_fwd_s,
                               ex_b=lc.exposed_tp_bwd_s + lc.exposed_cp_bwd_s + lc.exposed_ep_bwd_s)

        emb_f, emb_b = ops_time(gpu, precision, embedding_ops(model, s), self.eff)
        head_f, head_b = ops_time(gpu, precision, head_ops(model, s), self.eff, eager=self.eager_elementwise)
        got = _TimeTerms(dense=terms(False), moe=terms(True) if model.moe is not None else None,
                         emb_f=emb_f, emb_b=emb_b, head_f=head_f, head_b=head_b)
        self._time[key] = got
        return got

    def stage_classes(self, layout: Layout) -> tuple[_StageClass, ...]:
        key = (layout.tp, layout.ep, layout.pp)
        got = self._stages.get(key)
        if got is not None:
            return got
        model, p = self.model, layout.pp
        s = self.representative(layout)
        sigs: list[tuple] = []
        per_stage: list[int] = []
        for i, layers in enumerate(stage_layers(model, s)):
            sig = (len(layers), sum(model.is_moe_layer(j) for j in layers), i == 0, i == p - 1)
            if sig not in sigs:
                sigs.append(sig)
            per_stage.append(sigs.index(sig))
        all_layers = stage_layers(model, s)
        classes = []
        for c, (n, nm, first, last) in enumerate(sigs):
            idx = per_stage.index(c)
            before = tuple(per_stage[:idx].count(k) for k in range(len(sigs)))
            params = stage_params(model, s, all_layers[idx], first=first, last=last)
            classes.append(_StageClass(n_layers=n, n_moe=nm, first=first, last=last, index=idx,
                                       count=per_stage.count(c), before=before, dense_params=params.dense_params,
                                       expert_params=params.expert_params, layers=tuple(all_layers[idx])))
        got = tuple(classes)
        self._stages[key] = got
        return got

    def _collective(self, layout: Layout, op: str, dim: str, nbytes: float) -> float:
        """``Network.dim_collective_time_s`` for this layout, as ``sim.costs.step_costs`` calls it
        (all groups of ``dim`` at once)."""
        key = (layout.tp, layout.cp, layout.pp, layout.dp, layout.ep, op, dim, nbytes)
        got = self._coll.get(key)
        if got is None:
            got = self.net.dim_collective_time_s(op, self.representative(layout), dim, nbytes) \
                + getattr(self.eff, "collective_overhead_s", 0.0)
            self._coll[key] = got
        return got

    def _p2p_s(self, layout: Layout, mbs: int, sp: bool) -> float:
        """One pipeline send of a micro-batch's activations (``sim.costs.step_costs``): every
        stage boundary at once; without SP the receiving TP ranks all-gather the 1/tp pieces."""
        if layout.pp == 1:
            return 0.0
        nbytes = 2.0 * mbs * (self.seq_len // layout.cp) * self.model.hidden_size / layout.tp
        t = self._collective(layout, "p2p", "pp", nbytes)
        if layout.tp > 1 and not sp:
            t += self._collective(layout, "all_gather", "tp", nbytes * layout.tp)
        return t

    def _inflight_mb(self, pp: int, m: int, vp: int, schedule: str, stage: int) -> float:
        key = (pp, m, vp, schedule, stage)
        got = self._inflight.get(key)
        if got is None:
            s = Strategy(pp=pp, dp=1, mbs=1, gbs=m, vp=vp, schedule=schedule)
            got = inflight_microbatches(s, stage)
            self._inflight[key] = got
        return got

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, layout: Layout, grid: Grid) -> LayoutEval:
        """Peak memory of every grid point, and step time of every point when any fits."""
        model, cl = self.model, self.cluster
        M, S, R, Z, K = grid.shape
        shape5 = grid.shape
        classes = self.stage_classes(layout)
        p, dpcp = layout.pp, layout.dp * layout.cp

        keys = [(layout.tp, layout.cp, layout.ep, mbs, sp, rc, layout.precision)
                for mbs in grid.mbs for sp in grid.sp for rc in grid.recompute]

        def a_arr(terms: list, get: Callable) -> np.ndarray:  # (M, S, R) -> broadcastable 5-D
            return np.array([get(t) for t in terms], dtype=float).reshape(M, S, R, 1, 1)

        zero = np.array(grid.zero, dtype=int).reshape(1, 1, 1, Z, 1)
        vp = np.array([v for v, _ in grid.pipes], dtype=float).reshape(1, 1, 1, 1, K)
        m_list = [self.gbs // (mbs * layout.dp) for mbs in grid.mbs]
        m = np.array(m_list, dtype=float).reshape(M, 1, 1, 1, 1)
        valid = np.broadcast_to(np.array(grid.pipe_ok, dtype=bool).reshape(M, 1, 1, 1, K), shape5)
        rc_full = np.array([rc == "full" for rc in grid.recompute], dtype=bool).reshape(1, 1, R, 1, 1)

        # ---- memory (sim.memory.memory_breakdown), per stage class ----------------------
        rt = self.mem_rt
        tok = np.array([mbs * self.seq_len // layout.cp for mbs in grid.mbs], dtype=float).reshape(M, 1, 1, 1, 1)
        acts = [self.act_terms(*k) for k in keys]
        dense_act = a_arr(acts, lambda t: t.dense)
        moe_act = a_arr(acts, lambda t: t.moe) if model.moe is not None else 0.0
        full_extra = a_arr(acts, lambda t: t.full_extra)
        dropout = model_has_dropout(model)
        reps = [self.representative(layout, zero=z) for z in grid.zero]
        peak = None
        for c in classes:
            wgo = np.empty(Z)
            for zi, z in enumerate(grid.zero):
                w, g, o = model_state_bytes(StageParams(c.dense_params, c.expert_params), reps[zi])
                if z >= 3:
                    w += 2 * 2 * (c.dense_params + c.expert_params) / max(1, c.n_layers)
                wgo[zi] = w + g + o
            wgo5 = wgo.reshape(1, 1, 1, Z, 1)
            infl = np.array([[self._inflight_mb(p, mm, v, sch, c.index) for v, sch in grid.pipes] for mm in m_list],
                            dtype=float).reshape(M, 1, 1, 1, K)
            act = ((c.n_layers - c.n_moe) * dense_act + c.n_moe * moe_act) * infl
            if c.n_layers:
                act = act + np.where(rc_full, full_extra, 0.0)
            if c.first and dropout:
                act = act + tok * model.hidden_size * infl
            if c.last:
                act = act + tok * model.vocab_size / layout.tp * LOSS_BYTES_PER_LOGIT
            live = wgo5 + act
            total = live + (rt.workspace_bytes + rt.fragmentation_fraction * live)
            peak = total if peak is None else np.maximum(peak, total)
        assert peak is not None
        peak = np.where(valid, np.broadcast_to(peak, shape5), np.nan)
        fits = valid & (peak <= cl.gpu.hbm_bytes)
        if not fits.any():
            return LayoutEval(valid=valid, memory_peak_bytes=peak, fits=fits, step_time_s=None)

        # ---- time (sim.costs.step_costs + sim.analytic.simulate_analytic) ---------------
        times = [self.time_terms(*k) for k in keys]

        def lt(get):
            d = a_arr(times, lambda t: get(t.dense))
            e = a_arr(times, lambda t: get(t.moe)) if model.moe is not None else 0.0
            return d, e

        (d_f, e_f), (d_b, e_b), (d_r, e_r) = lt(lambda x: x.fwd), lt(lambda x: x.bwd), lt(lambda x: x.rc)
        (d_xf, e_xf), (d_xb, e_xb) = lt(lambda x: x.ex_f), lt(lambda x: x.ex_b)
        emb_f, emb_b = a_arr(times, lambda t: t.emb_f), a_arr(times, lambda t: t.emb_b)
        head_f, head_b = a_arr(times, lambda t: t.head_f), a_arr(times, lambda t: t.head_b)
        p2p = np.array([[self._p2p_s(layout, mbs, sp) for sp in grid.sp] for mbs in grid.mbs],
                       dtype=float).reshape(M, S, 1, 1, 1)
        is_zb = np.array([sch == "zero-bubble" for _, sch in grid.pipes], dtype=bool).reshape(1, 1, 1, 1, K)
        z3 = zero >= 3

        g_b, pg_b = self.comm.grad_reduce_bytes_per_param, self.comm.param_gather_bytes_per_param
        sigma = getattr(self.eff, "overlap_compute_slowdown", 0.0)
        hbm = cl.gpu.hbm_bytes_per_s * cl.gpu.hbm_efficiency
        acc_b = np.array([self.comm.grad_accumulation_bytes(self.grad_accumulation, mm) for mm in m_list],
                         dtype=float).reshape(M, 1, 1, 1, 1)
        ep_dp = max(1, dpcp // layout.ep)
        F, B, W, N, GS, PG, OPT = [], [], [], [], [], [], []
        for c in classes:
            nd, nm = c.n_layers - c.n_moe, c.n_moe
            lf = nd * d_f + nm * e_f
            lb = nd * d_b + nm * e_b
            lbr = lb + (nd * d_r + nm * e_r)
            ex_f = nd * d_xf + nm * e_xf
            ex_b = nd * d_xb + nm * e_xb
            extra_f = (emb_f if c.first else 0.0) + (head_f if c.last else 0.0)
            extra_b = (emb_b if c.first else 0.0) + (head_b if c.last else 0.0)
            synced = c.dense_params + (c.expert_params if ep_dp > 1 else 0.0)
            gs = np.zeros(Z)
            pg = np.zeros(Z)
            ag3 = rs3 = 0.0
            if dpcp > 1 and synced > 0:
                for zi, z in enumerate(grid.zero):
                    if z == 0:
                        gs[zi] = self._collective(layout, "all_reduce", "dp_cp", synced * g_b)
                    elif z in (1, 2):
                        gs[zi] = self._collective(layout, "reduce_scatter", "dp_cp", synced * g_b)
                        pg[zi] = self._collective(layout, "all_gather", "dp_cp", synced * pg_b)
                    else:
                        ag3 = self._collective(layout, "all_gather", "dp_cp", synced * pg_b)
                        rs3 = self._collective(layout, "reduce_scatter", "dp_cp", synced * g_b)
                        gs[zi] = rs3
            n1 = max(1, c.n_layers)
            if (ag3 or rs3) and not self.dp_overlap:
                z3f = np.where(z3, ag3, 0.0)
                z3b = np.where(z3, ag3 + rs3, 0.0)
            elif ag3 or rs3:
                z3f = np.where(z3, np.maximum(0.0, ag3 - lf - extra_f) + ag3 / n1, 0.0)
                z3b = np.where(z3, np.maximum(0.0, ag3 + rs3 - lbr - extra_b) + rs3 / n1, 0.0)
            else:
                z3f = z3b = 0.0
            if ag3 or rs3:  # compute slowed by the hidden FSDP traffic (sim.costs)
                slow_f = np.where(z3, sigma * np.maximum(0.0, ag3 - z3f), 0.0)
                slow_b = np.where(z3, sigma * np.maximum(0.0, ag3 + rs3 - z3b), 0.0)
            else:
                slow_f = slow_b = 0.0
            # gradient accumulation pass per micro-batch (sim.costs; FSDP adds into its shard)
            acc_p = np.array([(c.dense_params + c.expert_params) if z < 3 else
                              c.dense_params / dpcp + c.expert_params / max(1, dpcp // layout.ep)
                              for z in grid.zero], dtype=float).reshape(1, 1, 1, Z, 1)
            accum = acc_p * acc_b / hbm
            copy_f = copy_b = 0.0
            if self.fsdp_copies and dpcp > 1:  # FSDP2 packing around ZeRO-3 collectives (sim.costs)
                local = c.dense_params + c.expert_params
                copy_f = np.where(z3, local * self.comm.fsdp_gather_copy_bytes_per_param / hbm, 0.0)
                copy_b = np.where(z3, local * (self.comm.fsdp_gather_copy_bytes_per_param
                                               + self.comm.fsdp_reduce_copy_bytes_per_param) / hbm, 0.0)
            fwd = ((lf + extra_f) + slow_f + copy_f + ex_f) + z3f
            bwd = ((lbr + extra_b) + slow_b + accum + copy_b + ex_b) + z3b
            nf, nb = (0 if c.last else 1), (0 if c.first else 1)
            F.append(fwd + nf * vp * p2p)
            B.append(bwd + nb * vp * p2p)
            W.append(0.5 * lb)
            N.append(c.n_layers)
            GS.append(gs.reshape(1, 1, 1, Z, 1))
            PG.append(pg.reshape(1, 1, 1, Z, 1))
            opt = np.empty(Z)
            opt_bytes = self.comm.optimizer_bytes_per_param + (
                getattr(self.comm, "fp16_extra_bytes_per_param", 0.0) if layout.precision == "fp16" else 0.0)
            for zi, z in enumerate(grid.zero):
                shard = dpcp if z >= 1 else 1
                local = c.dense_params / shard + c.expert_params / (max(1, shard // layout.ep) if z >= 1 else 1)
                opt[zi] = local * opt_bytes / (cl.gpu.hbm_bytes_per_s * cl.gpu.hbm_efficiency)
            OPT.append(opt.reshape(1, 1, 1, Z, 1))

        tot = [f + b for f, b in zip(F, B)]
        slowest = tot[0]
        for t in tot[1:]:
            slowest = np.maximum(slowest, t)
        summed = sum(c.count * t for c, t in zip(classes, tot))
        t_pipe = summed / vp + (m - 1.0 / vp) * slowest
        if p > 1 and is_zb.any():
            drain = tot[0] - W[0]
            for t, w in zip(tot[1:], W[1:]):
                drain = np.maximum(drain, t - w)
            t_zb = m * slowest + (p - 1) * drain / vp
            t_pipe = np.where(is_zb, t_zb, t_pipe)

        step = None
        for ci, c in enumerate(classes):
            tail = sum(k * B[j] for j, k in enumerate(c.before) if k) if any(c.before) else 0.0
            last_end = t_pipe - tail
            if np.all(z3):
                ready = last_end
            else:
                window = B[ci] * (N[ci] - 1) / max(1, N[ci]) if self.dp_overlap else 0.0
                slow = sigma * np.minimum(GS[ci], window)
                ready = np.where(z3, last_end, np.maximum(last_end + slow, last_end - window + GS[ci]))
            if self.dp_overlap:
                gather = np.maximum(0.0, PG[ci] - F[ci])
                ready = ready + sigma * (PG[ci] - gather)
            else:
                gather = PG[ci]
            end = ready + OPT[ci] + gather
            step = end if step is None else np.maximum(step, end)
        step = np.where(valid, np.broadcast_to(step, shape5), np.nan)
        return LayoutEval(valid=valid, memory_peak_bytes=peak, fits=fits, step_time_s=step)
