"""Shared links with bandwidth: the fabric as a table of directed links, and flows sharing them.

``LinkTable`` is the fabric ``sim.network.Network`` prices collectives on (every directed
link with its capacity after the calibration's efficiency: NVLink ports, host/PCIe edges, NIC
ports, leaf/spine uplinks, mesh/torus hops), plus what-if degradations.  ``loads(src, dst)``
routes a set of flows with the same policy as ``Network`` (NVSwitch inside a domain, else
striped over the node's NICs, then the switch tree or grid) and returns, per link, how many
flows cross it (a stripe counts ``1/stripes``).

``FairShare`` runs flows on those links inside a simpy environment.  A *kind* is a fixed set of
sub-flows that move together: one collective of a group and of every replica it stands for
(a ring's edges, an all-to-all's ordered pairs, a pipeline send's pairs), so a kind has one
rate, in bytes/s per sub-flow.  Rates are max-min fair over the active kinds (progressive
filling; Bertsekas & Gallager, *Data Networks*, 2nd ed., Sec. 6.5.2): alone, a kind runs at
``min over its links of capacity / load``, which is exactly ``Network.group_link``'s
equal-share bottleneck for the same groups; when kinds share a link they split it, and any
capacity one leaves unused goes to the others.  Rates change only when a flow starts or ends
in the *component* of kinds that share links with it; solutions are cached per component
(a multiset of kinds), so a step with thousands of sends costs a dictionary lookup per send.

Known error: a collective is one fluid flow (no per-step ring pipelining; latency runs at full
speed in front of the bytes); tree and hierarchical algorithms are given the ring's footprint
on the links, so their contention is approximate; flows of one kind never slow each other
unless two of the same kind overlap in time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import simpy

from sim.errors import InputError
from sim.topology import TIERS

_EPS = 1e-12


class LinkTable:
    """Directed links of ``net``'s fabric: capacities (bytes/s, after efficiency) and tiers.

    Built from ``sim.network.Network``'s link layout so both price the same fabric.  ``scale``
    multiplies capacities (what-ifs); ``scale_link(ids, factor)`` returns a new table.
    """

    def __init__(self, net: object) -> None:
        try:
            self._net = net
            f = net.fabric  # type: ignore[attr-defined]
            self.fabric = f
            self.num_links = int(net._num_links)  # type: ignore[attr-defined]
            self.cap = np.asarray(net._cap, dtype=float).copy()  # type: ignore[attr-defined]
            self._su_up, self._su_down = net._su_up, net._su_down  # type: ignore[attr-defined]
            self._host_up, self._host_down = net._host_up, net._host_down  # type: ignore[attr-defined]
            self._nic_up, self._nic_down = net._nic_up, net._nic_down  # type: ignore[attr-defined]
            # Link ids are laid out by tier: scale-up ports, host edges, then scale-out.
            ids = np.arange(self.num_links)
            self.tier = np.where(ids < self._host_up, 0, np.where(ids < self._nic_up, 1, 2)).astype(np.int8)
            self._blk_up, self._blk_down = list(net._blk_up), list(net._blk_down)  # type: ignore[attr-defined]
            self._out_path, self._in_path = net._out_path, net._in_path  # type: ignore[attr-defined]
            self._fabric_paths: Callable = net._fabric_paths  # type: ignore[attr-defined]
        except AttributeError as exc:  # pragma: no cover - guards a refactor of sim.network
            raise RuntimeError(f"sim.network.Network no longer exposes its link layout ({exc}); "
                               "sim/event/resources.py LinkTable needs updating") from exc
        assert self.cap.shape == (self.num_links,)

    # ------------------------------------------------------------------ routing

    def loads(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(link_ids, loads)`` (sorted, loads > 0) of all flows ``src[k] -> dst[k]`` at once.

        Flows with ``src == dst`` are local and load nothing.
        """
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        keep = src != dst
        src, dst = src[keep], dst[keep]
        E = self.num_links
        f = self.fabric
        load = np.zeros(E)
        if src.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        if f.has_scale_up:
            same = f.gpu_domain[src] == f.gpu_domain[dst]
        else:
            same = np.zeros(len(src), dtype=bool)
        if same.any():
            load += np.bincount(src[same] + self._su_up, minlength=E)
            load += np.bincount(dst[same] + self._su_down, minlength=E)
        xs, xd = src[~same], dst[~same]
        if xs.size:
            m = f.stripes
            G = f.num_gpus
            for counts, paths in ((np.bincount(xs, minlength=G), self._out_path),
                                  (np.bincount(xd, minlength=G), self._in_path)):
                used = np.nonzero(counts)[0]
                p = paths[used]
                w = np.broadcast_to((counts[used] / m)[:, None, None], p.shape)
                valid = p >= 0
                load += np.bincount(p[valid], weights=w[valid], minlength=E)
            pools = f.num_pools
            key = f.gpu_pool[xs] * pools + f.gpu_pool[xd]
            ukey, cnt = np.unique(key, return_counts=True)
            fpath = self._fabric_paths(ukey // pools, ukey % pools)
            valid = fpath >= 0
            w = np.broadcast_to((cnt / m)[:, None, None], fpath.shape)
            load += np.bincount(fpath[valid], weights=w[valid], minlength=E)
        ids = np.nonzero(load > 0)[0]
        return ids, load[ids]

    def alone_rate(self, ids: np.ndarray, loads: np.ndarray) -> float:
        """Bytes/s per sub-flow of a kind with nothing else on its links."""
        if ids.size == 0:
            return math.inf
        return float(np.min(self.cap[ids] / loads))

    # ------------------------------------------------------------------ what-ifs

    def select(self, target: str) -> np.ndarray:
        """Link ids named by a what-if target (see ``sim.event.whatif.parse_slow_link``)."""
        f = self.fabric
        kind, _, num = target.partition(":")
        if kind in TIERS and not num:
            return np.nonzero(self.tier == TIERS.index(kind))[0]
        if not num.isdigit():
            raise InputError("slow-link", target, "expected TIER or KIND:INDEX "
                             "(scale-up, host, scale-out, gpu:N, nic:N, node:N, leaf:N)")
        k = int(num)
        total_nics = f.num_nodes * f.nics_per_node
        if kind == "gpu":
            _bound("gpu", k, f.num_gpus, target)
            ids = [self._su_up + k, self._su_down + k]
            if f.gpu_per_nic_host_edge:
                ids += [self._host_up + k, self._host_down + k]
            return np.array(ids, dtype=np.int64)
        if kind == "nic":
            _bound("nic", k, total_nics, target)
            return np.array([self._nic_up + k, self._nic_down + k], dtype=np.int64)
        if kind == "node":
            _bound("node", k, f.num_nodes, target)
            nics = np.arange(k * f.nics_per_node, (k + 1) * f.nics_per_node)
            return np.concatenate([self._nic_up + nics, self._nic_down + nics]).astype(np.int64)
        if kind == "leaf":
            if not self._blk_up:
                raise InputError("slow-link", target, f"the {f.topology} fabric has no leaf uplinks")
            n = self._blk_down[0] - self._blk_up[0]
            _bound("leaf", k, n, target)
            return np.array([self._blk_up[0] + k, self._blk_down[0] + k], dtype=np.int64)
        raise InputError("slow-link", target, "kind must be one of gpu, nic, node, leaf or a tier "
                         f"({', '.join(TIERS)})")

    def scaled(self, ids: np.ndarray, factor: float) -> "LinkTable":
        """A copy whose links ``ids`` carry ``factor`` times their capacity."""
        out = object.__new__(LinkTable)
        out.__dict__.update(self.__dict__)
        out.cap = self.cap.copy()
        out.cap[ids] *= factor
        return out


def _bound(kind: str, k: int, n: int, target: str) -> None:
    if not 0 <= k < n:
        raise InputError("slow-link", target, f"{kind} index must be in [0, {n})")


# --------------------------------------------------------------------------- flows


@dataclass(eq=False, slots=True)
class Kind:
    """Sub-flows that move together at one rate (see module docstring)."""

    index: int
    name: str
    ids: np.ndarray
    loads: np.ndarray
    alone_rate: float
    neighbours: set[int] = field(default_factory=set)


class Flow:
    __slots__ = ("kind", "fixed_s", "bytes", "rate", "t_last", "version", "done", "start_s")

    def __init__(self, kind: Kind, fixed_s: float, nbytes: float, now: float, done: simpy.Event) -> None:
        self.kind = kind
        self.fixed_s = fixed_s
        self.bytes = nbytes
        self.rate = 0.0
        self.t_last = now
        self.version = 0
        self.done = done
        self.start_s = now

    def advance(self, now: float) -> None:
        dt = now - self.t_last
        if dt > 0:
            used = min(self.fixed_s, dt)
            self.fixed_s -= used
            self.bytes = max(0.0, self.bytes - (dt - used) * self.rate)
        self.t_last = now

    def remaining_s(self) -> float:
        if self.bytes <= 0:
            return self.fixed_s
        return self.fixed_s + (self.bytes / self.rate if self.rate < math.inf else 0.0)


class FairShare:
    """Max-min fair sharing of ``table``'s links by flows in ``env`` (module docstring)."""

    def __init__(self, env: simpy.Environment, table: LinkTable) -> None:
        self.env = env
        self.table = table
        self.kinds: list[Kind] = []
        self._by_name: dict[str, Kind] = {}
        self._active: dict[int, list[Flow]] = {}
        self._solutions: dict[tuple, tuple[dict[int, float], float]] = {}
        self.max_utilisation = 0.0  # highest link load / capacity of any solved sharing
        self.num_flows = 0

    # -- kinds ------------------------------------------------------------------------

    def kind(self, name: str, src: np.ndarray, dst: np.ndarray) -> Kind:
        k = self._by_name.get(name)
        if k is None:
            ids, loads = self.table.loads(src, dst)
            k = Kind(index=len(self.kinds), name=name, ids=ids, loads=loads,
                     alone_rate=self.table.alone_rate(ids, loads))
            self.kinds.append(k)
            self._by_name[name] = k
        return k

    def link_neighbours(self) -> None:
        """Index which kinds share which links: every kind's ``neighbours``, and the links of
        each distinct set of sharing kinds (the only links a solve needs, see ``_solve``)."""
        self._cols: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in self.kinds]
        self._vals: list[np.ndarray] = [np.zeros(0) for _ in self.kinds]
        if not self.kinds:
            return
        link = np.concatenate([k.ids for k in self.kinds])
        owner = np.concatenate([np.full(len(k.ids), k.index) for k in self.kinds])
        order = np.lexsort((owner, link))
        link, owner = link[order], owner[order]
        starts = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
        ends = np.r_[starts[1:], len(link)]
        multi = np.flatnonzero(ends - starts > 1)
        groups: dict[tuple[int, ...], list[int]] = {}
        owners = owner.tolist()
        links = link.tolist()
        for j in multi.tolist():
            a, b = int(starts[j]), int(ends[j])
            groups.setdefault(tuple(owners[a:b]), []).append(links[a])
        # Constraint columns: per distinct set of sharing kinds, its distinct (load / capacity)
        # columns; kept per kind as (column ids, values) for a vectorised solve.
        cols: list[list[np.ndarray]] = [[] for _ in self.kinds]
        vals: list[list[np.ndarray]] = [[] for _ in self.kinds]
        ncol = 0
        for group, id_list in groups.items():
            ids = np.array(id_list, dtype=np.int64)
            norm = np.stack([self.kinds[a].loads[np.searchsorted(self.kinds[a].ids, ids)] for a in group])
            norm = np.unique(norm / self.table.cap[ids], axis=1)
            n = norm.shape[1]
            for j, a in enumerate(group):
                cols[a].append(np.arange(ncol, ncol + n))
                vals[a].append(norm[j])
                self.kinds[a].neighbours.update(group)
            ncol += n
        self._cols = [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in cols]
        self._vals = [np.concatenate(v) if v else np.zeros(0) for v in vals]
        for k in self.kinds:
            k.neighbours.discard(k.index)

    def isolated(self, kind: Kind) -> bool:
        """Whether no other kind ever shares a link with ``kind`` (it always runs alone)."""
        return not kind.neighbours

    # -- running ----------------------------------------------------------------------

    def start(self, kind: Kind, nbytes: float, fixed_s: float = 0.0) -> simpy.Event:
        """Start one flow of ``kind`` moving ``nbytes`` per sub-flow after ``fixed_s`` of
        latency; the returned event fires when it completes."""
        env = self.env
        done = env.event()
        self.num_flows += 1
        flow = Flow(kind, fixed_s, nbytes, env.now, done)
        lst = self._active.get(kind.index)
        if lst is None:
            self._active[kind.index] = [flow]
        else:
            lst.append(flow)
        if lst is None and not (kind.neighbours and kind.neighbours.intersection(self._active)):
            flow.rate = kind.alone_rate
            self._schedule(flow)
        else:
            self._resolve(kind.index, new=flow)
        return done

    def _schedule(self, flow: Flow) -> None:
        flow.version += 1
        version = flow.version
        ev = self.env.timeout(flow.remaining_s())
        ev.callbacks.append(lambda _e, f=flow, v=version: self._finish(f, v))

    def _finish(self, flow: Flow, version: int) -> None:
        if version != flow.version:
            return
        kid = flow.kind.index
        lst = self._active[kid]
        lst.remove(flow)
        if not lst:
            del self._active[kid]
        flow.done.succeed(flow)
        touched = [k for k in flow.kind.neighbours if k in self._active]
        if lst:
            touched.append(kid)
        if touched:
            self._resolve(touched[0], extra=touched[1:])

    def _component(self, seeds: list[int]) -> list[int]:
        comp, todo = set(seeds), list(seeds)
        active = self._active
        while todo:
            k = todo.pop()
            for n in self.kinds[k].neighbours:
                if n in active and n not in comp:
                    comp.add(n)
                    todo.append(n)
        return sorted(comp)

    def _resolve(self, seed: int, *, new: Flow | None = None, extra: list[int] | None = None) -> None:
        now = self.env.now
        comp = self._component([seed] + (extra or []))
        key = tuple((k, len(self._active[k])) for k in comp)
        sol = self._solutions.get(key)
        if sol is None:
            sol = self._solve(key)
            self._solutions[key] = sol
        rates, util = sol
        if util > self.max_utilisation:
            self.max_utilisation = util
        for k in comp:
            r = rates[k]
            for flow in self._active[k]:
                if flow is new or flow.rate != r:
                    flow.advance(now)
                    flow.rate = r
                    self._schedule(flow)

    def _solve(self, key: tuple) -> tuple[dict[int, float], float]:
        """Max-min fair rates of the kinds in ``key`` (``(kind, active flows)`` pairs).

        A kind's links that no other kind of the component uses only bound it by its alone
        rate (divided by its own active count), so the solve needs the shared links only.
        """
        kinds = [self.kinds[k] for k, _ in key]
        count = np.array([c for _, c in key], dtype=float)
        bound = np.array([k.alone_rate for k in kinds]) / count
        cols = np.concatenate([self._cols[k.index] for k in kinds])
        vals = np.concatenate([self._vals[k.index] * c for k, c in zip(kinds, count)])
        rows = np.repeat(np.arange(len(kinds)), [len(self._cols[k.index]) for k in kinds])
        ucols, inv = np.unique(cols, return_inverse=True)
        A = np.zeros((len(kinds), len(ucols)))  # load / capacity: every constraint is A @ rate <= 1
        A[rows, inv] = vals
        A = A[:, (A > 0).sum(axis=0) >= 2]  # a column only one kind uses is implied by its bound
        ncol = A.shape[1]
        cap = np.ones(ncol)
        rate = np.zeros(len(kinds))
        free = np.isfinite(bound)
        rate[~free] = math.inf
        rem = cap.copy()
        while free.any():
            L = A[free].sum(axis=0) if ncol else np.zeros(0)
            pos = L > 0
            inc = float(np.min(bound[free] - rate[free]))
            if pos.any():
                inc = min(inc, float(np.min(rem[pos] / L[pos])))
            rate[free] += inc
            rem = rem - inc * L
            sat = pos & (rem <= _EPS * cap)
            frozen = free & ((rate >= bound * (1 - _EPS)) | (A[:, sat] > 0).any(axis=1))
            if not frozen.any():  # pragma: no cover - numerical safety
                frozen = free
            free &= ~frozen
        finite = np.isfinite(rate)
        util = float(np.max(rate[finite] / bound[finite])) if finite.any() else 0.0
        if ncol:
            used = (A[finite] * rate[finite, None]).sum(axis=0)
            util = max(util, float(np.max(used / cap)))
        return {k.index: float(r) for k, r in zip(kinds, rate)}, util


class CollectiveStream:
    """One communicator's stream: collectives run one at a time in issue order (as NCCL does
    on one stream), each after all ``parties`` members have issued it."""

    def __init__(self, net: FairShare, parties: int) -> None:
        self.net = net
        self.parties = parties
        self._arrived: dict[object, int] = {}
        self._events: dict[object, simpy.Event] = {}
        self._queue: deque = deque()
        self._busy = False
        self.log: list[tuple[object, float, float]] = []  # (key, start, end)

    def issue(self, key: object, kind: Kind, nbytes: float, fixed_s: float) -> simpy.Event:
        """Member arrival for collective ``key``; returns its completion event."""
        ev = self._events.get(key)
        if ev is None:
            ev = self.net.env.event()
            self._events[key] = ev
            self._arrived[key] = 0
        self._arrived[key] += 1
        if self._arrived[key] == self.parties:
            del self._arrived[key]
            self._queue.append((key, kind, nbytes, fixed_s, ev))
            if not self._busy:
                self._next()
        return ev

    def _next(self) -> None:
        if not self._queue:
            self._busy = False
            return
        self._busy = True
        key, kind, nbytes, fixed_s, ev = self._queue.popleft()
        start = self.net.env.now
        done = self.net.start(kind, nbytes, fixed_s)

        def finished(_e: simpy.Event) -> None:
            self.log.append((key, start, self.net.env.now))
            del self._events[key]
            ev.succeed()
            self._next()
        done.callbacks.append(finished)
