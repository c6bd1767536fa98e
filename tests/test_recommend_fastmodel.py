"""The fast vectorised model equals ``simulate_analytic`` / ``memory_breakdown``, and the search's
pruning keeps exactly the plans that are feasible and fit (two implementations checking each
other)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.plans.recommend import Settings
from planner.plans.search import SearchSpace, divisors, search
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.base.errors import InputError
from sim.cost.memory import plan_memory
from sim.cost.plan import Plan
from sim.data.hardware import Cluster
from sim.data.specs import Strategy
from tests.conftest import cluster as shared_cluster

REL = 1e-9  # the fast path sums n identical layers as n*x: ~1e-15 apart


def cluster(gpu: str, n: int, *, gpn: int = 8, domain: int | None = None) -> Cluster:
    return shared_cluster(gpu, n, gpn=gpn, domain=domain)


def _frameworks() -> list[str | None]:
    try:
        from sim.cost.framework import list_frameworks
    except ImportError:
        return [None]
    ids = [f.id for f in list_frameworks()]
    return [None] + [f for f in ("torchtitan", "megatron-lm-2021", "megatron-deepspeed") if f in ids]


CASES = [
    # model, gpu, num_gpus, gbs, seq_len, space
    ("gpt3-175b", "a100-80gb", 64, 64, 2048, SearchSpace()),
    ("llama3-8b", "h100-80gb", 32, 64, 8192, SearchSpace(max_mbs=4)),
    ("mixtral-8x7b", "h100-80gb", 64, 128, 4096, SearchSpace(max_mbs=4, max_vp=4)),
    ("deepseek-v3", "h200-141gb", 128, 256, 4096, SearchSpace(tp=(1, 2, 8), cp=(1,), ep=(4, 8, 32), mbs=(1, 2),
                                                               max_vp=2)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("framework", _frameworks())
def test_fast_model_equals_simulate_analytic(case, framework):
    model_id, gpu, n, gbs, seq, space = case
    model, cl = get_model(model_id), cluster(gpu, n)
    st = Settings.from_framework(framework)
    r = search(model, cl, gbs=gbs, seq_len=seq, space=space, plan_kwargs=st.kwargs, dp_overlap=st.dp_overlap)
    assert r.evaluated > 100
    rng = np.random.default_rng(hash((model_id, framework)) % 2**32)
    best = int(np.argmin(r.candidates.step_time_s))
    sample = {best, *rng.choice(r.evaluated, size=min(25, r.evaluated), replace=False).tolist()}
    for i in sample:
        s = r.strategy(int(i))
        res = simulate_analytic(r.fastmodel.plan(s), net=r.fastmodel.net)
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=REL), s.to_string()
        assert r.candidates.memory_device_bytes[i] == pytest.approx(res.memory_device_bytes, rel=REL), s.to_string()
        assert res.fits_memory


def _brute_force(model, cl, gbs, seq, space: SearchSpace) -> tuple[set[str], int]:
    """Every combination of the space, checked the slow way: Strategy + Plan + plan_memory.
    Offload modes pair with the ZeRO stages they run with (optimizer 1-3, params 3; without data
    parallelism the lowest one); an offload plan whose twin without offload fits is considered
    but not kept (it cannot be faster)."""
    n = cl.num_gpus
    fits, total = set(), 0
    mbs_all = [1 << k for k in range(space.max_mbs.bit_length()) if 1 << k <= space.max_mbs]

    def entries(dpcp: int) -> list[tuple[int, str]]:
        out = []
        for off in space.offload:
            need = 3 if off.startswith("params") else (1 if off.startswith("optimizer") else 0)
            zs = [z for z in sorted(space.zero) if z >= need and (need < 3 or z == 3)]
            if off == "none" and dpcp == 1:
                zs = [min(space.zero)]
            out += [(z, off) for z in (zs[:1] if dpcp == 1 else zs)]
        return out

    for tp in [t for t in divisors(n) if t <= space.max_tp]:
        for cp in [c for c in divisors(n // tp) if c <= space.max_cp]:
            for pp in [p for p in divisors(n // (tp * cp)) if p <= model.num_layers]:
                dp = n // (tp * cp * pp)
                pipes = [(1, "1f1b")] if pp == 1 else \
                    [(1, "1f1b"), (1, "gpipe"), (1, "zero-bubble")] + \
                    [(v, sch) for v in range(2, space.max_vp + 1) for sch in ("interleaved", "zero-bubble")]
                for mbs in mbs_all:
                    for vp, sched in pipes:
                        for sp in ((False, True) if tp > 1 else (False,)):
                            for rc in space.recompute:
                                for z, off in entries(dp * cp):
                                    total += 1
                                    try:
                                        s = Strategy(tp=tp, cp=cp, pp=pp, dp=dp, vp=vp, mbs=mbs, gbs=gbs, seq_len=seq,
                                                     zero=z, sp=sp, recompute=rc, schedule=sched, offload=off)
                                        plan = Plan(model=model, cluster=cl, strategy=s).checked()
                                    except InputError:
                                        continue
                                    if off != "none":
                                        twin = s.with_(offload="none", zero=z if dp * cp > 1 else min(space.zero))
                                        if plan_memory(replace(plan, strategy=twin)).fits:
                                            continue
                                    if plan_memory(plan).fits:
                                        fits.add(s.to_string())
    return fits, total


def test_pruning_keeps_exactly_the_feasible_plans_that_fit():
    model, cl = get_model("gpt-7.5b"), cluster("a100-40gb", 16)
    space = SearchSpace(max_tp=8, max_cp=2, max_mbs=2, max_vp=2, zero=(0, 3), recompute=("none", "full"),
                        precision=("bf16",), offload=("none", "optimizer", "params", "activations"),
                        recompute_layers=(), offload_layers=())  # partial keys: their own tests
    r = search(model, cl, gbs=24, seq_len=2048, space=space)
    found = {r.strategy(i).to_string() for i in range(r.evaluated)}
    expected, total = _brute_force(model, cl, 24, 2048, space)
    assert r.considered == total
    assert r.evaluated + sum(r.rejected.values()) == r.considered
    assert r.rejected["oom"] > 0 and r.rejected["batch"] > 0 and r.rejected["offload_unneeded"] > 0
    assert any("offload=" in f for f in found)  # offload rescues some plans that do not fit without it
    assert len(found) > 50
    assert found == expected


def test_search_offers_partial_activation_offload_priced_as_simulate():
    """Megatron-Core's --cpu-offloading-num-layers N (Strategy.offload_num_layers): searched next to
    every activation-offload entry, only without pipelining and recomputation (its
    TransformerConfig refuses both); each plan priced as simulate prices it (the host link moves N
    of the stage's layers), and the profiles without it (framework_space) never get it."""
    from planner.plans.recommend import framework_space
    from sim.cost.costs import offload_report
    from sim.engines.run import RunChoices, resolve

    model, cl = get_model("llama3-8b"), cluster("h100-80gb", 8)
    st = Settings.from_framework("megatron-core")
    space = SearchSpace(pp=(1, 2), cp=(1,), mbs=(1, 2, 4), zero=(1,), recompute=("none", "full"),
                        offload=("none", "activations"), precision=("bf16",), schedule=("1f1b",))
    r = search(model, cl, gbs=64, seq_len=8192, space=framework_space(space, "megatron-core", cl),
               plan_kwargs=st.kwargs, dp_overlap=st.dp_overlap)
    assert r.evaluated + sum(r.rejected.values()) == r.considered and r.rejected["framework"] > 0
    partial = [i for i in range(r.evaluated) if r.strategy(i).offload_num_layers is not None]
    assert len({r.strategy(i).offload_num_layers for i in partial}) >= 2
    full_offload = {r.strategy(i).with_(offload_num_layers=None).to_string() for i in partial}
    for i in partial:
        s = r.strategy(i)
        assert s.pp == 1 and s.recompute == "none" and s.offload_num_layers < model.num_layers
        run = resolve(model, cl, s.to_string(), RunChoices(framework="megatron-core"))  # the profile runs it
        res = simulate_analytic(r.fastmodel.plan(s), net=r.fastmodel.net)
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=REL), s.to_string()
        assert r.candidates.memory_device_bytes[i] == pytest.approx(res.memory_device_bytes, rel=REL)
        assert run.plan.strategy.offload_num_layers == s.offload_num_layers
        whole = simulate_analytic(r.fastmodel.plan(s.with_(offload_num_layers=None)), net=r.fastmodel.net)
        assert res.memory_device_bytes > whole.memory_device_bytes  # fewer layers leave the GPU
        assert res.breakdown.exposed_offload_s <= whole.breakdown.exposed_offload_s
        moved, moved_all = (offload_report(r.fastmodel.plan(x))["d2h_bytes_per_step"]
                            for x in (s, s.with_(offload_num_layers=None)))
        assert moved == pytest.approx(moved_all * s.offload_num_layers / model.num_layers, rel=1e-12)
    assert full_offload  # the same plans offloading every layer were searched too
    for fw in ("megatron-deepspeed", "torchtitan"):
        assert framework_space(SearchSpace(), fw, cl).offload_layers == ()
    with pytest.raises(InputError):  # a profile without it refuses it by name
        resolve(model, cl, "tp=2,dp=4,mbs=1,gbs=64,seq=8192,zero=1,offload=activations,offload_num_layers=8",
                RunChoices(framework="megatron-deepspeed"))
    for bad in ("pp=2,dp=4,tp=1,recompute=none", "tp=2,dp=4,recompute=full"):
        with pytest.raises(InputError):
            resolve(model, cl, f"{bad},mbs=1,gbs=64,seq=8192,zero=1,offload=activations,offload_num_layers=8",
                    RunChoices(framework="megatron-core"))


def test_restricted_space_only_yields_allowed_values():
    model, cl = get_model("llama3-8b"), cluster("h100-80gb", 32)
    space = SearchSpace(tp=(2, 4), pp=(1, 2), cp=(1,), mbs=(1,), zero=(1,), recompute=("selective",),
                        schedule=("1f1b",), precision=("bf16",))
    r = search(model, cl, gbs=64, seq_len=4096, space=space)
    assert r.evaluated > 0
    for i in range(r.evaluated):
        s = r.strategy(i)
        assert s.tp in (2, 4) and s.pp in (1, 2) and s.cp == 1 and s.mbs == 1
        assert s.zero == 1 and s.recompute == "selective" and s.schedule == "1f1b" and s.vp == 1


def test_space_validates_its_values():
    for bad in ({"tp": (0,)}, {"zero": (4,)}, {"recompute": ("some",)}, {"schedule": ("dualpipe",)},
                {"precision": ("fp4",)}, {"max_mbs": 0}, {"mbs": ()}):
        with pytest.raises(InputError):
            SearchSpace(**bad)


def test_fast_model_prices_a_profiles_fp8_states_layout_like_simulate():
    """A layout for fp8 plans of its own (``fp8_state_layout``: bf16 gradients for fp8 only, as NeMo's
    DeepSeek-V3 performance script ran, planner.fitting.reference.strategy_of; Plan.states_layout_for):
    the search's memory and data-parallel bytes follow each candidate's precision exactly as
    simulate does."""
    model, cl = get_model("llama3-8b"), cluster("h100-80gb", 32)
    st = Settings.from_framework("nemo-2025h1")
    kwargs = {**st.kwargs, "state_layout": "megatron", "fp8_state_layout": "megatron_bf16_grads"}
    r = search(model, cl, gbs=64, seq_len=8192, space=SearchSpace(max_mbs=2, precision=("bf16", "fp8")),
               plan_kwargs=kwargs, dp_overlap=st.dp_overlap)
    seen = set()
    for i in range(r.evaluated):
        s = r.strategy(i)
        if s.precision in seen or s.dp < 2:
            continue
        seen.add(s.precision)
        plan = r.fastmodel.plan(s)
        res = simulate_analytic(plan, net=r.fastmodel.net)
        assert plan.model_states_layout == ("megatron_bf16_grads" if s.precision == "fp8" else "megatron")
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=REL), s.to_string()
        assert r.candidates.memory_device_bytes[i] == pytest.approx(res.memory_device_bytes, rel=REL), s.to_string()
    assert seen == {"bf16", "fp8"}
