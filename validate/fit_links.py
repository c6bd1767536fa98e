"""Fit the links of a calibration profile from collective microbenchmarks.

Per link tier (``intra``: inside a node, the scale-up link; ``inter``: between nodes, the
NIC), the latency ``alpha`` (per algorithm step), the bandwidth ``B`` and a per-call overhead
``c`` (``collective_overhead_s``, which ``sim.cost.costs`` adds to every collective) minimise the
squared log error of ``Network.collective_time_s + c`` (the ring/tree/pairwise closed forms of
``sim.net.collectives`` on the measured rank placement, concurrent groups included) over every
measured op, size and layout of that tier: a log-spaced grid search over ``(alpha, B)``
refined around the best point, ``c`` by a 1-D search inside (no SciPy needed).

Each tier is fitted from its own records only, and a tier without records is not fitted
(``fit_links`` returns None for it; the profile then carries no link for it, and the
simulator keeps the catalog's).  Inter-node groups with several ranks per node also cross
the intra-node link, which is then held at its own fit; with one rank per node they are pure
NIC traffic and need nothing else.

The probe cluster gives each rank of a node its own NIC (``min(ranks per node, NICs per
node)`` NICs, the catalog's rail-optimised servers: one NIC per GPU), so the fitted NIC
bandwidth is what one rank's traffic gets through one NIC, the quantity the simulator
multiplies by the node's NICs.  Units: bytes/s, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from validate.fit import MIN_POINTS, FitError


@dataclass(frozen=True, slots=True)
class LinkFit:
    bytes_per_s: float
    latency_s: float  # per algorithm step (alpha)
    rms_log: float  # RMS of log(predicted / measured)
    n: int
    call_overhead_s: float = 0.0  # per collective call (``collective_overhead_s``)
    measured_over_predicted: dict[str, float] | None = None  # per op, geometric mean
    layouts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Machine:
    """What the probe cluster copies from the measured machine."""

    world: int
    ranks_per_node: int
    nics_per_node: int = 1
    pcie_generation: int = 5

    @property
    def probe_nics(self) -> int:
        return max(1, min(self.ranks_per_node, self.nics_per_node))


SIM_OP = {"send_recv": "p2p"}


def probe_cluster(m: Machine, *, intra: tuple[float, float] | None, inter: tuple[float, float] | None):
    """A cluster shaped like the measured job whose scale-up (and NIC) links have the trial
    parameters (bandwidth, latency)."""
    from sim.data.hardware import Cluster, Gpu, Link

    su_bw, su_lat = intra if intra is not None else (inter if inter is not None else (1e9, 1e-5))
    nic_bw, nic_lat = inter if inter is not None else (su_bw, su_lat)
    su = Link(id="probe-su", name="probe", kind="scale-up", bytes_per_s_per_direction=su_bw, latency_s=su_lat)
    nic = Link(id="probe-nic", name="probe", kind="nic", bytes_per_s_per_direction=nic_bw, latency_s=nic_lat)
    rpn = m.ranks_per_node
    gpu = Gpu(id="probe", name="probe", dense_flops_per_s={"bf16": 1e12}, hbm_bytes=1e10, hbm_bytes_per_s=1e10,
              nvlink_bytes_per_s_per_direction=su_bw, nvlink_domain_size=rpn,
              nvlink_generation="probe-su", pcie_generation=m.pcie_generation, tdp_w=1.0, gpus_per_node=rpn,
              nics_per_node=m.probe_nics, default_nic="probe-nic", matmul_efficiency={"bf16": 1.0},
              hbm_efficiency=1.0)
    return Cluster(gpu=gpu, num_gpus=m.world, nic=nic, gpus_per_node=rpn, nvlink_domain=rpn,
                   nics_per_node=m.probe_nics, scale_up=su, topology="fat-tree")


def collective_groups(rec: dict) -> list[list[int]]:
    """All groups of a measured layout (they ran at the same time)."""
    if rec.get("groups"):
        return [[int(x) for x in g] for g in rec["groups"]]
    first = [int(x) for x in rec["ranks"]]
    n, g = int(rec["group_size"]), int(rec["num_groups"])
    layout = str(rec.get("layout"))
    if g == 1:
        return [first]
    if layout == "node" or layout.startswith("tp"):
        return [[i * n + j for j in range(n)] for i in range(g)]
    if layout == "pp":
        return [[2 * i, 2 * i + 1] for i in range(g)]
    stride = first[1] - first[0] if len(first) > 1 else 1
    return [[first[0] + i + j * stride for j in range(n)] for i in range(g)]


def predict_collective(net, rec: dict) -> float:
    """What ``net`` (a ``sim.net.network.Network``) predicts for one measured collective."""
    op = SIM_OP.get(rec["op"], rec["op"])
    groups = collective_groups(rec)
    concurrent = [tuple(g) for g in groups] if len(groups) > 1 else None
    ranks = (groups[0][0], groups[0][1]) if op == "p2p" else groups[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return net.collective_time_s(op, ranks, rec["message_bytes"], concurrent_groups=concurrent)


def _best_overhead(pred: np.ndarray, meas: np.ndarray, fixed: float | None) -> tuple[float, float]:
    """(RMS log error, per-call overhead c >= 0) minimising it for ``pred + c`` vs ``meas``."""
    lm = np.log(meas)

    def err(c: float) -> float:
        return float(np.sqrt(np.mean((np.log(np.maximum(pred + c, 1e-12)) - lm) ** 2)))

    if fixed is not None:
        return err(fixed), fixed
    cands = [0.0] + list(np.logspace(-7, -1.5, 45))
    errs = [err(c) for c in cands]
    i = int(np.argmin(errs))
    lo, hi = (cands[i - 1] if i > 0 else 0.0), (cands[i + 1] if i + 1 < len(cands) else cands[i] * 2)
    for _ in range(30):  # golden-section refinement inside the bracket
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        if err(a) < err(b):
            hi = b
        else:
            lo = a
    c = 0.5 * (lo + hi)
    return (err(c), c) if err(c) < errs[i] else (errs[i], cands[i])


def _network(m: Machine, tier: str, trial: tuple[float, float], fixed: tuple[float, float] | None):
    from sim.net.network import Network

    if tier == "intra":
        return Network(probe_cluster(m, intra=trial, inter=fixed))
    return Network(probe_cluster(m, intra=fixed, inter=trial))


def _rms_log(params: tuple[float, float], pts: list[dict], m: Machine, tier: str,
             fixed: tuple[float, float] | None, overhead: float | None) -> tuple[float, float]:
    net = _network(m, tier, (math.exp(params[0]), math.exp(params[1])), fixed)
    pred = np.array([predict_collective(net, r) for r in pts])
    return _best_overhead(pred, np.array([r["time_s"] for r in pts]), overhead)


def _one_rank_per_node(rec: dict, rpn: int) -> bool:
    return all(len({r // rpn for r in g}) == len(g) for g in collective_groups(rec))


def fit_link(records: Iterable[dict], *, tier: str, machine: Machine,
             fixed: tuple[float, float] | None = None, overhead_s: float | None = None) -> LinkFit:
    """Alpha-beta parameters of one tier, and the per-call overhead, through the simulator's
    collective model: ``t = Network.collective_time_s(alpha, B) + c``.

    ``fixed`` are the (bandwidth, latency) of the intra-node link when fitting ``inter``
    (needed only when a group has several ranks on a node); ``overhead_s`` fixes ``c``.
    """
    pts = [r for r in records if r.get("kind") == "collective" and r.get("tier") == tier and r["time_s"] > 0]
    if len(pts) < MIN_POINTS:
        raise FitError(f"need >= {MIN_POINTS} {tier}-node collective measurements, got {len(pts)}")
    if tier == "inter" and fixed is None and not all(_one_rank_per_node(r, machine.ranks_per_node) for r in pts):
        raise FitError("inter-node groups with several ranks per node need the intra-node link fitted first")
    small = min(pts, key=lambda r: r["message_bytes"])
    large = max(pts, key=lambda r: r["message_bytes"])
    best = (math.log(max(large["message_bytes"] / large["time_s"], 1e5)), math.log(max(small["time_s"] / 4, 1e-7)))
    best_err, best_c = _rms_log(best, pts, machine, tier, fixed, overhead_s)
    span = (math.log(100.0), math.log(100.0))
    for _ in range(6):  # coarse-to-fine grid, 9 x 9 per round
        cx, cy = best
        for gx in np.linspace(cx - span[0], cx + span[0], 9):
            for gy in np.linspace(cy - span[1], cy + span[1], 9):
                e, c = _rms_log((gx, gy), pts, machine, tier, fixed, overhead_s)
                if e < best_err:
                    best, best_err, best_c = (float(gx), float(gy)), e, c
        span = (span[0] / 3.0, span[1] / 3.0)
    bw, lat = math.exp(best[0]), math.exp(best[1])
    net = _network(machine, tier, (bw, lat), fixed)
    by_op: dict[str, list[float]] = {}
    for r in pts:
        p = predict_collective(net, r) + best_c
        by_op.setdefault(r["op"], []).append(math.log(r["time_s"] / max(p, 1e-12)))
    ratios = {op: math.exp(sum(v) / len(v)) for op, v in sorted(by_op.items())}
    layouts = tuple(sorted({str(r.get("layout")) for r in pts}))
    return LinkFit(bw, lat, best_err, len(pts), best_c, ratios, layouts)


def fit_links(records: list[dict], machine: Machine) -> tuple[LinkFit | None, LinkFit | None]:
    """(intra, inter): each tier fitted from its own records, None where none were measured.
    The per-call overhead is fitted on the intra-node tier when there is one, else on the
    inter-node one."""
    has = {t: sum(1 for r in records if r.get("kind") == "collective" and r.get("tier") == t and r["time_s"] > 0)
           for t in ("intra", "inter")}
    intra = fit_link(records, tier="intra", machine=machine) if has["intra"] >= MIN_POINTS else None
    inter = None
    if has["inter"] >= MIN_POINTS:
        inter = fit_link(records, tier="inter", machine=machine,
                         fixed=None if intra is None else (intra.bytes_per_s, intra.latency_s),
                         overhead_s=None if intra is None else intra.call_overhead_s)
    return intra, inter
