"""Microbenchmarks: what one rank's device and the links between ranks achieve.

All ranks run every compute benchmark at the same time, as they do in training (on a CPU
host they share memory bandwidth and, when oversubscribed, cores); a result is the slowest
rank's median.  Collectives run on process groups laid out like the simulator places TP, DP
and PP groups (``sim.placement``: TP ranks adjacent, DP ranks strided), every group of a
layout at once, and are labelled with the link tier they cross (``intra`` inside one node,
``inter`` across nodes).

Records are plain dicts (JSON).  Units: seconds, bytes, FLOPs.  Message sizes follow the
simulator's ``Network.collective_time_s`` convention: the full buffer (all-reduce buffer,
gathered output of all-gather, input of reduce-scatter, one rank's input of all-to-all,
bytes of one send).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from validate.runtime import Env, max_over_ranks, time_collective
from validate.specs import MicrobenchConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Recorder:
    records: list[dict[str, object]] = field(default_factory=list)

    def add(self, **rec: object) -> None:
        self.records.append(rec)


# -------------------------------------------------------------------------- compute


def bench_matmul(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    """``C = A @ B`` with A (m x k), B (k x n): 2*m*n*k FLOPs."""
    for dname in cfg.matmul_dtypes:
        dtype = DTYPES[dname]
        shapes = cfg.matmul_shapes if dname == cfg.dtype else cfg.matmul_shapes[: cfg.other_dtype_shapes]
        for m, n, k in shapes:
            a = torch.randn(m, k, device=env.device, dtype=dtype)
            b = torch.randn(k, n, device=env.device, dtype=dtype)
            dist.barrier()
            t = max_over_ranks(time_collective(lambda: torch.mm(a, b), env, min_time_s=cfg.min_time_s, warmup=1), env)
            rec.add(kind="matmul", dtype=dname, m=m, n=n, k=k, flops=2.0 * m * n * k, time_s=t)


def bench_attention(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    """Causal ``scaled_dot_product_attention``, forward and forward+backward.

    ``flops`` is the simulator's count for a causal kernel that skips masked blocks
    (``sim.ops``: ``2 * b * heads * s^2 * d``, half of the full square's ``4 b a s^2 d``).
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
        tf = max_over_ranks(time_collective(fwd, env, min_time_s=cfg.min_time_s, warmup=1), env)
        tfb = max_over_ranks(time_collective(fwd_bwd, env, min_time_s=cfg.min_time_s, warmup=1), env)
        rec.add(kind="attention", dtype=cfg.dtype, batch=b, heads=a, seq=s, head_dim=d,
                flops=2.0 * b * a * s * s * d, fwd_time_s=tf, bwd_time_s=max(tfb - tf, 1e-9))


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
            t = max_over_ranks(time_collective(fn, env, min_time_s=cfg.min_time_s / 2, warmup=1), env)
            rec.add(kind="memory", op=name, dtype=cfg.dtype, numel=numel, bytes=2.0 * numel * elt, time_s=t)


def bench_overhead(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    """Per-op cost with no work: a one-element add, and a tiny linear layer forward+backward
    (one forward op, two backward ops)."""
    x = torch.ones(1, device=env.device)
    w = torch.randn(4, 4, device=env.device, requires_grad=True)
    inp = torch.randn(4, 4, device=env.device, requires_grad=True)
    dist.barrier()
    t_op = max_over_ranks(time_collective(lambda: x.add(1.0), env, min_time_s=cfg.min_time_s / 2, max_reps=20000), env)

    def lin() -> None:
        out = inp @ w
        torch.autograd.grad(out, (inp, w), torch.ones_like(out))

    t_lin = max_over_ranks(time_collective(lin, env, min_time_s=cfg.min_time_s / 2, max_reps=5000), env)
    rec.add(kind="overhead", op="tiny_add", time_s=t_op)
    rec.add(kind="overhead", op="tiny_linear_fwd_bwd", time_s=t_lin, num_ops=3)


# -------------------------------------------------------------------------- comms


def group_layouts(env: Env) -> list[tuple[str, list[list[int]]]]:
    """Process-group layouts: every group of a layout runs concurrently.

    ``world``: all ranks (data parallelism over the job); ``tp``: adjacent pairs (and
    node-sized blocks), TP-like; ``dp``: strided pairs, DP-like across TP groups; ``pp``:
    pairs that exchange point-to-point messages, one node apart when there are several nodes.
    """
    w, lw = env.world_size, env.local_world_size
    out: list[tuple[str, list[list[int]]]] = []
    if w >= 2:
        out.append(("world", [list(range(w))]))
    if w >= 4 and w % 2 == 0:
        out.append(("tp", [[i, i + 1] for i in range(0, w, 2)]))
        half = w // 2
        out.append(("dp", [[i, i + half] for i in range(half)]))
    if env.num_nodes > 1 and lw >= 2:
        out.append(("node", [list(range(n * lw, (n + 1) * lw)) for n in range(env.num_nodes)]))
        out.append(("cross", [[r, r + lw] for r in range(0, w - lw)][:lw]))
    return out


def _pp_pairs(env: Env) -> list[tuple[str, list[tuple[int, int]]]]:
    w, lw = env.world_size, env.local_world_size
    pairs = [("pp", [(i, i + 1) for i in range(0, w - 1, 2)])]
    if env.num_nodes > 1:
        pairs.append(("pp_cross", [(r, r + lw) for r in range(lw)]))
    return pairs


def _tier(env: Env, ranks: list[int] | tuple[int, ...]) -> str:
    nodes = {r // env.local_world_size for r in ranks}
    return "intra" if len(nodes) == 1 else "inter"


def bench_collectives(env: Env, cfg: MicrobenchConfig, rec: Recorder) -> None:
    dtype = DTYPES["fp32"]
    elt = 4
    layouts = group_layouts(env)
    # new_group is collective over the whole world: create every group on every rank, in order.
    created: list[tuple[str, list[list[int]], dist.ProcessGroup | None, list[int] | None]] = []
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
                t = max_over_ranks(time_collective(fn, env, min_time_s=cfg.comm_min_time_s), env)
                rec.add(kind="collective", op=op, layout=name, group_size=n, num_groups=len(groups),
                        ranks=groups[0], groups=groups, tier=_tier(env, groups[0]),
                        message_bytes=float(numel * elt), time_s=t)
    if "send_recv" in cfg.collective_ops and env.world_size >= 2:
        for name, pairs in _pp_pairs(env):
            for size in cfg.message_bytes:
                numel = max(1, size // elt)
                buf = torch.ones(numel, device=dev, dtype=dtype)
                peer, first = None, False
                for a, b in pairs:
                    if env.rank in (a, b):
                        peer, first = (b, True) if env.rank == a else (a, False)

                def ping_pong() -> None:
                    if first:
                        dist.send(buf, peer)
                        dist.recv(buf, peer)
                    else:
                        dist.recv(buf, peer)
                        dist.send(buf, peer)

                dist.barrier()
                t = time_collective(ping_pong if peer is not None else None, env, min_time_s=cfg.comm_min_time_s) / 2
                t = max_over_ranks(t, env)
                rec.add(kind="collective", op="send_recv", layout=name, group_size=2, num_groups=len(pairs),
                        ranks=list(pairs[0]), groups=[list(p) for p in pairs], tier=_tier(env, pairs[0]),
                        message_bytes=float(numel * elt), time_s=t)


def run(env: Env, cfg: MicrobenchConfig, *, parts: tuple[str, ...] = ("compute", "comm")) -> list[dict[str, object]]:
    """Run the benchmarks; every rank must call this.  Returns the records (same on all ranks)."""
    import time

    from validate.runtime import cpu_snapshot

    rec = Recorder()
    b0, o0 = cpu_snapshot()
    t0 = time.perf_counter()
    if "compute" in parts:
        bench_overhead(env, cfg, rec)
        bench_matmul(env, cfg, rec)
        bench_attention(env, cfg, rec)
        bench_memory(env, cfg, rec)
    if "comm" in parts and env.world_size > 1:
        bench_collectives(env, cfg, rec)
    b1, o1 = cpu_snapshot()
    wall = time.perf_counter() - t0
    ours = [0.0] * env.world_size
    dist.all_gather_object(ours, (env.node, o1 - o0))
    mine = sum(o for node, o in ours if node == 0)  # type: ignore[misc]
    rec.add(kind="contention", wall_s=wall, other_processes_cores=max(0.0, (b1 - b0) - mine) / wall)
    return rec.records
