"""Shared links with bandwidth: the fabric as a table of directed links, and flows sharing them.

``LinkTable`` is the fabric ``sim.net.network.Network`` prices collectives on (every directed
link with its capacity after the calibration's efficiency: NVLink ports, host/PCIe edges, NIC
ports, leaf/spine uplinks, mesh/torus hops), plus what-if degradations.  ``loads(src, dst)``
routes a set of flows with the same policy as ``Network`` (NVSwitch inside a domain, else
striped over the node's NICs, then the switch tree or grid) and returns, per link, how many
flows cross it (a stripe counts ``1/stripes``).

``FairShare`` runs flows on those links inside a simpy environment.  A *kind* is a fixed set of
sub-flows that move together: one collective of a group and of every replica it stands for
(a ring's edges, an all-to-all's ordered pairs, a pipeline send's pairs), so a kind has one
rate, in bytes/s per sub-flow.  Alone, a kind runs at ``min over its links of capacity /
load``: exactly ``Network.group_link``'s equal-share bottleneck for the same groups.  When
kinds overlap in time on a link, the link is shared in proportion to demand: with ``D`` the
sum over the active flows of their full-speed load as a fraction of the link's capacity, every
flow on a link with ``D > 1`` keeps ``1 / D`` of its full-speed rate, and a flow runs at the
fraction of its most overloaded link (demand-proportional scaling, a fluid flow model; it is
neither max-min nor "proportional fairness" in the sense of Kelly 1997).  No link is ever
loaded above capacity; with equal full-speed rates this is ``sim.net.network``'s equal-share
bottleneck.  Rates are settled once per simulated instant (all flows starting or ending at one
time together) and only for the kinds that share a link with a changed one.

Known error: proportional sharing is not work-conserving: a flow slowed on one link does not
hand the capacity it leaves on its other links to others (max-min fairness would), so sharing
is slightly pessimistic for flows that meet on a link that is not both their bottlenecks.  A
collective is one fluid flow (no per-step ring pipelining; its latency runs in front of its
bytes while it already loads the links); tree and hierarchical algorithms get the ring's
footprint on the links, so their contention is approximate.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.base.errors import InputError
from sim.net.fabric import TIERS
from sim.net.network import Network

_EPS = 1e-12


class LinkTable:
    """Directed links of ``net``'s fabric: capacities (bytes/s, after efficiency) and tiers.

    Built from ``sim.net.network.Network``'s link layout (``net.links``, ``sim.net.links``) so both
    price the same fabric.  ``scale``
    multiplies capacities (what-ifs); ``scale_link(ids, factor)`` returns a new table.
    """

    def __init__(self, net: Network) -> None:
        self._net = net
        links = net.links
        self.fabric = links.fabric
        self.num_links = int(links.num_links)
        self.cap = np.asarray(links.cap, dtype=float).copy()
        self._su_up, self._su_down = links.su_up, links.su_down
        self._host_up, self._host_down = links.host_up, links.host_down
        self._nic_up, self._nic_down = links.nic_up, links.nic_down
        self.tier = np.asarray(links.tier, dtype=np.int8)  # per link: index into sim.net.fabric.TIERS
        self._links = links
        self._blk_up, self._blk_down = list(links.blk_up), list(links.blk_down)
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
        if src.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        load = self._net.link_loads(src, dst)
        ids = np.nonzero(load > 0)[0]
        return ids, load[ids]

    def alone_rate(self, ids: np.ndarray, loads: np.ndarray) -> float:
        """Bytes/s per sub-flow of a kind with nothing else on its links."""
        if ids.size == 0:
            return math.inf
        return float(np.min(self.cap[ids] / loads))

    # ------------------------------------------------------------------ what-ifs

    def select(self, target: str) -> np.ndarray:
        """Link ids named by a what-if target (see ``sim.engines.event.whatif.parse_slow_link``)."""
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
            ids = list(self._links.gpu_slot_links(k))
            if f.gpu_per_nic_host_edge and f.server is None:
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
    __slots__ = ("kind", "fixed_s", "bytes", "rate", "t_last", "version", "done")

    def __init__(self, kind: Kind, fixed_s: float, nbytes: float, now: float, done: simpy.Event) -> None:
        self.kind = kind
        self.fixed_s = fixed_s
        self.bytes = nbytes
        self.rate = 0.0
        self.t_last = now
        self.version = 0
        self.done = done

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


def _sharing_groups(link: np.ndarray, owner: np.ndarray, starts: np.ndarray, ends: np.ndarray, multi: np.ndarray,
                    num_kinds: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """The links used by more than one kind, grouped by the set of kinds using them: (kinds in
    ascending order, link ids in ascending order), groups in order of their first link.
    ``link``/``owner`` are sorted by (link, owner); ``starts``/``ends`` delimit each link's
    entries and ``multi`` indexes the links with more than one."""
    if num_kinds > 62 or not multi.size:  # the set of kinds as one int64 bit mask needs <= 62 kinds
        groups: dict[tuple[int, ...], list[int]] = {}
        owners, links = owner.tolist(), link.tolist()
        for j in multi.tolist():
            a, b = int(starts[j]), int(ends[j])
            groups.setdefault(tuple(owners[a:b]), []).append(links[a])
        return [(g, np.array(ids, dtype=np.int64)) for g, ids in groups.items()]
    mask = np.bitwise_or.reduceat(np.left_shift(np.int64(1), owner.astype(np.int64)), starts)[multi]
    first_links = link[starts[multi]]
    _, first, inverse = np.unique(mask, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    members = np.split(first_links[np.argsort(inverse, kind="stable")], np.cumsum(np.bincount(inverse))[:-1])
    out = []
    for u in np.argsort(first, kind="stable").tolist():  # groups in order of their first link
        m = int(mask[first[u]])
        out.append((tuple(i for i in range(num_kinds) if m >> i & 1), members[u]))
    return out


def _unique_columns(dem: np.ndarray) -> np.ndarray:
    """``np.unique(dem, axis=1)`` for a 2-D float array: its distinct columns in lexicographic
    order (the first row first), by one lexsort instead of a structured-dtype sort."""
    if dem.shape[1] <= 1:
        return dem
    order = np.lexsort(dem[::-1])
    srt = dem[:, order]
    keep = np.r_[True, np.any(srt[:, 1:] != srt[:, :-1], axis=0)]
    return srt[:, keep]


class FairShare:
    """Flows in ``env`` sharing ``table``'s links in proportion to demand (module docstring)."""

    def __init__(self, env: simpy.Environment, table: LinkTable, *, check: bool = False) -> None:
        self.env = env
        self.table = table
        self.check = check  # track the highest shared-link utilisation (tests; costs time)
        self.kinds: list[Kind] = []
        self._by_name: dict[str, Kind] = {}
        self._active: dict[int, list[Flow]] = {}
        self._factor: dict[int, float] = {}  # active kind -> fraction of its full-speed rate
        self._dirty: set[int] = set()  # kinds whose rate must be recomputed at this instant
        self._new: list[Flow] = []
        self._flush_pending = False
        self.max_utilisation = 0.0  # highest shared-link load / capacity seen (with ``check``)
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
        """Index the links kinds share: every kind's ``neighbours`` and, per kind, its
        full-speed demand (fraction of capacity) on each shared link class."""
        cols: list[list[np.ndarray]] = [[] for _ in self.kinds]
        vals: list[list[np.ndarray]] = [[] for _ in self.kinds]
        ncol = 0
        if self.kinds:
            link = np.concatenate([k.ids for k in self.kinds])
            owner = np.concatenate([np.full(len(k.ids), k.index) for k in self.kinds])
            order = np.lexsort((owner, link))
            link, owner = link[order], owner[order]
            starts = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
            ends = np.r_[starts[1:], len(link)]
            multi = np.flatnonzero(ends - starts > 1)
            groups = _sharing_groups(link, owner, starts, ends, multi, len(self.kinds))
            # One column per distinct demand pattern of a set of sharing kinds: links whose
            # every kind puts the same fraction of capacity on them are one constraint.
            for group, ids in groups:
                dem = np.stack([self.kinds[a].loads[np.searchsorted(self.kinds[a].ids, ids)]
                                * self.kinds[a].alone_rate for a in group])
                dem = _unique_columns(dem / self.table.cap[ids])
                n = dem.shape[1]
                for j, a in enumerate(group):
                    cols[a].append(np.arange(ncol, ncol + n))
                    vals[a].append(dem[j])
                    self.kinds[a].neighbours.update(group)
                ncol += n
        self._cols = [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in cols]
        self._dem = [np.concatenate(v) if v else np.zeros(0) for v in vals]
        self._demand = np.zeros(ncol)  # full-speed demand of the active flows, / capacity
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
        k = kind.index
        lst = self._active.get(k)
        cols = self._cols[k]
        if cols.size:
            self._demand[cols] += self._dem[k]
        if lst is None:
            self._active[k] = [flow]
            self._factor[k] = 1.0
            if kind.neighbours.isdisjoint(self._active):  # alone on its links: full speed now
                flow.rate = kind.alone_rate
                self._schedule(flow)
                return done
        else:
            lst.append(flow)
        self._new.append(flow)
        self._touch(kind)
        return done

    def _schedule(self, flow: Flow) -> None:
        flow.version += 1
        version = flow.version
        ev = self.env.timeout(flow.remaining_s())
        ev.callbacks.append(lambda _e, f=flow, v=version: self._finish(f, v))

    def _finish(self, flow: Flow, version: int) -> None:
        if version != flow.version:
            return
        kind = flow.kind
        k = kind.index
        lst = self._active[k]
        lst.remove(flow)
        cols = self._cols[k]
        if cols.size:
            self._demand[cols] -= self._dem[k]
        if not lst:
            del self._active[k]
            del self._factor[k]
        flow.done.succeed(flow)
        if lst or not kind.neighbours.isdisjoint(self._active):
            self._touch(kind)

    def _touch(self, kind: Kind) -> None:
        """Mark ``kind`` and its active neighbours for new rates at the end of this instant
        (all starts and ends at one time are settled together)."""
        if kind.index in self._active:
            self._dirty.add(kind.index)
        if kind.neighbours:
            self._dirty.update(kind.neighbours.intersection(self._active))
        if not self._flush_pending:
            self._flush_pending = True
            ev = self.env.event()
            ev.callbacks.append(self._flush)
            ev.succeed()

    def _flush(self, _ev: simpy.Event) -> None:
        self._flush_pending = False
        now = self.env.now
        demand = self._demand
        new = set(map(id, self._new))
        for k in sorted(self._dirty):
            flows = self._active.get(k)
            if flows is None:
                continue
            n = len(flows)
            cols = self._cols[k]
            worst = float(demand[cols].max()) if cols.size else 0.0
            f = min(1.0 / n, 1.0 / worst) if worst > 1.0 else 1.0 / n
            self._factor[k] = f
            rate = self.kinds[k].alone_rate * f
            for flow in flows:
                if id(flow) in new or abs(flow.rate - rate) > 1e-12 * rate:
                    flow.advance(now)
                    flow.rate = rate
                    self._schedule(flow)
        self._dirty.clear()
        self._new.clear()
        if self.check:
            used = np.zeros_like(demand)
            for k, flows in self._active.items():
                cols = self._cols[k]
                if cols.size:
                    used[cols] += len(flows) * self._factor[k] * self._dem[k]
            if used.size:
                self.max_utilisation = max(self.max_utilisation, float(used.max()))


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
