"""Microbenchmarks: what one rank's device and the links between ranks achieve.

All ranks run every benchmark at the same time, as they do in training (on a CPU host they
share memory bandwidth and cores; on a GPU node every GPU runs its own copy), with an agreed
number of back-to-back calls timed by CUDA events on a GPU (``validate.timing``); a result is
the slowest rank's median.  Collectives run on every layout of ``validate.layouts`` (TP-, DP-
and PP-like groups on every GPU of a node, and across nodes), every group of a layout at once,
each record labelled with the link tier it crosses.

Records are plain dicts (JSON).  Units: seconds, bytes, FLOPs.  Message sizes follow the
simulator's ``Network.collective_time_s`` convention: the full buffer (all-reduce buffer,
gathered output of all-gather, input of reduce-scatter, one rank's input of all-to-all,
bytes of one send).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from validate import hostbench
from validate.layouts import group_layouts, pp_pairs, tier
from validate.runtime import Env, cpu_snapshot
from validate.specs import MicrobenchConfig
from validate.timing import collective_s, host_s, max_over_ranks, queued_s

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Recorder:
    records: list[dict[str, object]] = field(default_factory=list)

    def add(self, **rec: object) -> None:
        self.records.append(rec)


def _together(fn, env: Env, min_time_s: float, **kw) -> float:
    """Seconds per call with every rank running ``fn`` at once; the slowest rank's median."""
    return max_over_ranks(collective_s(fn, env.device, min_time_s=min_time_s, warmup=1, **kw), env.device)


# -------------------------------------------------------------------------- compute


def bench_overhead(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    """Per-kernel and per-op costs of an op with no work (a one-element add).

    GPU: ``queued_add``, GPU seconds per kernel with the stream already full (the simulator's
    ``kernel_overhead_s``), and ``eager_add``, wall seconds per op when the host issues ops back
    to back (its dispatch rate: ``host_op_floor_s + kernel_overhead_s``).  CPU: ``tiny_add``,
    the op itself (ops run on the host; there is no separate floor).
    """
    x = torch.zeros(1, device=env.device)
    dist.barrier()
    if env.device.type == "cuda":
        q = max_over_ranks(queued_s(lambda: x.add_(1.0), env.device, n=cfg.overhead_calls), env.device)
        h = max_over_ranks(host_s(lambda: x.add_(1.0), env.device, n=cfg.overhead_calls), env.device)
        rec.add(kind="overhead", op="queued_add", time_s=q, calls=cfg.overhead_calls)
        rec.add(kind="overhead", op="eager_add", time_s=h, calls=cfg.overhead_calls)
        return
    t = _together(lambda: x.add(1.0), env, cfg.min_time_s / 2, max_calls=20000)
    rec.add(kind="overhead", op="tiny_add", time_s=t)


def bench_matmul(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    """``C = A @ B`` with A (m x k), B (k x n): 2*m*n*k FLOPs."""
    for dname in cfg.matmul_dtypes:
        dtype = DTYPES[dname]
        shapes = cfg.matmul_shapes if dname == cfg.dtype else cfg.matmul_shapes[: cfg.other_dtype_shapes]
        for m, n, k in shapes:
            a = torch.randn(m, k, device=env.device, dtype=dtype)
            b = torch.randn(k, n, device=env.device, dtype=dtype)
            c = torch.empty(m, n, device=env.device, dtype=dtype)
            dist.barrier()
            t = _together(lambda: torch.mm(a, b, out=c), env, cfg.min_time_s)
            rec.add(kind="matmul", dtype=dname, m=m, n=n, k=k, flops=2.0 * m * n * k, time_s=t)
            del a, b, c


def bench_attention(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    """Causal ``scaled_dot_product_attention``, forward and forward+backward.

    ``flops`` is the simulator's count for a causal kernel that skips masked blocks
    (``sim.layers.ops``: ``2 * b * heads * s^2 * d``, half of the full square's ``4 b a s^2 d``).
    """
    dtype = DTYPES[cfg.dtype]
    for b, a, s, d in cfg.attention_shapes:
        q, k, v = (torch.randn(b, a, s, d, device=env.device, dtype=dtype, requires_grad=True) for _ in range(3))
        go = torch.randn(b, a, s, d, device=env.device, dtype=dtype)

        def fwd() -> None:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd() -> None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(o, (q, k, v), go)

        dist.barrier()
        tf = _together(fwd, env, cfg.min_time_s)
        tfb = _together(fwd_bwd, env, cfg.min_time_s)
        rec.add(kind="attention", dtype=cfg.dtype, batch=b, heads=a, seq=s, head_dim=d,
                flops=2.0 * b * a * s * s * d, fwd_time_s=tf, bwd_time_s=max(tfb - tf, 1e-9))
        del q, k, v, go


def bench_memory(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    """Memory-bound kernels: copy, scale-add, GELU, LayerNorm (read once, write once)."""
    dtype = DTYPES[cfg.dtype]
    elt = torch.finfo(dtype).bits // 8
    for numel in cfg.memory_numel:
        x = torch.randn(numel, device=env.device, dtype=dtype)
        y = torch.empty_like(x)
        width = 256 if numel >= 256 else numel
        x2 = x.view(-1, width)
        kernels = {
            "copy": lambda: y.copy_(x),
            "add": lambda: torch.add(x, 1.0, out=y),
            "gelu": lambda: F.gelu(x),
            "layer_norm": lambda: F.layer_norm(x2, (width,)),
        }
        for name, fn in kernels.items():
            dist.barrier()
            t = _together(fn, env, cfg.min_time_s / 2)
            rec.add(kind="memory", op=name, dtype=cfg.dtype, numel=numel, bytes=2.0 * numel * elt, time_s=t)
        del x, y, x2


# -------------------------------------------------------------------------- comms


def bench_collectives(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    """Every collective of ``cfg.collective_ops`` on every layout, at every message size."""
    dtype, elt = torch.float32, 4
    lw = env.local_world_size
    layouts = group_layouts(env.world_size, lw)
    # new_group is collective over the whole world: create every group on every rank, in order.
    created = []
    for name, groups in layouts:
        mine_pg, mine = None, None
        for g in groups:
            pg = dist.new_group(g) if len(g) < env.world_size else dist.group.WORLD
            if env.rank in g:
                mine_pg, mine = pg, g
        created.append((name, groups, mine_pg, mine))
    dev = env.device
    for name, groups, pg, mine in created:
        n = len(groups[0])
        for op in cfg.collective_ops:
            if op == "send_recv":
                continue
            for size in cfg.message_bytes:
                numel = max(n, size // elt // n * n)
                fn = None
                if mine is not None:
                    buf = torch.ones(numel, device=dev, dtype=dtype)
                    shard = torch.empty(numel // n, device=dev, dtype=dtype)
                    out = torch.empty(numel, device=dev, dtype=dtype)
                    fn = {
                        "all_reduce": lambda: dist.all_reduce(buf, group=pg),
                        "all_gather": lambda: dist.all_gather_into_tensor(out, shard, group=pg),
                        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, buf, group=pg),
                        "all_to_all": lambda: dist.all_to_all_single(out, buf, group=pg),
                    }[op]
                dist.barrier()
                t = max_over_ranks(collective_s(fn, dev, min_time_s=cfg.comm_min_time_s), dev)
                rec.add(kind="collective", op=op, layout=name, group_size=n, num_groups=len(groups),
                        ranks=groups[0], groups=groups, tier=tier(groups[0], lw),
                        message_bytes=float(numel * elt), time_s=t)
                fn = buf = shard = out = None  # type: ignore[assignment]
    if "send_recv" in cfg.collective_ops:
        for name, pairs in pp_pairs(env.world_size, lw):
            for size in cfg.message_bytes:
                numel = max(1, size // elt)
                peer, first = None, False
                for a, b in pairs:
                    if env.rank in (a, b):
                        peer, first = (b, True) if env.rank == a else (a, False)
                buf = torch.ones(numel, device=dev, dtype=dtype) if peer is not None else None

                def ping_pong() -> None:
                    if first:
                        dist.send(buf, peer)
                        dist.recv(buf, peer)
                    else:
                        dist.recv(buf, peer)
                        dist.send(buf, peer)

                dist.barrier()
                t = collective_s(ping_pong if peer is not None else None, dev, min_time_s=cfg.comm_min_time_s) / 2
                t = max_over_ranks(t, dev)
                rec.add(kind="collective", op="send_recv", layout=name, group_size=2, num_groups=len(pairs),
                        ranks=list(pairs[0]), groups=[list(p) for p in pairs], tier=tier(pairs[0], lw),
                        message_bytes=float(numel * elt), time_s=t)
    rec.add(kind="communicators", count=1 + sum(1 for _, g, _, _ in created if len(g[0]) < env.world_size),
            layouts=[name for name, *_ in created])


def bench_device_memory(env: Env, rec: Recorder, *, before: dict[str, float]) -> None:
    """Device memory outside PyTorch's caching allocator before and after the collectives
    (the CUDA context, then NCCL's communicator buffers on top; ``validate.memstats``), and
    what stayed allocated through the allocator once the compute benchmarks freed their
    tensors: the cuBLAS workspaces (PyTorch allocates them through the caching allocator and
    keeps them per handle and stream)."""
    if env.device.type != "cuda":
        return
    torch.cuda.synchronize(env.device)
    free, total = torch.cuda.mem_get_info(env.device)
    outside = float(total - free) - float(torch.cuda.memory_reserved(env.device))
    rec.add(kind="device_memory", outside_allocator_before_comm_bytes=before.get("outside", 0.0),
            outside_allocator_after_comm_bytes=outside,
            allocated_after_compute_bytes=before.get("allocated", 0.0),
            total_bytes=float(total))


def _memory_state(env: Env) -> dict[str, float]:
    if env.device.type != "cuda":
        return {}
    import gc

    gc.collect()
    torch.cuda.synchronize(env.device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(env.device)
    return {"outside": float(total - free) - float(torch.cuda.memory_reserved(env.device)),
            "allocated": float(torch.cuda.memory_allocated(env.device))}


PARTS: tuple[str, ...] = ("compute", "host", "comm")


def run(env: Env, cfg: MicrobenchConfig, *, parts: tuple[str, ...] = PARTS) -> list[dict[str, object]]:
    """Run the benchmarks; every rank must call this.  Returns the records (same on all ranks).
    ``parts``: ``compute`` (kernels), ``host`` (host memory and host<->device copies,
    ``validate.hostbench``), ``comm`` (collectives)."""
    rec = Recorder()
    b0, o0 = cpu_snapshot()
    t0 = time.perf_counter()
    if "compute" in parts:
        bench_overhead(env, cfg, rec)
        bench_matmul(env, cfg, rec)
        bench_attention(env, cfg, rec)
        bench_memory(env, cfg, rec)
    before = _memory_state(env)
    if "host" in parts:
        hostbench.run(env, cfg, rec)
    if "comm" in parts and env.world_size > 1:
        bench_collectives(env, cfg, rec)
    bench_device_memory(env, rec, before=before)
    b1, o1 = cpu_snapshot()
    wall = time.perf_counter() - t0
    ours = [0.0] * env.world_size
    dist.all_gather_object(ours, (env.node, o1 - o0))
    mine = sum(o for node, o in ours if node == 0)  # type: ignore[misc]
    rec.add(kind="contention", wall_s=wall, other_processes_cores=max(0.0, (b1 - b0) - mine) / wall)
    return rec.records
