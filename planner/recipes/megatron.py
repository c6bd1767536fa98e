"""Megatron-LM / Megatron-Core argument lists: a launch script, an args file, or the
``MODEL_ARGS`` mapping of Megatron-LM's functional-test ``model_config.yaml``.

Key names are those of ``megatron/training/arguments.py`` (``megatron/arguments.py`` before
core_v0.6) from Megatron-LM v2 (2021) to core_v0.19 / main (2026), including the renamed ones:
``--checkpoint-activations`` (v2) and ``--recompute-activations`` (2022) for recomputation,
``--num-layers-per-virtual-pipeline-stage`` (to core_v0.11) and
``--num-virtual-stages-per-pipeline-rank`` (core_v0.12+) for interleaving,
``--overlap-p2p-communication`` (core_v0.5-0.7) and ``--no-overlap-p2p-communication`` (later),
``--use-flash-attn`` (to core_v0.10) and ``--attention-backend`` (core_v0.11+),
``--enable-cuda-graph``/``--external-cuda-graph`` and ``--cuda-graph-impl`` (2026),
``--moe-enable-deepep`` and ``--moe-flex-dispatcher-backend``.  The full key table, with what is
ignored and why, is docs/recipes/megatron.md (tests/test_recipes.py checks they agree).

The architecture comes from the arguments themselves (``--num-layers``, ``--hidden-size``,
``--ffn-hidden-size`` (Megatron's default: 4h, or 8h/3 rounded down to 64 with ``--swiglu``),
``--num-attention-heads``, ``--num-query-groups``, ``--kv-channels``, MoE and MLA options), the
vocabulary from ``--vocab-size`` or the tokenizer, padded as Megatron pads it
(``--make-vocab-size-divisible-by`` times tp).  The cluster comes from the launcher
(``torchrun --nproc_per_node/--nnodes``) or ``#SBATCH`` lines.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sim.data.catalog import catalog_records
from sim.base.errors import InputError
from sim.data.layout import format_layout, megatron_layout, parse_layout
from sim.data.specs import Model, MoeSpec

from planner.recipes.base import (Recipe, RecipeKey, as_bool, as_float, as_int, classify, recipe_error)
from planner.recipes.megatron_keys import COSTLY, NO_COST

VERSIONS = ("Megatron-LM v2 (2021) to core_v0.19 / main (2026): megatron/training/arguments.py "
            "(megatron/arguments.py before core_v0.6), renamed keys included")

_TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000, "BertWordPieceLowerCase": 30522,
                    # tokenizer types FlagPerf's Megatron-LM patches add (FlagOpen/FlagPerf@1b5a0303
                    # training/benchmarks/*/megatron/tokenizer.patch): _Llama3Tokenizer is the Hugging Face
                    # Llama 3 tokenizer's 128,000 entries + extra_vocab_size 256; MistralTokenizer is the
                    # Hugging Face Mistral/Mixtral tokenizer (32,000)
                    "Llama3Tokenizer": 128256, "MistralTokenizer": 32000}
# Tokenizer model files recipes name, with their vocabulary: NVIDIA's Nemotron-2 SentencePiece
# model has 256,000 entries (Parmar et al. 2024, Nemotron-4 15B, arXiv:2402.16819, Sec. 2).
_TOKENIZER_FILES = {"nemotron_2_256k.model": 256000}


def options_from_tokens(path: str, tokens: list[str]) -> list[tuple[str, object]]:
    """``--flag value`` / ``--flag=value`` / ``--switch`` words -> (key, value) in order; the
    words after an option up to the next option are its value (a list when several, as
    ``nargs='+'`` options take them)."""
    out: list[tuple[str, object]] = []
    tokens = [t for t in tokens if t != ""]
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            i += 1  # a stray value (an empty variable left its option without one)
            continue
        key, eq, val = tok.partition("=")
        if eq:
            out.append((key, val))
            i += 1
            continue
        vals = []
        j = i + 1
        while j < len(tokens) and not tokens[j].startswith("--"):
            vals.append(tokens[j])
            j += 1
        out.append((key, True if not vals else (vals[0] if len(vals) == 1 else vals)))
        i = j
    return out


def options_from_mapping(path: str, mapping: dict) -> list[tuple[str, object]]:
    """Megatron-LM's functional-test ``MODEL_ARGS`` (``--flag: value``; ``true`` a switch)."""
    out: list[tuple[str, object]] = []
    for k, v in mapping.items():
        key = str(k)
        if not key.startswith("--"):
            raise recipe_error(path, key, v, "MODEL_ARGS keys are Megatron-LM options (--name)")
        if v is True:
            out.append((key, True))
        elif v is False or v is None:
            continue
        else:
            out.append((key, str(v) if not isinstance(v, list) else [str(x) for x in v]))
    return out


def _moe_layer_pattern(path: str, key: str, value: object, num_layers: int) -> tuple[int, int]:
    """``--moe-layer-freq`` (an int, or a Python list expression such as ``[0]*3+[1]*58``) as
    (first_k_dense_layers, layer_frequency)."""
    text = str(value).strip()
    if re.fullmatch(r"\d+", text):
        return 0, int(text)
    pattern = _layer_list(path, key, value, num_layers)
    first = next((i for i, x in enumerate(pattern) if x), num_layers)
    rest = pattern[first:]
    ones = [i for i, x in enumerate(rest) if x]
    freq = ones[1] - ones[0] if len(ones) > 1 else 1
    expect = [1 if i % freq == 0 else 0 for i in range(len(rest))]
    if list(rest) != expect:
        raise recipe_error(path, key, value, "MoE layers must repeat every k-th layer after the first dense ones "
                                             "(the planner's first_k_dense_layers / layer_frequency)")
    return first, freq


def _deepspeed_moe(path: str, r: "_Reader", ffn: int, warn: list[str]) -> MoeSpec | None:
    """DeepSpeed-MoE as Megatron-DeepSpeed configures it (megatron/arguments.py at f4157be lines
    608-615, 910-916, 1159, 1650-1660): ``--num-experts`` one count or one per MoE layer (1 =
    dense), MoE on every ``--expert-interval``-th layer counted from 1 (default 2: layers 2, 4, ...),
    ``--topk`` (default 1), ``--mlp-type residual`` (PR-MoE: a dense MLP beside the experts, priced
    as one shared expert); experts as wide as the dense FFN."""
    raw = r.get("--num-experts", "model.moe.num_experts")
    words = raw if isinstance(raw, list) else str(raw).split()
    try:
        counts = [int(w) for w in words]
    except ValueError:
        raise recipe_error(path, "--num-experts", raw, "must be expert counts (integers)") from None
    interval = r.int("--expert-interval", "model.moe.layer_frequency") or 2
    topk = r.int("--topk", "model.moe.top_k") or 1
    residual = r.text("--mlp-type", "model.moe.num_shared_experts") == "residual"
    if max(counts) <= 1:
        return None
    if len(set(counts)) > 1:
        warn.append(f"--num-experts {' '.join(words)}: layers with different expert counts priced with "
                    f"{max(counts)} experts each (the planner's MoE layers are alike)")
    # capacity and token dropping are not priced (balanced routing): listed as ignored, with their cost
    cf = r.opts.get("--moe-train-capacity-factor")
    dropping = not r.has("--disable-moe-token-dropping")
    padded = dropping and cf is not None and as_float(path, "--moe-train-capacity-factor", cf) != 1.0
    if cf is not None:
        r.ignore("--moe-train-capacity-factor", "yes" if padded else "no",
                 "experts padded to this capacity (the planner prices balanced routing, capacity 1.0)")
    if not dropping:
        r.ignore("--disable-moe-token-dropping", "no", "dropless: balanced routing is what the planner prices")
    if padded:
        warn.append(f"--moe-train-capacity-factor {cf}: DeepSpeed-MoE pads every expert to this capacity; the planner "
                    "prices balanced routing (capacity 1.0)")
    return MoeSpec(num_experts=max(counts), top_k=topk, expert_ffn_hidden_size=ffn, num_shared_experts=int(residual),
                   layer_frequency=interval, first_k_dense_layers=interval - 1)


def _window(path: str, r: "_Reader", num_layers: int) -> dict[str, int]:
    """``--window-size LEFT,RIGHT`` (Megatron-Core core_v0.17 arguments.py: a tuple; -1 is an
    unbounded side) and ``--window-attn-skip-freq`` (an int N: one full-attention layer after
    N - 1 windowed ones; or a per-layer list of 1 = windowed, 0 = full) as the model's
    ``local_attention_window`` and ``local_attention_layers``."""
    size = r.text("--window-size", "model.local_attention_window")
    if size is None:
        return {}
    sides = re.findall(r"-?\d+", size)
    if len(sides) != 2:
        raise recipe_error(path, "--window-size", size, "must be two integers LEFT,RIGHT")
    left = int(sides[0])
    if left < 0:  # unbounded on the left: full causal attention
        return {}
    if left == 0:
        raise recipe_error(path, "--window-size", size, "the left window must be > 0 (or -1 for none)")
    freq = r.get("--window-attn-skip-freq", "model.local_attention_layers")
    text = str(freq).strip()
    if freq is None:
        local = num_layers
    elif text.isdigit():
        local = num_layers - num_layers // max(1, int(text))
    else:
        local = sum(_layer_list(path, "--window-attn-skip-freq", freq, num_layers))
    return {"local_attention_window": left, "local_attention_layers": local} if local else {}


def _layer_list(path: str, key: str, value: object, num_layers: int) -> list[int]:
    """A per-layer list of 0 and 1, written as a Python list expression (``[1,0]*24``,
    ``[0]*3+[1]*58``), with one entry per layer."""
    text = str(value).strip()
    if not re.fullmatch(r"[\[\]\(\)0-9,+*\s]+", text):
        raise recipe_error(path, key, value, "must be an integer or a list expression such as [1,0]*24")
    if any(int(n) > 1 << 16 for n in re.findall(r"\d+", text)):
        raise recipe_error(path, key, value, "repeats more layers than a model has")
    try:
        pattern = eval(text, {"__builtins__": {}}, {})  # noqa: S307 digits, brackets, + and * only
    except Exception:  # noqa: BLE001
        raise recipe_error(path, key, value, "is not a valid list expression") from None
    if not isinstance(pattern, (list, tuple)) or any(x not in (0, 1) for x in pattern):
        raise recipe_error(path, key, value, "must be a list of 0 and 1 per layer")
    if len(pattern) != num_layers:
        raise recipe_error(path, key, value, f"has {len(pattern)} entries for num_layers={num_layers}")
    return [int(x) for x in pattern]


def _catalog_vocab(num_layers: int, hidden: int, heads: int, ffn: int, kv_heads: int | None,
                   swiglu: bool) -> tuple[int, str] | None:
    """The vocabulary of the catalog model of this whole shape (layers, width, heads, KV heads,
    FFN width and kind): Llama 2 7B and Llama 3 8B share the first three and differ in vocabulary
    by 4x, so a partial match is no evidence."""
    want = (num_layers, hidden, heads, kv_heads or heads, ffn, "swiglu" if swiglu else "gelu")
    for rec in catalog_records("models"):
        have = (rec.get("num_layers"), rec.get("hidden_size"), rec.get("num_attention_heads"),
                rec.get("num_kv_heads") or rec.get("num_attention_heads"), rec.get("ffn_hidden_size"),
                rec.get("ffn_type", "gelu"))
        if have == want:
            return int(rec["vocab_size"]), str(rec["id"])
    return None


class _Reader:
    """Consumes options, recording what each maps to."""

    def __init__(self, path: str, options: list[tuple[str, object]]) -> None:
        self.path = path
        self.opts: dict[str, object] = {}
        for k, v in options:
            self.opts[k] = v  # a repeated option: the last wins, as argparse does
        self.maps: dict[str, tuple[str, str]] = {}
        self.ignored: dict[str, tuple[str, str]] = {}
        self.order = [k for k, _ in options]

    def has(self, key: str) -> bool:
        return key in self.opts

    def get(self, key: str, maps_to: str, note: str = "") -> object | None:
        if key not in self.opts:
            return None
        self.maps[key] = (maps_to, note)
        return self.opts[key]

    def flag(self, key: str, maps_to: str, note: str = "") -> bool:
        v = self.get(key, maps_to, note)
        if v is None:
            return False
        return True if v is True else as_bool(self.path, key, v)

    def int(self, key: str, maps_to: str, *, minimum: int = 1, note: str = "") -> int | None:
        v = self.get(key, maps_to, note)
        return None if v is None else as_int(self.path, key, v, minimum=minimum)

    def text(self, key: str, maps_to: str, note: str = "") -> str | None:
        v = self.get(key, maps_to, note)
        if v is None:
            return None
        if v is True or isinstance(v, list):
            raise recipe_error(self.path, key, v, "needs one value")
        return str(v)

    def ignore(self, key: str, cost: str, note: str) -> None:
        self.maps.pop(key, None)
        self.ignored[key] = (cost, note)

    def keys(self, model: Model | None = None) -> tuple[RecipeKey, ...]:
        """Every option with what it maps to; ignored ones classified (``COSTLY``/``NO_COST``,
        and by value where the planner's own assumption is the stated value)."""
        out = []
        for k in dict.fromkeys(self.order):
            v = self.opts[k]
            if k in self.ignored:
                out.append(RecipeKey(key=k, value=v, cost=self.ignored[k][0], note=self.ignored[k][1]))
            elif k in self.maps and self.maps[k][0]:
                maps_to, note = self.maps[k]
                out.append(RecipeKey(key=k, value=v, maps_to=maps_to, note=note))
            else:
                cost, note = classify(k, NO_COST, COSTLY)
                cost, note = _by_value(k, v, cost, note, model)
                out.append(RecipeKey(key=k, value=v, cost=cost, note=note))
        return tuple(out)


def _by_value(key: str, value: object, cost: str, note: str, model: Model | None) -> tuple[str, str]:
    """Ignored keys whose stated value is what the planner assumes anyway cost nothing extra."""
    text = str(value).strip().lower()
    if key == "--transformer-impl" and text == "transformer_engine":
        return "no", "Transformer Engine layers (what the planner prices)"
    return cost, note


def _with_dropout(path: str, r: "_Reader", model: Model, warn: list[str], *, megatron_defaults: bool) -> Model:
    """The model with the run's dropout (``Model.dropout``): on when ``--hidden-dropout`` is above 0
    (the residual branches' and the embedding's masks are what a layer saves; a fused attention
    kernel regenerates its own), or ``--attention-dropout`` alone is.  Megatron-LM's defaults
    (arguments.py ``_add_regularization_args``: both 0.1, core_v0.6.0 to main) apply to a launch
    script that sets neither, whatever the model family; NeMo's model configs carry their own
    (0.0 for the Llama family), so a NeMo recipe that states none keeps the family's default."""
    hidden = r.get("--hidden-dropout", "model.dropout")
    attention = r.get("--attention-dropout", "model.dropout")
    if hidden is None and attention is None and not megatron_defaults:
        return model
    p_hidden = 0.1 if hidden is None else as_float(path, "--hidden-dropout", hidden)
    p_attention = 0.1 if attention is None else as_float(path, "--attention-dropout", attention)
    on = p_hidden > 0 or p_attention > 0
    if hidden is None and attention is None and on != model.has_dropout:
        warn.append("Megatron-LM's defaults --hidden-dropout 0.1 and --attention-dropout 0.1 apply (the recipe sets "
                    "neither): priced with dropout (its masks' activation memory)")
    return model if model.has_dropout == on else replace(model, dropout=on)


def read_megatron(path: str, options: list[tuple[str, object]], *, dialect: str, model: Model | None = None,
                  num_gpus: int | None = None, gpus_per_node: int | None = None,
                  warnings: list[str] | None = None, extra_keys: tuple[RecipeKey, ...] = (),
                  default_precision: str | None = None, framework: str | None = None, versions: str = VERSIONS,
                  format: str = "megatron") -> Recipe:
    """A ``Recipe`` from Megatron-LM options (module docstring).  ``default_precision`` is used
    (with a warning) when the options state none (a NeMo model dump, where the trainer's
    precision plugin sets it); the NeMo reader passes its own ``framework``."""
    r = _Reader(path, options)
    warn = list(warnings or [])
    st: dict[str, object] = {}
    plan: dict[str, object] = {}

    # ---- parallelism
    tp = r.int("--tensor-model-parallel-size", "strategy.tp") or 1
    pp = r.int("--pipeline-model-parallel-size", "strategy.pp") or 1
    st.update(tp=tp, pp=pp)
    for key, name in (("--context-parallel-size", "cp"), ("--ds-sequence-parallel-size", "cp"),
                      ("--expert-model-parallel-size", "ep"), ("--moe-expert-parallel-size", "ep"),
                      ("--expert-tensor-parallel-size", "etp")):
        v = r.int(key, f"strategy.{name}")
        if v is not None:
            st[name] = v
    if st.get("etp") == tp:
        st.pop("etp")
    if r.flag("--sequence-parallel", "strategy.sp"):
        st["sp"] = tp > 1
        if tp == 1:
            warn.append("--sequence-parallel with tp=1: Megatron-LM turns it off")
    mbs = r.int("--micro-batch-size", "strategy.mbs")
    gbs = r.int("--global-batch-size", "strategy.gbs")
    if mbs is not None:
        st["mbs"] = mbs
    if gbs is not None:
        st["gbs"] = gbs
    seq = r.int("--seq-length", "strategy.seq_len")
    if seq is not None:
        st["seq_len"] = seq

    # ---- recomputation
    gran = r.text("--recompute-granularity", "strategy.recompute")
    if gran is not None:
        if gran not in ("full", "selective"):
            raise recipe_error(path, "--recompute-granularity", gran, "must be full or selective")
        st["recompute"] = gran
    elif r.flag("--recompute-activations", "strategy.recompute", "selective (renamed --recompute-granularity)"):
        st["recompute"] = "selective"
    elif r.flag("--checkpoint-activations", "strategy.recompute", "full (Megatron-LM v2)"):
        st["recompute"] = "full"
    method = r.text("--recompute-method", "strategy.recompute_method")
    if method is not None:
        if method not in ("uniform", "block"):
            raise recipe_error(path, "--recompute-method", method, "must be uniform or block")
        if st.get("recompute") == "full":
            st["recompute_method"] = method
    n_rec = r.int("--recompute-num-layers", "strategy.recompute_num_layers")
    if n_rec is not None and st.get("recompute") == "full":
        st["recompute_num_layers"] = n_rec
    if st.get("recompute_method") == "uniform" and st.get("recompute_num_layers", 1) == 1:
        # every layer its own checkpoint: the planner's recompute=full as it stands
        st.pop("recompute_method")
        st.pop("recompute_num_layers", None)
    modules = r.opts.get("--recompute-modules")
    if modules is not None and st.get("recompute") == "selective":
        raw = " ".join(modules) if isinstance(modules, list) else str(modules)
        mods = [m for m in re.split(r"[\s,\[\]'\"]+", raw) if m]
        policy = ("mlp" if {"mlp", "moe"} & set(mods) else "moe_act" if "moe_act" in mods else
                  "mla_up_proj" if "mla_up_proj" in mods else "attention" if "core_attn" in mods else None)
        if policy is not None:
            rest = [m for m in mods if m not in {"mlp": ("mlp", "moe"), "moe_act": ("moe_act",),
                                                 "mla_up_proj": ("mla_up_proj",), "attention": ("core_attn",)}[policy]]
            r.get("--recompute-modules", "plan.selective_policy",
                  f"{policy}" + (f"; not priced: {', '.join(rest)}" if rest else ""))
            plan["selective_policy"] = policy

    # ---- ZeRO / FSDP
    zero = 0
    if r.flag("--use-distributed-optimizer", "strategy.zero", "1 (distributed optimizer)"):
        zero = 1
    sharding = r.text("--data-parallel-sharding-strategy", "strategy.zero")
    fsdp = r.flag("--use-megatron-fsdp", "strategy.zero", "Megatron-FSDP (with --data-parallel-sharding-strategy)") \
        or r.flag("--use-custom-fsdp", "strategy.zero", "Megatron-FSDP (renamed --use-megatron-fsdp)")
    if fsdp:
        levels = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        s_name = sharding or "optim_grads_params"
        if s_name not in levels:
            raise recipe_error(path, "--data-parallel-sharding-strategy", s_name, f"must be one of {', '.join(levels)}")
        zero = levels[s_name]
    if r.flag("--use-torch-fsdp2", "strategy.zero", "3 (PyTorch FSDP2)"):
        zero = 3
    st["zero"] = zero
    inst = r.int("--num-distributed-optimizer-instances", "strategy.dp_shard", note="dp / instances")
    if inst is not None and inst > 1:
        st["_dp_instances"] = inst
    if r.flag("--optimizer-cpu-offload", "strategy.offload", "optimizer"):
        st["offload"] = "optimizer"
        frac = r.opts.get("--optimizer-offload-fraction")
        if frac is not None and as_float(path, "--optimizer-offload-fraction", frac) < 1.0:
            warn.append(f"--optimizer-offload-fraction {frac}: the planner offloads the whole optimizer")
    n_off = r.int("--cpu-offloading-num-layers", "strategy.offload_num_layers", minimum=0)
    if n_off:  # Megatron-Core activation offloading of N layers (the optimizer offload combines with it)
        st["offload_num_layers"] = n_off
        st["offload"] = "optimizer+activations" if st.get("offload") == "optimizer" else "activations"

    # ---- overlaps and graphs
    st["dp_overlap"] = r.flag("--overlap-grad-reduce", "strategy.dp_overlap")
    r.flag("--overlap-param-gather", "strategy.dp_overlap", "parameter all-gather overlapped (ZeRO-1)")
    if r.flag("--tp-comm-overlap", "strategy.tp_overlap"):
        st["tp_overlap"] = True
    if r.flag("--overlap-moe-expert-parallel-comm", "strategy.ep_overlap") or \
            r.flag("--moe-a2a-overlap", "strategy.ep_overlap"):
        st["ep_overlap"] = True
    if r.flag("--enable-cuda-graph", "strategy.cuda_graphs") or r.flag("--external-cuda-graph", "strategy.cuda_graphs"):
        st["cuda_graphs"] = True
    impl = r.text("--cuda-graph-impl", "strategy.cuda_graphs")
    if impl is not None and impl != "none":
        st["cuda_graphs"] = True
    scope = r.get("--cuda-graph-scope", "plan.cuda_graph_scope")
    if scope is not None and scope is not True:
        # Megatron-Core's scopes (transformer_config.py cuda_graph_scope): "full" or none = the whole
        # layer; a subset of attn / moe_router / moe_preprocess = the attention block and the router
        parts = {p for v in (scope if isinstance(scope, list) else [scope]) for p in re.split(r"[\s,]+", str(v)) if p}
        if parts and parts <= {"attn", "moe_router", "moe_preprocess"}:
            plan["cuda_graph_scope"] = "attention"

    # ---- precision
    if r.flag("--fp16", "strategy.precision", "fp16"):
        st["precision"] = "fp16"
    if r.flag("--bf16", "strategy.precision", "bf16"):
        st["precision"] = "bf16"
    fmt = r.text("--fp8-format", "strategy.precision", "fp8 (Transformer Engine)")
    if fmt is None and (r.flag("--fp8-e4m3", "strategy.precision", "fp8") or r.flag("--fp8-hybrid", "strategy.precision", "fp8")):
        fmt = "e4m3"
    if fmt is not None:
        if fmt not in ("e4m3", "hybrid"):
            raise recipe_error(path, "--fp8-format", fmt, "must be e4m3 or hybrid")
        st["precision"] = "fp8"
        rec = r.text("--fp8-recipe", "strategy.fp8_recipe") or "delayed"
        if rec not in ("delayed", "tensorwise", "mxfp8", "blockwise"):
            raise recipe_error(path, "--fp8-recipe", rec, "must be delayed, tensorwise, mxfp8 or blockwise")
        st["fp8_recipe"] = rec
    if r.has("--fp4-format"):
        raise recipe_error(path, "--fp4-format", r.opts["--fp4-format"],
                           "fp4 training is not modelled (precisions: bf16, fp16, fp8)")
    if "precision" not in st and default_precision is not None:
        st["precision"] = default_precision
        warn.append(f"no precision stated: assumed {default_precision}")
    if r.flag("--fp8-param-gather", "strategy.fp8_params"):
        if st.get("precision") != "fp8":
            raise recipe_error(path, "--fp8-param-gather", True, "fp8 parameters need fp8 training (--fp8-format)")
        st["fp8_params"] = True
    if "precision" not in st:  # Megatron-LM without --bf16/--fp16 trains in fp32
        raise recipe_error(path, "--bf16", None, "neither --bf16 nor --fp16: Megatron-LM trains in fp32, which the "
                           "planner does not model (add --bf16)")

    # ---- model-state layout (sim.data.runtime.STATE_LAYOUTS): the gradient buffer's dtype and the
    # precision-aware optimizer's 16-bit master-weight remainders (Megatron-Core optimizer/__init__.py)
    bf16_grads = r.flag("--grad-reduce-in-bf16", "plan.state_layout")
    if r.flag("--use-precision-aware-optimizer", "plan.state_layout"):
        plan["state_layout"] = plan["fp8_state_layout"] = ("megatron_remainders" if bf16_grads
                                                           else "megatron_remainders_fp32_grads")
    elif bf16_grads:
        plan["state_layout"] = plan["fp8_state_layout"] = "megatron_bf16_grads"

    # ---- kernels the framework profile does not fix
    backend = r.text("--attention-backend", "plan.attention")
    if backend is not None:
        plan["attention"] = {"flash": "flash2", "fused": "flash", "auto": "flash", "unfused": "unfused",
                             "local": "unfused"}.get(backend, "flash")
    elif r.flag("--use-flash-attn", "plan.attention", "flash2 (flash-attn package)"):
        plan["attention"] = "flash2"
    disp = r.text("--moe-token-dispatcher-type", "plan.moe_dispatcher")
    if disp is not None:
        backend_flex = r.text("--moe-flex-dispatcher-backend", "plan.moe_dispatcher")
        deepep = r.flag("--moe-enable-deepep", "plan.moe_dispatcher", "deepep")
        plan["moe_dispatcher"] = {"alltoall": "alltoall", "alltoall_seq": "alltoall", "allgather": "allgather",
                                  "flex": "deepep"}.get(disp, "alltoall")
        if disp == "flex" and backend_flex is not None and backend_flex not in ("deepep", "hybridep"):
            warn.append(f"--moe-flex-dispatcher-backend {backend_flex}: priced as DeepEP")
        if deepep:
            plan["moe_dispatcher"] = "deepep"

    # ---- model
    n_layers = r.int("--num-layers", "model.num_layers")
    if model is None:
        model, note = _model(path, r, tp, n_layers, warn, megatron_defaults=format == "megatron")
    else:
        note = "--model (the recipe's architecture options are not used)"
        for k in _ARCH_KEYS:
            if r.has(k):
                r.ignore(k, "no", "the model comes from --model")

    if model is not None:
        model = _with_dropout(path, r, model, warn, megatron_defaults=format == "megatron")

    # ---- pipeline split
    layout_note = ""
    vp = r.int("--num-virtual-stages-per-pipeline-rank", "strategy.vp")
    per_stage = r.int("--num-layers-per-virtual-pipeline-stage", "strategy.vp", note="vp = layers per rank / this")
    if per_stage is not None and model is not None and pp > 1:
        if (model.num_layers // pp) % per_stage:
            raise recipe_error(path, "--num-layers-per-virtual-pipeline-stage", per_stage,
                               f"must divide the {model.num_layers // pp} layers of each pipeline rank")
        vp = model.num_layers // pp // per_stage
    text_layout = r.text("--pipeline-model-parallel-layout", "strategy.pipeline_layout")
    first = r.int("--decoder-first-pipeline-num-layers", "strategy.pipeline_layout", minimum=0)
    last = r.int("--decoder-last-pipeline-num-layers", "strategy.pipeline_layout", minimum=0)
    acc_e = r.flag("--account-for-embedding-in-pipeline-split", "strategy.pipeline_layout")
    acc_l = r.flag("--account-for-loss-in-pipeline-split", "strategy.pipeline_layout")
    mtp = r.opts.get("--mtp-num-layers")
    if text_layout is not None:
        lay = parse_layout(text_layout, pp, field=f"{path.rsplit('/', 1)[-1]}: --pipeline-model-parallel-layout")
        lay_vp = len(lay) // pp
        if vp is not None:  # Megatron-LM asserts at most one of them (arguments.py, "Uneven virtual pipeline")
            raise recipe_error(path, "--num-virtual-stages-per-pipeline-rank", vp, "cannot be set with "
                               "--pipeline-model-parallel-layout (the layout's virtual stages fix vp)")
        vp = lay_vp
        st["pipeline_layout"] = lay
        layout_note = f"--pipeline-model-parallel-layout {format_layout(lay)}"
        if mtp is not None and "m" not in "".join(lay):
            warn.append("--mtp-num-layers without MTP layers (m) in the layout")
    elif (first is not None or last is not None or acc_e or acc_l) and pp > 1:
        if model is None:
            raise recipe_error(path, "--decoder-first-pipeline-num-layers", first, "needs the model's layer count")
        st["pipeline_layout"] = megatron_layout(model.num_layers, pp, vp or 1, first=first, last=last,
                                                account_embedding=acc_e, account_loss=acc_l,
                                                field=f"{path.rsplit('/', 1)[-1]}: pipeline split")
        layout_note = " ".join(k for k in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                                           "--account-for-embedding-in-pipeline-split",
                                           "--account-for-loss-in-pipeline-split") if r.has(k))
    if vp is not None and vp > 1:
        st["vp"] = vp
        st["schedule"] = "interleaved"
        # Megatron-Core overlaps pipeline sends with interleaving unless told not to (core_v0.8+;
        # core_v0.5-0.7 had the opposite switch, --overlap-p2p-communication, off by default)
        pp_ov = True
        if r.has("--overlap-p2p-communication"):
            pp_ov = r.flag("--overlap-p2p-communication", "strategy.pp_overlap")
        if r.has("--no-overlap-p2p-communication") and r.flag("--no-overlap-p2p-communication", "strategy.pp_overlap",
                                                              "off"):
            pp_ov = False
        st["pp_overlap"] = pp_ov
    else:
        for k in ("--no-overlap-p2p-communication", "--overlap-p2p-communication"):
            if r.has(k):
                r.ignore(k, "no", "no interleaving (vp 1): no effect")

    # ---- cluster from the launcher (the caller reads it) and the framework
    if framework is None:
        framework = "megatron-deepspeed" if r.has("--deepspeed") else "megatron-core"
        if framework == "megatron-deepspeed":
            r.flag("--deepspeed", "framework", "Megatron-DeepSpeed")
    return Recipe(path=path, format=format, dialect=dialect, versions=versions, framework=framework,
                  settings=st, model=model, model_note=note, num_gpus=num_gpus, gpus_per_node=gpus_per_node,
                  plan=plan, keys=tuple(extra_keys) + r.keys(model), warnings=tuple(warn), layout=layout_note)


_ARCH_KEYS = ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention",
              "--num-query-groups", "--kv-channels", "--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights",
              "--vocab-size", "--make-vocab-size-divisible-by", "--max-position-embeddings", "--position-embedding-type",
              "--disable-bias-linear", "--add-bias-linear", "--num-key-value-heads", "--use-rotary-position-embeddings",
              "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
              "--moe-layer-freq", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
              "--qk-pos-emb-head-dim", "--v-head-dim", "--tokenizer-type", "--window-size", "--window-attn-skip-freq",
              "--expert-interval", "--topk", "--mlp-type")


def _model(path: str, r: _Reader, tp: int, n_layers: int | None, warn: list[str], *,
           megatron_defaults: bool = True) -> tuple[Model | None, str]:
    """The model the architecture options describe (module docstring), or None without them."""
    hidden = r.int("--hidden-size", "model.hidden_size")
    heads = r.int("--num-attention-heads", "model.num_attention_heads")
    if n_layers is None or hidden is None or heads is None:
        missing = [k for k, v in (("--num-layers", n_layers), ("--hidden-size", hidden),
                                  ("--num-attention-heads", heads)) if v is None]
        return None, f"no architecture in the recipe ({', '.join(missing)} missing): give --model"
    swiglu = r.flag("--swiglu", "model.ffn_type", "swiglu")
    if r.flag("--squared-relu", "model.ffn_type", "2-matrix MLP (squared ReLU)"):
        swiglu = False
    ffn = r.int("--ffn-hidden-size", "model.ffn_hidden_size")
    if ffn is None:  # Megatron-LM's default (arguments.py)
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
    kv = None
    if r.flag("--group-query-attention", "model.num_kv_heads"):
        kv = r.int("--num-query-groups", "model.num_kv_heads") or 1
    elif r.has("--num-query-groups"):
        r.int("--num-query-groups", "", note="without --group-query-attention: not used")
    if r.has("--num-key-value-heads"):  # Megatron-DeepSpeed's GQA option (megatron/arguments.py at f4157be)
        kv = r.int("--num-key-value-heads", "model.num_kv_heads", note="Megatron-DeepSpeed's grouped-query option")
    head_dim = r.int("--kv-channels", "model.head_dim")
    if head_dim is not None and head_dim * heads == hidden:
        head_dim = None
    tied = not r.flag("--untie-embeddings-and-output-weights", "model.tied_embeddings", "false")
    # Megatron-LM's linears are biased unless --disable-bias-linear (arguments.py: add_bias_linear
    # defaults to True; --add-bias-linear is the older spelling of the default)
    bias = r.flag("--add-bias-linear", "model.linear_bias") if r.has("--add-bias-linear") else True
    if r.flag("--disable-bias-linear", "model.linear_bias", "false"):
        bias = False
    max_pos = r.int("--max-position-embeddings", "model.max_seq_len")
    pos = r.text("--position-embedding-type", "model.position_embedding")
    position = None if pos is None else ("rope" if pos in ("rope", "yarn", "mrope") else "learned")
    # the switch before --position-embedding-type (Megatron-LM 2023; Megatron-DeepSpeed's arguments.py)
    if r.flag("--use-rotary-position-embeddings", "model.position_embedding", "rope") and pos is None:
        position = "rope"
    if position is None and megatron_defaults:  # Megatron-LM's default (arguments.py: learned_absolute)
        position = "learned"
        if swiglu:  # a Llama-style block, whose usual positions are rotary
            warn.append("no --position-embedding-type: Megatron-LM's default learned absolute positions apply "
                        "(a table of --max-position-embeddings x hidden parameters, no rotary embedding)")
    # vocabulary: --vocab-size (NullTokenizer), a known tokenizer, or a catalog model of this shape
    vocab = r.int("--vocab-size", "model.vocab_size")
    tok = r.text("--tokenizer-type", "model.vocab_size" if vocab is None else "")
    if tok is None and r.has("--vocab-file") and r.has("--merge-file"):
        tok = "GPT2BPETokenizer"  # pretrain_gpt.py's args_defaults (Megatron-LM v2)
    note = "the recipe's architecture options"
    tok_file = str(r.opts.get("--tokenizer-model", "")).rsplit("/", 1)[-1]
    if vocab is None:
        if tok in _TOKENIZER_VOCAB:
            vocab = _TOKENIZER_VOCAB[tok]
            note += f"; vocabulary {vocab} of {tok}"
        elif tok_file in _TOKENIZER_FILES:
            vocab = _TOKENIZER_FILES[tok_file]
            r.get("--tokenizer-model", "model.vocab_size")
            note += f"; vocabulary {vocab} of {tok_file}"
        else:
            hit = _catalog_vocab(n_layers, hidden, heads, ffn, kv, swiglu)
            if hit is None:
                raise recipe_error(path, "--vocab-size", None, f"not stated and the tokenizer ({tok or 'none'}) does not "
                                   "say it: give --model (a catalog id or a Hugging Face config.json)")
            vocab = hit[0]
            note += f"; vocabulary {vocab} from the catalog model {hit[1]} of the same shape"
    div = r.int("--make-vocab-size-divisible-by", "model.vocab_size", note="padded as Megatron-LM pads") or 128
    multiple = div * tp
    padded = -(-vocab // multiple) * multiple
    if padded != vocab:
        note += f" (padded {vocab} -> {padded}: multiple of {div} x tp)"
    moe = None
    if r.has("--deepspeed") and r.has("--num-experts"):
        moe = _deepspeed_moe(path, r, ffn, warn)
    experts = None if r.has("--deepspeed") else r.int("--num-experts", "model.moe.num_experts")
    if experts is not None:
        topk = r.int("--moe-router-topk", "model.moe.top_k") or 2
        e_ffn = r.int("--moe-ffn-hidden-size", "model.moe.expert_ffn_hidden_size") or ffn
        shared = r.int("--moe-shared-expert-intermediate-size", "model.moe.num_shared_experts", minimum=0) or 0
        n_shared = -(-shared // e_ffn)
        if shared and shared != n_shared * e_ffn:
            warn.append(f"--moe-shared-expert-intermediate-size {shared}: priced as {n_shared} shared expert(s) of "
                        f"{e_ffn} (the planner counts shared experts in expert sizes)")
        first, freq = 0, 1
        freq_v = r.get("--moe-layer-freq", "model.moe.first_k_dense_layers")
        if freq_v is not None:
            first, freq = _moe_layer_pattern(path, "--moe-layer-freq", freq_v, n_layers)
        moe = MoeSpec(num_experts=experts, top_k=topk, expert_ffn_hidden_size=e_ffn, num_shared_experts=n_shared,
                      layer_frequency=freq, first_k_dense_layers=first)
    mla = {}
    if r.flag("--multi-latent-attention", "model.kv_lora_rank"):
        q_lora = r.int("--q-lora-rank", "model.q_lora_rank")
        kv_lora = r.int("--kv-lora-rank", "model.kv_lora_rank") or 512
        qk = r.int("--qk-head-dim", "model.head_dim") or 128
        rope = r.int("--qk-pos-emb-head-dim", "model.qk_rope_head_dim", minimum=0) or 64
        vdim = r.int("--v-head-dim", "model.v_head_dim") or 128
        mla = {"q_lora_rank": q_lora, "kv_lora_rank": kv_lora, "qk_rope_head_dim": rope, "v_head_dim": vdim}
        head_dim = qk
    try:
        m = Model(name=path.rsplit("/", 1)[-1], num_layers=n_layers, hidden_size=hidden, num_attention_heads=heads,
                  ffn_hidden_size=ffn, vocab_size=padded, num_kv_heads=kv, head_dim=head_dim,
                  ffn_type="swiglu" if swiglu else "gelu", tied_embeddings=tied, moe=moe, max_seq_len=max_pos,
                  position_embedding=position, linear_bias=bias, source=f"recipe {path}", **mla,
                  **_window(path, r, n_layers))
    except InputError as exc:
        raise recipe_error(path, exc.field, exc.value, exc.message) from None
    return m, note
