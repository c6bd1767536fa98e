"""One resolution of a run (sim.engines.run, issue 20): the same design gives the same step time and
memory from `planner simulate`, `planner tco --strategy`, the app's evaluation and the
`planner simulate` line the app prints; Plan's defaults are the `default` profile's; the node's
one host (server design, catalog, calibration) is what offloading prices."""

from __future__ import annotations

import json
import shlex
from dataclasses import fields, replace

import pytest

from appkit.design import Design
from appkit.evaluate import cli_command, evaluate
from planner.cli import main
from sim.data.catalog import get_model
from sim.net.clusters import cluster_from_catalog
from sim.cost.framework import apply_framework, default_frameworks, get_framework
from sim.data.hostspecs import HostCalibration, HostCopy
from sim.cost.offload import default_host, host_spec, measured_host, offload_rates, server_host
from sim.cost.plan import Plan
from sim.engines.run import RunChoices, resolve
from sim.engines.simulate import simulate_run

# (model, gpu, GPUs, cluster flags as the app's sidebar states them, seq, STRATEGY)
DESIGNS = [
    ("llama3-70b", "h100-80gb", 512, {}, 8192, "tp=4,pp=4,dp=32,vp=5,mbs=1,gbs=512,sp=1,zero=1,recompute=selective"),
    ("gpt3-175b", "a100-80gb", 1024, {}, 2048, "tp=8,pp=16,vp=3,mbs=1,gbs=1536,sp=1,recompute=selective"),
    ("llama3-8b", "h100-80gb", 16, {}, 4096, "mbs=1,gbs=64,zero=3"),
    ("mixtral-8x7b", "h100-80gb", 64, {}, 4096, "tp=2,ep=8,mbs=1,gbs=128,sp=1,zero=1,recompute=selective"),
    ("llama3-70b", "gb200-186gb", 72, {}, 4096, "tp=4,pp=2,mbs=1,gbs=144,sp=1,zero=1,recompute=selective"),
    ("llama3-70b", "h100-80gb", 64, {}, 4096, "tp=8,mbs=1,gbs=64,sp=1,zero=1,precision=fp8"),
    ("llama3-8b", "h100-80gb", 16, {}, 2048, "pp=2,vp=2,mbs=1,gbs=64,schedule=zero-bubble"),  # torchtitan runs it
    ("llama3-8b", "rtx4090-24gb", 4, {}, 2048, "mbs=1,gbs=16,zero=1,recompute=full,offload=optimizer"),  # PCIe
    ("llama3-8b", "l40s-48gb", 8, {}, 2048, "mbs=1,gbs=16,zero=3,recompute=full,offload=params"),  # PCIe, torchtitan
    ("gpt-1.7b", "v100-32gb", 8, {}, 2048, "tp=2,mbs=2,gbs=32,precision=fp16"),
    ("llama3-70b", "mi300x-192gb", 64, {}, 4096, "tp=8,mbs=1,gbs=64,zero=1,sp=1"),
    ("llama3-8b", "h100-80gb", 16, {"oversubscription": 2.0}, 32768, "cp=2,tp=2,mbs=1,gbs=16,sp=1,zero=1"),
]


def _json(argv: list[str], capsys) -> dict:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("design", DESIGNS, ids=lambda d: f"{d[0]}-{d[1]}-{d[2]}-{d[5].split(',')[0]}")
def test_every_entry_point_prices_the_same_run(design, capsys):
    model_id, gpu, n, extra, seq, strategy = design
    d = Design(model=get_model(model_id), model_ref=model_id, gpu=gpu, num_gpus=n, seq_len=seq, strategy=strategy,
               **extra)
    ev = evaluate(d, rec=(None, None))  # the app: the user's strategy, no search
    [app] = [p for p in ev.plans if p["source"] == "yours"]
    line = cli_command(ev, app, catalog_model=True)
    assert "--engine analytic" in line and (app["framework"] is None or f"--framework {app['framework']}" in line)
    repro = _json(shlex.split(line)[1:] + ["--json"], capsys)
    flags = ["--model", model_id, "--gpu", gpu, "--num-gpus", str(n), "--seq-len", str(seq)]
    flags += [x for k, v in extra.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    cli = _json(["simulate", *flags, "--strategy", strategy, "--engine", "analytic", "--json"], capsys)
    tco = _json(["tco", *flags, "--strategy", strategy, "--pricing", "cloud", "--usd-per-gpu-hour", "2",
                 "--json"], capsys)
    for got in (repro, app, tco):
        assert got["step_time_s"] == pytest.approx(cli["step_time_s"], rel=1e-12)
        assert got["model_step_time_s"] == pytest.approx(cli["model_step_time_s"], rel=1e-12)
        assert got["memory_peak_bytes"] == pytest.approx(cli["memory_peak_bytes"], rel=1e-12)
        assert got["framework"] == cli["framework"]
    assert cli["step_time_s_low"] <= cli["step_time_s"] <= cli["step_time_s_high"]


@pytest.mark.parametrize("fname,gpu,n,strategy", [
    ("hf_llama3_8b_config.json", "h100-80gb", 16, "tp=2,mbs=1,gbs=64,sp=1,zero=1,recompute=selective"),
    ("hf_mixtral_8x7b_config.json", "h100-80gb", 64, "tp=2,ep=8,mbs=1,gbs=128,sp=1,zero=1"),
])
def test_an_uploaded_model_file_prices_as_the_cli_reads_it(fname, gpu, n, strategy, capsys):
    """The issue's case: a Hugging Face config.json uploaded to the app (74.0 GiB there, 71.9 GiB
    from `planner simulate --model config.json`): the same file, the same run, the same memory."""
    from pathlib import Path

    from appkit.design import model_from_upload

    path = Path(__file__).parent / "data" / fname
    d = Design(model=model_from_upload(fname, path.read_bytes()), model_ref=str(path), gpu=gpu, num_gpus=n,
               seq_len=4096, strategy=strategy)
    [app] = [p for p in evaluate(d, rec=(None, None)).plans if p["source"] == "yours"]
    cli = _json(["simulate", "--model", str(path), "--gpu", gpu, "--num-gpus", str(n), "--seq-len", "4096",
                 "--strategy", strategy, "--engine", "analytic", "--json"], capsys)
    for key in ("step_time_s", "memory_peak_bytes", "memory_device_bytes"):
        assert app[key] == pytest.approx(cli[key], rel=1e-12), key


def test_plan_defaults_are_the_default_profile():
    """`Plan()` without framework fields prices what the `default` profile (megatron-core) does."""
    fw = get_framework("default")
    assert fw.id == "megatron-core" and fw in default_frameworks()
    defaults = {f.name: f.default for f in fields(Plan) if f.name not in ("model", "cluster", "strategy")}
    assert apply_framework({}, fw) == {k: defaults[k] for k in apply_framework({}, fw)}


def test_the_strategy_string_is_completed_by_its_framework():
    model, cl = get_model("llama3-8b"), cluster_from_catalog("h100-80gb", 8)
    tt = resolve(model, cl, "tp=2,mbs=1,gbs=8,precision=fp8", RunChoices(framework="torchtitan"))
    assert tt.plan.strategy.fp8_recipe == "tensorwise"  # its own recipe, not Megatron's delayed scaling
    assert tt.plan.strategy.sp  # torchtitan's tensor parallelism always shards the sequence
    mc = resolve(model, cl, "tp=2,mbs=1,gbs=8,precision=fp8")
    assert mc.framework.id == "megatron-core" and mc.plan.strategy.fp8_recipe == "delayed" and not mc.plan.strategy.sp
    ds = resolve(model, cl, "pp=2,mbs=1,gbs=8", RunChoices(framework="megatron-deepspeed"))
    assert not ds.plan.strategy.dp_overlap and ds.plan.grad_accumulation == "autograd"
    assert resolve(model, cl, "pp=2,mbs=1,gbs=8,dp_overlap=1", RunChoices(framework="megatron-deepspeed")
                   ).plan.strategy.dp_overlap  # what the string says stays
    none = resolve(model, cl, "pp=2,vp=2,mbs=1,gbs=8,zero=2,schedule=zero-bubble")
    assert not none.runnable and "no framework profile runs" in none.notes[0]
    assert "--framework" not in none.flags()


def test_one_host_per_node_server_catalog_calibration():
    """A PCIe workstation offloads at its own host's rates, not a DGX's; a calibration's measured
    rates replace them; --host-dram-gib overrides the capacity of that same host."""
    ws = cluster_from_catalog("rtx4090-24gb", 4)
    assert ws.server is not None and host_spec(ws) == server_host(ws)
    dgx = default_host(ws)
    srv = host_spec(ws)
    assert srv.host_mem_bytes_per_s != dgx.host_mem_bytes_per_s and "server" in srv.source
    measured = HostCalibration(host_mem_bytes_per_s=20e9, h2d_pinned=HostCopy(bytes_per_s=11e9, latency_s=1e-5),
                               d2h_pinned=HostCopy(bytes_per_s=9e9, latency_s=1e-5))
    m = measured_host(srv, measured)
    assert m.host_mem_bytes_per_s == 20e9 and m.link_bytes_per_s_per_gpu == 9e9 and m.host_dram_bytes == srv.host_dram_bytes
    slow = replace(ws, host=m)
    assert offload_rates(slow).link_bytes_per_s == 9e9
    model = get_model("llama3-8b")
    s = "mbs=1,gbs=16,zero=1,recompute=full,offload=optimizer"
    fast_t = simulate_run(resolve(model, ws, s)).step_time_s
    slow_t = simulate_run(resolve(model, slow, s)).step_time_s
    assert slow_t > fast_t  # the measured host reaches the price
    hgx = cluster_from_catalog("h100-80gb", 8)
    assert hgx.server is None and host_spec(hgx) == default_host(hgx)


# The recommender's plans as the app shows them: the event-timed #1, an fp8 plan (the fp8 toggle,
# precision bf16,fp8), a PCIe workstation, a framework and memory headroom chosen in the sidebar.
SEARCHES = [
    dict(model="llama3-8b", gpu="h100-80gb", num_gpus=8, gbs=64, precisions=("bf16", "fp8"), memory_headroom=0.2),
    dict(model="llama3-8b", gpu="rtx4090-24gb", num_gpus=4, gbs=16, framework="torchtitan"),
]


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: f"{s['gpu']}-{s['num_gpus']}")
def test_the_reproduce_lines_rerun_the_apps_search_and_plans(search, capsys):
    """`recommend_command` runs the search the app ran (same plans, same times); `cli_command`
    reprices each shown plan exactly, with the engine that timed it, its framework and precision."""
    from appkit.evaluate import recommend_command

    kw = dict(search)
    model_id = kw.pop("model")
    d = Design(model=get_model(model_id), model_ref=model_id, **kw)
    ev = evaluate(d)
    line = recommend_command(ev, catalog_model=True)
    assert "--nvlink-domain" not in line if ev.cluster.server is not None else "--nvlink-domain" in line
    cli = _json(shlex.split(line)[1:] + ["--json"], capsys)
    assert [p["strategy"] for p in cli["plans"]] == [p["strategy"] for p in ev.plans]
    assert cli["memory_headroom"] == ev.search["memory_headroom"]
    for got, want in zip(ev.plans, cli["plans"]):
        assert got["step_time_s"] == pytest.approx(want["step_time_s"], rel=1e-12)
        assert got["framework"] == want["framework"] == (d.framework or got["framework"])
    engines = set()
    for plan in ev.plans:
        repro = _json(shlex.split(cli_command(ev, plan, catalog_model=True))[1:] + ["--json"], capsys)
        engines.add(plan["engine"])
        for key in ("step_time_s", "memory_peak_bytes", "memory_device_bytes"):
            assert repro[key] == pytest.approx(plan[key], rel=1e-12), (plan["strategy"], key)
        for key in ("framework", "precision", "fp8_recipe"):
            assert repro[key] == plan[key]
        assert plan["memory_device_bytes"] <= (1 - cli["memory_headroom"]["fraction"]) * ev.cluster.gpu.hbm_bytes
    assert "event" in engines  # the re-ranked plans are reproduced with the event engine
    if d.precisions is not None:
        assert "fp8" in {p["precision"] for p in ev.plans}


def test_the_users_strategy_and_time_to_train_use_the_sidebars_framework(capsys):
    """A fixed strategy with a framework chosen in the sidebar is priced as `planner simulate
    --framework` prices it, and so is its time and cost to train (`planner tco --framework`)."""
    from appkit.evaluate import economics_of

    strategy = "tp=2,mbs=1,gbs=16,zero=3,precision=fp8"
    d = Design(model=get_model("llama3-8b"), model_ref="llama3-8b", gpu="h100-80gb", num_gpus=8, strategy=strategy,
               framework="torchtitan", pricing="cloud")
    ev = evaluate(d, rec=(None, None))
    [mine] = ev.plans
    flags = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--seq-len", "2048",
             "--strategy", strategy, "--framework", "torchtitan"]
    cli = _json(["simulate", *flags, "--engine", "analytic", "--json"], capsys)
    assert mine["framework"] == cli["framework"] == "torchtitan" and mine["fp8_recipe"] == cli["fp8_recipe"]
    assert mine["step_time_s"] == pytest.approx(cli["step_time_s"], rel=1e-12)
    default = _json(["simulate", *flags[:-2], "--engine", "analytic", "--json"], capsys)
    assert default["framework"] == "megatron-core" and default["step_time_s"] != pytest.approx(cli["step_time_s"])
    eco, _ = economics_of(d, ev.cluster, mine)
    tco = _json(["tco", *flags, "--pricing", "cloud", "--tokens", repr(d.token_budget), "--json"], capsys)
    assert eco["step_time_s"] == pytest.approx(cli["step_time_s"], rel=1e-12)
    assert eco["time_to_train_s"] == pytest.approx(tco["time_to_train_s"], rel=1e-9)
    line = cli_command(ev, mine, catalog_model=True)
    assert "--framework torchtitan" in line and "precision=fp8" in line
