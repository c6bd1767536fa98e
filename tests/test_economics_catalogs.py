"""The economics catalogs: every record sourced, every id covered, Llama 3 counts reproduced."""

import math

import pytest

from sim.data.catalog import list_gpus, list_links
from sim.base.errors import InputError

from planner.economics.failures import load_failure_model, rates_for_units
from planner.economics.prices import load_prices
from sim.data.catalog import catalog_file_records as load_records
from planner.economics.storage import load_storage


@pytest.mark.parametrize("name", ["prices.yaml", "failures.yaml", "storage.yaml"])
def test_every_record_has_a_source(name):
    for rec in load_records(name):
        assert rec["source"].strip(), rec["id"]


def test_every_nic_has_a_switch_an_adapter_and_links():
    pb = load_prices()
    for nic in list_links("nic"):
        sw = pb.switch_for(nic)
        assert sw.price_usd > 0 and sw.radix >= 2
        assert pb.adapter_for(nic).price_usd > 0
        for media in ("dac", "optical"):
            assert pb.link_for(nic.bytes_per_s_per_direction, media).price_usd_per_link > 0


# No public or estimated purchase price (each record's price_source says so): GB300, MI250X and
# the PCIe data-center cards of the issue-15 research pass.
UNPRICED = {"gb300-288gb", "mi250x-128gb", "l4-24gb", "l40s-48gb", "a100-pcie-80gb", "h100-pcie-80gb",
            "h100-nvl-94gb", "mi210-64gb"}


def test_every_gpu_has_a_server_and_most_have_prices():
    pb = load_prices()
    for gpu in list_gpus():
        assert pb.server_for(gpu).host_power_w_per_node > 0
        assert (pb.gpu_price(gpu) is None) == (gpu.id in UNPRICED), gpu.id
    assert len(UNPRICED) <= len(list_gpus()) // 3


def test_link_rate_above_every_record_is_an_error():
    with pytest.raises(InputError, match="link"):
        load_prices().link_for(10e12, "optical")


def test_llama3_table5_counts_are_reproduced():
    """Llama 3 Team 2024, Table 5: 419 unexpected interruptions in 54 days on 16,384 H100."""
    fm = load_failure_model()
    assert sum(c.count for c in fm.components) == 419
    assert fm.component("gpu").count == 148 + 72 + 19 + 17 + 6 + 6
    rates = rates_for_units({"gpu": 16384, "node": 2048, "nic": 16384, "cable": 49152}, fm)
    assert rates.total_per_s * 54 * 86400 == pytest.approx(419, rel=1e-12)
    assert rates.mtbf_s == pytest.approx(54 * 86400 / 419, rel=1e-12)  # ~3.1 h, "one failure every three hours"
    assert rates.node_loss_fraction == pytest.approx((268 + 46 + 7) / 419)


def test_failure_units_scale_linearly():
    fm = load_failure_model()
    a = rates_for_units({"gpu": 1024, "node": 128, "nic": 1024, "cable": 2048}, fm)
    b = rates_for_units({"gpu": 2048, "node": 256, "nic": 2048, "cable": 4096}, fm)
    assert b.mtbf_s == pytest.approx(a.mtbf_s / 2)


def test_storage_tiers_and_aliases():
    cat = load_storage()
    ids = {t.id for t in cat.tiers}
    assert {"nvme-local", "lustre-ddn", "s3", "gcs", "hdfs", "tectonic"} <= ids
    assert cat.get("lustre").id == "lustre-ddn" and cat.get("S3").id == "s3"
    with pytest.raises(InputError, match="storage"):
        cat.get("floppy")
    for t in cat.tiers:
        for write in (True, False):
            assert 0 < t.bytes_per_s(1, write=write) < math.inf
    assert cat.weight_bytes_per_param + cat.optimizer_bytes_per_param == 14  # ZeRO, K = 12 (+2 bf16 weights)


def test_storage_rate_is_min_of_aggregate_and_per_node():
    t = load_storage().get("lustre-ddn")
    assert t.bytes_per_s(1, write=True) == pytest.approx(50e9)
    assert t.bytes_per_s(1000, write=True) == pytest.approx(520e9)


def test_power_model_and_finance_are_sane():
    pb = load_prices()
    assert 1.0 <= pb.power.pue <= 2.0
    assert 0 < pb.power.gpu_idle_fraction_of_tdp < 0.5
    assert 0.02 < pb.usd_per_kwh < 0.5
    assert pb.amortization_s == pytest.approx(5 * 365.25 * 86400)
