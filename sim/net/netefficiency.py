"""The fitted efficiency of the network, as ``sim.net.network.Network`` takes it.

Read from the ``fitted`` block of ``catalogs/efficiency.yaml`` (written by
``scripts/fit_efficiency.py`` from NCCL bus-bandwidth sweeps, ``catalogs/microbenchmarks/``):
the large-message bandwidth efficiency per tier (``network_efficiency``), the fraction of it a
collective reaches at each chunk size (``network_size_curves``) and NVLink SHARP's all-reduce
gain over the ring (``nvls_gain``); ``network_kwargs`` bundles the three.  Known error: one
efficiency per tier (and per NVLink generation) ignores the group's shape beyond the size
curve (``planner/fitting/fit.py`` fits them).
"""

from __future__ import annotations

from typing import Mapping

from sim.net.collectives import SizeCurve
from sim.layers.compute import catalog_fitted
from sim.base.records import Record


def network_efficiency(scale_up_link: str | None = None, fitted: Mapping | None = None) -> dict[str, float]:
    """Collective bandwidth efficiency per network tier, fitted from NCCL bus-bandwidth curves.

    ``scale_up_link`` (an NVLink generation id such as ``nvlink4``) picks that generation's own
    fitted NVLink efficiency when the microbenchmarks have one; otherwise the median across
    generations applies.  ``fitted``: a fitted block other than the catalog's.
    """
    fitted = catalog_fitted() if fitted is None else fitted
    rec = Record(fitted, where="efficiency.fitted", file="efficiency.yaml")
    out: dict[str, float] = {}
    if "scale_up" in fitted:
        su = rec.mapping("scale_up")
        out["scale-up"] = su.req("bandwidth_efficiency", positive=True)
        if su.has("per_generation"):
            gens = su.mapping("per_generation")
            for key in gens.rec:
                if scale_up_link and str(key).endswith("-" + scale_up_link):
                    out["scale-up"] = gens.req(str(key), positive=True)
    if "scale_out" in fitted:
        out["scale-out"] = rec.mapping("scale_out").req("bandwidth_efficiency", positive=True)
    return out


def network_size_curves(fitted: Mapping | None = None) -> dict[str, object]:
    """Per tier, the ``sim.net.collectives.SizeCurve`` fitted from NCCL bus-bandwidth curves: the
    fraction of the large-message bandwidth a collective reaches at each chunk size."""
    fitted = catalog_fitted() if fitted is None else fitted
    return {tier: SizeCurve(points) for tier, points in (fitted.get("size_curves") or {}).items()}


def nvls_gain(scale_up_link: str | None = None, fitted: Mapping | None = None) -> dict[int, float]:
    """NVLink SHARP all-reduce bus bandwidth over the ring's, by group size, on the NVSwitch
    generation ``scale_up_link`` (fitted from NCCL sweeps with NVLS on and off: H200 for
    NVLink4, B200 for NVLink5); empty where NVLS does not exist (A100's NVSwitch, PCIe)."""
    fitted = catalog_fitted() if fitted is None else fitted
    table = (fitted.get("scale_up") or {}).get("nvls_all_reduce_gain") or {}
    return {int(n): float(g) for n, g in (table.get(scale_up_link or "") or {}).items()}


def network_kwargs(scale_up_link: str | None = None, fitted: Mapping | None = None) -> dict[str, object]:
    """Keyword arguments of the calibrated ``sim.net.network.Network``: large-message efficiency
    per tier (``network_efficiency``), the size curves (``network_size_curves``) and the
    NVLS all-reduce gain of the scale-up generation (``nvls_gain``)."""
    return {"bandwidth_efficiency": network_efficiency(scale_up_link, fitted), "nvls_gain": nvls_gain(scale_up_link, fitted),
            "size_curves": network_size_curves(fitted)}
