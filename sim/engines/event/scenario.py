"""What the event engine simulates: units, their passes cut into pieces, and the flows they send.

Everything here is data derived from ``sim.cost.costs.step_costs`` (the same costed pieces the
analytic engine composes) and the rank placement of ``sim.net.placement``:

* a **unit** is a set of GPUs that run in lock-step: tensor- and context-parallel peers wait
  for each other at every layer's collectives, expert-parallel peers at every MoE all-to-all.
  Symmetric mode (default) has one unit per pipeline stage standing for all its data-parallel
  replicas; explicit mode has one unit per stage and data-parallel replica (``ep`` replicas
  together when the model has experts), so every GPU is simulated;
* a pass (``F``/``B``/``W`` of one chunk) is a list of **pieces**, one per layer (plus the
  embedding or output layer on the pipeline ends); the engine runs a whole chunk as one event
  unless it needs the layers (the last backward, which launches gradient buckets, and ZeRO-3,
  which gathers parameters per layer);
* **flow specs** give, for each communication a unit or stage issues, the rank pairs it moves
  data between (for ``FairShare``) and the bytes per pair.  Durations in ``sim.cost.costs`` are
  converted to bytes at the per-pair bandwidth ``sim.cost.costs`` priced them with (``Network.
  dim_link`` of the same dimension), so a flow alone on the fabric takes exactly the costed
  time, and a slower or shared link stretches it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.net.network import Network
from sim.cost.costs import LayerCost, StageCost, StepCosts, plan_comm_runtime
from sim.base.errors import InputError
from sim.engines.event.schedules import Op, flushed_orders
from sim.engines.event.whatif import WhatIf, apply_layers_per_stage
from sim.net.placement import stage_block
from sim.cost.plan import Plan

COMM_DIMS: tuple[str, ...] = ("tp", "cp", "ep")


@dataclass(frozen=True, slots=True)
class Piece:
    """One layer (or the embedding/output layer) of one pass, on one GPU."""

    name: str
    compute_s: float
    recompute_s: float
    comm_s: tuple[float, float, float]  # exposed tp, cp, ep seconds at the costed bandwidth
    param_frac: float  # share of the stage's parameters this piece uses
    makes_grads: bool  # whether it produces their gradients (B, or W under zero-bubble)
    offload_s: float = 0.0  # exposed host-link copies (sim.cost.offload), by parameter share


@dataclass(frozen=True, slots=True)
class Unit:
    index: int
    stage: int
    replica: int
    ranks: np.ndarray  # shape (dp_in_unit, cp, tp), global ranks
    slow: float  # compute slowdown factor (stragglers)

    @property
    def rep_rank(self) -> int:
        return int(self.ranks.flat[0])


@dataclass(frozen=True, slots=True)
class DpSpec:
    """Per stage data-parallel collective (bytes per ring edge for the whole stage)."""

    grad_bytes: float
    grad_fixed_s: float
    gather_bytes: float  # ZeRO-1/2 after the optimizer, or ZeRO-3 per micro-batch all-gather
    gather_fixed_s: float


def _replicas_per_expert_group(s) -> int:
    """Data-parallel replicas (``tp * cp`` ranks each) one block of ``etp * ep`` expert ranks
    spans: the replicas an explicit-mode unit must hold so its expert groups are whole."""
    block, replica = s.expert_tp * s.ep, s.tp * s.cp
    if block <= replica:
        if replica % block:
            raise InputError("ep", s.ep, f"etp*ep = {block} must divide tp*cp = {replica} for --explicit-ranks")
        return 1
    if block % replica:
        raise InputError("ep", s.ep, f"etp*ep = {block} must be a multiple of tp*cp = {replica} for --explicit-ranks")
    return block // replica


def event_pieces(plan: Plan, *, explicit: bool = False) -> int:
    """How many pieces the engine will run for ``plan`` (its cost, ``sim.base.limits``), from the
    strategy alone: every unit runs ``m * v`` passes per phase, each one piece (a whole chunk)
    or, under ZeRO-3 and in the last backward of each chunk, one per layer of the chunk (an
    upper bound: the largest chunk, and the embedding or head piece counted in every chunk)."""
    s = plan.strategy
    moe = plan.model.moe is not None and s.ep > 1
    units = s.pp * (s.dp // (_replicas_per_expert_group(s) if moe else 1) if explicit else 1)
    phases = 3 if s.schedule == "zero-bubble" else 2
    per_chunk = -(-plan.model.num_layers // (s.pp * s.vp)) + 1  # layers, and the embedding or head
    per_pass = per_chunk if s.zero == 3 and s.dp * s.cp > 1 else 1
    return units * (s.num_microbatches * s.vp * phases * per_pass + s.vp * (phases - 1) * (per_chunk - per_pass))


def _ring(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if groups.shape[1] < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return groups.ravel(), np.roll(groups, -1, axis=1).ravel()


def _all_pairs(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    g, n = groups.shape
    src = np.broadcast_to(groups[:, :, None], (g, n, n))
    dst = np.broadcast_to(groups[:, None, :], (g, n, n))
    off = ~np.eye(n, dtype=bool)[None].repeat(g, axis=0)
    return src[off], dst[off]


class Scenario:
    """Units, pieces, orders and flow specs of one step (module docstring)."""

    def __init__(self, plan: Plan, costs: StepCosts, net: Network, *, explicit: bool = False,
                 whatif: WhatIf | None = None) -> None:
        s = plan.strategy
        self.whatif = whatif or WhatIf()
        self.whatif.check(plan)
        if self.whatif.layers_per_stage is not None:
            costs = apply_layers_per_stage(costs, self.whatif.layers_per_stage)
        self.plan, self.costs, self.net = plan, costs, net
        self.p, self.m, self.v = s.pp, s.num_microbatches, s.vp
        self.zb = s.schedule == "zero-bubble"
        self.zero = s.zero
        # FSDP with pipelining (sim.cost.step.stage_pieces pipelined_fsdp): no per-micro-batch traffic
        self.pipelined_fsdp = s.zero >= 3 and any(st.pieces.fsdp_step_sync_s > 0 for st in costs.stages)
        # the updated weights are all-gathered after the step: ZeRO-1/2 and DeepSpeed's BF16_Optimizer
        self.param_gather = s.zero in (1, 2) or plan.bf16_optimizer_active
        self.dp_overlap = s.dp_overlap
        self.explicit = explicit
        # one schedule per pipeline flush (Plan.pipeline_flushes), run back to back, micro-batches numbered on
        self.orders: list[list[Op]] = flushed_orders(s.schedule, self.p, self.m, self.v, plan.pipeline_flushes)
        self.flushes = plan.pipeline_flushes if self.p > 1 else 1
        self.stage_size = s.tp * s.cp * s.dp
        moe = plan.model.moe is not None and s.ep > 1
        self.group_dp = (_replicas_per_expert_group(s) if moe else 1) if explicit else s.dp  # dp replicas per unit
        self.replicas = s.dp // self.group_dp
        slow = {x.rank: x.factor for x in self.whatif.stragglers}
        self.units: list[Unit] = []
        for i in range(self.p):
            block = stage_block(s, i)
            for r in range(self.replicas):
                ranks = block[r * self.group_dp:(r + 1) * self.group_dp]
                lo, hi = int(ranks.min()), int(ranks.max())
                members = [x for x in slow if lo <= x <= hi]
                if members:
                    inside = set(ranks.ravel().tolist())
                    members = [x for x in members if x in inside]
                f = max([slow[x] for x in members], default=1.0)
                self.units.append(Unit(index=len(self.units), stage=i, replica=r, ranks=ranks, slow=f))
        self._build_pieces()
        self._build_refs()

    # ------------------------------------------------------------------ units and pieces

    def unit(self, stage: int, replica: int) -> Unit:
        return self.units[stage * self.replicas + replica]

    def _stage_pieces(self, st: StageCost) -> None:
        p, v = self.p, self.v
        n = len(st.layer_costs)
        fr = [c.params / st.params if st.params > 0 else 0.0 for c in st.layer_costs]
        extra_frac = max(0.0, 1.0 - sum(fr))
        if st.chunk_sizes is not None:  # a pipeline layout's chunks (sim.data.layout)
            bounds = np.cumsum((0,) + st.chunk_sizes)
            chunks = [np.arange(bounds[c], bounds[c + 1]) for c in range(v)]
        else:
            chunks = np.array_split(np.arange(n), v)
        first_stage = st.stage == 0 and p > 1
        extra_chunk = 0 if first_stage else v - 1
        # Per-parameter work of the stage (compute slowed by hidden FSDP traffic, FSDP2's
        # packing, the gradient accumulation pass: sim.cost.costs StageCost) is spread over the
        # layers by parameter share, as it happens layer by layer; the embedding/head's share
        # rides with the embedding/head compute.  Lumping it into one chunk would unbalance
        # the virtual stages of an interleaved schedule.
        per_param_f, per_param_b = st.pieces.param_work_fwd_s, st.pieces.param_work_bwd_s
        # exposed offload copies of a pass (weights in, gradients and activations out), by the same share
        off_f, off_b = st.pieces.offload_fwd_s, st.pieces.offload_bwd_s
        if sum(fr) <= 0:
            extra_frac = 1.0
        extra_f = st.extra_fwd_s + extra_frac * per_param_f
        extra_b = st.extra_bwd_s + extra_frac * per_param_b
        has_extra = extra_f > 0 or extra_b > 0 or extra_frac > 0
        for c, idx in enumerate(chunks):
            lcs: list[tuple[int, LayerCost, float]] = [(st.layers[j], st.layer_costs[j], fr[j]) for j in idx]
            # the chunk's all-to-all an A2A overlap hides, exposed in a pass without a partner
            self.a2a_hidden[(st.stage, c)] = (sum(lc.a2a_hidden_fwd_s for _, lc, _ in lcs),
                                              sum(lc.a2a_hidden_bwd_s for _, lc, _ in lcs))
            fwd = [Piece(f"L{l}", lc.fwd_s + f * per_param_f, 0.0,
                         (lc.exposed_tp_fwd_s, lc.exposed_cp_fwd_s, lc.exposed_ep_fwd_s), f, False, f * off_f)
                   for l, lc, f in lcs]
            bwd, wgt = [], []
            for l, lc, f in reversed(lcs):
                comm = (lc.exposed_tp_bwd_s, lc.exposed_cp_bwd_s, lc.exposed_ep_bwd_s)
                if self.zb:
                    w = 0.5 * lc.bwd_s  # the analytic engine's ZB-H1 convention (sim.engines.analytic)
                    bwd.append(Piece(f"L{l}", lc.bwd_s - w + lc.recompute_s + f * per_param_b, lc.recompute_s,
                                     comm, f, False, f * off_b))
                    wgt.append(Piece(f"L{l}", w, 0.0, (0.0, 0.0, 0.0), f, True))
                else:
                    bwd.append(Piece(f"L{l}", lc.bwd_s + lc.recompute_s + f * per_param_b, lc.recompute_s,
                                     comm, f, True, f * off_b))
            if has_extra and c == extra_chunk:
                name = "embedding" if first_stage else ("head" if p > 1 else "embedding+head")
                zero = (0.0, 0.0, 0.0)
                ef = Piece(name, extra_f, 0.0, zero, extra_frac, False, extra_frac * off_f)
                eb = Piece(name, extra_b, 0.0, zero, extra_frac, not self.zb, extra_frac * off_b)
                ew = Piece(name, 0.0, 0.0, zero, extra_frac, True)
                if first_stage:
                    fwd.insert(0, ef)
                    bwd.append(eb)
                    wgt.append(ew)
                else:
                    fwd.append(ef)
                    bwd.insert(0, eb)
                    wgt.insert(0, ew)
            for phase, lst in (("F", fwd), ("B", bwd), ("W", wgt)):
                if phase == "W" and not self.zb:
                    continue
                self.pieces[(st.stage, c, phase)] = (tuple(lst), _sum(lst))

    def _build_pieces(self) -> None:
        self.pieces: dict[tuple[int, int, str], tuple[tuple[Piece, ...], Piece]] = {}
        self.a2a_hidden: dict[tuple[int, int], tuple[float, float]] = {}
        for st in self.costs.stages:
            self._stage_pieces(st)

    # ------------------------------------------------------------------ flows

    def _build_refs(self) -> None:
        """Per-pair bandwidth and latency ``sim.cost.costs`` priced each dimension with."""
        s, net = self.plan.strategy, self.net
        self.ref_rate: dict[str, float] = {}
        self.ref_latency: dict[str, float] = {}
        for dim, size, pattern in (("tp", s.tp, "ring"), ("cp", s.cp, "ring"), ("ep", s.ep, "all_to_all"),
                                   ("dp_cp", s.dp * s.cp, "ring")):
            if size < 2:
                continue
            link = net.dim_link(s, dim, pattern=pattern)
            rate = link.bytes_per_s / (size - 1 if pattern == "all_to_all" else 1)
            self.ref_rate[dim], self.ref_latency[dim] = rate, link.latency_s
        if s.pp > 1:  # sim.cost.costs prices a send with every stage boundary sending at once
            link = net.dim_link(s, "pp", pattern="p2p")
            self.ref_rate["pp"], self.ref_latency["pp"] = link.bytes_per_s, link.latency_s
        n = s.dp * s.cp
        rt = plan_comm_runtime(self.plan)
        self.dp: list[DpSpec] = []
        for st in self.costs.stages:
            if n < 2 or "dp_cp" not in self.ref_rate:
                self.dp.append(DpSpec(grad_bytes=0.0, grad_fixed_s=0.0, gather_bytes=0.0, gather_fixed_s=0.0))
                continue
            rate, lat = self.ref_rate["dp_cp"], self.ref_latency["dp_cp"]
            steps = 2 * (n - 1) if self.zero == 0 else n - 1
            g_fixed = min(st.pieces.dp_grad_sync_s, steps * lat)
            g_bytes = _bytes(st.pieces.dp_grad_sync_s - g_fixed, rate)
            if self.zero == 3:
                ratio = rt.param_gather_bytes_per_param / rt.grad_reduce_bytes_per_param
                a_t = g_bytes / rate * ratio + g_fixed if rate < math.inf else 0.0
            else:
                a_t = st.pieces.dp_param_gather_s
            a_fixed = min(a_t, (n - 1) * lat)
            self.dp.append(DpSpec(grad_bytes=g_bytes, grad_fixed_s=g_fixed,
                                  gather_bytes=_bytes(a_t - a_fixed, rate), gather_fixed_s=a_fixed))

    def comm_pairs(self, unit: Unit, dim: str) -> tuple[np.ndarray, np.ndarray]:
        """Rank pairs of the ``dim`` collective of every group inside ``unit`` (all at once)."""
        r = unit.ranks  # (d, cp, tp)
        d, cp, tp = r.shape
        if dim == "tp":
            return _ring(r.reshape(-1, tp))
        if dim == "cp":
            return _ring(r.transpose(0, 2, 1).reshape(-1, cp))
        if dim == "ep":  # MoE parallel folding (sim.net.placement): ep ranks of stride etp
            s = self.plan.strategy
            ep, etp = s.ep, s.expert_tp
            if r.size % (ep * etp):
                raise InputError("ep", ep, f"etp*ep = {etp * ep} must divide the {r.size} ranks of a unit")
            g = r.reshape(-1, ep, etp).transpose(0, 2, 1).reshape(-1, ep)
            return _all_pairs(g)
        raise InputError("dim", dim, "must be tp, cp or ep")

    def dp_pairs(self, stage: int) -> tuple[np.ndarray, np.ndarray]:
        """Ring edges of every data(x context)-parallel group of ``stage``."""
        s = self.plan.strategy
        return _ring(stage_block(s, stage).reshape(s.dp * s.cp, s.tp).T)

    def p2p_pairs(self, src: Unit, dst: Unit) -> tuple[np.ndarray, np.ndarray]:
        return src.ranks.ravel(), dst.ranks.ravel()

    def comm_bytes(self, dim: str, seconds: float) -> float:
        return _bytes(seconds, self.ref_rate.get(dim, math.inf))


def _bytes(seconds: float, rate: float) -> float:
    if seconds <= 0:
        return 0.0
    return seconds * rate if rate < math.inf else 0.0


def _sum(pieces: list[Piece]) -> Piece:
    return Piece("chunk", sum(x.compute_s for x in pieces), sum(x.recompute_s for x in pieces),
                 tuple(sum(x.comm_s[k] for x in pieces) for k in range(3)),  # type: ignore[arg-type]
                 sum(x.param_frac for x in pieces), any(x.makes_grads for x in pieces),
                 sum(x.offload_s for x in pieces))
