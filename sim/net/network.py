"""Placement-aware collective costs: which links a group's traffic crosses, and how shared.

``Network(cluster)`` prices a collective over given ranks (GPU index = rank) on the cluster's
fabric (``sim.net.fabric.layout_fabric``).  It routes every flow of the group, and of every group
running at the same time (``concurrent_groups``), with the reference policy of
``sim.net.routing`` (NVSwitch inside a domain; otherwise striped over the node's NICs, PXN-style,
then the switch tree or the mesh/torus), counts on each directed link how many flows share it,
and gives the group the bottleneck ``min over its links of capacity * efficiency / flows``.
That per-rank bandwidth and the worst per-step path latency feed the closed forms of
``sim.net.collectives``.

It does this without a graph: links are integer ids in flat numpy arrays, a flow's path is
split into a sender-side piece (precomputed per GPU), a fabric piece (computed once per pair
of NIC pools, i.e. per pair of node/domain) and a receiver-side piece, and loads are
``bincount``s.  ``tests/test_collectives.py`` checks it against routing on the networkx graph.
The message-size-independent part (the two coefficients of ``time = a * bytes + b``) is cached
per (op, algorithm, ranks, concurrent groups); a cached call is a dictionary lookup.

Approximations: every flow of the step moves at the same rate (the equal-share bottleneck,
not max-min fairness); parallel spine links are one pooled link (ideal ECMP); NCCL's own ring
re-ordering is not modelled (rings follow the given rank order); the latency of a striped flow
is that of its slowest stripe (for all-to-all bounded piece by piece: sender, fabric, receiver).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from sim.net import collectives as cf
from sim.net.collectives import Line, SizeCurve, envelope_time_s
from sim.base.errors import InputError
from sim.net.fabric import TIERS, Fabric, layout_fabric
from sim.net.links import Links
from sim.net.placement import group_shape, pipeline_pairs
from sim.data.hardware import Cluster
from sim.data.specs import Strategy

_LOCAL = -1


@dataclass(frozen=True, slots=True)
class GroupLink:
    """What a group's traffic sees: per-rank bandwidth, per-step latency, highest tier crossed.

    ``bytes_per_s`` is per rank and direction after contention and efficiency (``inf`` for a
    group of one); for ``pattern="all_to_all"`` it is the rank's total send rate over all peers.
    ``tier`` is ``"scale-up"``, ``"host"``, ``"scale-out"`` or ``"local"`` (no traffic).
    """

    bytes_per_s: float
    latency_s: float
    tier: str
    num_ranks: int


_Classes = list[np.ndarray]  # groups, one 2-D array (num_groups, size) per group size

PATTERNS: tuple[str, ...] = ("ring", "p2p", "all_to_all", "chain", "chain_in", "fan_out", "fan_in")
# the cheapest candidate at each size: "auto" with NVLS where the fabric has it, "auto_no_nvls"
# without (NCCL_NVLS_ENABLE=0, a plan's nvls off: sim.cost.costs.nvls_algorithm)
AUTOS: tuple[str, ...] = ("auto", "auto_no_nvls")
"""Flows of a group ``g``: ``ring`` g[i] -> g[i+1] closing the ring; ``p2p`` g[0] -> g[1];
``all_to_all`` every ordered pair; ``chain`` g[i] -> g[i+1] (a pipelined broadcast from g[0]
along the ring, the closing edge idle) and ``chain_in`` g[i+1] -> g[i] (a reduce to g[0]);
``fan_out`` g[0] -> every other (scatter from a root); ``fan_in`` every other -> g[0] (gather)."""


def _pattern_flows(arr: np.ndarray, pattern: str) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` arrays ``(groups, flows per group)`` of ``pattern`` over groups ``arr``."""
    g, n = arr.shape
    if n < 2:
        return np.zeros((g, 0), dtype=np.int64), np.zeros((g, 0), dtype=np.int64)
    if pattern == "ring":
        return arr, np.roll(arr, -1, axis=1)
    if pattern == "p2p":
        return arr[:, :1], arr[:, 1:2]
    if pattern == "chain":
        return arr[:, :-1], arr[:, 1:]
    if pattern == "chain_in":
        return arr[:, 1:], arr[:, :-1]
    if pattern == "fan_out":
        return np.repeat(arr[:, :1], n - 1, axis=1), arr[:, 1:]
    if pattern == "fan_in":
        return arr[:, 1:], np.repeat(arr[:, :1], n - 1, axis=1)
    i, j = np.nonzero(~np.eye(n, dtype=bool))  # all_to_all: every ordered pair
    return arr[:, i], arr[:, j]


class _GroupsKey:
    """A tuple of groups with its hash computed once (cache keys for ``concurrent_groups``)."""

    __slots__ = ("groups", "_hash")

    def __init__(self, groups: tuple) -> None:
        self.groups = groups
        self._hash = hash(groups)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _GroupsKey) and self._hash == other._hash
                                 and self.groups == other.groups)


class Network:
    """Collective and point-to-point costs on ``cluster`` (see module docstring).

    ``bandwidth_efficiency`` maps a tier (``scale-up``, ``host``, ``scale-out``) to the fraction
    of its nominal bandwidth collectives achieve with large messages (default 1.0; a
    calibration fills it from NCCL bus-bandwidth measurements); ``size_curves`` maps a tier to
    a ``SizeCurve``, the further fraction reached at smaller chunk sizes (none: the alpha-beta
    line alone).
    """

    def __init__(self, cluster: Cluster, *, bandwidth_efficiency: Mapping[str, float] | None = None,
                 size_curves: Mapping[str, SizeCurve] | None = None, nvls_gain: Mapping[int, float] | None = None) -> None:
        for tier in size_curves or {}:
            if tier not in TIERS:
                raise InputError("size_curves", tier, f"tier must be one of {', '.join(TIERS)}")
        self.size_curves = dict(size_curves or {})
        eff = dict(bandwidth_efficiency or {})
        for tier, v in eff.items():
            if tier not in TIERS:
                raise InputError("bandwidth_efficiency", tier, f"tier must be one of {', '.join(TIERS)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise InputError(f"bandwidth_efficiency.{tier}", v, "must be a finite number > 0")
        self.cluster = cluster
        # NVLink SHARP: all-reduce bus bandwidth inside an NVSwitch domain over the ring's, by group size
        self.nvls_gain = {int(n): float(g) for n, g in (nvls_gain or {}).items()}
        self.bandwidth_efficiency = {t: float(eff.get(t, 1.0)) for t in TIERS}
        self.fabric: Fabric = layout_fabric(cluster)
        self.links = Links(self.fabric, self.bandwidth_efficiency)
        self._coeffs: dict[tuple, tuple[tuple[float, float], ...]] = {}
        self._links: dict[tuple, GroupLink | tuple] = {}
        self._cg_memo: tuple[object, int, object] | None = None

    # ------------------------------------------------------------------ flow evaluation

    def link_loads(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Load on every directed link (``self.links`` ids) when all flows ``src[k] -> dst[k]``
        run at once; a striped flow puts ``1/stripes`` on each stripe."""
        return self.links.link_loads(src, dst)

    def _evaluate(self, src: np.ndarray, dst: np.ndarray, starts: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per flow group (segments of the flow arrays beginning at ``starts``): bottleneck
        flow rate, worst path latency and highest tier, all flows running at once."""
        f = self.fabric
        loads, same, inv, fpath, valid = self.links.route(src, dst)
        ss, sd = src[same], dst[same]
        cross = ~same
        xs, xd = src[cross], dst[cross]
        share = self.links.share(loads)

        n = len(src)
        rate = np.empty(n)
        lat = np.empty(n)
        tier = np.empty(n, dtype=np.int8)
        if ss.size and self.links.srv is not None:  # inside a PCIe server: the node's own paths
            p = self.links.same_paths(ss, sd)
            ok, q = p >= 0, np.maximum(p, 0)
            rate[same] = np.where(ok, share[q], np.inf).min(axis=-1)
            lat[same] = self.links.path_latency(p)
            tier[same] = np.where(ok, self.links.tier[q], -1).max(axis=-1)
        elif ss.size:
            rate[same] = np.minimum(share[ss + self.links.su_up], share[sd + self.links.su_down])
            lat[same] = self.links.lat[ss + self.links.su_up] + self.links.lat[sd + self.links.su_down]
            tier[same] = 0
        if xs.size:
            def piece_rate(paths: np.ndarray) -> np.ndarray:
                return self.links.piece_rate(share, paths)
            out_rate = np.full(f.num_gpus, np.inf)
            in_rate = np.full(f.num_gpus, np.inf)
            u_out, u_in = np.unique(xs), np.unique(xd)
            out_rate[u_out] = piece_rate(self.links.out_path[u_out])
            in_rate[u_in] = piece_rate(self.links.in_path[u_in])
            f_rate = piece_rate(fpath)
            f_lat = self.links.path_latency(fpath)  # (pairs, stripes)
            f_tier = np.where(valid.any(axis=(1, 2)), 2, 1)
            rate[cross] = np.minimum(np.minimum(out_rate[xs], in_rate[xd]), f_rate[inv])
            lat[cross] = (self.links.out_lat_j[xs] + f_lat[inv] + self.links.in_lat_j[xd]).max(axis=1)
            tier[cross] = f_tier[inv]
        return (np.minimum.reduceat(rate, starts), np.maximum.reduceat(lat, starts),
                np.maximum.reduceat(tier, starts))

    def _evaluate_a2a(self, classes: _Classes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per group (all classes, in order): pair-flow rate, worst latency, highest tier of an
        all-to-all, all groups at once.

        Same loads as routing every ordered pair, computed from counts: a member with ``s``
        same-domain and ``x`` cross-domain peers puts ``s`` flows on its NVLink ports and ``x`` on
        its sender/receiver pieces; fabric pieces are aggregated per pair of NIC pools over
        groups with the same pool make-up, so the work is ~(distinct pool patterns) x (pools per
        group)^2 rather than groups x n^2.  Latency is bounded piece by piece.
        """
        f = self.fabric
        E, G, P, m = self.links.num_links, f.num_gpus, f.num_pools, f.stripes
        pool_domain = f.gpu_domain[np.minimum(np.arange(P) * min(f.gpus_per_node, f.nvlink_domain), G - 1)]
        ndom = int(f.gpu_domain[-1]) + 1
        loads = np.zeros(E)
        per_class = []
        keys_all, w_all = [], []
        for arr in classes:
            g, n = arr.shape
            members = arr.ravel()
            rows = np.repeat(np.arange(g), n)
            if f.has_scale_up and n > 1:
                _, invd, cntd = np.unique(rows * ndom + f.gpu_domain[members], return_inverse=True,
                                          return_counts=True)
                same = cntd[invd] - 1
            else:
                same = np.zeros(g * n, dtype=np.int64)
            cross = (n - 1) - same
            if same.any():
                loads += np.bincount(members + self.links.su_up, weights=same, minlength=E)
                loads += np.bincount(members + self.links.su_down, weights=same, minlength=E)
            if cross.any():
                self.links.side_loads(loads, np.bincount(members, weights=cross, minlength=G))
            records = []
            if cross.any():
                ukey, cnt = np.unique(rows * P + f.gpu_pool[members], return_counts=True)
                r_of, p_of = ukey // P, ukey % P
                per_row = np.bincount(r_of, minlength=g)
                row_start = np.concatenate(([0], np.cumsum(per_row)[:-1]))
                for u in np.unique(per_row):
                    rows_u = np.nonzero(per_row == u)[0]
                    idx = row_start[rows_u][:, None] + np.arange(u)
                    sig = np.concatenate([p_of[idx], cnt[idx]], axis=1)
                    pats, pinv, mult = np.unique(sig, axis=0, return_inverse=True, return_counts=True)
                    pp, pc = pats[:, :u], pats[:, u:]
                    dpool = pool_domain[pp]
                    mask = dpool[:, :, None] != dpool[:, None, :]
                    w = (pc[:, :, None] * pc[:, None, :] * mult[:, None, None])[mask]
                    keys = (pp[:, :, None] * P + pp[:, None, :])[mask]
                    pat_id = np.nonzero(mask)[0]
                    records.append((rows_u, pinv.ravel(), len(pats), pat_id, sum(len(k) for k in keys_all), len(keys)))
                    keys_all.append(keys)
                    w_all.append(w.astype(float))
            per_class.append((g, n, members, same, cross, records))
        if keys_all:
            keys = np.concatenate(keys_all)
            ukeys, kinv = np.unique(keys, return_inverse=True)
            wsum = np.bincount(kinv, weights=np.concatenate(w_all))
            fpath = self.links.fabric_paths(ukeys // P, ukeys % P)
            valid = fpath >= 0
            loads += np.bincount(fpath[valid], weights=np.broadcast_to((wsum / m)[:, None, None], fpath.shape)[valid],
                                 minlength=E)
        share = self.links.share(loads)
        if keys_all:
            f_rate = self.links.piece_rate(share, fpath)[kinv]
            f_lat = self.links.path_latency(fpath).max(axis=1)[kinv]
            f_link = valid.any(axis=(1, 2))[kinv]
        out_rate = self.links.piece_rate(share, self.links.out_path)
        in_rate = self.links.piece_rate(share, self.links.in_path)
        su_rate = np.minimum(share[self.links.su_up:self.links.su_up + G], share[self.links.su_down:self.links.su_down + G])
        su_lat = self.fabric.scale_up_latency_s
        rates, lats, tiers = [], [], []
        for g, n, members, same, cross, records in per_class:
            inf = np.full(g * n, np.inf)
            r = np.minimum(np.where(same > 0, su_rate[members], inf),
                           np.where(cross > 0, np.minimum(out_rate[members], in_rate[members]), inf))
            rate = r.reshape(g, n).min(axis=1)
            has_same = (same > 0).reshape(g, n).any(axis=1)
            has_cross = (cross > 0).reshape(g, n).any(axis=1)
            side = np.where(cross > 0, 1.0, -np.inf).reshape(g, n)
            out_l = (side * self.links.out_lat[members].reshape(g, n)).max(axis=1)
            in_l = (side * self.links.in_lat[members].reshape(g, n)).max(axis=1)
            fab_rate, fab_lat, fab_link = np.full(g, np.inf), np.zeros(g), np.zeros(g, dtype=bool)
            for rows_u, pinv, npat, pat_id, off, cnt in records:
                sl = slice(off, off + cnt)
                pr, pl, pk = np.full(npat, np.inf), np.zeros(npat), np.zeros(npat, dtype=bool)
                np.minimum.at(pr, pat_id, f_rate[sl])
                np.maximum.at(pl, pat_id, f_lat[sl])
                np.logical_or.at(pk, pat_id, f_link[sl])
                fab_rate[rows_u], fab_lat[rows_u], fab_link[rows_u] = pr[pinv], pl[pinv], pk[pinv]
            rates.append(np.minimum(rate, fab_rate))
            lats.append(np.maximum(np.where(has_same, su_lat, 0.0),
                                   np.where(has_cross, out_l + fab_lat + in_l, 0.0)))
            tiers.append(np.where(fab_link, 2, np.where(has_cross, 1, np.where(has_same, 0, _LOCAL))))
        return np.concatenate(rates), np.concatenate(lats), np.concatenate(tiers)

    def _link(self, classes: _Classes, targets: np.ndarray | None, pattern: str) -> GroupLink:
        """GroupLink of the worst group among ``targets`` (global group indices; None = all)."""
        size = np.concatenate([np.full(a.shape[0], a.shape[1]) for a in classes])
        sel = np.arange(len(size)) if targets is None else targets
        if pattern == "all_to_all" and self.links.srv is None:
            if (size[sel] < 2).all():
                return GroupLink(math.inf, 0.0, "local", int(size[sel].max()))
            rate, lat, tier = self._evaluate_a2a(classes)
            rate = rate * (size - 1)
            return GroupLink(float(rate[sel].min()), float(lat[sel].max()), TIERS[int(tier[sel].max())],
                             int(size[sel].max()))
        srcs, dsts, counts = [], [], []
        for arr in classes:
            s, d = _pattern_flows(arr, pattern)
            counts.append(np.full(arr.shape[0], s.shape[1], dtype=np.int64))
            if s.shape[1]:
                srcs.append(s.ravel())
                dsts.append(d.ravel())
        count = np.concatenate(counts)
        if not count[sel].any():
            return GroupLink(math.inf, 0.0, "local", int(size[sel].max()))
        has = count > 0
        starts = np.concatenate(([0], np.cumsum(count)[:-1]))[has]
        rate, lat, tier = self._evaluate(np.concatenate(srcs), np.concatenate(dsts), starts)
        idx = np.cumsum(has) - 1  # group -> row of the per-group results
        mine = idx[sel[has[sel]]]
        if pattern == "all_to_all":  # pairs routed one by one (PCIe servers): the rank's send rate
            rate = rate * (size[has] - 1)
        return GroupLink(float(rate[mine].min()), float(lat[mine].max()), TIERS[int(tier[mine].max())],
                         int(size[sel].max()))

    def bottleneck(self, classes: _Classes, targets: np.ndarray | None, pattern: str = "ring"
                   ) -> tuple[str, float] | None:
        """The link that bounds the worst of ``targets``' groups (all groups running at once):
        ``(label, bytes_per_s per flow)``; None for groups without traffic."""
        pairs = [_pattern_flows(arr, pattern) for arr in classes]
        src = np.concatenate([s.ravel() for s, _ in pairs])
        dst = np.concatenate([d.ravel() for _, d in pairs])
        if not src.size:
            return None
        loads = self.links.link_loads(src, dst)
        share = self.links.share(loads)
        sizes = np.concatenate([np.full(a.shape[0], s.shape[1]) for a, (s, _) in zip(classes, pairs)])
        group_of = np.repeat(np.arange(len(sizes)), sizes)
        mask = np.ones(len(src), dtype=bool) if targets is None else np.isin(group_of, targets)
        mine = self.links.link_loads(src[mask], dst[mask]) > 0
        if not mine.any():
            return None
        rate = np.where(mine, share, np.inf)
        tied = rate <= rate.min() * (1 + 1e-9)  # of equal rates, name the most shared link
        link = int(np.argmax(np.where(tied, loads, -1.0)))
        return self.links.label(link), float(share[link])

    def bottlenecks(self, strategy: Strategy) -> dict[str, dict[str, object]]:
        """Per parallel dimension of ``strategy`` with groups of more than one GPU: the link its
        collective (all groups at once) is bound by and the rate per flow there
        (``{"tp": {"link": ..., "bytes_per_s": ...}, ...}``; ``dp`` is the dp x cp gradient group,
        ``pp`` the pipeline sends, ``ep`` the expert all-to-all)."""
        dims = (("tp", strategy.tp, "ring"), ("cp", strategy.cp, "ring"), ("ep", strategy.ep, "all_to_all"),
                ("dp", strategy.dp * strategy.cp, "ring"), ("pp", strategy.pp, "p2p"))
        out: dict[str, dict[str, object]] = {}
        for name, size, pattern in dims:
            if size > 1:
                found = self.dim_bottleneck(strategy, "dp_cp" if name == "dp" else name, pattern=pattern)
                if found is not None:
                    out[name] = {"link": found[0], "bytes_per_s": found[1]}
        return out

    def dim_bottleneck(self, strategy: Strategy, dim: str, *, pattern: str = "ring") -> tuple[str, float] | None:
        """``bottleneck`` of the ``dim`` groups of ``strategy`` (the link a ring over each
        group, all at once, is bound by; ``pattern="p2p"`` with ``dim="pp"``: the pipeline sends)."""
        _, spec = self._dim_spec(strategy, dim, pattern_pp=(pattern == "p2p"))
        classes, targets = spec()
        return self.bottleneck(classes, targets, pattern)

    # ------------------------------------------------------------------ group specifications

    def _classes(self, groups: Sequence[Sequence[int]]) -> tuple[_Classes, np.ndarray]:
        """Groups bucketed by size into 2-D arrays; returns the global index of ``groups[0]``."""
        by_size: dict[int, list[Sequence[int]]] = {}
        order: list[tuple[int, int]] = []
        for g in groups:
            lst = by_size.setdefault(len(g), [])
            order.append((len(g), len(lst)))
            lst.append(g)
        sizes = sorted(by_size)
        classes, offsets, off = [], {}, 0
        for n in sizes:
            arr = np.array(by_size[n], dtype=np.int64).reshape(len(by_size[n]), n)
            if arr.size and (arr.min() < 0 or arr.max() >= self.fabric.num_gpus):
                raise InputError("ranks", int(arr.min() if arr.min() < 0 else arr.max()),
                                 f"must be in [0, {self.fabric.num_gpus}) (GPU index = rank)")
            if n > 1 and (np.diff(np.sort(arr, axis=1), axis=1) == 0).any():
                raise InputError("ranks", by_size[n][0], "a group lists a rank twice")
            classes.append(arr)
            offsets[n] = off
            off += len(arr)
        n0, row0 = order[0]
        return classes, np.array([offsets[n0] + row0])

    def _tiling(self, stride: int, size: int, total: int) -> _Classes:
        if total > self.fabric.num_gpus:
            raise InputError("strategy", total, f"needs {total} GPUs, the cluster has {self.fabric.num_gpus}")
        blocks = total // (stride * size)
        arr = np.arange(total).reshape(blocks, size, stride).transpose(0, 2, 1).reshape(-1, size)
        return [arr]

    def _hierarchy(self, classes: _Classes, targets: np.ndarray | None
                   ) -> tuple[int, int, _Classes, np.ndarray | None, _Classes, np.ndarray | None] | None:
        """Split every group into per-domain chunks (``k`` ranks) and domain-peer groups (``D``).

        None when some group does not split into equal chunks, or the split is trivial.
        """
        f = self.fabric
        if not f.has_scale_up:
            return None
        intra, inter, row_off = [], [], 0
        intra_rows, inter_rows = [], []
        kd: tuple[int, int] | None = None
        sel = None if targets is None else set(int(t) for t in targets)
        for arr in classes:
            g, n = arr.shape
            dom = f.gpu_domain[arr]
            order = np.argsort(dom, axis=1, kind="stable")
            arr_s = np.take_along_axis(arr, order, axis=1)
            dom_s = np.take_along_axis(dom, order, axis=1)
            k = int((dom_s[0] == dom_s[0, 0]).sum())
            if n % k:
                return None
            d = n // k
            chunks = dom_s.reshape(g, d, k)
            if not (chunks == chunks[:, :, :1]).all() or (d > 1 and not (np.diff(chunks[:, :, 0], axis=1) > 0).all()):
                return None
            for r in range(g):
                if sel is None or row_off + r in sel:
                    if kd is not None and kd != (k, d):
                        return None
                    kd = (k, d)
            base_i = sum(len(a) for a in intra)
            base_o = sum(len(a) for a in inter)
            intra.append(arr_s.reshape(g * d, k))
            inter.append(arr_s.reshape(g, d, k).transpose(0, 2, 1).reshape(g * k, d))
            if sel is not None:
                for r in range(g):
                    if row_off + r in sel:
                        intra_rows.extend(base_i + r * d + np.arange(d))
                        inter_rows.extend(base_o + r * k + np.arange(k))
            row_off += g
        assert kd is not None
        k, d = kd
        if k == 1 or d == 1:
            return None
        ti = None if targets is None else np.array(intra_rows)
        to = None if targets is None else np.array(inter_rows)
        return k, d, intra, ti, inter, to

    # ------------------------------------------------------------------ coefficients

    def _lines(self, op: str, algorithm: str, spec: Callable[[], tuple[_Classes, np.ndarray | None]],
               link_key: tuple) -> tuple[Line, ...]:
        """``(seconds_per_byte, fixed_s, chunk_divisor, tier)`` of ``algorithm`` (one line) or of
        every candidate (``auto``: the time is the lower envelope)."""
        if op not in cf.OPS:
            raise InputError("op", op, f"must be one of {', '.join(cf.OPS)}")
        allowed = cf.ALGORITHMS[op]
        if algorithm not in AUTOS and algorithm not in allowed:
            raise InputError("algorithm", algorithm, f"must be auto or one of {', '.join(allowed)} for {op}")
        return tuple(self._candidates(op, algorithm, spec, link_key).values())

    def _candidates(self, op: str, algorithm: str, spec: Callable[[], tuple[_Classes, np.ndarray | None]],
                    link_key: tuple) -> dict[str, Line]:
        nvls = algorithm == "auto"
        algorithm = "auto" if algorithm in AUTOS else algorithm
        if op == "p2p":
            link = self._cached_link(link_key + ("p2p",), spec, "p2p")
            return {"direct": (*cf.p2p_coeffs(link.bytes_per_s, link.latency_s), 1.0, link.tier)}
        if op in ("broadcast", "reduce"):  # pipelined along the chain from / to the root
            pattern = "chain" if op == "broadcast" else "chain_in"
            link = self._cached_link(link_key + (pattern,), spec, pattern)
            return {"ring": (*cf.chain_coeffs(link.num_ranks, link.bytes_per_s, link.latency_s), 1.0, link.tier)}
        if op in ("gather", "scatter"):  # every part straight to / from the root at once
            pattern = "fan_in" if op == "gather" else "fan_out"
            link = self._cached_link(link_key + (pattern,), spec, pattern)
            return {"direct": (*cf.fan_coeffs(link.num_ranks, link.bytes_per_s, link.latency_s),
                               float(max(1, link.num_ranks)), link.tier)}
        if op == "all_to_all":
            link = self._cached_link(link_key + ("all_to_all",), spec, "all_to_all")
            return {"pairwise": (*cf.all_to_all_coeffs(link.num_ranks, link.bytes_per_s, link.latency_s),
                                 float(max(1, link.num_ranks)), link.tier)}
        ring = self._cached_link(link_key + ("ring",), spec, "ring")
        n, B, a = ring.num_ranks, ring.bytes_per_s, ring.latency_s
        chunk = float(max(1, n))  # a ring step moves S/n
        cands: dict[str, Line] = {}
        if algorithm in ("ring", "auto"):
            cands["ring"] = (*(cf.ring_all_reduce_coeffs if op == "all_reduce" else cf.ring_all_gather_coeffs)(n, B, a),
                             chunk, ring.tier)
        if op == "all_reduce" and algorithm in ("tree", "auto"):
            cands["tree"] = (*cf.tree_all_reduce_coeffs(n, B, a), 2.0, ring.tier)  # each tree carries S/2
        gain = self._nvls(n) if ring.tier == "scale-up" else 1.0
        if op == "all_reduce" and nvls and gain > 1.0:  # NVLS: the switch reduces in-network
            cands["nvls"] = (*cf.ring_all_reduce_coeffs(n, B * gain, a), chunk, ring.tier)
        if algorithm in ("hierarchical", "auto"):
            hier = self._cached_hier(link_key, spec)
            if hier is None:  # does not split evenly over NVLink domains: the flat ring
                cands["hierarchical"] = (*(cf.ring_all_reduce_coeffs if op == "all_reduce"
                                           else cf.ring_all_gather_coeffs)(n, B, a), chunk, ring.tier)
            else:
                k, d, li, lo = hier
                fn = cf.hierarchical_all_reduce_coeffs if op == "all_reduce" else cf.hierarchical_all_gather_coeffs
                cands["hierarchical"] = (*fn(k, d, li.bytes_per_s, li.latency_s, lo.bytes_per_s, lo.latency_s),
                                         chunk, lo.tier if d > 1 else li.tier)
        return cands

    def _nvls(self, n: int) -> float:
        """NVLS gain for an ``n``-rank all-reduce (the largest measured size at or below ``n``)."""
        if not self.nvls_gain or n < 2:
            return 1.0
        below = [k for k in self.nvls_gain if k <= n]
        return self.nvls_gain[max(below)] if below else 1.0

    def _cached_link(self, key: tuple, spec: Callable[[], tuple[_Classes, np.ndarray | None]], pattern: str) -> GroupLink:
        link = self._links.get(key)
        if link is None:
            classes, targets = spec()
            link = self._link(classes, targets, pattern)
            self._links[key] = link
        return link  # type: ignore[return-value]

    def _cached_hier(self, link_key: tuple, spec: Callable[[], tuple[_Classes, np.ndarray | None]]) -> tuple | None:
        key = link_key + ("hier",)
        if key not in self._links:
            classes, targets = spec()
            h = self._hierarchy(classes, targets)
            if h is None:
                self._links[key] = None  # type: ignore[assignment]
            else:
                k, d, intra, ti, inter, to = h
                self._links[key] = (k, d, self._link(intra, ti, "ring"), self._link(inter, to, "ring"))
        return self._links[key]  # type: ignore[return-value]

    def _time(self, key: tuple, op: str, algorithm: str, message_bytes: float,
              spec: Callable[[], tuple[_Classes, np.ndarray | None]], link_key: tuple) -> float:
        lines = self._coeffs.get(key)
        if lines is None:
            lines = self._lines(op, algorithm, spec, link_key)
            self._coeffs[key] = lines
        if not message_bytes >= 0 or message_bytes == math.inf:
            raise InputError("message_bytes", message_bytes, "must be a finite number >= 0")
        return envelope_time_s(lines, message_bytes, self.size_curves)

    # ------------------------------------------------------------------ public API

    def _group_key(self, ranks: Sequence[int], concurrent_groups: Sequence[Sequence[int]] | None) -> tuple:
        rk = ranks if type(ranks) is tuple else tuple(int(r) for r in ranks)
        if concurrent_groups is None:
            return (rk, None)
        memo = self._cg_memo  # the same list object passed again: reuse its hashed key
        if memo is not None and memo[0] is concurrent_groups and memo[1] == len(concurrent_groups):
            return (rk, memo[2])
        try:
            groups = tuple(concurrent_groups)
            hash(groups)
        except TypeError:
            groups = tuple(tuple(int(r) for r in g) for g in concurrent_groups)
        ck = _GroupsKey(groups)
        self._cg_memo = (concurrent_groups, len(concurrent_groups), ck)
        return (rk, ck)

    @staticmethod
    def _spec_of(gkey: tuple) -> Callable[[], tuple[list[tuple[int, ...]], None]]:
        rk, ck = gkey

        def groups() -> list[tuple[int, ...]]:
            out = [rk]
            if ck is not None:
                out += [tuple(g) for g in ck.groups if tuple(g) != rk]
            return out
        return groups  # type: ignore[return-value]

    def group_link(self, ranks: Sequence[int], *, concurrent_groups: Sequence[Sequence[int]] | None = None,
                   pattern: str = "ring") -> GroupLink:
        """Bottleneck of a ring over ``ranks`` in this order (``pattern="ring"``), of
        ``ranks[0] -> ranks[1]`` (``"p2p"``) or of all ordered pairs (``"all_to_all"``), with
        every group in ``concurrent_groups`` running at the same time (``ranks`` is added if
        it is not among them)."""
        if pattern not in PATTERNS:
            raise InputError("pattern", pattern, f"must be one of {', '.join(PATTERNS)}")
        gkey = self._group_key(ranks, concurrent_groups)
        spec = self._group_spec(gkey)
        return self._cached_link(("g",) + gkey + (pattern,), spec, pattern)

    def _group_spec(self, gkey: tuple) -> Callable[[], tuple[_Classes, np.ndarray]]:
        groups = self._spec_of(gkey)
        return lambda: self._classes(groups())

    def collective_time_s(self, op: str, ranks: Sequence[int], message_bytes: float, *,
                          algorithm: str = "auto",
                          concurrent_groups: Sequence[Sequence[int]] | None = None) -> float:
        """Seconds for ``op`` over ``ranks`` (for ``p2p``: ``(src, dst)``) of ``message_bytes``.

        ``op``: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``p2p``
        (``message_bytes`` conventions: ``sim.net.collectives``).  ``algorithm``: ``ring``,
        ``tree`` (all-reduce), ``hierarchical`` (all-reduce/gather/scatter; the ring when the
        group does not split evenly over NVLink domains), ``auto`` (the cheapest at this
        size) or ``auto_no_nvls`` (the same without NVLS).  ``concurrent_groups``: all groups
        issuing the same collective at once.
        """
        gkey = self._group_key(ranks, concurrent_groups)
        key = (op, algorithm) + gkey
        lines = self._coeffs.get(key)
        if lines is not None and 0 < message_bytes < math.inf:
            return envelope_time_s(lines, message_bytes, self.size_curves)
        if op == "p2p" and len(gkey[0]) != 2:
            raise InputError("ranks", gkey[0], "p2p takes (src, dst)")
        return self._time(key, op, algorithm, message_bytes, self._group_spec(gkey), ("g",) + gkey)

    def p2p_time_s(self, src: int, dst: int, message_bytes: float) -> float:
        """Seconds for one send of ``message_bytes`` from GPU ``src`` to GPU ``dst`` (alone);
        0 when ``src == dst``."""
        if src == dst:
            return 0.0
        return self.collective_time_s("p2p", (src, dst), message_bytes)

    def best_algorithm(self, op: str, ranks: Sequence[int], message_bytes: float, *,
                       concurrent_groups: Sequence[Sequence[int]] | None = None) -> str:
        """The algorithm ``auto`` picks for this op, group and size."""
        gkey = self._group_key(ranks, concurrent_groups)
        self._lines(op, "auto", self._group_spec(gkey), ("g",) + gkey)  # validates op
        co = self._candidates(op, "auto", self._group_spec(gkey), ("g",) + gkey)
        return min(co, key=lambda name: envelope_time_s((co[name],), message_bytes, self.size_curves))

    # -- per strategy dimension: all groups of the dimension at once, worst group ----------

    def _dim_spec(self, strategy: Strategy, dim: str, pattern_pp: bool = False
                  ) -> tuple[tuple, Callable[[], tuple[_Classes, None]]]:
        total = strategy.num_gpus
        if pattern_pp:
            stride, size = group_shape(strategy, "pp")
            key = ("pp-pairs", stride, size, total)

            def spec() -> tuple[_Classes, None]:
                if total > self.fabric.num_gpus:
                    raise InputError("strategy", total, f"needs {total} GPUs, the cluster has {self.fabric.num_gpus}")
                pairs = pipeline_pairs(strategy)
                return ([np.array(pairs, dtype=np.int64).reshape(len(pairs), 2)] if pairs
                        else [np.zeros((1, 1), dtype=np.int64)]), None
            return key, spec
        stride, size = group_shape(strategy, dim)
        return ("t", stride, size, total), lambda: (self._tiling(stride, size, total), None)

    def dim_link(self, strategy: Strategy, dim: str, *, pattern: str = "ring") -> GroupLink:
        """``group_link`` of the worst ``dim`` group of ``strategy`` (``sim.net.placement``) with all
        ``dim`` groups running at once; ``pattern="p2p"`` with ``dim="pp"`` prices every forward
        pipeline send at once.  Cached by the groups' shape: microseconds once warm."""
        if pattern not in PATTERNS:
            raise InputError("pattern", pattern, f"must be one of {', '.join(PATTERNS)}")
        lkey, spec = self._dim_spec(strategy, dim, pattern_pp=(pattern == "p2p"))
        return self._cached_link(lkey + (pattern,), spec, pattern)

    def dim_collective_time_s(self, op: str, strategy: Strategy, dim: str, message_bytes: float, *,
                              algorithm: str = "auto") -> float:
        """``collective_time_s`` for every ``dim`` group of ``strategy`` at once (the slowest
        group's time).  ``op="p2p"`` with ``dim="pp"``: all forward pipeline sends at once."""
        key = ("dim", op, algorithm, dim, strategy.tp, strategy.cp, strategy.dp, strategy.pp, strategy.ep,
               strategy.expert_tp, strategy.zero_shard, strategy.order)
        lines = self._coeffs.get(key)
        if lines is not None and 0 < message_bytes < math.inf:
            return envelope_time_s(lines, message_bytes, self.size_curves)
        lkey, spec = self._dim_spec(strategy, dim, pattern_pp=(op == "p2p"))
        return self._time(key, op, algorithm, message_bytes, spec, lkey)
