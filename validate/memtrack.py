"""Ground truth for the memory model: PyTorch's own per-category accounting of one rank.

``track(plan)`` builds the plan's most loaded rank (or ``stage``) with ``validate.titan`` under
``FakeTensorMode`` on a fake process group, runs a warm-up step (so the optimizer states
exist, as in every step after the first), then one tracked step: the micro-batches the stage
holds at its peak (1F1B: ``sim.cost.memory.inflight_microbatches``) forward, their backwards in
order, the remaining micro-batches of gradient accumulation, and the optimizer step.
``torch.distributed._tools.mem_tracker.MemTracker`` (``FSDPMemTracker`` with FSDP2) sees
every tensor the dispatcher creates and reports the composition at the peak, which is
mapped onto the planner's categories (``CATEGORIES``):

* ``weights``: parameters and buffers (FSDP2: sharded + unsharded parameters);
* ``gradients``: parameter gradients (FSDP2: sharded + unsharded);
* ``optimizer``: the optimizer's states;
* ``activations``: tensors created in forward (saved for backward, recomputed in backward);
* ``temporaries``: tensors created in backward (activation gradients, loss gradients), the
  FSDP2 all-gather and reduce-scatter buffers, and what the optimizer step allocates.

The optimizer is AdamW as torchtitan runs it (``fused``: one kernel per parameter group, no
temporaries), applied to the local shards (``LocalFusedAdamW``: the fused kernel on a DTensor
under ``FakeTensorMode`` keeps phantom temporaries alive in torch 2.13).  Pipeline stages take
their input as a received activation of the right shape (no send/receive buffers are
counted; the planner counts none either).  With FSDP2 and pipelining, the schedule's gradient
handling is the one ``torch.distributed.pipelining`` applies (stage.py:
``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)`` until the last
micro-batch).
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from sim.cost.memory import inflight_microbatches
from sim.cost.plan import Plan

from validate.patching import replaced
from validate.titan import Stage, apply_ac, apply_fsdp, apply_tp, stage_of

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporaries")

_MAP = {
    "PARAM": "weights", "BUFFER": "weights", "SHARDED_PARAM": "weights", "UNSHARDED_PARAM": "weights",
    "GRAD": "gradients", "SHARDED_GRAD": "gradients", "UNSHARDED_GRAD": "gradients",
    "OPT": "optimizer", "ACT": "activations", "INP": "activations", "OTH": "activations",
    "TEMP": "temporaries", "ALL_GATHER": "temporaries", "REDUCE_SCATTER": "temporaries",
}


class LocalFusedAdamW(torch.optim.Optimizer):
    """AdamW with the fused kernel (``torch._fused_adamw_``) on each parameter's local tensor.
    ``zero_engine_step``: first allocate what DeepSpeed's ZeRO engine allocates at its step, the
    flattened 16-bit gradient partition and its fp32 copy (stage3.py
    ``_prepare_fp32_grad_for_sub_group``), the copy held through the update."""

    def __init__(self, params, lr: float = 1e-4, *, zero_engine_step: bool = False) -> None:
        super().__init__(params, {"lr": lr})
        self.zero_engine_step = zero_engine_step

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        fp32_grad = None
        if self.zero_engine_step:
            n = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                    for g in self.param_groups for p in g["params"])
            flat = torch.empty(n, dtype=torch.bfloat16)
            fp32_grad = flat.float()
            del flat
        self._update()
        del fp32_grad
        return None

    def _update(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                local = p.to_local() if hasattr(p, "to_local") else p
                grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                st = self.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(local)
                    st["exp_avg_sq"] = torch.zeros_like(local)
                    st["step"] = torch.zeros((), dtype=torch.float32)
                torch._fused_adamw_([local], [grad], [st["exp_avg"]], [st["exp_avg_sq"]], [], [st["step"]],
                                    lr=group["lr"], beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False,
                                    maximize=False)


class _Groups:
    """A module's FSDP2 parameter groups presented as one, for FSDPMemTracker (torch 2.13
    fsdp2_mem_tracker.py), which reads ``FSDPState._fsdp_param_group`` (one group per module; the
    property raises for the two groups of a per-parameter mesh, torchtitan's MoE blocks since
    18a46d4).  ``fsdp_params`` is every group's; the tracker's wrapper of ``pre_backward`` /
    ``post_backward`` goes on the first group around a call of every group's own (post-backward
    last group first, as FSDP's final callback orders them: the last group gates the held
    reduce-scatter inputs' release), the other groups' own calls become no-ops, and restoring
    gives each group its own back."""

    _HOOKS = ("pre_backward", "post_backward")

    def __init__(self, groups) -> None:  # noqa: ANN001
        object.__setattr__(self, "_groups", list(groups))

    @property
    def fsdp_params(self) -> list:
        return [p for g in self._groups for p in g.fsdp_params]

    def __getattr__(self, name: str):  # noqa: ANN204
        if name in self._HOOKS:
            own = [getattr(g, name) for g in self._groups]
            order = own[::-1] if name == "post_backward" else own

            def call_all(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                for fn in order:
                    fn(*args, **kwargs)

            call_all.own = own  # type: ignore[attr-defined]
            return call_all
        return getattr(self._groups[0], name)

    def __setattr__(self, name: str, value) -> None:  # noqa: ANN001
        if name not in self._HOOKS:
            setattr(self._groups[0], name, value)
            return
        own = getattr(value, "own", None)
        if own is not None:  # restoring: each group its own
            for g, fn in zip(self._groups, own):
                setattr(g, name, fn)
            return
        setattr(self._groups[0], name, value)
        for g in self._groups[1:]:
            setattr(g, name, lambda *args, **kwargs: None)


@contextmanager
def _param_groups_as_one():
    """``FSDPState._fsdp_param_group`` returns the groups as one (``_Groups``) where a module has
    several, while the tracker runs."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    original = FSDPState.__dict__["_fsdp_param_group"]

    def one(self):  # noqa: ANN001, ANN202
        groups = self._fsdp_param_groups
        if len(groups) > 1:
            return _Groups(groups)
        return original.fget(self)

    with replaced(FSDPState, "_fsdp_param_group", property(one)):
        yield


def _tracker_class(fsdp: bool, events: list | None = None):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
    from torch.distributed._tools.mem_tracker import MemTracker, _UpdateType

    base = FSDPMemTracker if fsdp else MemTracker

    class Tracker(base):  # type: ignore[misc, valid-type]
        """The tracker with what the optimizer step allocates counted as temporaries (its states
        exist from the warm-up step on and keep their category); with ``events``, every storage
        it sees created, resized and freed is appended in order (``validate.allocator``'s
        trace: ``("alloc" | "free", handle, bytes)``)."""

        def _track(self, reftype, t):  # noqa: ANN001
            if self._in_opt:
                reftype = type(reftype)("Temp")
            return super()._track(reftype, t)

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):  # noqa: ANN001
            if events is not None and u_type != _UpdateType.REF:
                h = id(winfo)
                if u_type in (_UpdateType.DEL, _UpdateType.SIZE):
                    events.append(("free", h, 0))
                if u_type in (_UpdateType.ADD, _UpdateType.SIZE) and winfo.mem_consumed > 0:
                    events.append(("alloc", h, int(winfo.mem_consumed)))
            return super()._update_snap(u_type, winfo, old_mem_consumed=old_mem_consumed, old_reftype=old_reftype)

        if fsdp:
            def _fsdp_param_group_post_backward(self, fsdp_mod, orig):  # noqa: ANN001, ANN202
                """FSDPMemTracker files a unit's unsharded gradient at its post-backward, but
                with gradient sync off (pipelining: ``set_requires_gradient_sync(False)``)
                post-backward moves it into ``unsharded_accumulated_grad`` in the reduce dtype
                (_fsdp_param.py ``to_accumulated_grad_if_needed``), a tensor the tracker saw
                created in backward and files as a temporary.  It is the unit's gradient."""
                inner = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

                def post_backward(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                    inner(*args, **kwargs)
                    group = fsdp_mod._get_fsdp_state()._fsdp_param_group
                    for fsdp_param in group.fsdp_params if group else ():
                        acc = fsdp_param.unsharded_accumulated_grad
                        if acc is not None:
                            self._update_and_maybe_create_winfos(acc, _FSDPRefType.UNSHARDED_GRAD,
                                                                 update_existing=True)

                return post_backward

    return Tracker


def _ensure_world(world: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())


def heaviest_stage(plan: Plan) -> int:
    """The stage the planner predicts to peak (``sim.cost.memory``)."""
    from sim.cost.memory import plan_memory

    return plan_memory(plan).stage


def track(plan: Plan, *, stage: int | None = None, events: list | None = None, steps: int = 1,
          zero_engine_step: bool = False) -> dict[str, float]:
    """Bytes per category at the tracked step's peak on one rank of ``stage`` (default: the
    planner's heaviest stage), plus ``total`` and ``stage``.  With ``events`` (a list), the
    allocation trace of ``steps`` tracked steps is appended to it, the states that exist before
    them first; ``zero_engine_step`` adds DeepSpeed's step transients to the optimizer
    (``LocalFusedAdamW``).  The fake process group it runs in is destroyed afterwards, so a later
    gloo run in the same process starts clean."""
    try:
        return _track(plan, stage=stage, events=events, steps=steps, zero_engine_step=zero_engine_step)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _track(plan: Plan, *, stage: int | None = None, events: list | None = None, steps: int = 1,
           zero_engine_step: bool = False) -> dict[str, float]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    s, model = plan.strategy, plan.model
    if stage is None:
        stage = heaviest_stage(plan)
    if s.vp > 1 or s.schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"schedule={s.schedule} vp={s.vp}: the tracker runs 1F1B and GPipe stages")
    if s.etp is not None and s.etp != s.tp:
        raise ValueError("etp: the tracker runs experts with the attention's tensor parallelism")
    if s.zero not in (0, 2, 3):
        raise ValueError(f"zero={s.zero}: torchtitan runs FSDP2 (zero 3, or 2 = no reshard after forward) or none")
    if s.ep > 1 and s.tp > 1:
        raise ValueError("ep with tp: the tracker runs expert parallelism without tensor parallelism")
    dpcp = s.dp * s.cp
    _ensure_world(s.tp * s.pp * dpcp)
    mesh = init_device_mesh("cpu", (s.pp, dpcp, s.tp), mesh_dim_names=("pp", "dp_shard_cp", "tp"))
    ep_group, expert_mesh = None, None
    if s.ep > 1:
        emesh = init_device_mesh("cpu", (s.pp, dpcp // s.ep, s.ep), mesh_dim_names=("pp", "efsdp", "ep"))
        ep_group, expert_mesh = emesh["ep"].get_group(), emesh["efsdp"]
    layers, first, last = stage_of(model, s, stage)
    fsdp = s.zero >= 2
    tokens = s.seq_len // s.cp
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        st = Stage(model, layers, first=first, last=last, seq_len=tokens, ep=s.ep, ep_group=ep_group,
                   imbalance=plan.moe_imbalance)
    # parallelised outside the fake mode (its device-mesh bookkeeping reads real values)
    if s.tp > 1:
        apply_tp(st, mesh["tp"])
    apply_ac(st, s.recompute, num_layers=s.recompute_num_layers, method=s.recompute_method)
    if fsdp:
        apply_fsdp(st, mesh["dp_shard_cp"], pipelined=s.pp > 1 or s.zero == 2,
                   expert_mesh=expert_mesh, experts_own_unit=plan.fsdp_experts_unit == "own")
    else:
        st.autocast = True
    with fake:
        opt = LocalFusedAdamW(st.parameters(), zero_engine_step=zero_engine_step)
        k = max(1, round(inflight_microbatches(s, stage)))
        m = s.num_microbatches
        run = _Runner(st, s, first=first, last=last, tokens=tokens, fsdp=fsdp, hidden=model.hidden_size,
                      tp_mesh=mesh["tp"])
        run.step(opt, k, m)  # warm-up: optimizer states exist from here on
        tracker = _tracker_class(fsdp, events)(st, opt) if fsdp else _tracker_class(False, events)()
        if not fsdp:
            tracker.track_external(st, opt)
        run.tracker = tracker
        with _param_groups_as_one(), tracker, _sharding_propagation_off_the_books(), \
                _single_input_hooks_without_cycles():
            for _ in range(steps):
                run.step(opt, k, m)
        peak = tracker.get_tracker_snapshot("peak")
    snap = next(iter(peak.values())) if peak else {}
    out = {c: 0.0 for c in CATEGORIES}
    total = 0.0
    for key, v in snap.items():
        name = getattr(key, "name", str(key))
        if name == "Total" or key == "Total":
            total = float(v)
            continue
        out[_MAP[name]] += float(v)
    out["total"] = total or sum(out[c] for c in CATEGORIES)
    out["stage"] = float(stage)
    out["raw"] = {getattr(k, "name", str(k)): float(v) for k, v in snap.items()}  # type: ignore[assignment]
    return out


@contextmanager
def _sharding_propagation_off_the_books():
    """DTensor reads an op's output metadata by running the op once more on fake tensors of the
    *global* shape (torch/distributed/tensor/_sharding_prop.py ``_propagate_tensor_meta_non_cached``:
    "We must call the tracing in fake tensor mode so that it avoids materializing memory"; the
    loss-parallel handlers call it on every step, parallel/loss.py ``_propagate_tensor_meta``).  On
    a GPU that fake mode is a fresh one and nothing is allocated.  Under this harness it is the
    harness's own ``FakeTensorMode``, with the tracker's mode still on the stack, so the tracker
    filed those global-shape tensors as temporaries of the rank (two fp32 logits-sized tensors at
    the loss-parallel backward, whatever the tensor-parallel degree).  Run the propagation with
    the current modes disabled, as on a GPU."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.utils._python_dispatch import _disable_current_modes

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self, op_schema):  # noqa: ANN001, ANN202
        with _disable_current_modes():
            return original(self, op_schema)

    with replaced(ShardingPropagator, "_propagate_tensor_meta_non_cached", propagate):
        yield


@contextmanager
def _single_input_hooks_without_cycles():
    """ModTracker (inside MemTracker) marks a module's backward done with a multi-grad hook on the
    module's inputs that require grad, in "all" mode (torch/distributed/_tools/mod_tracker.py
    ``_fw_pre_hook``).  That mode's closure holds each input's gradient node
    (torch/autograd/graph.py ``register_multi_grad_hook``: ``grad_fns``) and is stored on that
    node (a non-leaf's hooks dict is registered with its ``grad_fn``): a cycle through C++ the
    garbage collector cannot break, so the node outlives the backward.  Executed nodes release
    their saved tensors, but their edges stay, and a chain from a pipelined stage's input
    (FSDP2's RegisterPostBackwardFunction, then the first block) ends at the input's
    AccumulateGrad, which holds the input.  Under the tracker every micro-batch's received input
    and its gradient therefore outlived the backward (measured: m - 1 of each at the last stage's
    loss, 7 x 64 MiB for a Llama 3 8B stage at 8192 tokens), where ``torch.distributed.pipelining``
    frees them (the ``fwd_cache`` entry is popped).  For one tensor "all" and "any" call the hook
    alike, once its gradient is computed; "any" keeps no node, so single inputs are hooked that
    way."""
    from torch.distributed._tools import mod_tracker

    original = mod_tracker.register_multi_grad_hook

    def register(tensors, fn, mode="all"):  # noqa: ANN001, ANN202
        if mode == "all" and len(tensors) == 1:
            mode = "any"
        return original(tensors, fn, mode=mode)

    with replaced(mod_tracker, "register_multi_grad_hook", register):
        yield


class _Runner:
    """One training step of a stage: ``k`` micro-batches in flight, then the rest one at a time."""

    def __init__(self, st: Stage, s, *, first: bool, last: bool, tokens: int, fsdp: bool, hidden: int,
                 tp_mesh) -> None:
        self.st, self.s, self.first, self.last, self.fsdp = st, s, first, last, fsdp
        self.tokens, self.hidden, self.tp_mesh = tokens, hidden, tp_mesh
        self.tracker = None
        self.pipelined = s.pp > 1

    def _input(self) -> torch.Tensor:
        s = self.s
        if self.first:
            return torch.randint(0, 1000, (s.mbs, self.tokens))
        seq = self.tokens // s.tp if s.tp > 1 else self.tokens
        x = torch.randn(s.mbs, seq, self.hidden, dtype=torch.bfloat16, requires_grad=True)
        if s.tp > 1:  # a sequence-parallel stage receives its sequence shard
            from torch.distributed.tensor import DTensor, Shard

            x = DTensor.from_local(x, self.tp_mesh, [Shard(1)], run_check=False)
        return x

    def _loss(self, out: torch.Tensor) -> torch.Tensor:
        if not self.last:
            return out
        labels = torch.randint(0, 1000, (self.s.mbs, self.tokens))
        ctx = nullcontext()
        if self.s.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            ctx = loss_parallel()
        with ctx:
            return torch.nn.functional.cross_entropy(out.flatten(0, 1).float(), labels.flatten(0, 1))

    def _backward(self, y: torch.Tensor) -> None:
        """``y``: the loss (last stage) or the stage output (kept until its backward, as
        ``torch.distributed.pipelining`` keeps it in ``fwd_cache``), given the received gradient."""
        if not self.last:
            y.backward(torch.ones_like(y))
            return
        ctx = nullcontext()
        if self.s.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            ctx = loss_parallel()
        with ctx:
            y.backward()

    def _sync(self, last_backward: bool) -> None:
        if self.fsdp and self.pipelined:  # torch.distributed.pipelining stage.py
            self.st.set_is_last_backward(last_backward)
            self.st.set_reshard_after_backward(last_backward)
            self.st.set_requires_gradient_sync(last_backward)

    def _forward(self) -> torch.Tensor:
        if self.tracker is not None:  # MemTracker keeps per-module stats of one call: start them anew
            self.tracker.reset_mod_stats()
        return self._loss(self.st(self._input()))

    def step(self, opt: torch.optim.Optimizer, k: int, m: int) -> None:
        k = min(k, m)
        done = 0
        pending = [self._forward() for _ in range(k)]
        while pending:
            y = pending.pop(0)
            done += 1
            self._sync(done == m)
            self._backward(y)
            del y
            if done + len(pending) < m:  # 1F1B: the next micro-batch's forward
                pending.append(self._forward())
        opt.step()
        opt.zero_grad(set_to_none=True)


def gib(x: float) -> float:
    return x / float(1 << 30)


def rel(a: float, b: float) -> float:
    return a / b - 1 if b else (0.0 if a == 0 else math.inf)
