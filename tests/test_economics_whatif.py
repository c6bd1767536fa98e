"""What-ifs: the input pipeline and communication-reducing training."""

import json

import pytest

from planner.cli import main
from planner.economics.comm_reduction import CAVEATS, comm_reduction
from planner.economics.input_pipeline import input_pipeline
from sim.data.catalog import get_gpu, get_nic
from sim.base.errors import InputError
from sim.data.models import load_model
from sim.cost.plan import Plan, parse_strategy
from sim.data.hardware import Cluster
from sim.net.fabric import pcie_x16_bytes_per_s

M8 = load_model("llama3-8b")


def slow_cluster(n=256):
    return Cluster(gpu=get_gpu("h100-80gb"), num_gpus=n, nic=get_nic("eth-100"), gpus_per_node=8, nvlink_domain=8,
                   nics_per_node=1)


def plan(strategy, n=256):
    return Plan(model=M8, cluster=slow_cluster(n), strategy=parse_strategy(strategy, num_gpus=n))


def test_input_pipeline_known_supplies():
    c = slow_cluster()
    s = parse_strategy("tp=1,pp=1,mbs=1,gbs=1024", num_gpus=256)
    r = input_pipeline(M8, c, s, 1e6, storage="lustre-ddn")
    assert r.bytes_per_token_storage == 4  # 128k vocabulary does not fit in uint16
    assert r.supply_tokens_per_s["storage"] == pytest.approx(min(720e9, 32 * 50e9) / 4)
    assert r.supply_tokens_per_s["pcie"] == pytest.approx(256 * pcie_x16_bytes_per_s(5) / 16)
    assert "host_cpu" not in r.supply_tokens_per_s and not r.data_bound
    raw = input_pipeline(M8, c, s, 1e6, storage="lustre-ddn", pretokenized=False)
    assert raw.supply_tokens_per_s["host_cpu"] == pytest.approx(32 * 5e7 / 4)


def test_input_pipeline_flags_data_bound_steps():
    """Video-like tokens (600 B each) from HDFS (66 MB/s per node, 32 nodes) cannot feed 10M tokens/s."""
    c = slow_cluster()
    s = parse_strategy("tp=1,pp=1,mbs=1,gbs=1024", num_gpus=256)
    r = input_pipeline(M8, c, s, 1e7, storage="hdfs", bytes_per_token_storage=600)
    assert r.data_bound and r.bound_by == "storage"
    assert r.headroom == pytest.approx(32 * 0.066e9 / 600 / 1e7)
    assert any("bounds the step" in w for w in r.warnings)


def test_compression_ratio_one_is_the_baseline_and_more_is_faster():
    p = plan("tp=1,pp=1,mbs=1,gbs=1024")
    one = comm_reduction(p, mode="compress", ratio=1.0)
    assert one.step_time_s == pytest.approx(one.baseline.step_time_s, rel=1e-12)
    steps = [comm_reduction(p, mode="compress", ratio=r).step_time_s for r in (2, 8, 64)]
    assert steps[0] > steps[1] > steps[2] >= one.baseline.breakdown.compute_s


def test_local_sgd_interpolates_between_sync_and_no_sync():
    p = plan("tp=1,pp=1,mbs=1,gbs=1024")
    r1 = comm_reduction(p, mode="local-sgd", sync_every=1)
    r100 = comm_reduction(p, mode="local-sgd", sync_every=100)
    inner = r1.parameters["inner_step_time_s"]
    assert r1.step_time_s == pytest.approx(inner + r1.parameters["outer_sync_s"])
    assert r1.step_time_s >= r1.baseline.step_time_s - 1e-9  # H=1 without overlap is no better than DDP
    assert inner < r100.step_time_s < r1.step_time_s
    assert r100.dp_bytes_factor == pytest.approx(0.01)


def test_async_pipeline_removes_the_bubble():
    p = plan("tp=1,pp=4,mbs=1,gbs=256")
    r = comm_reduction(p, mode="async-pipeline")
    assert r.baseline.breakdown.bubble_s > 0
    assert r.step_time_s == pytest.approx(r.baseline.step_time_s - r.baseline.breakdown.bubble_s)


@pytest.mark.parametrize("strategy,kw,needle", [
    ("tp=1,pp=1,mbs=1,gbs=1024,zero=1", {"mode": "local-sgd", "sync_every": 10}, "zero"),
    ("tp=1,pp=1,mbs=1,gbs=1024", {"mode": "local-sgd", "sync_every": 0}, "sync-every"),
    ("tp=1,pp=1,mbs=1,gbs=1024", {"mode": "compress", "ratio": 0.5}, "ratio"),
    ("tp=1,pp=1,mbs=1,gbs=1024", {"mode": "async-pipeline"}, "pp"),
    ("tp=1,pp=1,mbs=1,gbs=1024", {"mode": "teleport"}, "mode"),
])
def test_comm_reduction_bad_input(strategy, kw, needle):
    with pytest.raises(InputError, match=needle):
        comm_reduction(plan(strategy), **kw)


def test_cli_comm_reduce_states_the_caveat(capsys):
    argv = ["comm-reduce", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "256", "--nic", "eth-100",
            "--nics-per-node", "1", "--strategy", "tp=1,pp=1,mbs=1,gbs=1024", "--mode", "compress", "--ratio", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "CAVEAT" in out and "NOT modelled" in out
    assert main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["statistical_efficiency_modelled"] is False and d["caveat"] == CAVEATS["compress"] and d["speedup"] > 1


def test_cli_input_pipeline_json(capsys):
    code = main(["input-pipeline", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "64",
                 "--strategy", "tp=1,pp=1,mbs=1,gbs=256,zero=1", "--storage", "s3", "--raw-text", "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    d = json.loads(cap.out)
    assert set(d["supply_tokens_per_s"]) == {"storage", "host_cpu", "pcie"} and d["data_bound"] is False
