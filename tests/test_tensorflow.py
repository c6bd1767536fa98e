"""TensorFlow tf.distribute: the profiles' mechanisms, the asynchronous parameter-server model
(known answers from its closed forms), the Keras export and its readback, and one formula shared
by ``simulate --framework tf-parameter-server`` and ``comm-reduce --mode parameter-server``."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from planner.cli import main
from planner.exports import LaunchSpec, format_framework, render
from planner.exports.readback import parameter_servers_from_tensorflow, read_back, tensorflow_strategy_class
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.layers.compute import default_efficiency
from sim.cost.costs import default_network, host_sync_counts, pieces_hbm_bytes_per_s, step_costs
from sim.base.errors import InfeasibleError, InputError
from sim.cost.framework import apply_framework, check_supported, get_framework
from sim.data.modelio import model_from_dict
from sim.engines.parameter_server import (expected_max_normal, keras_variables, mva_throughput, parameter_server_report,
                                  ps_params)
from sim.cost.plan import Plan, parse_strategy
from sim.data.psspecs import ParameterServers
from sim.engines.run import RunChoices, resolve
from sim.data.runtime import default_comm_runtime
from sim.engines.simulate import simulate
from tests.conftest import cluster

ROOT = Path(__file__).resolve().parent.parent


def _plan(framework: str, strategy: str, n: int, *, model: str = "gpt-1.7b", gpu: str = "h100-80gb",
          ps: ParameterServers | None = None, **cl: object) -> Plan:
    """The plan ``planner simulate --framework`` prices (``sim.engines.run.resolve``)."""
    return resolve(get_model(model), cluster(gpu, n, **cl), strategy,
                   RunChoices(framework=framework, parameter_servers=ps)).plan


# ----------------------------------------------------------------- profiles (synchronous)


def test_tf_profiles_simulate_on_one_node_and_several(capsys):
    for fw, n in (("tf-mirrored", 8), ("tf-multiworker", 32)):
        code = main(["simulate", "--model", "gpt-1.7b", "--gpu", "h100-80gb", "--num-gpus", str(n), "--strategy",
                     f"mbs=1,gbs={n * 2}", "--framework", fw, "--json"])
        cap = capsys.readouterr()
        assert code == 0, cap.err
        out = json.loads(cap.out)
        assert out["framework"] == fw and out["fits_memory"]
        assert "dp_overlap=0" in out["strategy"]  # one gradient pack, reduced after the backward
        assert "tensorflow" not in out["uncertainty"]["class"]  # no published TensorFlow run: a coarser class


def test_keras_mechanisms_price_as_catalogued():
    """Same plan: the TensorFlow profile pays the Keras optimizer's bytes (runtime.yaml), the
    accumulation pass and unfused kernels; its gradient reduction is not hidden."""
    tf_plan = _plan("tf-multiworker", "mbs=2,gbs=128", 32)
    mc = _plan("megatron-core", "mbs=2,gbs=128,dp_overlap=0", 32)
    mc = replace(mc, host_syncs=replace(mc.host_syncs, per_bucket=0))  # Megatron-Core's NaN check: test_step_overheads
    rt = default_comm_runtime()
    st_tf, st_mc = step_costs(tf_plan).stages[0], step_costs(mc).stages[0]
    floor = default_efficiency().host_op_floor_s  # the per-step host syncs each profile counts (host_syncs)
    tf_hbm = st_tf.pieces.optimizer_s - host_sync_counts(tf_plan.host_syncs, 1)[2] * floor
    mc_hbm = st_mc.pieces.optimizer_s - host_sync_counts(mc.host_syncs, 1)[2] * floor
    assert tf_hbm == pytest.approx(mc_hbm * 128 / 42)
    assert rt.grad_accumulation_bytes("keras", 2) == 12 and rt.grad_accumulation_bytes("keras", 1) == 0
    hbm = pieces_hbm_bytes_per_s(tf_plan.cluster, default_efficiency())  # on the job's slowest GPU
    assert st_tf.pieces.grad_accum_s == pytest.approx(st_tf.params * 12 / hbm)
    r_tf, r_mc = simulate_analytic(tf_plan), simulate_analytic(mc)
    assert r_tf.step_time_s > r_mc.step_time_s  # unfused attention, eager element-wise, Keras Adam
    assert r_tf.breakdown.exposed_dp_s == pytest.approx(st_tf.pieces.dp_grad_sync_s, rel=1e-9)


@pytest.mark.parametrize("framework,strategy,key", [
    ("tf-mirrored", "tp=2,mbs=1,gbs=8", "tp"),
    ("tf-mirrored", "mbs=1,gbs=8,dp_overlap=1", "dp_overlap"),
    ("tf-multiworker", "mbs=1,gbs=8,zero=1", "zero"),
    ("tf-multiworker", "mbs=1,gbs=8,dp_impl=parameter-server,dp_overlap=0", "dp_impl"),
    ("tf-parameter-server", "mbs=1,gbs=8,dp_overlap=0", "dp_impl"),
])
def test_tf_capabilities_refuse_what_tf_distribute_cannot_run(framework, strategy, key):
    s = parse_strategy(strategy, num_gpus=8)
    with pytest.raises(InfeasibleError) as err:
        check_supported(get_framework(framework), s)
    assert err.value.field == key


def test_recommend_refuses_the_asynchronous_profile(capsys):
    code = main(["recommend", "--model", "gpt-1.7b", "--gpu", "h100-80gb", "--num-gpus", "16",
                 "--framework", "tf-parameter-server"])
    err = capsys.readouterr().err
    assert code == 2 and "comm-reduce --mode parameter-server" in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------- parameter servers: closed forms


@pytest.mark.parametrize("model_id", ["gpt-1.7b", "llama3-8b", "mixtral-8x7b", "deepseek-v3"])
def test_keras_variables_sum_to_the_model(model_id):
    model = get_model(model_id)
    assert sum(v.params for v in keras_variables(model)) == model.num_params


def test_tied_embeddings_have_no_head():
    m = model_from_dict({"name": "t", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                         "ffn_hidden_size": 128, "vocab_size": 256, "tied_embeddings": True})
    assert keras_variables(m)[-1].name == "final_norm" and sum(v.params for v in keras_variables(m)) == m.num_params


def test_round_robin_and_min_size_partitioner_known_answers():
    from sim.engines.parameter_server import Variable

    vs = (Variable("a", 100, 10), Variable("b", 1, 10), Variable("c", 30, 10))  # 1000, 10, 300 params
    # no partitioner: whole variables on count % 2 -> PS0: a + c, PS1: b
    assert ps_params(vs, 2, "round-robin", 256.0) == (1300.0, 10.0)
    # MinSizePartitioner(min_shard_bytes=400 B): a (4000 B) -> 2 shards of 50 rows (PS0, PS1),
    # b (40 B) whole (PS0), c (1200 B) -> 2 shards of 15 rows (PS1, PS0)
    assert ps_params(vs, 2, "even", 400.0) == (500.0 + 10.0 + 150.0, 500.0 + 150.0)
    # uneven rows: 3 shards of 7 rows -> 3, 2, 2
    assert ps_params((Variable("d", 7, 1),), 3, "even", 1.0) == (3.0, 2.0, 2.0)


def test_mva_known_answers():
    # one customer: no queueing
    x, q = mva_throughput((2.0,), 3.0, 1)
    assert x == pytest.approx(1 / 5) and q[0] == pytest.approx(0.4)
    # two customers (Reiser & Lavenberg recursion by hand): R = 2 (1 + 0.4) = 2.8, X = 2 / 5.8
    x2, _ = mva_throughput((2.0,), 3.0, 2)
    assert x2 == pytest.approx(2 / 5.8)


@settings(max_examples=60, deadline=None)
@given(demands=st.lists(st.floats(0.0, 5.0, allow_subnormal=False), min_size=1, max_size=4),
       think=st.floats(0.0, 20.0, allow_subnormal=False), n=st.integers(1, 200))
def test_mva_respects_the_asymptotic_bounds(demands, think, n):
    """Lazowska et al. Ch. 5: N / (D + Z + (N - 1) D_max) <= X(N) <= min(N / (D + Z), 1 / D_max)."""
    d, dmax = sum(demands), max(demands)
    if d + think < 1e-9:
        return
    x, _ = mva_throughput(tuple(demands), think, n)
    assert x <= n / (d + think) * (1 + 1e-9)
    if dmax > 0:
        assert x <= 1 / dmax * (1 + 1e-9)
    assert x >= n / (d + think + (n - 1) * dmax) * (1 - 1e-9)


def test_expected_maximum_of_normals_known_answers():
    # David & Nagaraja, Order Statistics, Table: 1/sqrt(pi) for two, 1.5388 for ten, 2.5076 for 100
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / 3.141592653589793 ** 0.5, abs=1e-5)
    assert expected_max_normal(10) == pytest.approx(1.5388, abs=1e-4)
    assert expected_max_normal(100) == pytest.approx(2.5076, abs=1e-4)


def _report(plan: Plan):
    return parameter_server_report(plan, net=default_network(plan.cluster), eff=default_efficiency())


def test_colocated_even_shards_move_what_a_ring_all_reduce_moves():
    """BytePS (Jiang et al. 2020) Sec. 3.1: with a PS on every worker node and even shards, a
    node's NIC carries 2 (W - 1)/W x 4P bytes per direction per round of W updates."""
    plan = _plan("tf-parameter-server", "mbs=2,gbs=128", 64)
    rep = _report(plan)
    w, p = rep.workers, rep.params
    b = rep.ps_bytes_per_s
    assert w == 8 and rep.num_ps == 8
    per_round = rep.demands_s["egress"] * w
    assert per_round == pytest.approx(2 * (w - 1) / w * 4 * p / b, rel=1e-3)  # shards even to ~1e-4
    assert rep.staleness_updates == w - 1 and rep.staleness_global_steps == pytest.approx((w - 1) / w)


def test_dedicated_ps_saturate_at_the_busiest_resource():
    """Few dedicated PS on a slow NIC: many workers saturate the PS; throughput -> 1 / D_max."""
    ps = ParameterServers(num_ps=1, placement="dedicated")
    plan = _plan("tf-parameter-server", "mbs=2,gbs=512", 256, ps=ps, nic="eth-25")
    rep = _report(plan)
    dmax = max(rep.demands_s.values())
    assert rep.bottleneck in ("egress", "ingress")
    # 32 workers on two balanced queues (egress, ingress): exact MVA within a few % of 1 / D_max
    assert 0.95 / dmax <= rep.updates_per_s <= 1 / dmax
    assert 0.95 <= max(rep.utilisation.values()) <= 1.0


def test_one_worker_runs_at_its_own_pace():
    plan = _plan("tf-parameter-server", "mbs=2,gbs=16", 8)
    rep = _report(plan)
    assert rep.workers == 1 and rep.staleness_updates == 0
    assert rep.cycle_s == pytest.approx(rep.worker_alone_s)


def test_stragglers_slow_the_synchronous_step_not_the_asynchronous_one():
    base = _plan("tf-parameter-server", "mbs=2,gbs=128", 64)
    slow = replace(base, parameter_servers=ParameterServers(step_time_cv=0.2))
    a, b = _report(base), _report(slow)
    assert b.tokens_per_s == pytest.approx(a.tokens_per_s)
    assert b.sync_step_time_s == pytest.approx(a.sync_step_time_s * (1 + 0.2 * expected_max_normal(8)))
    assert b.speedup_vs_sync > a.speedup_vs_sync


def test_simulate_and_comm_reduce_share_one_formula(capsys):
    args = ["--model", "gpt-1.7b", "--gpu", "h100-80gb", "--num-gpus", "64", "--strategy", "mbs=2,gbs=128",
            "--num-ps", "4", "--ps-placement", "dedicated", "--ps-nic", "eth-100", "--json"]
    assert main(["simulate", "--framework", "tf-parameter-server"] + args) == 0
    sim_out = json.loads(capsys.readouterr().out)
    assert main(["comm-reduce", "--mode", "parameter-server"] + args) == 0
    cr = json.loads(capsys.readouterr().out)
    ps = sim_out["parameter_server"]
    # simulate's headline carries the calibration of published runs like it; the model's own figure
    model_tps = sim_out["tokens_per_s"] * sim_out["step_time_s"] / sim_out["model_step_time_s"]
    assert cr["tokens_per_s"] == pytest.approx(model_tps, rel=1e-12)
    assert cr["baseline_tokens_per_s"] == pytest.approx(ps["sync_tokens_per_s"], rel=1e-12)
    assert cr["statistical_efficiency_modelled"] is False and "stale" in cr["caveat"]
    assert ps["num_ps"] == 4 and ps["placement"] == "dedicated"


def test_synchronous_closed_form_refuses_asynchronous_plans():
    plan = _plan("tf-parameter-server", "mbs=2,gbs=128", 64)
    with pytest.raises(InputError, match="dp_impl"):
        simulate_analytic(plan)
    res = simulate(plan, engine="event")  # either engine: the PS closed form
    assert res.extra["parameter_server"]["workers"] == 8


@pytest.mark.parametrize("argv,needle", [
    (["--strategy", "tp=2,mbs=2,gbs=64", "--framework", "tf-parameter-server"], "dp_impl"),
    (["--strategy", "mbs=2,gbs=128", "--framework", "tf-parameter-server"], "gbs"),
    (["--strategy", "mbs=2,gbs=64", "--framework", "tf-parameter-server", "--num-ps", "9"], "num-ps"),
    (["--strategy", "mbs=2,gbs=64", "--framework", "tf-parameter-server", "--ps-nic", "eth-100"], "ps-nic"),
])
def test_parameter_server_bad_input_is_one_line(capsys, argv, needle):
    code = main(["simulate", "--model", "gpt-1.7b", "--gpu", "h100-80gb", "--num-gpus", "32"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------- export and readback


def _spec(model_id: str, n: int, text: str, *, ps: ParameterServers | None = None) -> LaunchSpec:
    return LaunchSpec(model=get_model(model_id), strategy=parse_strategy(text, num_gpus=n), num_gpus=n,
                      gpus_per_node=min(8, n), gpu="h100-80gb", job_name="tfjob", steps=100, parameter_servers=ps)


@pytest.mark.parametrize("n,text,cls,profile", [
    (8, "mbs=4,gbs=64,dp_overlap=0", "MirroredStrategy", "tf-mirrored"),
    (8, "mbs=4,gbs=64,dp_overlap=1", "MultiWorkerMirroredStrategy", "tf-multiworker"),
    (32, "mbs=2,gbs=64,dp_overlap=0", "MultiWorkerMirroredStrategy", "tf-multiworker"),
    (32, "mbs=2,gbs=64,dp_impl=parameter-server,dp_overlap=0", "ParameterServerStrategy", "tf-parameter-server"),
])
def test_export_picks_the_strategy_of_the_plan(n, text, cls, profile):
    spec = _spec("gpt-1.7b", n, text, ps=ParameterServers(num_ps=2, placement="dedicated"))
    files = render("tensorflow", spec).files
    ast.parse(files["train_keras.py"])
    assert tensorflow_strategy_class(files) == cls and format_framework("tensorflow", spec) == profile
    if spec.num_nodes > 1 or cls != "MirroredStrategy":
        configs = json.loads(files["tf_configs.json"])
        kinds = [c["task"]["type"] for c in configs.values()]
        assert kinds.count("worker") == spec.num_nodes  # one TF_CONFIG per worker (and PS, chief)
        assert kinds.count("ps") == (2 if cls == "ParameterServerStrategy" else 0)
        assert all(c["cluster"] == next(iter(configs.values()))["cluster"] for c in configs.values())
        if shutil.which("bash"):
            r = subprocess.run(["bash", "-n"], input=files["launch_tf.sh"], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
    else:
        assert set(files) == {"train_keras.py"}


@pytest.mark.parametrize("n,text,ps", [
    (32, "mbs=2,gbs=64,dp_impl=parameter-server,dp_overlap=0", ParameterServers(num_ps=2, placement="dedicated")),
    (64, "mbs=1,gbs=64,recompute=full,dp_impl=parameter-server,dp_overlap=0,precision=fp16",
     ParameterServers(partition="round-robin")),
])
def test_parameter_server_export_reads_back_and_prices_the_same(n, text, ps):
    spec = _spec("gpt-1.7b", n, text, ps=ps)
    files = render("tensorflow", spec).files
    s = read_back("tensorflow", files, model=spec.model, num_gpus=n)
    assert s == spec.strategy
    back = parameter_servers_from_tensorflow(files)
    want = replace(ps, num_ps=ps.num_ps or spec.num_nodes, placement="colocated")
    assert replace(back, placement="colocated") == want
    fw = get_framework("tf-parameter-server")
    cl = cluster("h100-80gb", n)
    a = simulate(Plan(**apply_framework({"model": spec.model, "cluster": cl, "strategy": spec.strategy}, fw),
                      parameter_servers=ps))
    b = simulate(Plan(**apply_framework({"model": spec.model, "cluster": cl, "strategy": s}, fw),
                      parameter_servers=replace(back, placement=ps.placement)))
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-12)


@pytest.mark.parametrize("model_id,text,needle", [
    ("mixtral-8x7b", "mbs=1,gbs=8,dp_overlap=0", "experts"),
    ("gpt-1.7b", "tp=2,mbs=1,gbs=8", "tp"),
    ("gpt-1.7b", "mbs=1,gbs=8,precision=fp8", "precision"),
])
def test_export_refuses_what_the_script_cannot_carry(model_id, text, needle):
    with pytest.raises(InputError, match=needle):
        render("tensorflow", _spec(model_id, 8, text))


def test_recommend_exports_a_keras_script(capsys, tmp_path):
    code = main(["recommend", "--model", "gpt-1.7b", "--gpu", "h100-80gb", "--num-gpus", "16", "--gbs", "64",
                 "--rerank", "0", "--top", "1", "--export", "tensorflow", "--out", str(tmp_path), "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    out = json.loads(cap.out)
    assert out["framework"] == "tf-multiworker"
    files = {p.name: p.read_text() for p in tmp_path.iterdir()}
    s = read_back("tensorflow", files, model=get_model("gpt-1.7b"), num_gpus=16)
    assert s == parse_strategy(out["plans"][0]["strategy"], num_gpus=16)


def _tf_python() -> str | None:
    """An interpreter with TensorFlow: PLANNER_TF_PYTHON, else this one if it imports it."""
    env = os.environ.get("PLANNER_TF_PYTHON")
    if env:
        return env
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return None
    return sys.executable


@pytest.mark.timeout(1800)
def test_exported_scripts_run_on_tensorflow(tmp_path):
    """The Keras scripts train for real (CPU): Mirrored, MultiWorkerMirrored (2 local workers),
    ParameterServer (chief, 2 workers, 2 PS); minutes, so only where TensorFlow is installed."""
    tf_python = _tf_python()
    if tf_python is None:
        pytest.skip("TensorFlow is not installed (optional extra: pip install 'cluster-planner[tensorflow]', or "
                    "set PLANNER_TF_PYTHON to an interpreter that has it)")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "tf_export_smoke.py"), "--tf-python", tf_python,
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=1700,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_search_prices_tf_plans_as_simulate_does():
    """The vectorised search and simulate_analytic are one implementation for the TensorFlow
    mechanisms too (Keras optimizer and accumulation bytes, unfused kernels)."""
    import numpy as np

    from planner.plans.recommend import Settings
    from planner.plans.search import SearchSpace, search

    st_ = Settings.from_framework("tf-multiworker")
    cl = cluster("h100-80gb", 32)
    r = search(get_model("gpt-1.7b"), cl, gbs=256, seq_len=2048, space=SearchSpace(tp=(1,), pp=(1,), cp=(1,),
               zero=(0,), max_mbs=4), plan_kwargs=st_.kwargs, dp_overlap=st_.dp_overlap)
    assert r.evaluated >= 3
    for i in range(r.evaluated):
        s = r.strategy(i)
        res = simulate_analytic(r.fastmodel.plan(s), net=r.fastmodel.net)
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=1e-9), s.to_string()
    assert np.all(np.isfinite(r.candidates.step_time_s[:r.evaluated]))
