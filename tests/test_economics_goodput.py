"""Young/Daly formulas, the simpy campaign against Daly's closed form, spares, CLI."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.economics.campaign import CampaignSpec, FailureMode, mean_ci95, run_campaigns, simulate_campaign
from planner.economics.goodput import daly_goodput, daly_interval_s, goodput_report, young_interval_s
from planner.economics.storage import checkpoint_bytes
from sim.data.catalog import get_gpu, get_nic
from sim.base.errors import InputError
from sim.data.models import load_model
from sim.data.hardware import Cluster

M = 3 * 3600.0  # MTBF
MODES = (FailureMode(name="gpu", rate_per_s=0.7 / M, needs_node=True),
         FailureMode(name="software", rate_per_s=0.3 / M, needs_node=False))


def spec(**kw):
    base = dict(work_s=400 * 805.0, interval_s=805.0, write_s=30.0, restart_s=600.0, restore_s=20.0, modes=MODES,
                num_spares=10_000, repair_s=3600.0)
    base.update(kw)
    return CampaignSpec(**base)


def test_young_known_answer():
    assert young_interval_s(30.0, M) == pytest.approx(math.sqrt(2 * 30 * M))  # 804.98 s


def test_daly_close_to_young_when_checkpoints_are_cheap_and_capped_at_mtbf():
    assert daly_interval_s(1.0, 1e6) == pytest.approx(young_interval_s(1.0, 1e6), rel=1e-3)
    assert daly_interval_s(3 * M, M) == M


@settings(max_examples=40, deadline=None)
@given(write=st.floats(min_value=1, max_value=600), mtbf=st.floats(min_value=3600, max_value=1e7),
       restart=st.floats(min_value=0, max_value=3600))
def test_daly_interval_is_near_optimal(write, mtbf, restart):
    tau = daly_interval_s(write, mtbf)
    g = daly_goodput(tau, write, restart, mtbf)
    assert 0 < g < 1
    for f in (0.5, 2.0):
        assert g >= daly_goodput(tau * f, write, restart, mtbf) - 1e-9


def test_no_failures_goodput_is_checkpoint_overhead_only():
    run = simulate_campaign(spec(modes=()), seed=1)
    assert run.goodput == pytest.approx(805.0 / 835.0, rel=1e-9)
    assert daly_goodput(805.0, 30.0, 620.0, math.inf) == pytest.approx(805.0 / 835.0)


def test_simulation_agrees_with_daly_when_spares_never_run_out():
    """Two implementations of the same process: simpy campaigns vs Daly (2006) eq. (13)."""
    s = spec()
    summary = run_campaigns(s, seeds=30)
    expected = daly_goodput(s.interval_s, s.write_s, s.restart_s + s.restore_s, M)
    lo, hi = summary.goodput_ci95
    assert abs(summary.goodput_mean - expected) < 0.01
    assert lo - 0.005 < expected < hi + 0.005
    assert summary.spare_wait_s_mean == 0


def test_missing_spares_cost_goodput():
    few = run_campaigns(spec(num_spares=0, repair_s=86400.0), seeds=8)
    many = run_campaigns(spec(num_spares=100, repair_s=86400.0), seeds=8)
    assert few.spare_wait_s_mean > 0 and many.spare_wait_s_mean == 0
    assert few.goodput_mean < many.goodput_mean - 0.1


def test_campaign_is_deterministic_per_seed():
    assert simulate_campaign(spec(), seed=7) == simulate_campaign(spec(), seed=7)


def test_mean_ci95_known_answer():
    m, lo, hi = mean_ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(4.303 * 1.0 / math.sqrt(3))


def test_campaign_spec_validation():
    with pytest.raises(InputError, match="interval_s"):
        spec(interval_s=0)
    with pytest.raises(InputError, match="spares"):
        spec(num_spares=-1)


def test_checkpoint_is_14_bytes_per_parameter():
    m = load_model("llama3.1-405b")
    assert checkpoint_bytes(m) == pytest.approx(14 * m.num_params)


def test_llama3_scale_report():
    c = Cluster(gpu=get_gpu("h100-80gb"), num_gpus=16384, nic=get_nic("roce-400"), gpus_per_node=8, nvlink_domain=8,
                nics_per_node=8)
    r = goodput_report(load_model("llama3.1-405b"), c, storage="tectonic")
    assert 2 * 3600 < r.mtbf_s < 4 * 3600  # Llama 3: "one failure every three hours"
    assert r.optimal_checkpoint_interval_s == pytest.approx(math.sqrt(2 * r.checkpoint_write_s * r.mtbf_s))
    assert 0.8 < r.goodput < 0.95  # Meta reports > 90% effective training time with faster restarts
    fast = goodput_report(load_model("llama3.1-405b"), c, storage="nvme-local")
    assert fast.checkpoint_write_s < r.checkpoint_write_s and fast.goodput > r.goodput
    assert any("not durable" in w for w in fast.warnings)


def test_async_checkpoint_blocks_less():
    c = Cluster(gpu=get_gpu("h100-80gb"), num_gpus=1024, nic=get_nic("ib-ndr-400"), gpus_per_node=8, nvlink_domain=8,
                nics_per_node=8)
    m = load_model("llama3-70b")
    sync = goodput_report(m, c, storage="hdfs")
    asyn = goodput_report(m, c, storage="hdfs", async_checkpoint=True)
    assert asyn.checkpoint_write_s < sync.checkpoint_write_s and asyn.goodput > sync.goodput


def test_cli_goodput_json(capsys):
    code = main(["goodput", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "2048", "--seeds", "5",
                 "--campaign-days", "5", "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    d = json.loads(cap.out)
    for k in ("optimal_checkpoint_interval_s", "checkpoint_write_s", "mtbf_s", "goodput", "expected_failures_per_day"):
        assert d[k] > 0, k
    assert d["expected_failures_per_day"] == pytest.approx(86400 / d["mtbf_s"])
    sim = d["simulation"]
    assert sim["seeds"] == 5 and sim["goodput_ci95"][0] <= sim["goodput_mean"] <= sim["goodput_ci95"][1]


@pytest.mark.parametrize("argv,needle", [(["--storage", "tape"], "storage"), (["--seeds", "0"], "seeds"),
                                         (["--restart-s", "-5"], "restart-s"), (["--spares", "-1"], "spares")])
def test_cli_goodput_bad_input(capsys, argv, needle):
    code = main(["goodput", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "64"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
