"""The interleaved 1F1B schedule over model chunks of unequal cost, priced exactly.

With equal chunks the interleaved schedule has the closed form of ``sim.step`` (Narayanan et
al. 2021, Sec. 2.2.2).  With a pipeline layout whose chunks differ (``sim.layout``; DeepSeek-V3's
``Et*3|(tt|)*29,m|L``), no closed form holds: in the steady state a rank alternates forward
passes of one chunk with backward passes of another, and where their times differ the ranks
wait on each other every micro-batch, so the bubble grows with the number of micro-batches
(four ranks with chunks of 6 and 2 layers lose 18 layer-times at 4 micro-batches, 35 at 16;
tests/test_layout.py).  ``interleaved_time_s`` therefore evaluates the schedule itself: every
rank runs its passes in Megatron-LM's order (``interleaved_order``, the order
``forward_backward_pipelining_with_interleaving`` issues, which the event engine runs too), each pass starting when the rank is
free and its input has arrived (max-plus recurrence; the longest path through the schedule's
dependency graph).  It works elementwise on numpy arrays, so the search prices a grid of plans
in one pass, and costs ``2 m pp vp`` steps.  The event engine runs the same order with every
transfer a flow on the fabric and checks it (tests/test_layout.py).

Known error: the sends are charged to the sending pass (blocking, or their excess over the
chunk with ``pp_overlap``), as ``sim.step`` does; contention between sends is the event
engine's.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

Num = Union[float, np.ndarray]
Op = tuple[str, int, int]  # (phase, microbatch, chunk)


def interleaved_order(p: int, m: int, v: int, i: int) -> list[Op]:
    """Rank ``i``'s passes in Megatron-LM's interleaved 1F1B order (``v == 1``: plain 1F1B):
    warm-up ``2 (p - i - 1) + (v - 1) p`` forward chunk-passes (all of them when ``m == p``),
    then one forward and one backward alternately; virtual micro-batch ``k`` is chunk
    ``(k mod pv) // p`` (reversed for backward) of micro-batch ``(k // pv) p + k mod p``
    (``sim.event.schedules`` uses it for the event engine)."""
    total = m * v
    group = p * v

    def fwd(k: int) -> Op:
        return ("F", (k // group) * p + k % p, (k % group) // p)

    def bwd(k: int) -> Op:
        return ("B", (k // group) * p + k % p, v - 1 - (k % group) // p)

    if v == 1:
        warm = min(p - i - 1, m)
    elif m == p:
        warm = total
    else:
        warm = min(2 * (p - i - 1) + (v - 1) * p, total)
    out = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        out.append(fwd(warm + k))
        out.append(bwd(k))
    out += [bwd(k) for k in range(total - warm, total)]
    return out


def interleaved_time_s(fwd: Sequence[Sequence[Num]], bwd: Sequence[Sequence[Num]], *,
                       m: int) -> tuple[Num, list[Num]]:
    """(Time from the first forward to the last backward, when each rank ends its last pass)
    of the interleaved schedule with ``m`` micro-batches, given ``fwd[i][c]`` / ``bwd[i][c]``: one micro-batch's forward and
    backward through chunk ``c`` of rank ``i`` (with its send).  Virtual stage ``c * pp + i``
    feeds ``c * pp + i + 1`` forward and ``c * pp + i - 1`` backward."""
    pp, vp = len(fwd), len(fwd[0])
    nv = pp * vp
    if m % pp:
        raise ValueError(f"interleaved schedule needs micro-batches ({m}) divisible by pp={pp}")
    orders = [interleaved_order(pp, m, vp, i) for i in range(pp)]
    f_end: list[list[Num | None]] = [[None] * m for _ in range(nv)]
    b_end: list[list[Num | None]] = [[None] * m for _ in range(nv)]
    free: list[Num] = [0.0] * pp
    pos = [0] * pp
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for i in range(pp):
            order = orders[i]
            while pos[i] < len(order):
                phase, mb, c = order[pos[i]]
                vs = c * pp + i
                if phase == "F":
                    dep = f_end[vs - 1][mb] if vs else 0.0
                    if dep is None:
                        break
                    end = np.maximum(free[i], dep) + fwd[i][c]
                    f_end[vs][mb] = end
                else:
                    dep = f_end[vs][mb] if vs == nv - 1 else b_end[vs + 1][mb]
                    if dep is None:
                        break
                    end = np.maximum(free[i], dep) + bwd[i][c]
                    b_end[vs][mb] = end
                free[i] = end
                pos[i] += 1
                left -= 1
                moved = True
        if not moved:  # the schedule's own order cannot deadlock; this is an internal check
            raise AssertionError("interleaved schedule made no progress")
    out = free[0]
    for t in free[1:]:
        out = np.maximum(out, t)
    return out, list(free)
