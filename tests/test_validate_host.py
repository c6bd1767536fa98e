"""Host-side measurements (validate.hostbench, validate.fit_host): host memory bandwidth runs
here and gives a plausible number; exact synthetic host<->device copies (known alpha/beta per
direction, pinned and pageable) are recovered, written into the profile's ``host`` block,
loaded into ``Calibration.host_bandwidth`` and put on the cluster by ``simulate
--calibration``; a path that was not measured is absent, never zero; a malformed host block
is one line and exit 2."""

import json
from dataclasses import replace

import pytest
import yaml

# serial: host memory bandwidth timed on this CPU; `make test` runs these after the parallel phase (pyproject markers)
pytestmark = pytest.mark.serial

from sim.cost.calibration import HOST_BANDWIDTH_KEYS, dump_profile, load_calibration
from validate import synthetic as S
from validate.fit import weighted_line
from validate.fit_host import fit_host, fit_host_copy
from validate.profile import fit_profile, profile_header

TRUTH = S.Truth()
REL = 0.03
COPY_KEYS = [k for k in HOST_BANDWIDTH_KEYS if k.startswith(("h2d", "d2h"))]


def _run(capsys, argv):
    from planner.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _profile(tmp_path, name, recs, world=1, rpn=1, file=None):
    """One synthetic GPU (no collectives: the link fits are not what these tests are about)."""
    prof = fit_profile(recs, S.environment(world, rpn), profile_id=name)
    path = dump_profile(prof, tmp_path / (file or f"{name}.yaml"), header=profile_header(prof, "synthetic"))
    return prof, load_calibration(str(path))


# ------------------------------------------------------------------ the benchmark, on this CPU


@pytest.fixture
def one_rank():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from validate.runtime import Env

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Env(rank=0, world_size=1, local_rank=0, local_world_size=1, backend="gloo", device=torch.device("cpu"),
              threads=torch.get_num_threads())
    dist.destroy_process_group()


def test_host_memory_bandwidth_runs_here_and_is_plausible(one_rank):
    """STREAM copy and triad on 256 MiB host buffers: bytes counted as STREAM counts them
    (2 and 3 buffers per call), a rate above 0.5 GB/s (any DRAM since the 1990s), fitted into
    host_mem_bytes_per_s; the copies are recorded as not measured (no CUDA) and not written."""
    from validate import hostbench
    from validate.microbench import Recorder
    from validate.specs import MicrobenchConfig

    cfg = MicrobenchConfig(host_memory_bytes=(1 << 28,), host_min_time_s=0.01)
    rec = Recorder()
    hostbench.run(one_rank, cfg, rec)
    mem = [r for r in rec.records if r["kind"] == "host_memory"]
    assert {r["op"] for r in mem} == {"copy", "triad"}
    for r in mem:
        assert r["bytes"] == {"copy": 2, "triad": 3}[r["op"]] * r["buffer_bytes"]
        assert r["buffer_bytes"] == 1 << 28 and r["time_s"] > 0
        assert 0.5e9 < r["host_bytes_per_s"] < 1e13
    copies = [r for r in rec.records if r["kind"] == "host_copy"]
    assert len(copies) == 4 and not any(r["measured"] for r in copies) and all("no CUDA" in r["reason"] for r in copies)
    keys, section = fit_host(rec.records)
    assert set(keys) == {"host_mem_bytes_per_s"} and keys["host_mem_bytes_per_s"] > 0.5e9
    assert section["h2d_pinned"]["measured"] is False and "no CUDA" in section["h2d_pinned"]["reason"]


def test_copy_directions_and_blocking():
    """h2d writes the device buffer from the host one, d2h the other way (CPU tensors here)."""
    torch = pytest.importorskip("torch")
    from validate.hostbench import copy_fn

    dev, host = torch.zeros(4), torch.arange(4.0)
    copy_fn("h2d", dev, host, pinned=True)()
    assert dev.tolist() == [0, 1, 2, 3]
    dev.fill_(7)
    copy_fn("d2h", dev, host, pinned=False)()
    assert host.tolist() == [7, 7, 7, 7]
    with pytest.raises(ValueError):
        copy_fn("d2d", dev, host, pinned=True)


def test_quick_sweeps_and_old_measurements():
    """Quick CPU sweep keeps a 256 MiB buffer (what the fit needs) and nothing larger; GPU sweeps
    copy 1 MiB and more; a measurements.json config from before these keys still loads."""
    from validate.fit_host import HOST_MEMORY_MIN_BYTES
    from validate.specs import MicrobenchConfig

    q = MicrobenchConfig.quick()
    assert max(q.host_memory_bytes) == HOST_MEMORY_MIN_BYTES
    g = MicrobenchConfig.gpu(quick=False)
    assert min(g.host_copy_bytes) == 1 << 20 and max(g.host_copy_bytes) == 1 << 30
    old = {k: v for k, v in q.as_dict().items() if not k.startswith("host_")}
    assert MicrobenchConfig.from_dict(old).host_memory_bytes == MicrobenchConfig().host_memory_bytes
    assert MicrobenchConfig.from_dict(json.loads(json.dumps(q.as_dict()))) == q


# ------------------------------------------------------------------ fit and round trip


def test_weighted_line_latency_is_never_negative():
    fit = weighted_line([1.0, 2.0, 4.0], [0.9, 2.0, 4.1], nonneg_intercept=True)
    assert fit.a == 0.0 and fit.b == pytest.approx(1.0, rel=0.05)
    assert weighted_line([1.0, 2.0], [3.0, 5.0], nonneg_intercept=True).a == pytest.approx(1.0)


def test_synthetic_copies_are_recovered_and_round_trip(tmp_path, capsys):
    """Known alpha/beta of H2D/D2H, pinned and pageable, and the host memory rate come back
    within 3% through the fit, the profile writer and loader, and `planner simulate
    --calibration` (which puts them on the cluster and shows them in --json)."""
    prof, cal = _profile(tmp_path, "syn-host", S.records(TRUTH, 1, 1))
    hb = cal.host_bandwidth
    assert hb.host_mem_bytes_per_s == pytest.approx(TRUTH.host_mem_bytes_per_s, rel=REL)
    for direction in ("h2d", "d2h"):
        for pinned in (True, False):
            bw, lat = getattr(TRUTH, f"{direction}_{'pinned' if pinned else 'pageable'}")
            got = hb.copy(direction, pinned=pinned)
            assert got.bytes_per_s == pytest.approx(bw, rel=REL)
            assert got.latency_s == pytest.approx(lat, rel=REL)
            assert got.time_s(1 << 26) == pytest.approx(lat + (1 << 26) / bw, rel=REL)
    assert hb.h2d_bytes_per_s == pytest.approx(TRUTH.h2d_pinned[0], rel=REL) and hb.h2d_pinned_measured
    assert hb.d2h_latency_s == pytest.approx(TRUTH.d2h_pinned[1], rel=REL)
    written = {k for k in prof["host"] if k in HOST_BANDWIDTH_KEYS}
    assert written == set(HOST_BANDWIDTH_KEYS)
    assert prof["fit"]["host"]["memory"]["op"] == "triad"

    # the cluster simulate runs on carries them (sim.engines.simulate -> Calibration.apply_plan)
    from sim.data.catalog import get_model
    from sim.net.clusters import cluster_from_catalog
    from sim.cost.plan import Plan, parse_strategy

    plan = Plan(model=get_model("llama3-8b"), cluster=cluster_from_catalog(cal.gpu, 8, gpus_per_node=8),
                strategy=parse_strategy("tp=8,mbs=1,gbs=8", num_gpus=8, seq_len=4096))
    host = cal.apply_plan(plan).cluster.host  # the node's one host, with the measured rates (sim.cost.offload.host_spec)
    assert host.host_mem_bytes_per_s == pytest.approx(hb.host_mem_bytes_per_s)
    assert host.host_link_bytes_per_s == pytest.approx(min(hb.h2d_bytes_per_s, hb.d2h_bytes_per_s))
    assert plan.cluster.host is None  # the catalog's cluster knows no measured host

    argv = ["simulate", "--model", "llama3-8b", "--gpu", cal.id, "--num-gpus", "8", "--gpus-per-node", "8",
            "--seq-len", "4096", "--strategy", "tp=8,mbs=1,gbs=8", "--json", "--calibration", cal.path]
    rc, out, err = _run(capsys, argv)
    assert rc == 0, err
    shown = json.loads(out)["host_bandwidth"]
    assert shown["h2d_pageable_bytes_per_s"] == pytest.approx(TRUTH.h2d_pageable[0], rel=REL)
    assert shown["host_mem_bytes_per_s"] == pytest.approx(TRUTH.host_mem_bytes_per_s, rel=REL)
    step = json.loads(out)["step_time_s"]
    _, cal_plain = _profile(tmp_path, "syn-host", S.records(TRUTH, 1, 1, host=False), file="plain.yaml")
    rc, out, _ = _run(capsys, argv[:-1] + [cal_plain.path])
    assert rc == 0 and "host_bandwidth" not in json.loads(out)
    assert json.loads(out)["step_time_s"] == pytest.approx(step, rel=1e-12)  # no offload: the host is not on the path


def test_unmeasured_paths_are_absent_not_zero(tmp_path, capsys):
    """No CUDA: no copy key at all in the profile (not 0, not a stand-in), the fit section says
    why; one copy size is not enough; a pinned-only host falls back to nothing for pageable,
    a pageable-only host reports its pageable rate and says it is not pinned."""
    recs = S.records(TRUTH, 1, 1, host=False) + S.host_records(TRUTH, 1, copies=False)
    prof, cal = _profile(tmp_path, "syn-nocopy", recs)
    assert not any(k in prof["host"] for k in COPY_KEYS)
    assert "host_mem_bytes_per_s" in prof["host"]
    assert prof["fit"]["host"]["d2h_pageable"] == {"measured": False, "reason": "not measured: no CUDA device (synthetic)"}
    hb = cal.host_bandwidth
    assert hb.h2d_pinned is None and hb.h2d_bytes_per_s is None and hb.d2h_latency_s is None and not hb.empty

    m = tmp_path / "measurements.json"
    m.write_text(json.dumps({"suite": "quick", "env": S.environment(1, 1), "microbench": recs, "workloads": []}),
                 encoding="utf-8")
    rc, out, err = _run(capsys, ["validate", "fit", str(m), "--id", "cli-nocopy"])
    assert rc == 0, err
    assert "h2d pinned   not written: not measured: no CUDA device (synthetic)" in out and "host mem" in out

    one_size = [r for r in S.host_records(TRUTH, 1) if r["kind"] == "host_copy" and r["bytes"] == 1 << 20]
    assert fit_host_copy(one_size, "h2d", pinned=True) == "needs >= 2 copy sizes, got 1"
    flat = [{**r, "time_s": 1e-3} for r in S.host_records(TRUTH, 1) if r["kind"] == "host_copy"]
    assert "does not grow" in fit_host_copy(flat, "h2d", pinned=True)
    assert fit_host([]) == ({}, {**{p: {"measured": False, "reason": "not measured"}
                                     for p in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable")},
                                 "memory": {"measured": False, "reason": "not measured"}})

    pageable_only = [r for r in S.records(TRUTH, 1, 1) if not (r["kind"] == "host_copy" and r["pinned"])]
    _, cal = _profile(tmp_path, "syn-pageable", pageable_only)
    hb = cal.host_bandwidth
    assert hb.h2d_pinned is None and not hb.h2d_pinned_measured
    assert hb.h2d_bytes_per_s == pytest.approx(TRUTH.h2d_pageable[0], rel=REL)

    small = [r for r in S.records(TRUTH, 1, 1) if r["kind"] != "host_memory"]
    small += [{**r, "buffer_bytes": 1 << 24} for r in S.host_records(TRUTH, 1) if r["kind"] == "host_memory"]
    prof, cal = _profile(tmp_path, "syn-cache", small)
    assert "host_mem_bytes_per_s" not in prof["host"] and cal.host_bandwidth.host_mem_bytes_per_s is None
    assert "no buffer of at least 256 MiB" in prof["fit"]["host"]["memory"]["reason"]


# ------------------------------------------------------------------ malformed host blocks


@pytest.mark.parametrize("edit,field", [
    ({"h2d_pinned_bytes_per_s": 0}, "calibration.host.h2d_pinned_bytes_per_s"),
    ({"h2d_pinned_bytes_per_s": -5e10}, "calibration.host.h2d_pinned_bytes_per_s"),
    ({"d2h_pageable_bytes_per_s": "fast"}, "calibration.host.d2h_pageable_bytes_per_s"),
    ({"h2d_pinned_bytes_per_s": 55}, "calibration.host.h2d_pinned_bytes_per_s"),  # GB/s written as bytes/s
    ({"host_mem_bytes_per_s": float("nan")}, "calibration.host.host_mem_bytes_per_s"),
    ({"h2d_pinned_latency_s": None}, "calibration.host.h2d_pinned_latency_s"),
    ({"d2h_pinned_latency_s": 5.0}, "calibration.host.d2h_pinned_latency_s"),
    ({"d2h_pinned_latency_s": True}, "calibration.host.d2h_pinned_latency_s"),
    ({"h2d_pinned_bandwidth": 5e10}, "calibration.host.h2d_pinned_bandwidth"),
])
def test_malformed_host_block_is_one_line_exit_2(tmp_path, capsys, edit, field):
    prof, cal = _profile(tmp_path, "syn-bad", S.records(TRUTH, 1, 1))
    data = yaml.safe_load(open(cal.path, encoding="utf-8"))
    data["host"] = {**data["host"], **edit}
    data["host"] = {k: v for k, v in data["host"].items() if v is not None}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    rc, out, err = _run(capsys, ["simulate", "--model", "llama3-8b", "--gpu", "syn-bad", "--num-gpus", "1",
                                 "--strategy", "mbs=1,gbs=1", "--calibration", str(bad)])
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: {field}=") and "Traceback" not in err


def test_host_calibration_is_validated_on_construction():
    from sim.base.errors import InputError
    from sim.data.hostspecs import HostCalibration, HostCopy

    with pytest.raises(InputError):
        HostCopy(bytes_per_s=0.0)
    with pytest.raises(InputError):
        HostCalibration(host_mem_bytes_per_s=-1.0)
    hb = HostCalibration(d2h_pageable=HostCopy(bytes_per_s=1e10, latency_s=2e-5))
    assert hb.d2h_bytes_per_s == 1e10 and not hb.d2h_pinned_measured and hb.h2d_bytes_per_s is None
    assert hb.as_dict() == {"d2h_pageable_bytes_per_s": 1e10, "d2h_pageable_latency_s": 2e-5}
    assert HostCalibration().empty and replace(hb, d2h_pageable=None).empty
    with pytest.raises(InputError):
        hb.copy("d2d")
