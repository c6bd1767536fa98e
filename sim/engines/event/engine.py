"""The discrete-event engine: one simpy process per unit runs its pipeline schedule.

Each unit (``sim.engines.event.scenario``) is a compute stream: it takes its passes in schedule order
(``sim.engines.event.schedules``), waits for each pass's input (the previous virtual stage's forward,
or the next one's backward), runs it piece by piece, with the exposed tensor/context/expert
collectives after each piece's compute, then sends the activation or gradient to its neighbour
(a blocking send, as Megatron-LM's 1F1B issues them).  Communications are flows on shared
links (``sim.engines.event.resources.FairShare``); collectives of a kind no other traffic ever touches
are folded into the compute event, since nothing can slow them.

Data parallelism: the last backward of each chunk (the last ``W`` under zero-bubble) goes
layer by layer and issues each layer's gradient bucket on its stage's data-parallel stream as
soon as it is produced, so reduction overlaps the rest of the backward and the pipeline drain
(``dp_overlap=0``: all buckets after the last pass).  The optimizer step starts when the
stage's buckets are reduced; ZeRO-1/2 then all-gather the parameters, hidden behind the next
step's first forward when overlapping.  ZeRO-3 all-gathers every layer's parameters one layer
ahead (prefetch) of its forward and backward and reduce-scatters its gradients per micro-batch.

The step ends when the last unit is ready for the next step; its log gives the breakdown:
compute, each kind of exposed communication, optimizer, and bubble (the compute stream idle).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Generator, NamedTuple

import simpy

from sim.layers.compute import KernelEfficiency, default_efficiency
from sim.cost.costs import StepCosts, default_network, step_costs
from sim.base.errors import InputError
from sim.engines.event.measure import engine_result
from sim.engines.event.resources import CollectiveStream, FairShare, Kind, LinkTable
from sim.engines.event.scenario import COMM_DIMS, Piece, Scenario, Unit, _bytes, event_pieces
from sim.engines.event.schedules import w_limit
from sim.engines.event.trace import write_trace
from sim.engines.event.whatif import WhatIf
from sim.net.network import Network
from sim.base import limits
from sim.base.limits import check_work
from sim.base.outpaths import check_file
from sim.cost.plan import Plan
from sim.cost.step import a2a_unpaired_passes
from sim.engines.result import StepResult


class Entry(NamedTuple):
    """One interval of the log.  ``blocking``: on the unit's critical path (its compute stream
    waits for it).  ``op``: the pass it belongs to (``F3``, ``B3.1``: micro-batch.chunk)."""

    unit: int
    stream: str
    name: str
    cat: str
    start: float
    end: float
    blocking: bool
    op: str = ""
    recompute_s: float = 0.0


class Engine:
    """Run one step of ``scenario`` on the links of ``table``."""

    def __init__(self, scenario: Scenario, table: LinkTable, *, check_links: bool = False,
                 overlap_slowdown: float = 0.0) -> None:
        self.sc = sc = scenario
        self.sigma = overlap_slowdown  # efficiency.overlap_compute_slowdown
        for sl in sc.whatif.slow_links:
            table = table.scaled(table.select(sl.target), sl.capacity_factor)
        self.env = simpy.Environment()
        self.net = FairShare(self.env, table, check=check_links)
        self.log: list[Entry] = []
        self._ready: dict[tuple, simpy.Event] = {}
        self.unit_end = [0.0] * len(sc.units)
        self._first_fwd_s = [0.0] * len(sc.units)
        self._splits: dict[tuple[int, int], tuple[float, float, tuple, tuple]] = {}
        self._build_kinds()
        R = sc.replicas
        self.dp_stream = [CollectiveStream(self.net, R) for _ in range(sc.p)]
        self.ag_stream = [CollectiveStream(self.net, R) for _ in range(sc.p)]

    # ------------------------------------------------------------------ setup

    def _build_kinds(self) -> None:
        sc, net = self.sc, self.net
        s = sc.plan.strategy
        sizes = {"tp": s.tp, "cp": s.cp, "ep": s.ep}
        self._comm: dict[tuple[int, str], Kind] = {}
        self._send: dict[tuple[int, int], Kind] = {}
        for u in sc.units:
            for dim in COMM_DIMS:
                if sizes[dim] > 1 and dim in sc.ref_rate:
                    src, dst = sc.comm_pairs(u, dim)
                    self._comm[(u.index, dim)] = net.kind(f"{dim} u{u.index}", src, dst)
            for d in (-1, 1):
                j = (u.stage + d) % sc.p
                wraps = not 0 <= u.stage + d < sc.p
                if j == u.stage or (wraps and sc.v == 1):
                    continue
                dst = sc.unit(j, u.replica)
                src_r, dst_r = sc.p2p_pairs(u, dst)
                self._send[(u.index, j)] = net.kind(f"send u{u.index}->u{dst.index}", src_r, dst_r)
        self._dp: list[Kind | None] = []
        for i in range(sc.p):
            src, dst = sc.dp_pairs(i)
            self._dp.append(net.kind(f"dp s{i}", src, dst) if src.size else None)
        net.link_neighbours()
        # Seconds at the costed bandwidth -> seconds alone on this fabric (1.0 unless a what-if
        # degrades a link or the unit's groups share links among themselves).
        self._fold: dict[tuple[int, str], float] = {}
        for (ui, dim), k in self._comm.items():
            if net.isolated(k):
                ref = sc.ref_rate[dim]
                self._fold[(ui, dim)] = ref / k.alone_rate if k.alone_rate < math.inf else 0.0

    # ------------------------------------------------------------------ helpers

    def _event(self, key: tuple) -> simpy.Event:
        ev = self._ready.get(key)
        if ev is None:
            ev = self.env.event()
            self._ready[key] = ev
        return ev

    def _dep(self, u: Unit, phase: str, mb: int, k: int) -> tuple | None:
        if phase == "F" and k > 0:
            return (u.replica, k, "F", mb)
        if phase == "B" and k < self.sc.p * self.sc.v - 1:
            return (u.replica, k, "B", mb)
        return None

    # ------------------------------------------------------------------ processes

    def run(self) -> None:
        procs = [self.env.process(self._unit(u)) for u in self.sc.units]
        self.env.run()
        stuck = [u.index for u, proc in zip(self.sc.units, procs) if proc.is_alive]
        if stuck:  # pragma: no cover - an ordering bug, never a user error
            raise RuntimeError(f"event engine: units {stuck[:8]} never finished (dependency cycle)")

    def _unit(self, u: Unit) -> Generator:
        sc = self.sc
        p, i = sc.p, u.stage
        order = sc.orders[i]
        state = {"grad": None, "buffer": [], "ag": {}, "rs": None}
        # FSDP with pipelining, one schedule per flush: each schedule but the last ends with this
        # stage's exposed gather + reduce-scatter before its next forward (_flush_sync)
        per_flush = len(order) // sc.flushes
        flush_ends = (frozenset(range(per_flush - 1, per_flush * (sc.flushes - 1), per_flush))
                      if sc.flushes > 1 and sc.costs.stages[i].pieces.fsdp_step_sync_s > 0 else frozenset())
        alone = self._a2a_alone(order, i, per_flush)
        if not sc.zb:
            for idx, (ph, mb, c) in enumerate(order):
                k = c * p + i
                dep = self._dep(u, ph, mb, k)
                if dep is not None:
                    ev = self._event(dep)
                    if not ev.triggered:
                        yield ev
                    del self._ready[dep]
                yield from self._pass(u, ph, mb, c, state, idx in alone)
                if idx in flush_ends:
                    yield from self._flush_sync(u)
        else:
            pending: deque[tuple[int, int]] = deque()
            limit = w_limit(p, i, sc.v)
            idx = 0
            while idx < len(order) or pending:
                if idx < len(order):
                    ph, mb, c = order[idx]
                    dep = self._dep(u, ph, mb, c * p + i)
                    ev = None if dep is None else self._event(dep)
                    ready = ev is None or ev.triggered
                    if pending and (len(pending) >= limit or not ready):
                        wmb, wc = pending.popleft()
                        yield from self._pass(u, "W", wmb, wc, state)
                        continue
                    if ev is not None:
                        if not ready:
                            yield ev
                        del self._ready[dep]  # type: ignore[arg-type]
                    yield from self._pass(u, ph, mb, c, state, idx in alone)
                    if idx in flush_ends:
                        yield from self._flush_sync(u)
                    idx += 1
                    if ph == "B":
                        pending.append((mb, c))
                else:
                    wmb, wc = pending.popleft()
                    yield from self._pass(u, "W", wmb, wc, state)
        yield from self._finish(u, state)

    def _a2a_alone(self, order: list, stage: int, per_flush: int) -> frozenset[int]:
        """Indices in ``order`` of the passes that run without a partner under A2A overlap: in each
        schedule, the first ``a2a_unpaired_passes`` forwards and as many last backwards
        (``sim.cost.step.a2a_unpaired_passes``)."""
        sc = self.sc
        if not any(sc.a2a_hidden.get((stage, c), (0.0, 0.0)) != (0.0, 0.0) for c in range(sc.v)):
            return frozenset()
        n = int(a2a_unpaired_passes(sc.p, sc.v, sc.m / sc.flushes, stage))
        out: set[int] = set()
        for start in range(0, len(order), per_flush):
            seg = range(start, min(start + per_flush, len(order)))
            fwd = [j for j in seg if order[j][0] == "F"]
            bwd = [j for j in seg if order[j][0] == "B"]
            out.update(fwd[:n] + bwd[len(bwd) - n:])
        return frozenset(out)

    def _flush_sync(self, u: Unit) -> Generator:
        """After the last pass of a pipeline schedule that is not the step's last (``Plan.pipeline_flushes``),
        FSDP with pipelining reduce-scatters the stage's gradients and reshards, and gathers again for the
        next schedule: ``fsdp_step_sync_s``, exposed (``sim.cost.step.compose``)."""
        t = self.env.now
        yield self.env.timeout(self.sc.costs.stages[u.stage].pieces.fsdp_step_sync_s)
        self.log.append(Entry(u.index, "compute", "FSDP reduce-scatter + gather between schedules", "dp",
                              t, self.env.now, True))

    def _pass(self, u: Unit, ph: str, mb: int, c: int, state: dict, alone: bool = False) -> Generator:
        sc, env, log = self.sc, self.env, self.log
        p, i = sc.p, u.stage
        k = c * p + i
        layers, agg = sc.pieces[(i, c, ph)]
        grads = ph == "W" or (ph == "B" and not sc.zb)
        final = grads and mb == sc.m - 1
        # FSDP with pipelining gathers and reduce-scatters once per step (_finish), nothing here
        zero3 = sc.zero == 3 and self._dp[i] is not None and not sc.pipelined_fsdp
        pieces = layers if (final or zero3) else (agg,)
        op = f"{ph}{mb}" + (f".{c}" if sc.v > 1 else "")
        st_cost = sc.costs.stages[i]
        host = st_cost.pieces.host_sync_fwd_s if ph == "F" else (st_cost.pieces.host_sync_bwd_s if ph == "B" else 0.0)
        if host > 0:  # host synchronisations of the framework (Plan.host_syncs): the GPU waits for the host
            t = env.now
            yield env.timeout(host)
            log.append(Entry(u.index, "compute", f"host syncs {op}", "compute", t, env.now, True, op))
        a2a = sc.a2a_hidden.get((i, c), (0.0, 0.0))[0 if ph == "F" else 1] * u.slow if alone else 0.0
        if a2a > 0:  # A2A overlap: this pass has no partner to hide its all-to-alls behind
            t = env.now
            yield env.timeout(a2a)
            log.append(Entry(u.index, "compute", f"all-to-all without a partner {op}", "ep", t, env.now, True, op))
        t_start = env.now
        for j, pc in enumerate(pieces):
            if zero3 and ph != "W":
                ev = self._gather(u, op, pieces, j, state)
                if not ev.triggered:
                    t = env.now
                    yield ev
                    log.append(Entry(u.index, "compute", f"wait all-gather {op} {pc.name}", "dp", t, env.now, True, op))
                sync = sc.costs.stages[i].pieces.zero3_sync_s * pc.param_frac
                if sync > 0:  # gathered tensor by tensor, each behind a synchronize (sim.cost.step.stage_pieces)
                    t = env.now
                    yield env.timeout(sync)
                    log.append(Entry(u.index, "compute", f"host gathers {op} {pc.name}", "dp", t, env.now, True, op))
            yield from self._piece(u, op, pc, len(pieces) > 1)
            if sc.pipelined_fsdp:
                pass
            elif pc.makes_grads and pc.param_frac > 0 and self._dp[i] is not None:
                dp = sc.dp[i]
                if zero3:
                    state["rs"] = self.dp_stream[i].issue(f"reduce-scatter {op} {pc.name}", self._dp[i],
                                                          dp.grad_bytes * pc.param_frac, dp.grad_fixed_s)
                elif final:
                    args = (f"{'all-reduce' if sc.zero == 0 else 'reduce-scatter'} c{c} {pc.name}",
                            self._dp[i], dp.grad_bytes * pc.param_frac, dp.grad_fixed_s)
                    if sc.dp_overlap:
                        state.setdefault("dp_t0", env.now)
                        state["grad"] = self.dp_stream[i].issue(*args)
                        self._grad_offload(u, state, state["grad"], pc.param_frac, args[0])
                    else:
                        state["buffer"].append(args)
            elif final and pc.makes_grads and pc.param_frac > 0:  # no data parallelism: copy as produced
                self._grad_offload(u, state, None, pc.param_frac, f"{op} {pc.name}")
        if ph == "F" and not self._first_fwd_s[u.index]:
            self._first_fwd_s[u.index] = env.now - t_start
        last = p * sc.v - 1
        if (ph == "F" and k < last) or (ph == "B" and k > 0):
            k2 = k + 1 if ph == "F" else k - 1
            j = k2 % p
            key = (u.replica, k2, ph, mb)
            st = sc.costs.stages[i]
            if j != i and st.p2p_s > 0:
                kind = self._send[(u.index, j)]
                fixed = min(st.p2p_s, sc.ref_latency.get("pp", 0.0))
                t = env.now
                flow = self.net.start(kind, _bytes(st.p2p_s - fixed, sc.ref_rate.get("pp", math.inf)), fixed)
                if sc.plan.strategy.pp_overlap:  # overlap_p2p_comm: the sender goes on, the receiver waits
                    def delivered(_ev: object = None, key: tuple = key, t: float = t, j: int = j,
                                  unit: int = u.index, op: str = op) -> None:
                        log.append(Entry(unit, "pp", f"send {op} to stage {j}", "pp", t, env.now, False, op))
                        self._event(key).succeed()

                    if flow.callbacks is None:  # already delivered
                        delivered()
                    else:
                        flow.callbacks.append(delivered)
                    return
                yield flow
                log.append(Entry(u.index, "pp", f"send {op} to stage {j}", "pp", t, env.now, True, op))
            self._event(key).succeed()

    def _split(self, u: Unit, pc: Piece) -> tuple[float, float, tuple, tuple]:
        """(compute, compute + folded comm, folded (dim, s), flows (dim, kind, bytes)) of a
        piece on a unit; cached, a piece is run many times."""
        key = (u.index, id(pc))
        out = self._splits.get(key)
        if out is None:
            folded: list[tuple[str, float]] = []
            flows: list[tuple[str, Kind, float]] = []
            for dim, sec in zip(COMM_DIMS, pc.comm_s):
                if sec <= 0:
                    continue
                ck = (u.index, dim)
                kind = self._comm.get(ck)
                ratio = self._fold.get(ck)
                if kind is None:
                    folded.append((dim, sec))
                elif ratio is not None:
                    folded.append((dim, sec * ratio))
                else:
                    flows.append((dim, kind, self.sc.comm_bytes(dim, sec)))
            dur = pc.compute_s * u.slow
            out = (dur, dur + sum(x for _, x in folded), tuple(folded), tuple(flows))
            self._splits[key] = out
        return out

    def _piece(self, u: Unit, op: str, pc: Piece, per_layer: bool) -> Generator:
        env, log = self.env, self.log
        dur, total, folded, flows = self._split(u, pc)
        t0 = env.now
        if total > 0:
            yield env.timeout(total)
        name = f"{op} {pc.name}" if per_layer else op
        log.append(Entry(u.index, "compute", name, "compute", t0, t0 + dur, True, op, pc.recompute_s * u.slow))
        t = t0 + dur
        for dim, x in folded:
            log.append(Entry(u.index, dim, f"{dim} {name}", dim, t, t + x, True, op))
            t += x
        for dim, kind, nbytes in flows:
            t = env.now
            yield self.net.start(kind, nbytes)
            log.append(Entry(u.index, dim, f"{dim} {name}", dim, t, env.now, True, op))
        if pc.offload_s > 0:  # host-link copies the compute could not hide (sim.cost.costs offload pieces)
            t = env.now
            yield env.timeout(pc.offload_s)
            log.append(Entry(u.index, "host", f"offload {name}", "offload", t, env.now, True, op))

    def _gather(self, u: Unit, op: str, pieces: tuple[Piece, ...], j: int, state: dict) -> simpy.Event:
        """ZeRO-3: the all-gather of piece ``j`` (issued now if not prefetched), and the
        prefetch of piece ``j + 1``."""
        i = u.stage
        dp, kind, issued = self.sc.dp[i], self._dp[i], state["ag"]
        ahead = (j,) if self.sc.costs.stages[i].pieces.zero3_sync_s > 0 else (j, j + 1)  # synchronous: no prefetch
        for jj in ahead:
            if jj < len(pieces) and (op, jj) not in issued:
                issued[(op, jj)] = self.ag_stream[i].issue(f"all-gather {op} {pieces[jj].name}", kind,  # type: ignore[arg-type]
                                                           dp.gather_bytes * pieces[jj].param_frac, dp.gather_fixed_s)
        return issued.pop((op, j))

    def _grad_offload(self, u: Unit, state: dict, after: simpy.Event | None, frac: float, name: str) -> None:
        """ZeRO-1/2 optimizer offload: copy a bucket's gradient shard to the host once its
        reduction (``after``) is done, one copy at a time on the unit's host link."""
        seconds = self.sc.costs.stages[u.stage].pieces.offload_grad_s * frac
        if seconds <= 0:
            return
        env, prev = self.env, state.get("host")

        def copy() -> Generator:
            for ev in (prev, after):
                if ev is not None and not ev.triggered:
                    yield ev
            t = env.now
            yield env.timeout(seconds)
            self.log.append(Entry(u.index, "host", f"gradients to host {name}", "offload", t, env.now, False))

        state["host"] = env.process(copy())

    def _finish(self, u: Unit, state: dict) -> Generator:
        sc, env, log = self.sc, self.env, self.log
        i = u.stage
        for args in state["buffer"]:
            state["grad"] = self.dp_stream[i].issue(*args)
            self._grad_offload(u, state, state["grad"], args[2] / sc.dp[i].grad_bytes if sc.dp[i].grad_bytes else 0.0,
                               args[0])
        wait = state["rs"] if sc.zero == 3 else state["grad"]
        t_compute = env.now
        if wait is not None and not wait.triggered:
            t = env.now
            yield wait
            log.append(Entry(u.index, "compute", "wait gradient reduction", "dp", t, env.now, True))
        sigma = self.sigma
        if sc.zero < 3 and "dp_t0" in state and sigma > 0:
            # the backward that hid the reduction ran slower (efficiency.overlap_compute_slowdown)
            t0 = state["dp_t0"]
            hidden = sum(max(0.0, min(e, t_compute) - max(s0, t0)) for _, s0, e in self.dp_stream[i].log)
            extra = t_compute + sigma * hidden - env.now
            if extra > 0:
                t = env.now
                yield env.timeout(extra)
                log.append(Entry(u.index, "compute", "compute slowed by overlapped reduction", "compute",
                                 t, env.now, True))
        host = state.get("host")
        if host is not None and not host.triggered:
            t = env.now
            yield host
            log.append(Entry(u.index, "compute", "wait gradients to host", "offload", t, env.now, True))
        st = sc.costs.stages[i]
        t = env.now
        opt = st.pieces.optimizer_s * u.slow
        if opt > 0:
            yield env.timeout(opt)
        log.append(Entry(u.index, "compute", "optimizer", "optimizer", t, env.now, True))
        if st.pieces.offload_param_s > 0:  # the updated weight shard back from the host (no delayed update)
            t = env.now
            yield env.timeout(st.pieces.offload_param_s)
            log.append(Entry(u.index, "host", "weights to GPU", "offload", t, env.now, True))
        if st.pieces.fsdp_step_sync_s > 0:  # FSDP with pipelining: gather + reduce-scatter after the last schedule, exposed
            t = env.now
            yield env.timeout(st.pieces.fsdp_step_sync_s)
            log.append(Entry(u.index, "compute", "FSDP gather + reduce-scatter after the last schedule", "dp", t, env.now, True))
        end = env.now
        dp = sc.dp[i]
        if sc.param_gather and self._dp[i] is not None and dp.gather_bytes + dp.gather_fixed_s > 0:
            t_opt = env.now
            yield self.dp_stream[i].issue("all-gather params", self._dp[i], dp.gather_bytes, dp.gather_fixed_s)
            hidden = self._first_fwd_s[u.index] if sc.dp_overlap else 0.0
            slowed = self.sigma * min(hidden, env.now - t_opt)
            end = max(t_opt, env.now - hidden) + slowed
            if end > t_opt:
                log.append(Entry(u.index, "compute", "wait param all-gather", "dp", t_opt, end, True))
        self.unit_end[u.index] = end

    # ------------------------------------------------------------------ results

    def comm_log(self) -> list[Entry]:
        """Background data-parallel collectives, one entry per member unit of the stage."""
        out = []
        for i in range(self.sc.p):
            for stream, name in ((self.dp_stream[i], "dp"), (self.ag_stream[i], "dp-ag")):
                for key, start, end in stream.log:
                    for r in range(self.sc.replicas):
                        out.append(Entry(self.sc.unit(i, r).index, name, str(key), "dp", start, end, False))
        return out


def simulate_event(plan: Plan, *, net: Network | None = None, eff: KernelEfficiency | None = None,
                   trace_path: str | None = None, whatif: WhatIf | None = None, explicit_ranks: bool = False,
                   costs: StepCosts | None = None) -> StepResult:
    """Predict one optimizer step of ``plan`` with the event engine.

    Parameters
    ----------
    plan : the model, cluster and strategy.
    net, eff : the network and kernel efficiencies to cost with (defaults as ``sim.cost.costs``).
    trace_path : write the step's Chrome trace-event JSON there.
    whatif : stragglers, degraded links, uneven stages (``sim.engines.event.whatif``).
    explicit_ranks : simulate every data-parallel replica instead of one per stage.
    costs : precomputed ``step_costs(plan, net, eff)``.
    """
    whatif = whatif or WhatIf()
    whatif.check(plan)
    s = plan.strategy
    if s.zero_shard < s.dp * s.cp:
        raise InputError("dp_shard", s.dp_shard, "HSDP (dp_shard < dp) is modelled by the analytic engine only; "
                         "use --engine analytic")
    if s.dp_impl != "ddp":
        raise InputError("dp_impl", s.dp_impl, "the event engine schedules one process per GPU; "
                         "sim.engines.simulate prices torch.nn.DataParallel with sim.engines.dataparallel")
    if trace_path is not None:
        check_file("trace", trace_path)
    check_work("engine", "event", event_pieces(plan, explicit=explicit_ranks), limits.EVENT_MAX_PIECES,
               unit="event-engine pieces",
               hint="use --engine analytic (the same step by closed forms)"
                    + (", drop --explicit-ranks" if explicit_ranks else "")
                    + ", or fewer micro-batches per step (gbs / (mbs * dp))")
    net = net or default_network(plan.cluster)
    eff = eff or default_efficiency()
    costs = costs or step_costs(plan, net, eff)
    eng = Engine(Scenario(plan, costs, net, explicit=explicit_ranks, whatif=whatif), LinkTable(net),
                 overlap_slowdown=eff.overlap_compute_slowdown)
    eng.run()
    result = engine_result(eng, extra={})
    if trace_path is not None:
        write_trace(trace_path, eng)
    return result
