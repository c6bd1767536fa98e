"""The efficiency fit: known answers on synthetic curves, and the stored values match the script."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.errors import InputError
from sim.fitting import fit_ring_all_reduce, fit_scalar, parse_size

ROOT = Path(__file__).resolve().parents[1]


def test_ring_fit_recovers_known_alpha_beta():
    n, bw, alpha = 8, 200e9, 4e-6
    sizes = np.array([2.0**k for k in range(20, 34)])
    t = 2 * (n - 1) * alpha + 2 * (n - 1) / n * sizes / bw
    busbw = sizes * 2 * (n - 1) / n / t
    ab = fit_ring_all_reduce(sizes, busbw, n)
    assert ab.bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert ab.step_latency_s == pytest.approx(alpha, rel=1e-6)
    assert ab.max_rel_error < 1e-9


def test_fit_rejects_bad_curves():
    with pytest.raises(InputError):
        fit_ring_all_reduce([1e6], [1e9], 8)
    with pytest.raises(InputError):
        fit_ring_all_reduce([1e6, 2e6], [1e9, 1e9], 1)


def test_parse_size_and_scalar_fit():
    assert parse_size("32KiB") == 32768 and parse_size("2GiB") == 2 * 2**30 and parse_size(512) == 512
    with pytest.raises(InputError):
        parse_size("lots")
    assert fit_scalar(lambda x: (x - 3) ** 2, [0, 1, 2, 3, 4])[0] == 3


def test_stored_fit_matches_script():
    spec = importlib.util.spec_from_file_location("fit_efficiency", ROOT / "scripts" / "fit_efficiency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fitted = mod.fit_all()
    stored = yaml.safe_load((ROOT / "catalogs" / "efficiency.yaml").read_text())["fitted"]
    assert fitted["scale_up"]["bandwidth_efficiency"] == stored["scale_up"]["bandwidth_efficiency"]
    assert fitted["scale_out"]["bandwidth_efficiency"] == stored["scale_out"]["bandwidth_efficiency"]
    assert fitted["collective_overhead_s"] == pytest.approx(stored["collective_overhead_s"])
    assert fitted["gemm"]["gemm_half_dim"] == stored["gemm"]["gemm_half_dim"]
    assert fitted["gemm"]["gemm_sustained_fraction"] == stored["gemm"]["gemm_sustained_fraction"]
    # Large GEMMs sustain most, not all, of the best case (mamf-finder's searched shape).
    assert 0.8 <= fitted["gemm"]["gemm_sustained_fraction"] <= 1.0
    # The fitted layer model reproduces Korthikanti et al. Table 4 to within ~4% RMS.
    assert fitted["gemm"]["rms_rel_error"] < 0.05
    # NVLink ring efficiency is physically plausible.
    assert 0.6 < fitted["scale_up"]["bandwidth_efficiency"] < 0.9


def test_vtrain_multi_node_held_out():
    """The odd-numbered multi-node vTrain rows (3.6-175 B, 64-512 A100) are never used in
    fitting (the even ones fit the GEMM sustained fraction): they test generalisation.
    vTrain's own simulator reports 14.7% mean error on all multi-node rows."""
    import statistics

    from planner.vtrain import load_vtrain
    from sim.analytic import simulate_analytic

    rows = load_vtrain("multi")
    assert len(rows) == 109
    errs = [abs(simulate_analytic(r.plan).step_time_s / r.measured_step_time_s - 1) for r in rows[1::2]]
    assert statistics.median(errs) < 0.06
    assert statistics.fmean(errs) < 0.12


def test_vtrain_single_node_fit_quality():
    import statistics

    from planner.vtrain import load_vtrain
    from sim.analytic import simulate_analytic

    rows = load_vtrain("single")[1::8]  # rows the fit (every 4th from 0) did not use
    errs = [abs(simulate_analytic(r.plan).step_time_s / r.measured_step_time_s - 1) for r in rows]
    assert statistics.median(errs) < 0.12


def test_size_curve_interpolates_log_linearly_and_rejects_bad_points():
    from sim.network import SizeCurve

    c = SizeCurve([[1024, 0.2], [4096, 0.6], [1 << 20, 1.0]])
    # the bandwidth-bound time chunk/fraction is log-log linear between points
    assert c(1024) == pytest.approx(0.2) and c(4096) == pytest.approx(0.6)
    t1, t2 = 1024 / 0.2, 4096 / 0.6
    assert 2048 / c(2048) == pytest.approx((t1 * t2) ** 0.5)
    assert c(16) == pytest.approx(0.2) and c(1 << 30) == pytest.approx(1.0)  # flat beyond the points
    with pytest.raises(InputError):
        SizeCurve([[1024, 1.5]])
    with pytest.raises(InputError):
        SizeCurve([])


def test_calibrated_network_reproduces_the_a100_nccl_curve():
    """The fitted size curve makes the 8x A100 ring all-reduce match the measured bus bandwidth
    (an alpha-beta line alone was up to 2x fast at 1 MiB and 1.2-1.6x at 8-128 MiB)."""
    from sim.catalog import get_gpu, get_nic
    from sim.compute import default_efficiency
    from sim.costs import default_network
    from sim.specs import Cluster

    mb = yaml.safe_load((ROOT / "catalogs" / "reference" / "published_runs.yaml").read_text())["microbenchmarks"]
    curve = next(e for e in mb["allreduce_busbw"]["entries"] if "A100" in e["system"])["busbw_GBps_by_payload_bytes"]
    cl = Cluster(gpu=get_gpu("a100-80gb"), num_gpus=8, nic=get_nic("ib-hdr-200"), gpus_per_node=8, nvlink_domain=8,
                 nics_per_node=8)
    net, ov = default_network(cl), default_efficiency().collective_overhead_s
    errs = []
    for size, busbw in curve.items():
        t = net.collective_time_s("all_reduce", tuple(range(8)), float(size), algorithm="ring") + ov
        model = float(size) * 2 * 7 / 8 / t / 1e9
        errs.append(abs(model / busbw - 1))
    assert max(errs) < 0.03


def test_calibrated_collectives_never_get_faster_with_size():
    from sim.catalog import get_gpu, get_nic
    from sim.costs import default_network
    from sim.specs import Cluster

    for gpu, nic, n in (("a100-80gb", "ib-hdr-200", 8), ("h100-80gb", "ib-ndr-400", 64)):
        cl = Cluster(gpu=get_gpu(gpu), num_gpus=n, nic=get_nic(nic), gpus_per_node=8, nvlink_domain=8, nics_per_node=8)
        net = default_network(cl)
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            sizes = np.geomspace(1e3, 1e10, 400)
            times = [net.collective_time_s(op, tuple(range(n)), float(s)) for s in sizes]
            assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:])), (gpu, op)
        ts = [net.p2p_time_s(0, 8 if n > 8 else 1, float(s)) for s in np.geomspace(1e3, 1e10, 200)]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(ts, ts[1:]))
