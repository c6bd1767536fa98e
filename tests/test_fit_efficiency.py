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
