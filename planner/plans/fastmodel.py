"""The search's call of the one step model: many candidate strategies at once, as numpy arrays.

``simulate_analytic`` costs one plan at a time.  The search evaluates a whole *layout* (fixed
``num_gpus, tp, cp, pp, dp, ep, precision``) over a grid of the remaining choices (micro-batch
x sequence parallelism x recomputation x ZeRO stage x pipeline schedule/vp) by calling the same
functions with arrays of the grid's broadcast shape:

* per layer and micro-batch (depends on ``tp, cp, ep, etp, mbs, sp, recompute, precision``): the
  ``sim.cost.costs.layer_cost`` of the layer's ops, the embedding/head (``sim.cost.costs.end_costs``) and
  the saved activations (``sim.cost.memory.activation_bytes_per_layer``), computed once and cached;
* per pipeline stage shape (``sim.layers.stages.stage_shapes``): ``sim.cost.step.stage_pieces`` (ZeRO/FSDP
  exposure, optimizer, accumulation, FSDP copies), ``sim.cost.step.stage_times`` and
  ``sim.cost.memory.stage_memory``, with the data-parallel collectives of ``sim.cost.costs.dp_collectives``
  cached per layout and shape;
* the step: ``sim.cost.step.compose`` (pipeline closed forms and the end-of-step tail).

The ZeRO axis of the grid is a list of (ZeRO stage, offload, offload device) entries
(``Grid.offload``): offload modes ride on the stages they run with.  An offload entry whose
twin without offload (same ZeRO stage) fits is *dominated* (``LayoutEval.dominated``):
offloading only adds host-link copies and moves the optimizer step to the slower host, so it
can only pay where the plan does not fit without it; dominated points are not timed.

Nothing here composes a step of its own: ``tests/test_recommend_fastmodel.py`` checks that the
two ways of calling agree (search values == ``simulate_analytic`` on random candidates).  The
only difference is that the search sums ``n`` identical layers as ``n * x`` (~1e-15 relative).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from sim.layers.compute import KernelEfficiency, default_efficiency
from sim.cost.costs import (LayerCost, default_network, dp_collectives, end_costs, plan_layer_ops, layer_cost, p2p_bytes,
                       p2p_time_s, piece_settings, plan_comm_runtime)
from sim.cost.memory import (cluster_extra_bytes, eager_attention_block_bytes, head_activation_bytes, inflight,
                        layer_activations, layer_backward_bytes, recompute_time_fraction, split_of,
                        offloaded_activation_bytes, stage_memory, fp8_weight_cache_of, gpus_sharing_a_host, within_host)
from sim.net.network import Network
from sim.layers.ops import LayerOps
from sim.cost.offload import OffloadRates, host_spec, offload_constants, offload_rates
from sim.cost.plan import Plan
from sim.data.runtime import default_runtime, state_layout
from sim.data.hardware import Cluster
from sim.data.specs import Model, Strategy, expert_dp_size, offload_flags
from sim.layers.stages import (StageShape, layer_params, stage_embedding_params, stage_index_shapes,
                               stage_parameter_tensors, stage_shapes)
from sim.cost.step import ChunkSums, DpCollectives, compose, layout_chunk_sums, stage_pieces, stage_times


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """The outer loop of the search: degrees that fix the rank placement, and the precision."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    precision: str
    etp: int | None = None  # expert tensor parallelism (None: tp)
    # a pipeline layout (sim.data.layout) fixing vp and every chunk's layers; None: the default split
    pipeline_layout: tuple[str, ...] | None = None

    @property
    def layout_vp(self) -> int | None:
        """The vp a pipeline layout fixes (None without one)."""
        return None if self.pipeline_layout is None else len(self.pipeline_layout) // self.pp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_dp(self) -> int:
        return expert_dp_size(tp=self.tp, cp=self.cp, dp=self.dp, etp=self.etp, ep=self.ep)


@dataclass(frozen=True, kw_only=True, slots=True)
class Grid:
    """The inner choices evaluated together for one layout (all combinations).

    ``pipes`` are ``(vp, schedule)`` pairs.  ``pipe_ok[i][k]`` says whether pipe ``k`` is
    feasible with micro-batch ``mbs[i]`` (the interleaved schedule needs the micro-batch count
    divisible by ``pp``).  ``offload`` / ``offload_device`` (empty: ``none`` / ``cpu``) pair
    with ``zero`` entry by entry: the Z axis is (ZeRO stage, offload, device) entries.
    """

    mbs: tuple[int, ...]
    sp: tuple[bool, ...]
    recompute: tuple[str, ...]
    zero: tuple[int, ...]
    pipes: tuple[tuple[int, str], ...]
    pipe_ok: tuple[tuple[bool, ...], ...]
    offload: tuple[str, ...] = ()
    offload_device: tuple[str, ...] = ()
    # partial recomputation paired with ``recompute`` entry by entry (empty: none): Megatron's
    # block method with N layers per model chunk (Strategy.recompute_num_layers)
    recompute_layers: tuple[int | None, ...] = ()
    # partial activation offload paired with ``zero`` entry by entry (empty: none): Megatron-Core's
    # --cpu-offloading-num-layers N (Strategy.offload_num_layers) on entries that offload activations
    offload_layers: tuple[int | None, ...] = ()

    def offload_layers_of(self, z: int) -> int | None:
        return self.offload_layers[z] if self.offload_layers else None

    def recompute_of(self, k: int) -> int | None:
        return self.recompute_layers[k] if self.recompute_layers else None

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (len(self.mbs), len(self.sp), len(self.recompute), len(self.zero), len(self.pipes))

    def offload_of(self, z: int) -> tuple[str, str]:
        return (self.offload[z] if self.offload else "none", self.offload_device[z] if self.offload_device else "cpu")

    def strategy(self, layout: Layout, flat_index: int, *, gbs: int, seq_len: int) -> Strategy:
        i, j, k, z, q = np.unravel_index(int(flat_index), self.shape)
        vp, schedule = self.pipes[q]
        off, dev = self.offload_of(int(z))
        return Strategy(tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp, ep=layout.ep, etp=layout.etp, vp=vp,
                        mbs=self.mbs[i], gbs=gbs, seq_len=seq_len, zero=self.zero[z], sp=self.sp[j],
                        recompute=self.recompute[k], precision=layout.precision, schedule=schedule,
                        offload=off, offload_device=dev, recompute_num_layers=self.recompute_of(int(k)),
                        recompute_method="block" if self.recompute_of(int(k)) is not None else "uniform",
                        offload_num_layers=self.offload_layers_of(int(z)), pipeline_layout=layout.pipeline_layout)


@dataclass(frozen=True, slots=True)
class LayoutEval:
    """Arrays of ``Grid.shape``: ``valid`` (feasible), ``memory_device_bytes`` (NaN where not
    valid), ``fits`` (GPU memory less the headroom, and host memory), ``fits_gpu``, ``dominated`` (offload points whose
    twin without offload fits: never timed, module docstring); ``step_time_s`` is None when
    nothing fits (timing skipped), NaN where not timed."""

    valid: np.ndarray
    memory_device_bytes: np.ndarray
    fits: np.ndarray
    step_time_s: np.ndarray | None
    fits_gpu: np.ndarray | None = None
    dominated: np.ndarray | None = None
    host_bytes_per_node: np.ndarray | None = None  # offloaded bytes a node holds (None without offload)


# The per-micro-batch numbers the grid needs, one vector per (tp, cp, ep, mbs, sp, recompute,
# precision): layer sums of the dense and MoE layer, the embedding/head, and the activations.
_EXPOSED_FWD = ("exposed_tp_fwd_s", "exposed_cp_fwd_s", "exposed_ep_fwd_s")
_EXPOSED_BWD = ("exposed_tp_bwd_s", "exposed_cp_bwd_s", "exposed_ep_bwd_s")
_LAYER = ("fwd_s", "bwd_s", "recompute_s", "exposed_fwd_s", "exposed_bwd_s", "a2a_hidden_s")
_ENDS = ("embedding_fwd_s", "embedding_bwd_s", "head_fwd_s", "head_bwd_s")
_ACTS = ("dense_act_bytes", "moe_act_bytes", "dense_full_bytes", "moe_full_bytes", "recomputed_layer_bytes",
         "backward_bytes", "head_act_bytes", "attention_block_bytes")
_FIELDS = tuple(f"dense_{n}" for n in _LAYER) + tuple(f"moe_{n}" for n in _LAYER) + _ENDS + _ACTS
_COLUMN = {name: i for i, name in enumerate(_FIELDS)}


def _layer_vector(lc: LayerCost | None) -> list[float]:
    if lc is None:
        return [0.0] * len(_LAYER)
    return [lc.fwd_s, lc.bwd_s, lc.recompute_s, sum(getattr(lc, n) for n in _EXPOSED_FWD),
            sum(getattr(lc, n) for n in _EXPOSED_BWD), lc.a2a_hidden_fwd_s + lc.a2a_hidden_bwd_s]


class FastModel:
    """The step model of one model, cluster, global batch and sequence length, evaluated over
    grids of strategies (module docstring)."""

    def __init__(self, model: Model, cluster: Cluster, *, gbs: int, seq_len: int,
                 plan_kwargs: Mapping[str, object] | None = None, dp_overlap: bool = True,
                 net: Network | None = None, eff: KernelEfficiency | None = None,
                 fp8_recipe: str = "delayed", memory_limit_bytes: float | None = None,
                 share: "FastModel | None" = None) -> None:
        self.model, self.cluster = model, cluster
        # a plan fits when its peak is at most this (the GPU's memory less the headroom kept free)
        self.memory_limit_bytes = cluster.gpu.hbm_bytes if memory_limit_bytes is None else memory_limit_bytes
        self.gbs, self.seq_len = gbs, seq_len
        self.plan_kwargs = dict(plan_kwargs or {})
        self.dp_overlap = dp_overlap
        self.fp8_recipe = fp8_recipe  # the recipe of every fp8 candidate (the framework's)
        n = cluster.num_gpus
        # A probe plan validates the keyword arguments and carries the framework settings.
        self.probe = Plan(model=model, cluster=cluster, strategy=Strategy(dp=n, gbs=n, seq_len=seq_len),
                          **self.plan_kwargs)
        self._net = net  # built on first use: routing tables of a huge cluster cost seconds
        self.eff = eff or default_efficiency()
        self.mem_rt = default_runtime()
        self._micro: dict[tuple, np.ndarray] = {}
        self._coll: dict[tuple, DpCollectives] = {}
        self._p2p: dict[tuple, float] = {}
        self._offload: tuple | None = None  # (constants, host, {device: rates}), on first use
        self._zaxis: dict[tuple, tuple] = {}
        self._split_cache: dict[tuple, tuple] = {}
        self._reps: dict[tuple, Strategy] = {}
        self._dense: dict[tuple, list[float]] = {}
        self._ops: dict[tuple, LayerOps] = {}
        if share is not None:  # the same step model (a narrower search of it): its network and cached pieces
            assert (share.model, share.cluster, share.gbs, share.seq_len, share.plan_kwargs, share.dp_overlap,
                    share.fp8_recipe) == (model, cluster, gbs, seq_len, self.plan_kwargs, dp_overlap, fp8_recipe)
            assert eff is None or eff is share.eff
            self._net, self.eff = share.net, share.eff
            self._micro, self._coll, self._p2p, self._zaxis = share._micro, share._coll, share._p2p, share._zaxis
            self._split_cache, self._reps, self._dense = share._split_cache, share._reps, share._dense
            self._ops = share._ops

    @property
    def net(self) -> Network:
        if self._net is None:
            self._net = default_network(self.cluster)
        return self._net

    # ------------------------------------------------------------------ cached pieces

    def plan(self, strategy: Strategy) -> Plan:
        """The ``Plan`` of ``strategy`` with this model's settings (what ``simulate`` would get),
        checked (``Plan.checked``: ``InfeasibleError`` when no framework could run it)."""
        return Plan(model=self.model, cluster=self.cluster, strategy=strategy, **self.plan_kwargs).checked()

    def representative(self, layout: Layout, *, mbs: int = 1, sp: bool = False, recompute: str = "none",
                       zero: int = 0, vp: int = 1, schedule: str = "1f1b") -> Strategy:
        """A valid ``Strategy`` of this layout (the global batch replaced by one that divides)."""
        key = (layout, mbs, sp, recompute, zero, vp, schedule)
        got = self._reps.get(key)
        if got is None:
            got = self._reps[key] = self._representative(layout, mbs=mbs, sp=sp, recompute=recompute, zero=zero,
                                                         vp=vp, schedule=schedule)
        return got

    def _representative(self, layout: Layout, *, mbs: int, sp: bool, recompute: str, zero: int, vp: int,
                        schedule: str) -> Strategy:
        if layout.pipeline_layout is not None:  # the layout fixes vp
            vp, schedule = layout.layout_vp or 1, ("interleaved" if (layout.layout_vp or 1) > 1 else "1f1b")
        m = max(1, self.gbs // (mbs * layout.dp))
        return Strategy(tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp, ep=layout.ep, etp=layout.etp, vp=vp,
                        mbs=mbs, gbs=mbs * layout.dp * m, seq_len=self.seq_len, zero=zero, sp=sp, recompute=recompute,
                        precision=layout.precision, schedule=schedule, dp_overlap=self.dp_overlap,
                        fp8_recipe=self.fp8_recipe, pipeline_layout=layout.pipeline_layout)

    def micro(self, tp: int, cp: int, ep: int, etp: int | None, mbs: int, sp: bool, recompute: str,
              precision: str) -> np.ndarray:
        """The ``_FIELDS`` of one micro-batch (cached): layer costs (``sim.cost.costs.layer_cost``),
        embedding/head (``sim.cost.costs.end_costs``) and saved activations.  The layer's
        collectives depend only on the tp/cp/ep groups, so one strategy with these degrees (and
        no pipelining) stands for every layout that shares them."""
        key = (tp, cp, ep, etp, mbs, sp, recompute, precision)
        got = self._micro.get(key)
        if got is not None:
            return got
        model, probe = self.model, self.probe
        dp = self.cluster.num_gpus // (tp * cp)
        s = Strategy(tp=tp, cp=cp, ep=ep, etp=etp, dp=dp, pp=1, mbs=mbs, gbs=mbs * dp, seq_len=self.seq_len, sp=sp,
                     recompute=recompute, precision=precision, dp_overlap=self.dp_overlap,
                     fp8_recipe=self.fp8_recipe)
        plan = self.plan(s)

        def cost(moe: bool) -> LayerCost:
            # a layer's ops do not depend on recomputation (sim.layers.ops.layer_ops): one per other key
            okey = (tp, cp, ep, etp, mbs, sp, precision, moe)
            lops = self._ops.get(okey)
            if lops is None:
                lops = self._ops[okey] = plan_layer_ops(plan, s, self.eff, moe=moe)
            return layer_cost(plan, self.net, lops, self.eff, layer_params(model, s, moe=moe).total)

        is_moe = model.moe is not None
        # a dense layer and the embedding/head do not involve the expert groups: one cost per
        # (tp, cp, mbs, sp, recompute, precision) stands for every ep and etp
        dkey = (tp, cp, mbs, sp, recompute, precision)
        dense = self._dense.get(dkey)
        if dense is None:
            ends = end_costs(plan, self.eff)
            dense = self._dense[dkey] = _layer_vector(cost(False)) + [getattr(ends, n) for n in _ENDS]
        acts = layer_activations(model, s, attention=probe.attention_kernel, selective_policy=probe.selective_policy,
                                 eager=probe.eager_activations, fp8_saved_inputs=probe.fp8_saved_inputs,
                                 moe_imbalance=probe.moe_imbalance)
        back = max(layer_backward_bytes(model, s, moe=False),
                   layer_backward_bytes(model, s, moe=True, moe_imbalance=probe.moe_imbalance) if is_moe else 0.0)
        nl = len(_LAYER)
        vec = (dense[:nl] + _layer_vector(cost(True) if is_moe else None) + dense[nl:]
               + list(acts) + [back, head_activation_bytes(model, s, eager=probe.eager_activations),
                               eager_attention_block_bytes(model, s) if probe.eager_activations else 0.0])
        got = np.array(vec, dtype=float)
        self._micro[key] = got
        return got

    def _dp_collectives(self, layout: Layout, shape: StageShape) -> DpCollectives:
        key = (layout, shape.params)
        got = self._coll.get(key)
        if got is None:
            s = self.representative(layout)
            got = dp_collectives(self.net, s, shape.params, plan_comm_runtime(self.probe, s.precision, s.fp8_params),
                                 self.eff, nvls=self.probe.nvls)
            self._coll[key] = got
        return got

    def _p2p_s(self, layout: Layout, mbs: int, sp: bool) -> float:
        key = (layout, mbs, sp)
        got = self._p2p.get(key)
        if got is None:
            s = self.representative(layout, mbs=mbs, sp=sp)
            got = p2p_time_s(self.net, s, self.eff, p2p_bytes(self.model, s))
            self._p2p[key] = got
        return got

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, layout: Layout, grid: Grid) -> LayoutEval:
        """Peak memory of every grid point, and step time of every point when any fits."""
        model, cl, probe = self.model, self.cluster, self.probe
        M, S, R, Z, K = grid.shape
        shape5 = grid.shape
        shapes = stage_shapes(model, self.representative(layout))
        p, dpcp = layout.pp, layout.dp * layout.cp
        table = np.stack([self.micro(layout.tp, layout.cp, layout.ep, layout.etp, mbs, sp, rc, layout.precision)
                          for mbs in grid.mbs for sp in grid.sp for rc in grid.recompute])

        def msr(name: str) -> np.ndarray:  # (M, S, R) -> broadcastable 5-D
            return table[:, _COLUMN[name]].reshape(M, S, R, 1, 1)

        zero, off_opt, off_par, off_act, on_nvme, off_layers, modes, twins = self._z_axis(grid, dpcp)
        any_offload = twins is not None
        vp = np.array([v for v, _ in grid.pipes], dtype=float).reshape(1, 1, 1, 1, K)
        gpipe = np.array([sch == "gpipe" for _, sch in grid.pipes], dtype=bool).reshape(1, 1, 1, 1, K)
        zero_bubble = np.array([sch == "zero-bubble" for _, sch in grid.pipes], dtype=bool).reshape(1, 1, 1, 1, K)
        m_list = [self.gbs // (mbs * layout.dp) for mbs in grid.mbs]
        m = np.array(m_list, dtype=float).reshape(M, 1, 1, 1, 1)
        valid = np.broadcast_to(np.array(grid.pipe_ok, dtype=bool).reshape(M, 1, 1, 1, K), shape5)
        if any(n is not None for n in grid.recompute_layers):  # sim.cost.plan.check_feasible: N <= a chunk's layers
            per_stage = min(sh.num_layers for sh in shapes)
            rl = np.array([n or 0 for n in grid.recompute_layers], dtype=float).reshape(1, 1, R, 1, 1)
            chunk = np.array([max(1, per_stage // v) for v, _ in grid.pipes], dtype=float).reshape(1, 1, 1, 1, K)
            valid = valid & (rl <= chunk)
        if any(n is not None for n in grid.offload_layers):  # sim.cost.framework: Megatron-Core offloads N layers
            # only without recomputation
            partial = np.array([n is not None for n in grid.offload_layers], dtype=bool).reshape(1, 1, 1, Z, 1)
            recomputing = np.array([rc != "none" for rc in grid.recompute], dtype=bool).reshape(1, 1, R, 1, 1)
            valid = valid & ~(partial & recomputing)
        full = np.array([rc == "full" for rc in grid.recompute], dtype=bool).reshape(1, 1, R, 1, 1)
        selective = np.array([rc == "selective" for rc in grid.recompute], dtype=bool).reshape(1, 1, R, 1, 1)

        # ---- memory: sim.cost.memory.stage_memory per stage shape -----------------------------
        tokens = np.array([mbs * self.seq_len // layout.cp for mbs in grid.mbs], dtype=float).reshape(M, 1, 1, 1, 1)
        dense_act, moe_act, dense_full, moe_full, recomputed, back, head_act, attn_block = (msr(n) for n in _ACTS)
        oc, hs, _ = self._host() if any_offload else (None, None, None)
        lay = state_layout(probe.states_layout_for(layout.precision))
        stage_list = stage_index_shapes(model, self.representative(layout))
        extra = cluster_extra_bytes(self.representative(layout), model, cl, layout=lay, dispatcher=probe.moe_dispatcher,
                                    nvls=probe.nvls, nccl=probe.nccl)
        norm_tok = np.array([[mbs * self.seq_len // layout.cp / (layout.tp if sp else 1) for sp in grid.sp]
                             for mbs in grid.mbs], dtype=float).reshape(M, S, 1, 1, 1)

        def memory(zs: np.ndarray) -> tuple[np.ndarray, np.ndarray | float, np.ndarray | float]:
            """(peak, host, nvme) bytes of the Z entries ``zs`` (per GPU; arrays over M,S,R,len(zs),K)."""
            pick = (lambda a: a[:, :, :, zs, :]) if zs.size < Z else (lambda a: a)
            peak = host = nvme = 0.0
            # every stage: the peak moment depends on its in-flight count; the stages of one shape
            # are evaluated at once over a leading axis of their in-flight counts (then the max)
            for sh, idxs in _by_shape(stage_list):
                fi, ff, tl = self._splits(grid, sh.num_layers)
                flight = (inflight(p, m, vp, gpipe, idxs[0]) if len(idxs) == 1
                          else np.stack([np.broadcast_to(inflight(p, m, vp, gpipe, i), (M, 1, 1, 1, K)) for i in idxs]))
                mem = stage_memory(model, sh, zero=pick(zero), shard=dpcp, expert_shard=layout.expert_dp, tp=layout.tp,
                                   loss=probe.loss_for(layout.tp), dense_act_bytes=dense_act, moe_act_bytes=moe_act,
                                   full_recompute=full, recomputed_layer_bytes=recomputed,
                                   inflight_mb=flight, tokens=tokens, rt=self.mem_rt,
                                   offload_optimizer=pick(off_opt), offload_params=pick(off_par),
                                   offload_activations=pick(off_act), on_nvme=pick(on_nvme), oc=oc, layout=lay,
                                   offload_layers=pick(off_layers) if off_layers is not None else None,
                                   microbatches=m, pp=p, dense_full_bytes=dense_full, moe_full_bytes=moe_full,
                                   recompute_inputs=fi, recompute_full=ff, recompute_transient=tl,
                                   backward_bytes=back, head_act_bytes=head_act, device_extra_bytes=extra,
                                   eager=probe.eager_activations, norm_tokens=norm_tok, selective_op=selective,
                                   fp8_cached_weights=fp8_weight_cache_of(layout.precision, probe.fp8_weight_cache),
                                   bf16_optimizer=probe.deepspeed_bf16_optimizer and layout.precision == "bf16",
                                   allocator=probe.allocator,
                                   experts_own_unit=probe.fsdp_experts_unit == "own", attention_block_bytes=attn_block)
                stacked = len(idxs) > 1
                peak = np.maximum(peak, _stage_max(mem.total_bytes, stacked))
                if any_offload:
                    host = np.maximum(host, _stage_max(mem.host_bytes, stacked))
                    nvme = np.maximum(nvme, _stage_max(mem.nvme_bytes, stacked))
            return np.broadcast_to(peak, (M, S, R, zs.size, K)), host, nvme

        pk, host, nvme = memory(np.arange(Z))
        peak = np.where(valid, pk, np.nan)
        fits_gpu = valid & (peak <= self.memory_limit_bytes)
        fits, dominated, host_node = fits_gpu, None, None
        if any_offload:  # sim.cost.memory.memory_breakdown: the node holds its GPUs' offloaded bytes
            per_node = gpus_sharing_a_host(cl)
            host_node = np.broadcast_to(host * per_node, shape5)
            fits = fits_gpu & np.broadcast_to(within_host(host * per_node, nvme * per_node, hs.host_dram_bytes,
                                                          hs.nvme_bytes), shape5)
            dominated = np.zeros(shape5, dtype=bool)
            for z, twin in enumerate(twins):
                if twin is not None:
                    dominated[:, :, :, z, :] = fits[:, :, :, twin, :]
            fits = fits & ~dominated
        if not fits.any():
            return LayoutEval(valid=valid, memory_device_bytes=peak, fits=fits, step_time_s=None, fits_gpu=fits_gpu,
                              dominated=dominated, host_bytes_per_node=host_node)
        # time only the Z entries where something fits (offload entries are mostly dominated)
        sel = np.flatnonzero(fits.any(axis=(0, 1, 2, 4)))
        if sel.size < Z:
            zero, off_opt, off_par, off_act = (a[:, :, :, sel, :] for a in (zero, off_opt, off_par, off_act))
            off_layers = off_layers[:, :, :, sel, :] if off_layers is not None else None
        timed_offload = any(modes[z][0] != "none" for z in sel)
        rates = self._rates([modes[z][1] for z in sel]) if timed_offload else None

        # ---- time: sim.cost.step.stage_pieces / stage_times / compose ------------------------
        def layer_sum(sh: StageShape, name: str) -> np.ndarray:
            d = sh.num_dense_layers * msr(f"dense_{name}")
            return d + sh.num_moe_layers * msr(f"moe_{name}") if sh.num_moe_layers else d

        def end(sh: StageShape, phase: str) -> np.ndarray | float:
            out = msr(f"embedding_{phase}_s") if sh.first else 0.0
            if sh.last:
                out = out + msr(f"head_{phase}_s")
            return out

        p2p = np.array([[self._p2p_s(layout, mbs, sp) for sp in grid.sp] for mbs in grid.mbs],
                       dtype=float).reshape(M, S, 1, 1, 1)
        settings = piece_settings(probe, self.eff, precision=layout.precision, pp=p, num_microbatches=m,
                                  dp_overlap=self.dp_overlap, fp8_recipe=probe.strategy.fp8_recipe, dp_size=dpcp,
                                  model_chunks=vp)
        rep = self.representative(layout)
        per_layer = {False: layer_params(model, rep, moe=False).total,
                     True: layer_params(model, rep, moe=True).total if model.moe is not None else 0.0}

        def chunk_sums(sh: StageShape) -> tuple[ChunkSums, ...] | None:
            """Each chunk of a pipeline layout (``sim.cost.costs.StageCost.chunk_sums``, over arrays)."""
            if sh.chunks is None:
                return None
            rc_frac = self._rc_fraction(grid, sh.num_layers)  # the stage's share, on every layer (sim.cost.costs.step_costs)
            sums, params = [], []
            for d, e in sh.chunks:
                def csum(name: str) -> np.ndarray | float:
                    x = d * msr(f"dense_{name}") if d else 0.0
                    return x + e * msr(f"moe_{name}") if e else x
                sums.append((csum("fwd_s"), csum("bwd_s"), csum("recompute_s") * rc_frac,  # partial recompute, as step_costs
                             csum("exposed_fwd_s"), csum("exposed_bwd_s")))
                params.append(d * per_layer[False] + (e * per_layer[True] if e else 0.0))
            in_layers = sh.num_dense_layers * per_layer[False] + (sh.num_moe_layers * per_layer[True]
                                                                  if sh.num_moe_layers else 0.0)
            return layout_chunk_sums(sums, params, stage_params=sh.params.total, layer_params=in_layers,
                                     extras_first=sh.first and p > 1, extra_fwd_s=end(sh, "fwd"),
                                     extra_bwd_s=end(sh, "bwd"))

        stages = []
        for sh in shapes:
            lf, lb, lr = (layer_sum(sh, n) for n in ("fwd_s", "bwd_s", "recompute_s"))
            lr = lr * self._rc_fraction(grid, sh.num_layers)
            ef, eb = end(sh, "fwd"), end(sh, "bwd")
            pieces = stage_pieces(coll=self._dp_collectives(layout, sh), zero=zero, dp_size=dpcp,
                                  expert_dp=layout.expert_dp, params=sh.params, num_layers=sh.num_layers,
                                  layer_fwd_s=lf + ef, layer_bwd_s=lb + lr + eb, settings=settings,
                                  tensors=stage_parameter_tensors(model, sh),
                                  offload_optimizer=off_opt,
                                  offload_params=off_par, offload_activations=off_act,
                                  act_bytes=offloaded_activation_bytes(sh, dense_act, moe_act, off_layers)
                                  if timed_offload else 0.0,
                                  rates=rates, embedding_params=stage_embedding_params(model, rep, sh.first))
            stages.append(stage_times(layer_fwd_s=lf, layer_bwd_s=lb, recompute_s=lr,
                                      layer_exposed_fwd_s=layer_sum(sh, "exposed_fwd_s"),
                                      layer_exposed_bwd_s=layer_sum(sh, "exposed_bwd_s"), extra_fwd_s=ef,
                                      extra_bwd_s=eb, pieces=pieces, p2p_s=p2p, num_layers=sh.num_layers,
                                      first=sh.first, last=sh.last, count=sh.count, before=sh.before,
                                      chunks=chunk_sums(sh), stage_ids=sh.stages,
                                      layer_a2a_hidden_s=layer_sum(sh, "a2a_hidden_s")))
        out = compose(stages, m=m, vp=vp, zero_bubble=zero_bubble, pp=p, zero=zero, dp_overlap=self.dp_overlap,
                      overlap_slowdown=self.eff.overlap_compute_slowdown, flushes=self.probe.pipeline_flushes)
        sub = np.broadcast_to(out.step_time_s, (M, S, R, sel.size, K))
        if sel.size < Z:
            full_step = np.full(shape5, np.nan)
            full_step[:, :, :, sel, :] = sub
            sub = full_step
        step = np.where(valid, sub, np.nan)
        return LayoutEval(valid=valid, memory_device_bytes=peak, fits=fits, step_time_s=step, fits_gpu=fits_gpu,
                          dominated=dominated, host_bytes_per_node=host_node)

    def _splits(self, grid: Grid, num_layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``sim.cost.memory.split_of`` over the R (recompute entry) x K (vp) axes."""
        key = (grid.recompute, grid.recompute_layers, grid.pipes, num_layers)
        got = self._split_cache.get(key)
        if got is not None:
            return got
        R, K = len(grid.recompute), len(grid.pipes)
        out = np.zeros((3, R, K))
        for r, rc in enumerate(grid.recompute):
            n = grid.recompute_of(r)
            for q, (vp, _) in enumerate(grid.pipes):
                out[:, r, q] = split_of(rc, n, "block" if n is not None else "uniform", vp, num_layers)
        got = tuple(out[i].reshape(1, 1, R, 1, K) for i in range(3))
        self._split_cache[key] = got
        return got  # type: ignore[return-value]

    def _rc_fraction(self, grid: Grid, num_layers: int) -> np.ndarray | float:
        """``sim.cost.memory.recompute_time_fraction`` over the R x K axes (1 without partial entries)."""
        if not any(n is not None for n in grid.recompute_layers):
            return 1.0
        R, K = len(grid.recompute), len(grid.pipes)
        out = np.ones((R, K))
        for r, rc in enumerate(grid.recompute):
            n = grid.recompute_of(r)
            for q, (vp, _) in enumerate(grid.pipes):
                out[r, q] = recompute_time_fraction(rc, n, "block" if n is not None else "uniform", vp, num_layers)
        return out.reshape(1, 1, R, 1, K)

    def _z_axis(self, grid: Grid, dpcp: int) -> tuple:
        """The grid's Z axis as arrays (ZeRO stage, offload flags, NVMe, offloaded layers: None
        without partial offload, ``inf`` for every layer), its (offload, device) entries and their
        twins without offload (None without offload); cached per entry list."""
        key = (grid.zero, grid.offload, grid.offload_device, grid.offload_layers, dpcp == 1)
        got = self._zaxis.get(key)
        if got is None:
            Z = len(grid.zero)
            modes = [grid.offload_of(z) for z in range(Z)]

            def zvec(values: list) -> np.ndarray:
                return np.array(values).reshape(1, 1, 1, Z, 1)

            flags = [offload_flags(o) for o, _ in modes]
            got = (zvec(list(grid.zero)).astype(int), zvec([f[0] for f in flags]), zvec([f[1] for f in flags]),
                   zvec([f[2] for f in flags]), zvec([d == "nvme" for _, d in modes]),
                   zvec([np.inf if n is None else float(n) for n in grid.offload_layers]).astype(float)
                   if any(n is not None for n in grid.offload_layers) else None, modes,
                   _twins(grid, dpcp) if any(o != "none" for o, _ in modes) else None)
            self._zaxis[key] = got
        return got

    def _host(self) -> tuple:
        """(``sim.cost.offload`` constants, the cluster's host, rates per device), read once."""
        if self._offload is None:
            self._offload = (offload_constants(), host_spec(self.cluster),
                             {d: offload_rates(self.cluster, d) for d in ("cpu", "nvme")})
        return self._offload

    def _rates(self, devices: list[str]) -> OffloadRates:
        """``sim.cost.offload.offload_rates`` per Z entry (arrays where devices differ)."""
        table = self._host()[2]
        per = [table[d] for d in devices]
        if len(set(devices)) == 1:
            return per[0]

        def col(name: str) -> np.ndarray:
            return np.array([getattr(r, name) for r in per], dtype=float).reshape(1, 1, 1, len(per), 1)

        return OffloadRates(link_bytes_per_s=per[0].link_bytes_per_s, state_bytes_per_s=col("state_bytes_per_s"),
                            cpu_optimizer_s_per_param=col("cpu_optimizer_s_per_param"),
                            grad_bytes_per_param=per[0].grad_bytes_per_param,
                            param_bytes_per_param=per[0].param_bytes_per_param)


def _by_shape(stage_list: tuple[tuple[int, StageShape], ...]) -> list[tuple[StageShape, list[int]]]:
    """The stages of ``stage_index_shapes`` grouped by shape, in first-seen order."""
    groups: dict[int, tuple[StageShape, list[int]]] = {}
    for idx, sh in stage_list:
        groups.setdefault(id(sh), (sh, []))[1].append(idx)
    return list(groups.values())


def _stage_max(x: np.ndarray | float, stacked: bool) -> np.ndarray | float:
    """The largest over the leading stage axis of a stacked ``stage_memory`` output (a value
    that does not depend on the stage has no such axis)."""
    return np.max(x, axis=0) if stacked and np.ndim(x) == 6 else x


def _twins(grid: Grid, dpcp: int) -> list[int | None]:
    """For each Z entry with offload, the entry without offload it is compared with: the same
    ZeRO stage (any stage without data parallelism, where they hold the same), else None."""
    plain = {grid.zero[z]: z for z in range(len(grid.zero)) if grid.offload_of(z)[0] == "none"}
    out: list[int | None] = []
    for z in range(len(grid.zero)):
        if grid.offload_of(z)[0] == "none":
            out.append(None)
        elif grid.zero[z] in plain:
            out.append(plain[grid.zero[z]])
        else:
            out.append(next(iter(plain.values())) if dpcp == 1 and plain else None)
    return out
