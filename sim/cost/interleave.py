"""The interleaved 1F1B schedule over model chunks of unequal cost, priced exactly.

With equal chunks the interleaved schedule has the closed form of ``sim.cost.step`` (Narayanan et
al. 2021, Sec. 2.2.2).  With a pipeline layout whose chunks differ (``sim.data.layout``; DeepSeek-V3's
``Et*3|(tt|)*29,m|L``), no closed form holds: in the steady state a rank alternates forward
passes of one chunk with backward passes of another, and where their times differ the ranks
wait on each other every micro-batch, so the bubble grows with the number of micro-batches
(four ranks with chunks of 6 and 2 layers lose 18 layer-times at 4 micro-batches, 35 at 16;
tests/test_layout.py).  ``interleaved_time_s`` therefore evaluates the schedule itself: every
rank runs its passes in Megatron-LM's order (``interleaved_order``, the order
``forward_backward_pipelining_with_interleaving`` issues, which the event engine runs too), each pass starting when the rank is
free and its input has arrived (max-plus recurrence; the longest path through the schedule's
dependency graph).  The graph is built once per ``(pp, m, vp)`` and evaluated level by level
(the passes of one level are independent: about ``2 m vp`` levels of ``pp`` passes each), and
every duration may be a numpy array, so the search prices a grid of plans in one pass.  The event engine runs the same order with every
transfer a flow on the fabric and checks it (tests/test_layout.py).

Known error: the sends are charged to the sending pass (blocking, or their excess over the
chunk with ``pp_overlap``), as ``sim.cost.step`` does; contention between sends is the event
engine's.
"""

from __future__ import annotations

import functools
from typing import Sequence, Union

import numpy as np

Num = Union[float, np.ndarray]
Op = tuple[str, int, int]  # (phase, microbatch, chunk)


def interleaved_order(p: int, m: int, v: int, i: int) -> list[Op]:
    """Rank ``i``'s passes in Megatron-LM's interleaved 1F1B order (``v == 1``: plain 1F1B):
    warm-up ``2 (p - i - 1) + (v - 1) p`` forward chunk-passes (all of them when ``m == p``),
    then one forward and one backward alternately; virtual micro-batch ``k`` is chunk
    ``(k mod pv) // p`` (reversed for backward) of micro-batch ``(k // pv) p + k mod p``
    (``sim.engines.event.schedules`` uses it for the event engine)."""
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


@functools.lru_cache(maxsize=64)
def _levels(pp: int, m: int, vp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[np.ndarray],
                                               np.ndarray]:
    """The schedule's dependency graph, once per (pp, m, vp): for every pass its duration row
    (``phase * pp * vp + rank * vp + chunk``), the pass before it on its rank and the pass whose
    output it needs (``-1``: none; index ``n`` is a zero row), the passes grouped by level
    (longest chain of dependencies before them: the passes of one level are independent), and
    each rank's last pass."""
    nv = pp * vp
    orders = [interleaved_order(pp, m, vp, i) for i in range(pp)]
    index: dict[tuple[str, int, int], int] = {}
    dur, prev, dep, rank_of = [], [], [], []
    for i, order in enumerate(orders):
        for phase, mb, c in order:
            index[(phase, mb, c * pp + i)] = len(dur)
            dur.append((0 if phase == "F" else 1) * pp * vp + i * vp + c)
            rank_of.append(i)
    n = len(dur)
    prev = [-1] * n
    dep = [-1] * n
    for i, order in enumerate(orders):
        last = -1
        for phase, mb, c in order:
            k = index[(phase, mb, c * pp + i)]
            prev[k] = last
            last = k
            vs = c * pp + i
            if phase == "F":
                dep[k] = index[("F", mb, vs - 1)] if vs else -1
            else:
                dep[k] = index[("F", mb, vs)] if vs == nv - 1 else index[("B", mb, vs + 1)]
    level = [-1] * n
    pos = [0] * pp
    remaining = n
    while remaining:  # a topological pass over the ranks' orders
        moved = False
        for i, order in enumerate(orders):
            while pos[i] < len(order):
                phase, mb, c = order[pos[i]]
                k = index[(phase, mb, c * pp + i)]
                d = dep[k]
                if d >= 0 and level[d] < 0:
                    break
                level[k] = 1 + max(level[prev[k]] if prev[k] >= 0 else -1, level[d] if d >= 0 else -1)
                pos[i] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise AssertionError("interleaved schedule made no progress")
    lv = np.asarray(level)
    order_idx = np.argsort(lv, kind="stable")
    bounds = np.searchsorted(lv[order_idx], np.arange(lv.max() + 2))
    groups = [order_idx[bounds[j]:bounds[j + 1]] for j in range(len(bounds) - 1)]
    last_of_rank = np.array([index[(o[-1][0], o[-1][1], o[-1][2] * pp + i)] for i, o in enumerate(orders)])
    fix = lambda a: np.where(np.asarray(a) < 0, n, np.asarray(a))  # noqa: E731
    return np.asarray(dur), fix(prev), fix(dep), np.asarray(rank_of), groups, last_of_rank


# Micro-batches evaluated pass by pass; beyond, the steady state is extrapolated (below).
EXACT_MICROBATCHES = 512
PERIOD_GROUPS = 4


def interleaved_time_s(fwd: Sequence[Sequence[Num]], bwd: Sequence[Sequence[Num]], *,
                       m: int) -> tuple[Num, list[Num]]:
    """(Time from the first forward to the last backward, when each rank ends its last pass)
    of the interleaved schedule with ``m`` micro-batches, given ``fwd[i][c]`` / ``bwd[i][c]``: one micro-batch's forward and
    backward through chunk ``c`` of rank ``i`` (with its send).  Virtual stage ``c * pp + i``
    feeds ``c * pp + i + 1`` forward and ``c * pp + i - 1`` backward.

    The cost of the exact evaluation grows with ``m`` (``2 m vp`` levels); a global batch of
    millions of tiny sequences would take minutes.  Past ``EXACT_MICROBATCHES`` (and at least
    ``3 x PERIOD_GROUPS`` groups of ``pp``) the schedule is in its steady state, where a max-plus
    recurrence of this kind is periodic: every further group of ``pp`` micro-batches adds the
    same time to every rank's end.  The time is then evaluated exactly at two counts ``m_b``
    and ``m_b - PERIOD_GROUPS pp`` and extended linearly to ``m``.  Known error: none measured
    (random uneven chunks, pp 2-8, vp 1-4, m up to 2,400: within 1e-13 of the exact
    evaluation, tests/test_layout.py)."""
    pp, vp = len(fwd), len(fwd[0])
    if m % pp:
        raise ValueError(f"interleaved schedule needs micro-batches ({m}) divisible by pp={pp}")
    step = PERIOD_GROUPS * pp
    m_b = max(EXACT_MICROBATCHES // pp, 3 * PERIOD_GROUPS) * pp
    if m <= m_b:
        return _exact_time_s(fwd, bwd, m, pp, vp)
    t_b, e_b = _exact_time_s(fwd, bwd, m_b, pp, vp)
    t_a, e_a = _exact_time_s(fwd, bwd, m_b - step, pp, vp)
    periods = (m - m_b) / step
    return t_b + (t_b - t_a) * periods, [b + (b - a) * periods for a, b in zip(e_a, e_b)]


def _exact_time_s(fwd: Sequence[Sequence[Num]], bwd: Sequence[Sequence[Num]], m: int, pp: int,
                  vp: int) -> tuple[Num, list[Num]]:
    """``interleaved_time_s`` evaluated pass by pass (the max-plus recurrence, level by level)."""
    dur_idx, prev, dep, _, groups, last = _levels(pp, m, vp)
    table = [fwd[i][c] for i in range(pp) for c in range(vp)] + [bwd[i][c] for i in range(pp) for c in range(vp)]
    shape = np.broadcast_shapes(*(np.shape(x) for x in table))
    dur = np.stack([np.broadcast_to(np.asarray(x, dtype=float), shape) for x in table])
    end = np.zeros((len(dur_idx) + 1,) + shape)  # the last row: "no dependency" ends at 0
    for g in groups:  # the passes of a level do not depend on each other
        end[g] = np.maximum(end[prev[g]], end[dep[g]]) + dur[dur_idx[g]]
    ends = [end[k] if shape else float(end[k]) for k in last]
    out = ends[0]
    for t in ends[1:]:
        out = np.maximum(out, t)
    return out, ends
