"""Bill of materials, power and TCO: known answers from the sources, invariants, CLI."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.economics.bom import cluster_bom, network_bom
from planner.economics.power import gpu_power_w
from planner.economics.prices import PriceQuote, load_prices
from planner.economics.strategy import choose_plan
from planner.economics.tco import TcoOptions, compute_tco
from sim.base.errors import InputError
from sim.data.models import load_model
from sim.cost.plan import parse_strategy
from tests.conftest import cluster as shared_cluster

QUOTE = PriceQuote(value=27500.0, source="test", estimate=False)


def cluster(gpu="h100-80gb", n=1024, nic=None, topology="fat-tree", o=1.0):
    return shared_cluster(gpu, n, nic=nic, topology=topology, o=o)


def items(bom, category):
    return [i for i in bom if i.category == category]


def test_switch_count_and_cost_match_the_published_1024_h100_row():
    """H100 Freakonomics spreadsheet (Aug 2024): 1,024 H100 on 400G IB -> 48 switches, $1,728,000."""
    bom = network_bom(cluster(), load_prices())
    (sw,) = items(bom, "switch")
    assert sw.quantity == 48
    assert sw.total_usd == pytest.approx(1_728_000)
    links = {i.item: i.quantity for i in items(bom, "link")}
    assert links == {"nic-leaf dac link": 1024, "leaf-spine optical link": 1024}


def test_rail_optimized_leaves_use_optics():
    bom = network_bom(cluster(topology="rail-optimized"), load_prices())
    assert any(i.item == "nic-leaf optical link" for i in items(bom, "link"))


def test_single_node_has_no_scale_out_network():
    assert network_bom(cluster(n=8), load_prices()) == []


@pytest.mark.parametrize("topology", ["fat-tree", "tree"])
def test_oversubscription_never_raises_network_cost(topology):
    pb = load_prices()
    costs = [cluster_bom(cluster(n=2048, topology=topology, o=o), pb, QUOTE).network_capex_usd for o in (1, 2, 4)]
    assert costs[0] >= costs[1] >= costs[2]
    assert costs[0] > costs[2]


def test_network_share_of_capex_is_in_the_published_range():
    """Cottier et al. 2024: cluster interconnect ~9-13% of frontier hardware cost; allow 5-25%."""
    bom = cluster_bom(cluster(n=4096), load_prices(), QUOTE)
    share = bom.network_capex_usd / bom.total_usd()
    assert 0.05 < share < 0.25


@settings(max_examples=50, deadline=None)
@given(frac=st.floats(min_value=0, max_value=1), tdp=st.floats(min_value=50, max_value=2000))
def test_gpu_power_between_idle_and_tdp(frac, tdp):
    model = load_prices().power
    p, a = gpu_power_w(tdp, frac, model)
    assert model.gpu_idle_fraction_of_tdp * tdp - 1e-9 <= p <= tdp + 1e-9
    assert model.gpu_wait_fraction - 1e-12 <= a <= 1 + 1e-12


def test_gpu_power_known_answers():
    model = load_prices().power
    assert gpu_power_w(700, 1.0, model)[0] == pytest.approx(700)
    idle = model.gpu_idle_fraction_of_tdp * 700
    assert gpu_power_w(700, 0.0, model)[0] == pytest.approx(idle + (700 - idle) * model.gpu_wait_fraction)


GPT3 = "tp=8,pp=16,vp=3,mbs=1,gbs=1536,sp=1,recompute=selective"


@pytest.fixture(scope="module")
def gpt3_tco():
    c = cluster("a100-80gb")
    s = parse_strategy(GPT3, num_gpus=1024)
    return compute_tco(load_model("gpt3-175b"), c, strategy=s)


def test_tco_identities(gpt3_tco):
    r = gpt3_tco
    model = load_model("gpt3-175b")
    assert r.tokens == pytest.approx(20 * model.num_params)  # Chinchilla default
    # time to train plans with the calibrated estimate (planner.fitting.uncertainty), and carries its band
    bias = r.plan.out["uncertainty"]["bias"]
    assert r.plan.tokens_per_s == pytest.approx(r.plan.result.tokens_per_s / (1 + bias))
    assert r.time_to_train_ideal_s == pytest.approx(r.tokens / r.plan.tokens_per_s)
    d = r.as_dict()
    assert d["time_to_train_s_low"] <= d["time_to_train_s"] <= d["time_to_train_s_high"]
    assert d["cost_to_train_usd_low"] <= d["cost_to_train_usd"] <= d["cost_to_train_usd_high"]
    assert d["time_to_train_s_high"] / d["time_to_train_s"] == pytest.approx(d["step_time_s_high"] / d["step_time_s"])
    assert r.time_to_train_s == pytest.approx(r.time_to_train_ideal_s / r.goodput)
    assert 0.9 < r.goodput < 1
    assert r.energy_kwh == pytest.approx(r.power.facility_w * r.time_to_train_s / 3.6e6)
    b = r.cost_breakdown
    assert r.cost_to_train_usd == pytest.approx(b["depreciation_usd"] + b["energy_usd"] + b["facility_usd"])
    assert b["depreciation_usd"] == pytest.approx(r.capex_usd * r.time_to_train_s / r.amortization_s)
    assert r.cloud_cost_usd == pytest.approx(1024 * r.time_to_train_s / 3600 * 2.70)
    assert r.capex_usd == pytest.approx(r.bom.total_usd())
    assert r.power.facility_w == pytest.approx(r.power.it_w * 1.25)


def test_tco_scales_with_tokens_and_pricing():
    c = cluster("a100-80gb")
    m = load_model("gpt3-175b")
    s = parse_strategy(GPT3, num_gpus=1024)
    plan = choose_plan(m, c, strategy=s)
    one = compute_tco(m, c, plan=plan, options=TcoOptions(tokens=1e11, include_failures=False))
    two = compute_tco(m, c, plan=plan, options=TcoOptions(tokens=2e11, include_failures=False))
    assert one.goodput == 1.0
    assert two.time_to_train_s == pytest.approx(2 * one.time_to_train_s)
    assert two.cost_to_train_usd == pytest.approx(2 * one.cost_to_train_usd)
    cloud = compute_tco(m, c, plan=plan, options=TcoOptions(tokens=1e11, pricing="cloud", include_failures=False))
    assert cloud.cost_to_train_usd == pytest.approx(one.cloud_cost_usd)


def test_unpriced_gpu_asks_for_a_price():
    m = load_model("llama3-8b")
    c = cluster("mi250x-128gb", n=64)
    s = parse_strategy("tp=1,pp=1,mbs=1,gbs=64,zero=1", num_gpus=64)
    with pytest.raises(InputError, match="gpu-price-usd"):
        compute_tco(m, c, strategy=s)
    r = compute_tco(m, c, strategy=s, options=TcoOptions(gpu_price_usd=12000))
    assert r.bom.total_usd("gpu") == pytest.approx(64 * 12000)
    assert any("default assumption" in w for w in r.warnings)


def test_quick_space_returns_a_fitting_plan():
    chosen = choose_plan(load_model("llama3-8b"), cluster(n=64), quick=True)
    assert chosen.result.fits_memory and chosen.source == "planner.plans.recommend (quick space)"
    assert chosen.strategy.num_gpus == 64 and chosen.strategy.tp in (1, 2, 4, 8) and chosen.strategy.mbs == 1


def test_given_strategy_wins():
    s = parse_strategy("tp=2,pp=1,mbs=1,gbs=256,zero=1", num_gpus=64)
    chosen = choose_plan(load_model("llama3-8b"), cluster(n=64), strategy=s)
    assert chosen.source == "given" and chosen.strategy == s


def run(argv, capsys):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_cli_tco_json_interface_keys(capsys):
    code, out, err = run(["tco", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "1024",
                          "--strategy", GPT3, "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    for k in ("time_to_train_s", "cost_to_train_usd", "energy_kwh", "capex_usd", "network_capex_usd", "power_w"):
        assert isinstance(d[k], float) and d[k] > 0, k
    assert d["network_capex_usd"] < d["capex_usd"]
    assert d["input_pipeline"]["data_bound"] is False


def test_cli_tco_readable(capsys):
    code, out, _ = run(["tco", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "64",
                        "--strategy", "tp=1,pp=1,mbs=1,gbs=512,zero=1", "--tokens", "1e11"], capsys)
    assert code == 0
    assert "time to train" in out and "capex" in out and "switch" in out


@pytest.mark.parametrize("argv,needle", [
    (["--pue", "0.5"], "pue"),
    (["--tokens", "-1"], "tokens"),
    (["--tokens", "nan"], "tokens"),
    (["--storage", "floppy"], "storage"),
    (["--usd-per-kwh", "inf"], "usd-per-kwh"),
])
def test_cli_tco_bad_input_is_one_line(capsys, argv, needle):
    code, _, err = run(["tco", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "64",
                        "--strategy", "tp=1,pp=1,mbs=1,gbs=512,zero=1"] + argv, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err
