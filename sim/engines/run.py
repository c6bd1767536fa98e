"""One resolution of a run: what every entry point prices.

``resolve(model, cluster, strategy, choices)`` turns a model, a cluster, a strategy (a STRATEGY
string or a ``Strategy``), a framework profile, a calibration profile and the user's overrides
(``--attention``, ``--recompute-policy``, ``--moe-*``, ``--nccl``) into a ``Run``:

1. the framework: the one named (``--framework``; a strategy it cannot run is refused, reason
   ``framework``), else the first profile ``searched_by_default`` (``catalogs/frameworks.yaml``:
   megatron-core, torchtitan, megatron-deepspeed) that runs the strategy; when none does, the
   first one's mechanisms price it and ``Run.notes`` says why no profile runs it;
2. the strategy completed with what that framework does where the STRATEGY string is silent:
   gradient reduction overlapped with backward or not (``dp_overlap``), its own fp8 recipe on
   this GPU (``sim.cost.framework.fp8_recipe_for``), sequence parallelism where its tensor
   parallelism always shards the sequence (torchtitan), its way of data parallelism where it
   has only one (``dp_impl``: TensorFlow's parameter servers).  A ``Strategy`` object is taken as it
   is (the search builds complete ones);
3. the ``Plan``: the profile's mechanisms (``sim.cost.framework.apply_framework``), then the user's
   overrides;
4. a calibration profile (``sim.cost.calibration``): the measured device each rank sees, measured
   links and host rates (the node's one host, ``sim.cost.offload.host_spec``), the fitted kernel
   efficiencies and network efficiencies.

``planner simulate``, ``planner tco --strategy``, the plans ``planner recommend`` shows, the
app's evaluation and the ``planner simulate`` line it prints all price ``resolve``'s plan, so the
same design gives the same step time and memory everywhere (``tests/test_run.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from sim.cost.calibration import Calibration, load_calibration
from sim.layers.compute import KernelEfficiency, default_efficiency
from sim.cost.framework import (Framework, apply_framework, check_attention, check_supported, default_frameworks_for,
                                 fp8_recipe_for, get_framework)
from sim.net.netefficiency import network_kwargs
from sim.net.network import Network
from sim.cost.plan import Plan, parse_strategy
from sim.data.psspecs import ParameterServers
from sim.data.hardware import Cluster
from sim.data.specs import Model, Strategy

_ALIASES = {"seq": "seq_len", "micro_batch": "mbs", "global_batch": "gbs", "zero_stage": "zero",
            "sequence_parallel": "sp", "interleave": "vp", "fsdp": "zero"}


@dataclass(frozen=True, kw_only=True, slots=True)
class RunChoices:
    """What the user chose besides model, cluster and strategy; ``None`` = the framework's.

    ``framework`` None picks the first default profile that runs the strategy (module
    docstring); ``calibration`` is a profile file or name (``sim.cost.calibration``)."""

    framework: str | None = None
    calibration: str | None = None
    attention: str | None = None
    selective_policy: str | None = None
    moe_imbalance: float | None = None
    moe_dispatcher: str | None = None
    nccl: str | None = None  # the NCCL release (Plan.nccl): its NVLS buffers and their scope
    parameter_servers: ParameterServers | None = None  # dp_impl=parameter-server: where the PS tasks run

    def overrides(self) -> dict[str, object]:
        """The ``Plan`` fields the user set over the profile's."""
        out: dict[str, object] = {}
        for key, name in (("attention", "attention"), ("selective_policy", "selective_policy"),
                          ("moe_imbalance", "moe_imbalance"), ("moe_dispatcher", "moe_dispatcher"),
                          ("nccl", "nccl"), ("parameter_servers", "parameter_servers")):
            v = getattr(self, key)
            if v is not None:
                out[name] = v
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """A resolved run (module docstring): the plan to price, the framework that runs it, the
    kernel efficiencies and network settings to price it with, and the calibration used."""

    plan: Plan
    framework: Framework
    choices: RunChoices
    eff: KernelEfficiency
    net_kwargs: Mapping[str, object]
    calibration: Calibration | None = None
    runnable: bool = True  # False: no profile runs the strategy (``notes`` says why)
    notes: tuple[str, ...] = ()

    def network(self) -> Network:
        return Network(self.plan.cluster, **self.net_kwargs)  # type: ignore[arg-type]

    def flags(self) -> list[str]:
        """The ``planner simulate`` flags that resolve the same run (framework, calibration,
        overrides); without a runnable framework the framework is left to ``resolve``."""
        out: list[str] = ["--framework", self.framework.id] if self.runnable else []
        c = self.choices
        for flag, v in (("--calibration", c.calibration), ("--attention", c.attention),
                        ("--recompute-policy", c.selective_policy), ("--moe-imbalance", c.moe_imbalance),
                        ("--moe-dispatcher", c.moe_dispatcher), ("--nccl", c.nccl)):
            if v is not None:
                out += [flag, f"{v:g}" if isinstance(v, float) else str(v)]
        return out


def given_keys(text: str) -> frozenset[str]:
    """The strategy keys a STRATEGY string sets (aliases folded), e.g. ``{"tp", "mbs"}``."""
    keys = set()
    for part in str(text).split(","):
        key = part.partition("=")[0].strip().lower()
        if key:
            keys.add(_ALIASES.get(key, key))
    return frozenset(keys)


def complete_strategy(s: Strategy, fw: Framework, cluster: Cluster, given: frozenset[str]) -> Strategy:
    """``s`` with what ``fw`` does where the STRATEGY string (keys ``given``) is silent."""
    changes: dict[str, object] = {}
    if "dp_overlap" not in given:
        changes["dp_overlap"] = fw.dp_overlap
    if s.precision == "fp8" and "fp8_recipe" not in given:
        recipe = fp8_recipe_for(fw, cluster.gpu.architecture)
        if recipe is not None:
            changes["fp8_recipe"] = recipe
    if fw.capabilities.sp_with_tp and s.tp > 1 and "sp" not in given:
        changes["sp"] = True
    if fw.dp_impl != "ddp" and "dp_impl" not in given:  # TensorFlow's parameter servers: its only way
        changes["dp_impl"] = fw.dp_impl
    return replace(s, **changes) if changes else s


def plan_kwargs(fw: Framework, choices: RunChoices) -> dict[str, object]:
    """The ``Plan`` fields of ``fw``'s mechanisms with the user's overrides."""
    return {**apply_framework({}, fw), **choices.overrides()}


def _pick(s: Strategy, cluster: Cluster, given: frozenset[str] | None,
          attention: str | None = None) -> tuple[Framework, Strategy, tuple[str, ...]]:
    """The first default profile that runs ``s`` (completed its way) and launches the
    ``attention`` kernel asked for, or the first profile with the reasons none does."""
    why = []
    profiles = default_frameworks_for(attention)
    for fw in profiles:
        cand = s if given is None else complete_strategy(s, fw, cluster, given)
        refusal = fw.capabilities.refusal(cand)
        if refusal is None:
            return fw, cand, ()
        key, value, message = refusal
        why.append(f"{fw.id}: {key}={value} {message}")
    fw = profiles[0]
    cand = s if given is None else complete_strategy(s, fw, cluster, given)
    return fw, cand, (f"no framework profile runs this strategy ({'; '.join(why)}): priced with {fw.id}'s "
                      "mechanisms; name one with --framework to see what it runs",)


def resolve(model: Model, cluster: Cluster, strategy: Strategy | str, choices: RunChoices | None = None, *,
            seq_len: int | None = None, given: frozenset[str] | None = None) -> Run:
    """The run every entry point prices (module docstring).  ``strategy`` as a STRATEGY string
    is parsed (``dp`` derived from the GPU count, ``seq_len`` unless it sets ``seq``) and
    completed by the framework; a ``Strategy`` is taken as it is unless ``given`` names the
    keys its string set.  Raises ``InputError`` for bad input and ``InfeasibleError`` for a
    strategy the named framework (or no GPU) can run."""
    choices = choices or RunChoices()
    if isinstance(strategy, str):
        given = given_keys(strategy)
        strategy = parse_strategy(strategy, num_gpus=cluster.num_gpus, seq_len=seq_len)
    notes: tuple[str, ...] = ()
    runnable = True
    if choices.framework is not None:
        fw = get_framework(choices.framework)
        check_attention(fw, choices.attention)
        s = strategy if given is None else complete_strategy(strategy, fw, cluster, given)
        check_supported(fw, s)
    else:
        fw, s, notes = _pick(strategy, cluster, given, choices.attention)
        runnable = not notes
    plan, eff, net_kw, cal = calibrated(Plan(model=model, cluster=cluster, strategy=s,
                                             **plan_kwargs(fw, choices)).checked(), choices.calibration)
    if cal is not None:  # the profile's device and links: checked again (e.g. fp8 tensor cores)
        plan = plan.checked()
    return Run(plan=plan, framework=fw, choices=replace(choices, framework=fw.id if runnable else choices.framework),
               eff=eff, net_kwargs=net_kw, calibration=cal, runnable=runnable, notes=notes)


def calibrated(plan: Plan, calibration: str | None
               ) -> tuple[Plan, KernelEfficiency, dict[str, object], Calibration | None]:
    """(``plan`` on the profile's measured device, links and host; the kernel efficiencies; the
    network settings; the profile): with no calibration the catalog's efficiencies and the fitted
    network efficiency of the GPU's NVLink generation."""
    eff = default_efficiency()
    cal = None
    net_kw: dict[str, object] = {}
    if calibration is not None:
        cal = load_calibration(calibration)
        eff = cal.apply_efficiency(eff)
        plan = cal.apply_plan(plan)
        net_kw = cal.network_kwargs(plan.cluster)
    if not net_kw:
        net_kw = network_kwargs(plan.cluster.gpu.nvlink_generation)
    return plan, eff, net_kw, cal
