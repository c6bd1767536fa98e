"""validate.fit / fit_links / profile on synthetic measurements with known answers (no torch needed)."""

import math

import pytest

from sim.net import collectives as cf
from validate.fit import (FitError, fit_attention, fit_host_floor, fit_matmul, fit_memory, fit_overhead,
                          weighted_line)
from validate.fit_links import Machine, fit_link, fit_links, predict_collective, probe_cluster
from validate.profile import fit_profile

SHAPES = [(64, 256, 256), (128, 128, 512), (256, 256, 256), (512, 512, 512), (1024, 256, 1024),
          (32, 512, 512), (1024, 32, 512), (96, 1024, 1024)]


def matmul_records(P, h, o, dtype="fp32"):
    out = []
    for m, n, k in SHAPES:
        d = min(m, n, k)
        f = 2.0 * m * n * k
        out.append({"kind": "matmul", "dtype": dtype, "m": m, "n": n, "k": k, "flops": f,
                    "time_s": o + f / (P * d / (d + h))})
    return out


def test_weighted_line_exact():
    fit = weighted_line([1, 2, 3, 4], [3, 5, 7, 9])
    assert fit.a == pytest.approx(1) and fit.b == pytest.approx(2) and fit.rms_rel < 1e-12


def test_weighted_line_clamps_negative_slope():
    fit = weighted_line([1, 2, 3], [3.0, 2.0, 1.0])
    assert fit.b == 0.0 and 1.0 < fit.a < 3.0


@pytest.mark.parametrize("P,h", [(9e10, 0.0), (5e10, 64.0), (3e12, 512.0)])
def test_matmul_recovers_peak_and_half_dim(P, h):
    o = 5e-6
    fit = fit_matmul(matmul_records(P, h, o), "fp32", o)
    assert fit.flops_per_s == pytest.approx(P, rel=1e-6)
    assert fit.gemm_half_dim == pytest.approx(h, rel=1e-6, abs=1e-6)
    assert fit.rms_rel < 1e-9


def test_matmul_needs_points():
    with pytest.raises(FitError):
        fit_matmul(matmul_records(1e11, 0, 0)[:1], "fp32")
    with pytest.raises(FitError):
        fit_matmul(matmul_records(1e11, 0, 0), "bf16")


def test_attention_ratios():
    P, o = 8e10, 4e-6
    recs = []
    for b, a, s, d in [(2, 4, 256, 64), (1, 8, 512, 64)]:
        f = 2.0 * b * a * s * s * d
        recs.append({"kind": "attention", "batch": b, "heads": a, "seq": s, "head_dim": d, "flops": f,
                     "fwd_time_s": o + f / (P * 0.3),
                     "bwd_time_s": 2 * o + 2.5 * f / (P * 0.2)})
    fit = fit_attention(recs, P, o)
    assert fit.fwd_vs_matmul == pytest.approx(0.3) and fit.bwd_vs_matmul == pytest.approx(0.2)
    assert fit.rms_rel < 1e-9


def test_memory_bandwidth_and_small_tensors_ignored():
    W, o = 1.2e10, 5e-6
    recs = [{"kind": "memory", "op": "copy", "numel": n, "bytes": 8.0 * n, "time_s": o + 8.0 * n / W}
            for n in (1 << 20, 1 << 22, 1 << 24)]
    # launch-bound tiny tensors at a fake 100x bandwidth must not move the fit
    recs += [{"kind": "memory", "op": "copy", "numel": 1024, "bytes": 8192.0, "time_s": 8192.0 / (100 * W)}]
    fit = fit_memory(recs, o)
    assert fit.bytes_per_s == pytest.approx(W, rel=1e-9)


def test_overhead_is_the_tiny_op():
    assert fit_overhead([{"kind": "overhead", "op": "tiny_add", "time_s": 3e-6}]) == 3e-6
    assert fit_overhead([]) == 0.0


def test_gpu_overhead_is_the_queued_kernel_and_the_floor_the_host_dispatch():
    """On a GPU the per-kernel overhead is the queued (GPU-side) time of a no-work kernel and the
    host floor the eager per-op time beyond it; neither is the launch+sync round trip."""
    recs = [{"kind": "overhead", "op": "queued_add", "time_s": 2e-6},
            {"kind": "overhead", "op": "eager_add", "time_s": 7e-6}]
    o = fit_overhead(recs)
    assert o == 2e-6 and fit_host_floor(recs, o) == pytest.approx(5e-6)
    assert fit_host_floor([], 2e-6) == 0.0


def test_small_shapes_do_not_bias_the_fit():
    """Exact data t = o + max(work, floor): points at the floor are left out, the others give
    work = t - o exactly (the old clamp max(t - o, t / 2) bent the small shapes)."""
    o, floor, P, h, W = 2e-6, 6e-6, 7e14, 256.0, 4e12
    recs = []
    for m, n, k in [(128, 128, 128), (256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096),
                    (256, 8192, 8192), (8192, 8192, 8192)]:
        d, f = min(m, n, k), 2.0 * m * n * k
        mem = 2.0 * (m * k + k * n + m * n) / W
        recs.append({"kind": "matmul", "dtype": "bf16", "m": m, "n": n, "k": k, "flops": f,
                     "time_s": o + max(f / (P * d / (d + h)), mem, floor)})
    fit = fit_matmul(recs, "bf16", o, floor, W)
    assert fit.flops_per_s == pytest.approx(P, rel=1e-9) and fit.gemm_half_dim == pytest.approx(h, rel=1e-9)
    assert fit.bound_points == 3  # 128^3, 256^3 and 1024^3 take less than the floor
    att = []
    for b, a, s, d in [(1, 1, 128, 64), (8, 16, 1024, 128), (1, 32, 8192, 128)]:
        f = 2.0 * b * a * s * s * d
        att.append({"kind": "attention", "dtype": "bf16", "batch": b, "heads": a, "seq": s, "head_dim": d, "flops": f,
                    "fwd_time_s": o + max(f / (P * 0.6), floor), "bwd_time_s": 2 * o + max(2.5 * f / (P * 0.47), 2 * floor)})
    a = fit_attention(att, P, o, floor, W)
    assert a.fwd_vs_matmul == pytest.approx(0.6, rel=1e-9) and a.bwd_vs_matmul == pytest.approx(0.47, rel=1e-9)
    assert a.bound_points == 2
    mem = [{"kind": "memory", "op": "copy", "numel": n, "bytes": 4.0 * n, "time_s": o + max(4.0 * n / W, floor)}
           for n in (1 << 19, 1 << 20, 1 << 26, 1 << 28)]
    assert fit_memory(mem, o, floor).bytes_per_s == pytest.approx(W, rel=1e-9)


def test_everything_at_the_floor_is_an_error_not_a_guess():
    recs = [{"kind": "memory", "op": "copy", "numel": 1 << 20, "bytes": 4.0 * (1 << 20), "time_s": 8e-6}]
    with pytest.raises(FitError, match="host floor"):
        fit_memory(recs, 2e-6, 6e-6)


def ring_records(B, alpha, sizes=(4096, 65536, 1 << 20, 1 << 24)):
    """Two ranks: closed forms of sim.net.collectives (Patarasuk & Yuan: 2(n-1)/n S/B + 2(n-1) alpha)."""
    out = []
    for s in sizes:
        for op, t in (("all_reduce", cf.ring_all_reduce_time_s(2, s, B, alpha)),
                      ("all_gather", cf.ring_all_gather_time_s(2, s, B, alpha)),
                      ("reduce_scatter", cf.ring_reduce_scatter_time_s(2, s, B, alpha)),
                      ("send_recv", cf.p2p_time_s(s, B, alpha))):
            out.append({"kind": "collective", "op": op, "layout": "world", "group_size": 2, "num_groups": 1,
                        "ranks": [0, 1], "groups": [[0, 1]], "tier": "intra", "message_bytes": float(s),
                        "time_s": t})
    return out


def test_ring_all_reduce_known_answer():
    # 2 ranks, S = 1 MB, B = 1 GB/s, alpha = 100 us: S/B + 2 alpha = 1.2 ms
    assert cf.ring_all_reduce_time_s(2, 1e6, 1e9, 1e-4) == pytest.approx(1e-3 + 2e-4)


@pytest.mark.parametrize("B,alpha", [(1e9, 1e-4), (5e10, 5e-6)])
def test_link_fit_recovers_alpha_beta(B, alpha):
    """The fit goes through sim.net.network; data from the closed forms must come back out."""
    fit = fit_link(ring_records(B, alpha), tier="intra", machine=Machine(world=2, ranks_per_node=2))
    assert fit.bytes_per_s == pytest.approx(B, rel=0.03)
    assert fit.latency_s == pytest.approx(alpha, rel=0.05)
    assert fit.rms_log < 0.03


def test_link_fit_four_ranks_concurrent_groups():
    """Four ranks, two TP-like pairs at once on one node: same per-link parameters."""
    from sim.net.network import Network

    B, alpha = 2e9, 5e-5
    net = Network(probe_cluster(Machine(world=4, ranks_per_node=4), intra=(B, alpha), inter=None))
    recs = []
    for layout, groups in (("world", [[0, 1, 2, 3]]), ("tp", [[0, 1], [2, 3]]), ("dp", [[0, 2], [1, 3]])):
        for op in ("all_reduce", "all_gather", "all_to_all"):
            for s in (8192, 1 << 20, 1 << 23):
                r = {"kind": "collective", "op": op, "layout": layout, "group_size": len(groups[0]),
                     "num_groups": len(groups), "ranks": groups[0], "groups": groups, "tier": "intra",
                     "message_bytes": float(s)}
                r["time_s"] = predict_collective(net, r)
                recs.append(r)
    fit = fit_link(recs, tier="intra", machine=Machine(world=4, ranks_per_node=4))
    assert fit.bytes_per_s == pytest.approx(B, rel=0.03)
    assert fit.latency_s == pytest.approx(alpha, rel=0.05)


def test_a_tier_without_measurements_is_not_fitted():
    """One node: no inter-node fit; one rank per node (only inter records): no intra fit, and
    the inter fit needs no intra link."""
    intra, inter = fit_links(ring_records(1e9, 1e-4), Machine(world=2, ranks_per_node=2))
    assert intra is not None and inter is None
    cross = [{**r, "tier": "inter", "layout": "world"} for r in ring_records(5e8, 2e-4)]
    intra, inter = fit_links(cross, Machine(world=2, ranks_per_node=1))
    assert intra is None and inter is not None
    assert inter.bytes_per_s == pytest.approx(5e8, rel=0.03) and inter.latency_s == pytest.approx(2e-4, rel=0.05)
    assert fit_links([], Machine(world=1, ranks_per_node=1)) == (None, None)


def test_inter_groups_with_several_ranks_per_node_need_the_intra_link():
    recs = [{**r, "tier": "inter", "groups": [[0, 1, 2, 3]], "ranks": [0, 1, 2, 3], "group_size": 4}
            for r in ring_records(1e9, 1e-4) if r["op"] != "send_recv"]
    with pytest.raises(FitError, match="intra-node link"):
        fit_link(recs, tier="inter", machine=Machine(world=4, ranks_per_node=2))


def synthetic_records():
    recs = [{"kind": "overhead", "op": "tiny_add", "time_s": 4e-6}]
    recs += matmul_records(8e10, 32.0, 4e-6)
    f = 2.0 * 2 * 4 * 256 * 256 * 64
    recs.append({"kind": "attention", "batch": 2, "heads": 4, "seq": 256, "head_dim": 64, "dtype": "fp32", "flops": f,
                 "fwd_time_s": 4e-6 + f / (8e10 * 0.25),
                 "bwd_time_s": 8e-6 + 2.5 * f / (8e10 * 0.25)})
    recs += [{"kind": "memory", "op": "add", "numel": n, "bytes": 8.0 * n, "time_s": 4e-6 + 8.0 * n / 1e10}
             for n in (1 << 20, 1 << 22)]
    recs += ring_records(1e9, 1e-4)
    return recs


ENV = {"device_type": "cpu", "device_name": "Test CPU", "world_size": 2, "local_world_size": 2,
       "host_cores": 2, "threads_per_rank": 1, "backend": "gloo", "torch": "x", "hostname": "h",
       "host_memory_bytes": 8 * 2**30, "num_nodes": 1, "date": "2026-01-01T00:00:00+00:00"}


def test_profile_round_trips_through_sim_calibration(tmp_path):
    from sim.cost.calibration import dump_profile, load_calibration

    prof = fit_profile(synthetic_records(), ENV, profile_id="cpu-test")
    path = dump_profile(prof, tmp_path / "p.yaml", header="test")
    cal = load_calibration(str(path))
    assert cal.id == "cpu-test" and cal.host.compute_dtype == "fp32"
    assert cal.gpu.peak_flops_per_s("bf16") == pytest.approx(8e10, rel=1e-4)
    assert cal.gpu.hbm_bytes_per_s == pytest.approx(1e10, rel=1e-4)
    assert cal.scale_up.bytes_per_s_per_direction == pytest.approx(1e9, rel=0.03)
    assert cal.scale_up.latency_s == pytest.approx(1e-4, rel=0.05)
    assert cal.efficiency["gemm_half_dim"] == pytest.approx(32.0, rel=1e-3)
    assert cal.efficiency["attention_fwd_vs_matmul"] == pytest.approx(0.25, rel=1e-3)
    assert cal.nic is None  # one node: no inter-node tier measured


def test_profile_reproduces_its_microbenchmarks(tmp_path):
    """The fitted device, run through sim.layers.compute, gives back the GEMM times it was fitted on."""
    from sim.cost.calibration import dump_profile, load_calibration
    from sim.layers.compute import default_efficiency, op_time
    from sim.layers.ops import _gemm

    prof = fit_profile(synthetic_records(), ENV, profile_id="cpu-test")
    cal = load_calibration(str(dump_profile(prof, tmp_path / "p.yaml")))
    eff = cal.apply_efficiency(default_efficiency())
    gpu = cal.gpu  # fp32 element ratio applies to memory only; these GEMMs are compute-bound
    for r in matmul_records(8e10, 32.0, 4e-6):
        op = _gemm("mm", r["m"], r["n"], r["k"])
        assert op_time(gpu, "bf16", op, eff).fwd_s == pytest.approx(r["time_s"], rel=1e-3)


def test_fit_profile_without_microbenchmarks_fails():
    with pytest.raises(FitError):
        fit_profile([], ENV)
    assert math.isfinite(fit_overhead(synthetic_records()))


def test_one_rank_cpu_profile_writes_no_link_and_refuses_intra_host_plans(tmp_path):
    """A one-rank CPU host measured no link: the profile has none (no placeholder), and a plan
    with two ranks per host on it is refused with one line, while one rank per host works."""
    from sim.cost.calibration import dump_profile, load_calibration
    from sim.base.errors import InputError

    recs = [r for r in synthetic_records() if r["kind"] != "collective"]
    prof = fit_profile(recs, {**ENV, "world_size": 1, "local_world_size": 1}, profile_id="cpu-one")
    assert prof["links"] == [] and "nvlink_generation" not in prof["device"]
    assert "collective_overhead_s" not in prof["efficiency"]
    cal = load_calibration(str(dump_profile(prof, tmp_path / "one.yaml")))
    assert cal.scale_up is None and cal.nic is None and not cal.scale_up_known
    from validate.compare import compare

    w = {"name": "single", "world_size": 1, "env": {"local_world_size": 1}, "measured_step_time_s": 1.0,
         "spec": {"name": "single", "model": {"name": "m", "num_layers": 2, "hidden_size": 64, "num_heads": 2,
                                              "ffn_hidden_size": 128, "vocab_size": 256, "seq_len": 32}}}
    assert compare([w], cal.path)["workloads"][0]["predicted_step_time_s"] > 0
    two = {**w, "world_size": 2, "env": {"local_world_size": 2},
           "spec": {**w["spec"], "dp": 2}}
    with pytest.raises(InputError, match="no scale-up link"):
        compare([two], cal.path)


def test_gpu_profile_keeps_the_data_sheet_and_stores_efficiencies(tmp_path):
    """A GPU host: the catalog record of the matching GPU (guessed from torch's device name)
    keeps its peaks; the measurements become matmul/HBM efficiencies and the attention
    fractions of its architecture."""
    from sim.cost.calibration import dump_profile, load_calibration
    from sim.data.catalog import get_gpu
    from sim.layers.compute import default_efficiency

    h200 = get_gpu("h200-141gb")
    P, W = 0.7 * h200.peak_flops_per_s("bf16"), 0.8 * h200.hbm_bytes_per_s
    recs = [{"kind": "overhead", "op": "tiny_add", "time_s": 5e-6}]
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 8192, 8192)]:
        f = 2.0 * m * n * k
        recs.append({"kind": "matmul", "dtype": "bf16", "m": m, "n": n, "k": k, "flops": f, "time_s": 5e-6 + f / P})
    f = 2.0 * 4 * 32 * 4096 * 4096 * 128
    recs.append({"kind": "attention", "batch": 4, "heads": 32, "seq": 4096, "head_dim": 128, "dtype": "bf16",
                 "flops": f, "fwd_time_s": 5e-6 + f / (0.5 * P),
                 "bwd_time_s": 1e-5 + 2.5 * f / (0.4 * P)})
    recs += [{"kind": "memory", "op": "copy", "numel": n, "bytes": 4.0 * n, "time_s": 5e-6 + 4.0 * n / W}
             for n in (1 << 26, 1 << 28)]
    recs += ring_records(3.6e11, 8e-6, sizes=(1 << 20, 1 << 26, 1 << 30))
    env = {**ENV, "device_type": "cuda", "device_name": "NVIDIA H200", "device_memory_bytes": 143e9,
           "backend": "nccl"}
    prof = fit_profile(recs, env, profile_id="h200-test")
    cal = load_calibration(str(dump_profile(prof, tmp_path / "h200.yaml")))
    assert cal.host.compute_dtype == "bf16" and cal.host.element_ratio == 1.0
    assert cal.gpu.peak_flops_per_s("bf16") == h200.peak_flops_per_s("bf16")
    assert cal.gpu.achievable_matmul_fraction("bf16") == pytest.approx(0.7, rel=1e-3)
    assert cal.gpu.hbm_efficiency == pytest.approx(0.8, rel=1e-3)
    assert cal.device_for(8) == cal.gpu  # GPUs do not share cores
    eff = cal.apply_efficiency(default_efficiency())
    fwd, bwd = eff.attention_fractions[cal.gpu.architecture]["flash"]  # fractions of the peak
    assert fwd == pytest.approx(0.7 * 0.5, rel=1e-3) and bwd == pytest.approx(0.7 * 0.4, rel=1e-3)
