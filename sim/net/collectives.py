"""Alpha-beta closed forms of the collectives a training step issues.

Every cost is ``alpha`` (a per-step latency, ``latency_s``) times a step count plus bytes over
a bandwidth (``bytes_per_s``, per rank and per direction).  ``message_bytes`` (``S``) is, per
rank: the buffer for all-reduce; the full *output* for all-gather; the full *input* for
reduce-scatter; the whole send buffer (``S/n`` to each rank) for all-to-all; the payload for
point-to-point; the buffer for broadcast and reduce; the root's whole output (gather) or input
(scatter), ``S/n`` per rank.

References and equations:

* Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
  MPICH", IJHPCA 19(1), 2005 (hereafter TRG05): ring all-gather ``(p-1) alpha + (p-1)/p n beta``
  (Sec. 4.1); reduce-scatter + all-gather all-reduce ``2(p-1)/p n beta`` bandwidth term
  (Sec. 4.4, Rabenseifner's algorithm); pairwise-exchange all-to-all
  ``(p-1) alpha + (p-1)/p n beta`` for long messages (Sec. 4.5, ``n`` = total send buffer).
* Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
  JPDC 69(2), 2009: ring all-reduce ``2(p-1) alpha + 2(p-1)/p n beta`` and that
  ``2(p-1)/p n beta`` is the bandwidth lower bound (Sec. 3-4).
* Sanders, Speck & Traeff, "Two-tree algorithms for full bandwidth broadcast, reduction and
  scan", Parallel Computing 35(12), 2009: the double binary tree NCCL uses (NCCL >= 2.4).
* NCCL ``doc/PERFORMANCE.md`` (nccl-tests): bus bandwidth = algorithm bandwidth times
  ``2(n-1)/n`` (all-reduce) or ``(n-1)/n`` (all-gather, reduce-scatter, all-to-all), ``1``
  (broadcast, reduce); the factors here are the same, so a measured busbw is directly a
  ``bytes_per_s`` for these formulas.  Broadcast and reduce (``torch.nn.DataParallel``'s
  replication and gradient reduction) are NCCL's pipelined ring from / to the root; gather and
  scatter its root copying every part at once.

Known error.  The reduction arithmetic (TRG05's ``gamma`` term) is ignored: on GPUs it runs
at HBM speed inside the copy kernels.  Pipelining start-up (chunk size over bandwidth per
step), protocol choice (NCCL LL/LL128/Simple) and the per-launch base latency (~5-15 us in
NCCL's tuner) are not modelled; large-message bus bandwidth of real NCCL runs is typically
80-95 % of the link, which ``sim.net.network.Network(bandwidth_efficiency=...)`` absorbs.

Each algorithm comes as ``*_coeffs`` returning ``(seconds_per_byte, fixed_s)`` (time is
``seconds_per_byte * message_bytes + fixed_s``; ``sim.net.network`` caches these) and as a
``*_time_s`` function.  ``Network`` (placement-aware) lives in ``sim.net.network``.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from sim.base.errors import InputError

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p",
                        "broadcast", "reduce", "gather", "scatter")
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "hierarchical"),
    "all_gather": ("ring", "hierarchical"),
    "reduce_scatter": ("ring", "hierarchical"),
    "all_to_all": ("pairwise",),
    "p2p": ("direct",),
    "broadcast": ("ring",),  # pipelined along the ring from the root (NCCL)
    "reduce": ("ring",),
    "gather": ("direct",),  # every rank copies its part straight to the root, all at once
    "scatter": ("direct",),
}
"""Algorithms per op; ``"auto"`` (the cheapest, as NCCL's tuner roughly picks) is always allowed."""

Coeffs = tuple[float, float]  # (seconds per byte, fixed seconds)


def _per_byte(bytes_per_s: float) -> float:
    return 0.0 if bytes_per_s == math.inf else 1.0 / bytes_per_s


def _check(num_ranks: int, bytes_per_s: float, latency_s: float) -> None:
    if num_ranks < 1:
        raise InputError("num_ranks", num_ranks, "must be >= 1")
    if not bytes_per_s > 0:
        raise InputError("bytes_per_s", bytes_per_s, "must be > 0")
    if not latency_s >= 0:
        raise InputError("latency_s", latency_s, "must be >= 0")


def _time(coeffs: Coeffs, message_bytes: float) -> float:
    if not message_bytes >= 0 or message_bytes == math.inf:
        raise InputError("message_bytes", message_bytes, "must be a finite number >= 0")
    return 0.0 if message_bytes == 0 else coeffs[0] * message_bytes + coeffs[1]


# --------------------------------------------------------------------------- ring family


def ring_all_reduce_coeffs(num_ranks: int, bytes_per_s: float, latency_s: float) -> Coeffs:
    """Ring all-reduce: ``2(n-1)/n * S/B + 2(n-1) * alpha`` (Patarasuk & Yuan 2009, Sec. 4)."""
    _check(num_ranks, bytes_per_s, latency_s)
    n = num_ranks
    if n == 1:
        return 0.0, 0.0
    return 2.0 * (n - 1) / n * _per_byte(bytes_per_s), 2.0 * (n - 1) * latency_s


def ring_all_gather_coeffs(num_ranks: int, bytes_per_s: float, latency_s: float) -> Coeffs:
    """Ring all-gather: ``(n-1)/n * S/B + (n-1) * alpha``, ``S`` the gathered output (TRG05 4.1)."""
    _check(num_ranks, bytes_per_s, latency_s)
    n = num_ranks
    if n == 1:
        return 0.0, 0.0
    return (n - 1) / n * _per_byte(bytes_per_s), (n - 1) * latency_s


def ring_reduce_scatter_coeffs(num_ranks: int, bytes_per_s: float, latency_s: float) -> Coeffs:
    """Ring reduce-scatter: ``(n-1)/n * S/B + (n-1) * alpha``, ``S`` the full input (TRG05 4.4)."""
    return ring_all_gather_coeffs(num_ranks, bytes_per_s, latency_s)


def tree_all_reduce_coeffs(num_ranks: int, bytes_per_s: float, latency_s: float) -> Coeffs:
    """Pipelined double-binary-tree all-reduce: ``2 * S/B + 2 * ceil(log2 n) * alpha``.

    Sanders et al. 2009: each of two trees reduces then broadcasts half the buffer; a rank that
    is interior in one tree sends ``S/2`` up and ``2 * S/2`` down in it and ``S/2`` up as a leaf
    of the other, so the busiest rank moves ``2S`` (the ring moves ``2(n-1)/n S``; the totals
    over all ranks are equal, ``2(n-1) S``).  The latency term is the up-and-down depth.
    Pipeline fill (``~2 log2 n`` chunks) is ignored: it matters only for mid-size messages.
    """
    _check(num_ranks, bytes_per_s, latency_s)
    n = num_ranks
    if n == 1:
        return 0.0, 0.0
    return 2.0 * _per_byte(bytes_per_s), 2.0 * math.ceil(math.log2(n)) * latency_s


def _check_hier(ranks_per_domain: int, num_domains: int) -> None:
    if ranks_per_domain < 1 or num_domains < 1:
        raise InputError("ranks_per_domain, num_domains", (ranks_per_domain, num_domains), "must be >= 1")


def hierarchical_all_reduce_coeffs(ranks_per_domain: int, num_domains: int,
                                   intra_bytes_per_s: float, intra_latency_s: float,
                                   inter_bytes_per_s: float, inter_latency_s: float) -> Coeffs:
    """Two-level all-reduce: intra-domain reduce-scatter, inter-domain all-reduce, intra all-gather.

    With ``k`` ranks per domain and ``D`` domains: ``RS_ring(k, S) + AR_ring(D, S/k) +
    AG_ring(k, S)``, i.e. ``2(k-1)/k S/B_intra + 2(D-1)/D S/(k B_inter) + 2(k-1) a_intra +
    2(D-1) a_inter``.  Bytes sent per rank sum to the ring's ``2(kD-1)/(kD) S``; the ``k``
    inter-domain rings run at once (TRG05 Sec. 5 discusses such hierarchies; NCCL's
    "NVLS-tree"/2D variants follow the same shape).
    """
    _check_hier(ranks_per_domain, num_domains)
    k, d = ranks_per_domain, num_domains
    rs_b, rs_f = ring_reduce_scatter_coeffs(k, intra_bytes_per_s, intra_latency_s)
    ar_b, ar_f = ring_all_reduce_coeffs(d, inter_bytes_per_s, inter_latency_s)
    return 2 * rs_b + ar_b / k, 2 * rs_f + ar_f


def hierarchical_all_gather_coeffs(ranks_per_domain: int, num_domains: int,
                                   intra_bytes_per_s: float, intra_latency_s: float,
                                   inter_bytes_per_s: float, inter_latency_s: float) -> Coeffs:
    """Two-level all-gather: inter-domain ring all-gather of the ``S/k`` each domain peer set
    holds, then intra-domain ring all-gather of ``S``: ``(D-1)/D S/(k B_inter) + (k-1)/k S/B_intra
    + (D-1) a_inter + (k-1) a_intra``.  Reduce-scatter is the mirror image (same cost).
    """
    _check_hier(ranks_per_domain, num_domains)
    k, d = ranks_per_domain, num_domains
    in_b, in_f = ring_all_gather_coeffs(k, intra_bytes_per_s, intra_latency_s)
    out_b, out_f = ring_all_gather_coeffs(d, inter_bytes_per_s, inter_latency_s)
    return in_b + out_b / k, in_f + out_f


hierarchical_reduce_scatter_coeffs = hierarchical_all_gather_coeffs


def all_to_all_coeffs(num_ranks: int, bytes_per_s: float, latency_s: float) -> Coeffs:
    """Pairwise-exchange all-to-all: ``(n-1)/n * S/B + (n-1) * alpha`` (TRG05 Sec. 4.5).

    ``S`` is the whole send buffer; ``B`` the per-rank send rate all pairs sustain together.
    NCCL posts all pairs at once, so its latency term is closer to one ``alpha``; the pairwise
    ``(n-1) alpha`` overstates small all-to-alls at large ``n``.
    """
    return ring_all_gather_coeffs(num_ranks, bytes_per_s, latency_s)


def chain_coeffs(num_ranks: int, bytes_per_s: float, latency_s: float) -> Coeffs:
    """Pipelined chain broadcast (from the root) or reduce (to it) of ``S``: every link of the
    chain carries all of ``S`` in small chunks, so ``S/B + (n-1) * alpha`` (NCCL's ring
    broadcast/reduce; nccl-tests PERFORMANCE.md: their bus bandwidth equals the algorithm
    bandwidth ``S/t``).  Pipeline fill of the chunks is ignored."""
    _check(num_ranks, bytes_per_s, latency_s)
    if num_ranks == 1:
        return 0.0, 0.0
    return _per_byte(bytes_per_s), (num_ranks - 1) * latency_s


def fan_coeffs(num_ranks: int, bytes_per_s: float, latency_s: float) -> Coeffs:
    """Gather to (scatter from) a root of ``S`` in ``n`` parts, every part copied at once:
    ``(1/n) * S/B + alpha`` with ``B`` the rate each copy keeps while the root's link is shared
    by all ``n - 1`` (``torch.nn.parallel`` scatter/gather: one copy per device)."""
    _check(num_ranks, bytes_per_s, latency_s)
    if num_ranks == 1:
        return 0.0, 0.0
    return _per_byte(bytes_per_s) / num_ranks, latency_s


def p2p_coeffs(bytes_per_s: float, latency_s: float) -> Coeffs:
    """Point-to-point send: ``S/B + alpha``."""
    _check(1, bytes_per_s, latency_s)
    return _per_byte(bytes_per_s), latency_s


# --------------------------------------------------------------------------- times


def ring_all_reduce_time_s(num_ranks: int, message_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """Seconds of a ring all-reduce of ``message_bytes`` per rank (see ``ring_all_reduce_coeffs``)."""
    return _time(ring_all_reduce_coeffs(num_ranks, bytes_per_s, latency_s), message_bytes)


def ring_all_gather_time_s(num_ranks: int, message_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """Seconds of a ring all-gather producing ``message_bytes`` per rank."""
    return _time(ring_all_gather_coeffs(num_ranks, bytes_per_s, latency_s), message_bytes)


def ring_reduce_scatter_time_s(num_ranks: int, message_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """Seconds of a ring reduce-scatter of a ``message_bytes`` input per rank."""
    return _time(ring_reduce_scatter_coeffs(num_ranks, bytes_per_s, latency_s), message_bytes)


def tree_all_reduce_time_s(num_ranks: int, message_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """Seconds of a double-binary-tree all-reduce (see ``tree_all_reduce_coeffs``)."""
    return _time(tree_all_reduce_coeffs(num_ranks, bytes_per_s, latency_s), message_bytes)


def hierarchical_all_reduce_time_s(ranks_per_domain: int, num_domains: int, message_bytes: float,
                                   intra_bytes_per_s: float, intra_latency_s: float,
                                   inter_bytes_per_s: float, inter_latency_s: float) -> float:
    """Seconds of a two-level all-reduce (see ``hierarchical_all_reduce_coeffs``)."""
    return _time(hierarchical_all_reduce_coeffs(ranks_per_domain, num_domains, intra_bytes_per_s,
                                                intra_latency_s, inter_bytes_per_s, inter_latency_s),
                 message_bytes)


def all_to_all_time_s(num_ranks: int, message_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """Seconds of a pairwise all-to-all of a ``message_bytes`` send buffer per rank."""
    return _time(all_to_all_coeffs(num_ranks, bytes_per_s, latency_s), message_bytes)


def p2p_time_s(message_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """Seconds of one point-to-point send of ``message_bytes``."""
    return _time(p2p_coeffs(bytes_per_s, latency_s), message_bytes)


def bus_bandwidth_factor(op: str, num_ranks: int) -> float:
    """nccl-tests ``busbw / algbw``: ``2(n-1)/n`` all-reduce, ``(n-1)/n`` AG/RS/all-to-all, 1 p2p."""
    n = num_ranks
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if op in ("p2p", "broadcast", "reduce"):
        return 1.0
    raise InputError("op", op, f"must be one of {', '.join(OPS)}")


def bytes_sent_per_rank(op: str, algorithm: str, num_ranks: int, message_bytes: float, *,
                        ranks_per_domain: int = 1) -> float:
    """Average bytes one rank sends (total over ranks / ``n``) for ``op`` by ``algorithm``.

    Ring, tree and hierarchical all-reduce all average ``2(n-1)/n S`` (the Patarasuk-Yuan lower
    bound); all-gather and reduce-scatter ``(n-1)/n S``; they differ in how the bytes split
    over links and in the critical path, not in volume.  ``ranks_per_domain`` is ``k`` for the
    hierarchical split (``n`` must be a multiple).
    """
    n, s = num_ranks, float(message_bytes)
    if n == 1:
        return 0.0
    if algorithm == "hierarchical":
        k = ranks_per_domain
        if n % k:
            raise InputError("ranks_per_domain", k, f"must divide num_ranks={n}")
        d = n // k
        if op == "all_reduce":
            return 2 * (k - 1) / k * s + 2 * (d - 1) / d * s / k
        if op in ("all_gather", "reduce_scatter"):
            return (k - 1) / k * s + (d - 1) / d * s / k
    elif algorithm == "tree" and op == "all_reduce":
        # Double binary tree: every non-root rank sends S/2 up each tree, every non-leaf
        # rank forwards S/2 to each child: 2 * (n-1) * S/2 up + the same down, over n ranks.
        return 2 * (n - 1) * s / n
    elif algorithm in ("ring", "pairwise", "direct", "auto"):
        if op == "p2p":
            return s
        if op in ("broadcast", "reduce"):  # every rank but the chain's end forwards S
            return (n - 1) / n * s
        if op in ("gather", "scatter"):  # n - 1 parts of S/n, over n ranks
            return (n - 1) / n * s / n
        return bus_bandwidth_factor(op, n) * s
    raise InputError("algorithm", algorithm, f"not one of {', '.join(ALGORITHMS.get(op, ()))} for {op}")


# --------------------------------------------------------------------------- size curves


class SizeCurve:
    """Fraction of a tier's large-message collective bandwidth reached at a given chunk size
    (the bytes one rank moves per algorithm step: ``S/n`` for ring collectives over ``n``
    ranks and all-to-all, ``S`` for a point-to-point send).  Between measured points the
    bandwidth-bound time ``chunk / fraction`` is interpolated log-log (so a curve whose points
    never get faster with size gives a time that never does); beyond them the fraction is
    flat.  Fitted from NCCL bus-bandwidth curves (``scripts/fit_efficiency.py``): it carries
    what an alpha-beta line cannot, NCCL's protocol and channel switches at mid sizes (up to
    ~2x slower than the line at 1 MiB)."""

    __slots__ = ("log_chunk", "log_time", "frac")

    def __init__(self, points: Sequence[Sequence[float]]) -> None:
        pts = sorted((float(c), float(f)) for c, f in points)
        if not pts or any(not (c > 0 and 0 < f <= 1) for c, f in pts):
            raise InputError("size_curve", points, "needs points (chunk_bytes > 0, fraction in (0, 1])")
        self.log_chunk = np.log2([c for c, _ in pts])
        self.frac = np.array([f for _, f in pts])
        self.log_time = self.log_chunk - np.log2(self.frac)

    def __call__(self, chunk_bytes: float) -> float:
        if chunk_bytes <= 0:
            return 1.0
        x = math.log2(chunk_bytes)
        if x <= self.log_chunk[0]:
            return float(self.frac[0])
        if x >= self.log_chunk[-1]:
            return float(self.frac[-1])
        return float(2.0 ** (x - np.interp(x, self.log_chunk, self.log_time)))


# One candidate algorithm: (seconds per byte at full efficiency, fixed seconds, chunk divisor,
# tier whose size curve applies).
Line = tuple[float, float, float, str]


def envelope_time_s(lines: tuple[Line, ...], message_bytes: float,
              curves: Mapping[str, SizeCurve] | None = None) -> float:
    """Cheapest ``a * bytes / f(bytes / div) + b`` over ``lines`` (0 for an empty message);
    ``f`` is the tier's size curve (1 without one)."""
    if message_bytes == 0:
        return 0.0
    best = math.inf
    for a, b, div, tier in lines:
        t = a * message_bytes
        if curves and t > 0:
            curve = curves.get(tier)
            if curve is not None:
                t /= curve(message_bytes / div)
        t += b
        if t < best:
            best = t
    return best
