"""Single-process ``torch.nn.DataParallel`` (``dp_impl=dataparallel``), priced next to DDP.

What DataParallel does every iteration (PyTorch docs, torch.nn.DataParallel: "the module is
replicated on each device, and each replica handles a portion of the input.  During the
backwards pass, gradients from each replica are summed into the original module";
torch/nn/parallel/data_parallel.py, replicate.py, scatter_gather.py, parallel_apply.py,
torch/cuda/comm.py), one process driving ``N`` GPUs of one node:

1. **scatter** the input batch from GPU 0 into ``N`` chunks (``comm.scatter``);
2. **replicate** the module: every parameter and buffer broadcast from GPU 0 to the others
   (``comm.broadcast_coalesced``, NCCL broadcast), *every forward*, since the replicas are
   rebuilt per call;
3. **parallel_apply**: the ``N`` replica forwards, one Python thread each; the Python side of
   every op's dispatch holds the GIL, so the threads' host work partly serialises;
4. **gather** the outputs (the logits) onto GPU 0 and compute the loss there;
5. backward: the loss gradient is scattered back (the gather's backward), the replicas' backward
   runs in the autograd engine's per-device threads, and the replication's backward
   (``ReduceAddCoalesced``, NCCL reduce) sums every replica's gradients onto GPU 0 once all of
   them are done: a reduce, not an all-reduce, and not overlapped with the backward;
6. the optimizer steps the parameters on GPU 0 only (DDP steps every replica; same time).

Per micro-batch (``m = gbs / (mbs * N)`` per step, each its own forward/backward call)::

    t_mb = scatter_inputs + replicate + F_gil + gather_outputs + loss_on_gpu0 + scatter_grads
           + B + reduce_grads
    step = m * t_mb + optimizer

``F``/``B`` are the forward/backward compute of one replica (``sim.cost.costs.step_costs``, the same
pieces DDP is priced with); ``F_gil`` the forward with the per-op host floor multiplied by
``max(1, N * gil_held_fraction)`` (``catalogs/runtime.yaml`` ``dataparallel``; an assumption).
The collectives are priced by ``sim.net.network.Network`` on the node's fabric (for PCIe cards the
server of ``sim.net.server``: GPU 0's slot and, without P2P, host memory are where the broadcast,
gather and reduce queue).  GPU 0 also holds the other replicas' gathered logits and the loss on
them (``loss_bytes_per_logit``), which is its peak.  The DDP plan of the same strategy is
simulated alongside so the result can say what switching to DDP gains.

The vectorised search (``planner recommend``) does not search DataParallel; ``simulate`` prices
it (analytically under either engine: the event engine does not schedule it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.engines.analytic import simulate_analytic
from sim.layers.compute import KernelEfficiency, ops_time
from sim.data.conventions import conventions
from sim.cost.costs import step_costs
from sim.cost.memory import plan_memory
from sim.net.network import Network
from sim.layers.ops import head_ops
from sim.cost.plan import Plan
from sim.engines.result import Breakdown, StepResult, step_result
from sim.data.runtime import dataparallel_runtime, default_runtime


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallelCosts:
    """Seconds per micro-batch of DataParallel's own work (module docstring), the GIL factor on
    the forward's host floor, and GPU 0's extra memory."""

    scatter_inputs_s: float
    replicate_s: float
    gather_outputs_s: float
    loss_on_gpu0_s: float
    scatter_grads_s: float
    reduce_grads_s: float
    gil_s: float  # forward slowed by GIL-bound dispatch, beyond one thread's host floor
    gil_factor: float
    gpu0_extra_bytes: float

    @property
    def comm_s(self) -> float:
        return (self.scatter_inputs_s + self.replicate_s + self.gather_outputs_s + self.scatter_grads_s
                + self.reduce_grads_s)

    def as_dict(self) -> dict[str, float]:
        return {"scatter_inputs_s": self.scatter_inputs_s, "replicate_s": self.replicate_s,
                "gather_outputs_s": self.gather_outputs_s, "loss_on_gpu0_s": self.loss_on_gpu0_s,
                "scatter_grads_s": self.scatter_grads_s, "reduce_grads_s": self.reduce_grads_s,
                "gil_s": self.gil_s, "gil_factor": self.gil_factor, "gpu0_extra_bytes": self.gpu0_extra_bytes}


def simulate_dataparallel(plan: Plan, *, net: Network, eff: KernelEfficiency) -> StepResult:
    """One optimizer step of ``plan`` under ``torch.nn.DataParallel`` (module docstring), with
    ``dataparallel`` in the result: the per-micro-batch pieces, the DDP step of the same
    strategy and the speed-up a switch to DDP gives."""
    s, model, cluster = plan.strategy, plan.model, plan.cluster
    rt, n, m = dataparallel_runtime(), s.dp, s.num_microbatches
    ranks = tuple(range(n))
    costs = step_costs(plan, net, eff)
    stage = costs.stages[0]
    times = stage.times(1)
    factor = max(1.0, n * rt.gil_held_fraction)
    gil_costs = step_costs(plan, net, replace(eff, host_op_floor_s=eff.host_op_floor_s * factor))
    fwd_gil = gil_costs.stages[0].times(1).compute_fwd_s

    def coll(op: str, nbytes: float) -> float:
        return net.collective_time_s(op, ranks, nbytes) + eff.collective_overhead_s if n > 1 else 0.0

    logits = s.mbs * s.seq_len * model.vocab_size  # per replica
    ce = next(op for op in head_ops(model, s) if op.name == "cross_entropy")
    ce_f, ce_b = ops_time(cluster.gpu, s.precision, (ce,), eff, eager=plan.eager_elementwise)
    pieces = DataParallelCosts(
        scatter_inputs_s=coll("scatter", n * s.mbs * s.seq_len * conventions().device_bytes_per_token),
        replicate_s=coll("broadcast", stage.params * rt.broadcast_bytes_per_param),
        gather_outputs_s=coll("gather", n * logits * rt.output_bytes_per_logit),
        loss_on_gpu0_s=(n - 1) * (ce_f + ce_b),
        scatter_grads_s=coll("scatter", n * logits * rt.output_bytes_per_logit),
        reduce_grads_s=coll("reduce", stage.params * rt.reduce_bytes_per_param),
        gil_s=fwd_gil - times.compute_fwd_s, gil_factor=factor,
        gpu0_extra_bytes=(n - 1) * logits * default_runtime().loss_bytes_per_logit[plan.loss])
    compute = m * (times.compute_fwd_s + times.compute_bwd_s)
    overhead = m * (pieces.gil_s + pieces.loss_on_gpu0_s)
    comm = m * pieces.comm_s
    step = compute + overhead + comm + times.optimizer_s

    ddp_plan = replace(plan, strategy=replace(s, dp_impl="ddp"))
    ddp = simulate_analytic(ddp_plan, net=net, eff=eff, costs=costs)
    mem = plan_memory(plan)
    mem = replace(mem, activations_bytes=mem.activations_bytes + pieces.gpu0_extra_bytes)
    recompute_flops = stage.recompute_flops_per_microbatch * m * n
    speedup = step / ddp.step_time_s
    why = (f"per micro-batch: parameters broadcast from GPU 0 every forward {pieces.replicate_s * 1e3:.1f} ms, "
           f"gradients reduced onto GPU 0 after the backward (not overlapped) {pieces.reduce_grads_s * 1e3:.1f} ms, "
           f"outputs gathered to GPU 0 and their gradient scattered back "
           f"{(pieces.gather_outputs_s + pieces.scatter_grads_s) * 1e3:.1f} ms, the loss of every replica on GPU 0 "
           f"{pieces.loss_on_gpu0_s * 1e3:.1f} ms, GIL-bound dispatch of {n} threads {pieces.gil_s * 1e3:.1f} ms")
    warnings = [f"torch.nn.DataParallel: switching to DDP (one process per GPU, dp_impl=ddp) makes this step "
                f"{speedup:.2f}x faster on this machine ({step:.3f} s -> {ddp.step_time_s:.3f} s); {why}",
                "DataParallel is priced with the analytic closed form (the event engine does not schedule it)"]
    if not mem.fits:
        warnings.append("does not fit in GPU memory (GPU 0 holds the module, its optimizer and every replica's "
                        "gathered logits): DDP spreads the outputs; try a smaller mbs")
    breakdown = Breakdown(compute_s=compute, exposed_comm_s=comm, bubble_s=0.0, optimizer_s=times.optimizer_s,
                          overhead_s=overhead, exposed_dp_s=comm,
                          recompute_s=m * sum(c.recompute_s for c in stage.layer_costs))
    report = {**pieces.as_dict(), "microbatches": m, "step_time_s": step, "ddp_step_time_s": ddp.step_time_s,
              "ddp_speedup": speedup, "ddp_strategy": ddp_plan.strategy.to_string(), "why": why}
    return step_result(plan, step_time_s=step, breakdown=breakdown, memory=mem,
                       recompute_flops_per_step=recompute_flops, engine="analytic", warnings=warnings,
                       extra={"dataparallel": report})
