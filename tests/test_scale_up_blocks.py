"""Jobs on NVLink domains larger than a node (GB200 NVL72) take GPUs in blocks (issue 14)."""

import pytest

from sim.net.clusters import cluster_from_catalog
from sim.data.models import load_model
from sim.cost.plan import Plan, parse_strategy
from sim.engines.simulate import simulate


@pytest.mark.parametrize("num_gpus,block", [(128, 64), (256, 64), (2496, 64), (144, 72), (576, 72), (60, 72),
                                            (72, 72), (8, 72)])
def test_block_is_the_largest_node_multiple_dividing_the_job(num_gpus, block):
    c = cluster_from_catalog("gb200-186gb", num_gpus)
    assert c.scale_up_block == block
    assert c.domain_size == min(block, num_gpus)
    assert cluster_from_catalog("gb200-186gb", num_gpus, placement="packed").scale_up_block == 72
    assert c.num_gpus % c.scale_up_block == 0 or c.num_gpus < c.nvlink_domain


def test_one_node_domains_are_unchanged():
    c = cluster_from_catalog("h100-80gb", 1024)
    assert c.scale_up_block == 8 and cluster_from_catalog("h100-80gb", 1024, placement="packed").scale_up_block == 8


@pytest.mark.parametrize("strategy", ["tp=1,pp=1,ep=64,mbs=1,gbs=512,zero=1,recompute=full",
                                      "tp=4,pp=1,ep=16,mbs=1,gbs=512,zero=1,sp=1,recompute=full",
                                      "tp=8,pp=4,mbs=1,gbs=512,zero=1,sp=1,recompute=full"])
def test_block_placement_is_never_slower_than_packed(strategy):
    """Property: keeping equal groups inside NVLink domains never costs time."""
    model = load_model("deepseek-v3") if "ep" in strategy else load_model("llama3-70b")
    for n in (128, 256):
        times = {}
        for placement in ("block", "packed"):
            cl = cluster_from_catalog("gb200-186gb", n, placement=placement)
            s = parse_strategy(strategy, num_gpus=n, seq_len=4096)
            times[placement] = simulate(Plan(model=model, cluster=cl, strategy=s)).step_time_s
        assert times["block"] <= times["packed"] * (1 + 1e-9), (strategy, n, times)


def test_straddling_groups_are_named_in_the_warnings():
    model = load_model("deepseek-v3")
    s = parse_strategy("tp=1,pp=1,ep=64,mbs=1,gbs=512,zero=1,recompute=full", num_gpus=256, seq_len=4096)
    packed = simulate(Plan(model=model, cluster=cluster_from_catalog("gb200-186gb", 256, placement="packed"),
                           strategy=s))
    assert any("ep=64 groups span 2 NVLink domains" in w for w in packed.warnings)
    block = simulate(Plan(model=model, cluster=cluster_from_catalog("gb200-186gb", 256), strategy=s))
    assert not any("NVLink domains" in w for w in block.warnings)
    wide = parse_strategy("tp=1,pp=1,ep=128,mbs=1,gbs=512,zero=1,recompute=full", num_gpus=256, seq_len=4096)
    w = simulate(Plan(model=model, cluster=cluster_from_catalog("gb200-186gb", 256), strategy=wide)).warnings
    assert any("ep=128 groups span 2 NVLink domains (128 > 64 GPUs per domain)" in x for x in w)


def test_bad_placement_is_one_line_error():
    from sim.base.errors import InputError

    with pytest.raises(InputError) as e:
        cluster_from_catalog("gb200-186gb", 128, placement="scattered")
    assert "placement" in str(e.value)
