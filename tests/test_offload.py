"""Offloading (docs/offload.md): the strategy key, the bytes moved against the ZeRO-Offload and
ZeRO-Infinity closed forms, the CPU Adam step, host memory checked like HBM, a 13B model that
only fits four 24 GiB GPUs with offload, both engines and the search agreeing."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.plans.recommend import recommend
from planner.plans.search import SearchSpace, search
from sim.engines.analytic import simulate_analytic
from sim.layers.stages import trained_params
from sim.data.catalog import get_gpu, get_model
from sim.net.clusters import cluster_from_catalog
from sim.cost.costs import offload_report
from sim.base.errors import InfeasibleError, InputError
from sim.cost.memory import plan_memory
from sim.data.models import load_model
from sim.cost.offload import host_spec, offload_constants, with_host
from sim.cost.plan import Plan, normalize_offload, parse_strategy
from sim.engines.simulate import simulate
from sim.data.specs import Strategy

ROOT = Path(__file__).resolve().parent.parent
LLAMA2_13B = str(ROOT / "tests" / "data" / "llama2_13b.yaml")
GIB = 2**30


def small_gpu_cluster(n: int = 4):
    """``n`` A100-class GPUs cut to 24 GiB (no 24 GiB SXM part in the catalog), one node."""
    return cluster_from_catalog(replace(get_gpu("a100-40gb"), hbm_bytes=24 * GIB), n)


def plan(model, cl, text: str) -> Plan:
    return Plan(model=model, cluster=cl, strategy=parse_strategy(text, num_gpus=cl.num_gpus)).checked()


# --------------------------------------------------------------------------- the key


@pytest.mark.parametrize("text, canonical", [
    ("none", "none"), ("optimizer", "optimizer"), ("params", "params"), ("activations", "activations"),
    ("activations+optimizer", "optimizer+activations"), ("params+optimizer", "params"),
    ("optimizer+params+activations", "params+activations"), ("Params", "params")])
def test_offload_values_normalise(text, canonical):
    assert normalize_offload(text) == canonical
    s = parse_strategy(f"zero=3,offload={text}", num_gpus=8)
    assert s.offload == canonical
    assert parse_strategy(s.to_string(), num_gpus=8) == s  # the STRATEGY string round-trips


@pytest.mark.parametrize("text", ["gpu", "none+params", "optimizer+optimizer", "", "params,"])
def test_bad_offload_values_are_input_errors(text):
    with pytest.raises(InputError, match="offload"):
        normalize_offload(text)


@pytest.mark.parametrize("text, field", [
    ("zero=0,offload=optimizer", "offload"),          # ZeRO-Offload needs a ZeRO stage
    ("zero=2,offload=params", "offload"),             # parameter offload is ZeRO-3 / FSDP only
    ("zero=2,offload=optimizer,offload_device=nvme", "offload_device")])  # NVMe: ZeRO-3 only
def test_offload_needs_its_zero_stage(text, field):
    model, cl = get_model("llama3-8b"), cluster_from_catalog("h100-80gb", 8)
    with pytest.raises(InfeasibleError) as exc:
        plan(model, cl, text)
    assert exc.value.reason == "unsupported" and exc.value.field == field


def test_cli_bad_offload_exits_2_with_one_line():
    for bad in ("offload=gpu", "zero=1,offload=params", "offload_device=disk", "offload=activations,offload_device=nvme"):
        r = subprocess.run([sys.executable, "-c", "import sys; from planner.cli import main; sys.exit(main())",
                            "simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
                            "--strategy", bad, "--engine", "analytic"], capture_output=True, text=True, cwd=ROOT,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 2, (bad, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "offload" in lines[0] and "Traceback" not in r.stderr, (bad, r.stderr)


# --------------------------------------------------------------------------- volumes (papers)


def test_zero_offload_moves_2m_gradients_and_2m_parameters_per_step():
    """Ren et al. 2021 Sec. 4: per step the fp16 gradients go to the CPU (2M bytes) and the
    fp16 parameters come back (2M bytes), for M parameters on one GPU; with data parallelism
    each GPU moves its 1/dp shard."""
    model = get_model("gpt-1.7b")
    one = cluster_from_catalog("a100-80gb", 1)
    p = plan(model, one, "zero=1,mbs=1,gbs=1,offload=optimizer")
    M = trained_params(model, p.strategy)  # GPT's learned position table included
    rep = offload_report(p)
    assert rep["d2h_bytes_per_step"] == pytest.approx(2 * M, rel=1e-12)
    assert rep["h2d_bytes_per_step"] == pytest.approx(2 * M, rel=1e-12)
    eight = cluster_from_catalog("a100-80gb", 8)
    rep = offload_report(plan(model, eight, "zero=2,mbs=1,gbs=32,offload=optimizer"))  # 4 micro-batches
    assert rep["d2h_bytes_per_step"] == pytest.approx(2 * M / 8, rel=1e-12)  # once per step with ZeRO-2
    assert rep["h2d_bytes_per_step"] == pytest.approx(2 * M / 8, rel=1e-12)


def test_zero_infinity_loads_parameters_twice_and_writes_gradients_once():
    """Rajbhandari et al. 2021 Sec. 4: parameters are read for forward and for backward and the
    gradients written once, 3 x 2M bytes per micro-batch over the data-parallel group."""
    model = get_model("gpt-7.5b")
    dp, m = 8, 3
    cl = cluster_from_catalog("a100-80gb", dp)
    p = plan(model, cl, f"zero=3,mbs=1,gbs={dp * m},offload=params")
    M = trained_params(model, p.strategy)
    rep = offload_report(p)
    assert rep["h2d_bytes_per_step"] * dp == pytest.approx(2 * 2 * M * m, rel=1e-12)
    assert rep["d2h_bytes_per_step"] * dp == pytest.approx(2 * M * m, rel=1e-12)
    assert (rep["h2d_bytes_per_step"] + rep["d2h_bytes_per_step"]) * dp / m == pytest.approx(3 * 2 * M, rel=1e-12)


def test_activation_offload_moves_the_saved_activations_out_and_back():
    model, cl = get_model("gpt-7.5b"), cluster_from_catalog("a100-80gb", 8)
    p = plan(model, cl, "tp=8,mbs=1,gbs=4,recompute=full,offload=activations")
    mem = plan_memory(p)
    rep = offload_report(p)
    m = p.strategy.num_microbatches
    # full recomputation keeps each layer's input: 2 B x tokens x hidden per layer, out and back
    per_mb = model.num_layers * 2 * 2048 * model.hidden_size
    assert rep["d2h_bytes_per_step"] == pytest.approx(m * per_mb, rel=1e-12)
    assert rep["h2d_bytes_per_step"] == pytest.approx(m * per_mb, rel=1e-12)
    assert mem.host_activations_bytes == pytest.approx(8 * per_mb, rel=1e-12)  # one in flight, 8 GPUs per node


def test_a_slow_host_link_exposes_the_whole_transfer():
    """With a link so slow that nothing hides it, ZeRO-Offload's step grows by its 4M bytes over
    the link (gradients out, parameters back), the closed form."""
    model = get_model("gpt-1.7b")
    base = cluster_from_catalog("a100-80gb", 1)
    slow = with_host(base, host_link_bytes_per_s=1e6)  # 1 MB/s
    p = plan(model, slow, "zero=1,mbs=1,gbs=1,offload=optimizer")
    res = simulate_analytic(p)
    expected = 4 * trained_params(model, p.strategy) / 1e6
    assert res.breakdown.exposed_offload_s == pytest.approx(expected, rel=1e-3)


def test_cpu_adam_is_host_memory_bound():
    """The Adam step on the host streams catalogs/offload.yaml's bytes per parameter at the
    node's memory bandwidth, every GPU of the node stepping its shard at once."""
    model = get_model("gpt-7.5b")
    cl = cluster_from_catalog("a100-80gb", 8)
    # without Megatron-Core's per-bucket NaN check, which reads the GPU's gradient buffer apart
    # from the host's Adam step (tests/test_step_overheads.py prices it)
    p = plan(model, cl, "zero=2,mbs=1,gbs=8,offload=optimizer")
    res = simulate_analytic(replace(p, host_syncs=replace(p.host_syncs, per_bucket=0)))
    host = host_spec(cl)
    per_gpu = trained_params(model, p.strategy) / 8
    expected = per_gpu * 8 * offload_constants().cpu_adam_bytes_per_param / host.host_mem_bytes_per_s
    assert res.breakdown.optimizer_s == pytest.approx(expected, rel=1e-9)


# --------------------------------------------------------------------------- memory


def test_13b_does_not_fit_four_24gib_gpus_without_offload_and_fits_with_it():
    model, cl = load_model(LLAMA2_13B), small_gpu_cluster(4)
    assert 12.9e9 < model.num_params < 13.1e9
    base = "zero=3,mbs=1,gbs=8,seq=2048,recompute=full"
    none = plan_memory(plan(model, cl, base))
    assert not none.fits and none.total_bytes > 24 * GIB
    for mode in ("params", "optimizer"):
        mem = plan_memory(plan(model, cl, f"{base},offload={mode}"))
        assert mem.fits and mem.total_bytes < 24 * GIB, mode
        # the node holds the shards' fp32 master, moments, fp32 gradients and the fp16 copy: 18 B/param
        assert mem.host_states_bytes == pytest.approx(model.num_params * offload_constants().host_bytes_per_param,
                                                      rel=1e-9)
    # recommend finds a plan only because it may offload
    gbs, seq = 8, 2048
    off = recommend(model, cl, gbs=gbs, seq_len=seq, space=SearchSpace(max_mbs=2), rerank=0, explain=False,
                    suggest=False)
    assert off.best is not None and off.best.strategy.offload != "none" and off.best.result.fits_memory
    without = search(model, cl, gbs=gbs, seq_len=seq, space=SearchSpace(max_mbs=2, offload=("none",)))
    assert without.evaluated == 0


def test_host_memory_is_checked_like_hbm():
    model = load_model(LLAMA2_13B)
    cl = with_host(small_gpu_cluster(4), host_dram_bytes=100 * GIB)  # 13B x 18 B = 218 GiB do not fit
    p = plan(model, cl, "zero=3,mbs=1,gbs=8,recompute=full,offload=params")
    res = simulate_analytic(p)
    assert res.memory.fits_gpu and not res.memory.fits_host and not res.fits_memory
    assert any("host memory" in w for w in res.warnings)
    out = res.to_dict()
    assert out["host_memory_bytes"] > out["host_memory_capacity_bytes"] == 100 * GIB
    r = search(model, cl, gbs=8, seq_len=2048, space=SearchSpace(max_mbs=2))
    assert r.evaluated == 0 and r.rejected["host_oom"] > 0


def test_nvme_holds_the_states_and_streams_them_through_the_drives():
    model, cl = get_model("gpt-7.5b"), cluster_from_catalog("a100-80gb", 8)
    cpu = plan(model, cl, "zero=3,mbs=1,gbs=8,offload=params")
    nvme = plan(model, cl, "zero=3,mbs=1,gbs=8,offload=params,offload_device=nvme")
    a, b = plan_memory(cpu), plan_memory(nvme)
    assert b.nvme_bytes == pytest.approx(a.host_states_bytes) and b.host_states_bytes == 0
    assert simulate_analytic(nvme).step_time_s > simulate_analytic(cpu).step_time_s


# --------------------------------------------------------------------------- engines and search


AGREE = [
    ("gpt-1.7b", "a100-80gb", 1, "zero=1,mbs=4,gbs=16,offload=optimizer"),
    ("gpt-7.5b", "a100-80gb", 8, "tp=2,pp=2,zero=1,mbs=2,gbs=64,offload=optimizer"),
    ("gpt-7.5b", "a100-80gb", 8, "tp=2,pp=2,vp=2,zero=2,mbs=2,gbs=64,offload=optimizer+activations"),
    ("gpt-7.5b", "a100-80gb", 8, "tp=2,pp=2,zero=3,mbs=2,gbs=64,offload=params"),
    ("llama3-8b", "h100-80gb", 8, "zero=3,mbs=1,gbs=16,recompute=full,offload=params+activations"),
]


@pytest.mark.parametrize("model_id, gpu, n, text", AGREE)
def test_event_engine_agrees_with_analytic_on_offload_plans(model_id, gpu, n, text):
    """The engines agree on offload plans as on any (docs/event_engine.md: FSDP plans differ by
    ~2% from the per-layer gathers), and on what offloading adds to the plan without it."""
    model, cl = get_model(model_id), cluster_from_catalog(gpu, n)
    p = plan(model, cl, text)
    twin = replace(p, strategy=p.strategy.with_(offload="none"))
    a, e = simulate(p, engine="analytic"), simulate(p, engine="event")
    a0, e0 = simulate(twin, engine="analytic"), simulate(twin, engine="event")
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.03), text
    # the event engine copies each bucket's gradients as it is reduced (the embedding's large
    # bucket last); the closed form spreads them evenly over the backward: a few percent apart
    assert e.step_time_s - e0.step_time_s == pytest.approx(a.step_time_s - a0.step_time_s, rel=0.05), text
    assert a.breakdown.exposed_offload_s > 0 and e.breakdown.exposed_offload_s > 0
    assert e.breakdown.exposed_offload_s == pytest.approx(a.breakdown.exposed_offload_s, rel=0.1, abs=0.01 * a.step_time_s)
    assert sum(e.breakdown.as_dict()[k] for k in ("compute_s", "exposed_comm_s", "bubble_s", "optimizer_s",
                                                   "overhead_s")) == pytest.approx(e.step_time_s, rel=1e-9)
    assert e.to_dict()["offload"] == a.to_dict()["offload"]


def test_search_equals_simulate_for_offload_candidates():
    """The fast model's values are simulate_analytic's on offload plans (time and memory)."""
    model, cl = load_model(LLAMA2_13B), small_gpu_cluster(4)
    space = SearchSpace(max_mbs=2, max_vp=2, offload=("optimizer", "params", "optimizer+activations",
                                                      "params+activations"))
    r = search(model, cl, gbs=8, seq_len=2048, space=space)
    assert r.evaluated > 20
    rng = np.random.default_rng(15)
    best = int(np.argmin(r.candidates.step_time_s))
    for i in {best, *rng.choice(r.evaluated, size=min(20, r.evaluated), replace=False).tolist()}:
        s = r.strategy(int(i))
        assert s.offload != "none"
        res = simulate_analytic(r.fastmodel.plan(s), net=r.fastmodel.net)
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=1e-9), s.to_string()
        assert r.candidates.memory_device_bytes[i] == pytest.approx(res.memory_device_bytes, rel=1e-9), s.to_string()
        assert res.fits_memory


def test_offload_is_not_searched_where_the_plan_fits_without_it():
    model, cl = get_model("llama3-8b"), cluster_from_catalog("h100-80gb", 8)
    r = search(model, cl, gbs=32, seq_len=2048, space=SearchSpace(max_mbs=2, max_vp=2))
    kept = [r.strategy(i) for i in range(r.evaluated)]
    for s in kept:
        if s.offload != "none":  # only where its twin without offload does not fit
            twin = s.with_(offload="none", zero=s.zero)
            assert not plan_memory(Plan(model=model, cluster=cl, strategy=twin)).fits
    assert r.rejected["offload_unneeded"] > 0
    assert r.evaluated + sum(r.rejected.values()) == r.considered


def test_strategy_validates_offload_fields():
    with pytest.raises(InputError, match="offload"):
        Strategy(offload="gpu")
    with pytest.raises(InputError, match="offload_device"):
        Strategy(offload="none", offload_device="nvme")


def test_trace_shows_the_host_link(tmp_path):
    import json

    model, cl = get_model("gpt-7.5b"), cluster_from_catalog("a100-80gb", 8)
    p = plan(model, cl, "tp=2,pp=2,zero=1,mbs=2,gbs=64,offload=optimizer")
    out = tmp_path / "trace.json"
    simulate(p, engine="event", trace_path=str(out))
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert "host" in names
    assert any(e.get("ph") == "X" and e["name"].startswith("gradients to host") for e in events)
    assert any(e.get("ph") == "X" and e["name"] == "weights to GPU" for e in events)
