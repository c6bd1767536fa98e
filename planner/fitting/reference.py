"""The reference training runs as plans: every published and development-set row, mapped by rules.

Two files in ``catalogs/reference/`` hold the runs the model is scored on (nothing is fitted to a
row): ``published_runs.yaml`` (Narayanan et al. 2021, Korthikanti et al. 2022, torchtitan) and
``dev_runs.yaml`` (dgxc-benchmarking, FlagPerf, MLPerf v4.1/v5.0/v5.1, NeMo Automodel, NeMo
long-sequence, the Megatron-MoE model zoo).  A row becomes a plan by rules that read what the
row states, never by a per-row value:

* **hardware**: the catalog GPU its name names; the scale-out adapter and count the
  ``interconnect`` text states (else the GPU's usual server); the NVLink domain of the GPU's
  usual system (NVL72 for GB200/GB300) unless the row says otherwise;
* **model**: the row's shape (GQA, MLA, MoE with shared experts and leading dense layers; a
  gated activation (SwiGLU, GeGLU) has three matrices, an ungated one (GeLU, squared ReLU) two;
  a GPT row's linears are biased unless it says ``linear_bias: false``; dropout and learned
  positions where the row says ``dropout: true`` / ``position_embedding: learned``, else the
  family's (GPT with both, Llama without); an ``attention`` text
  naming a "sliding-window (W)" gives those layers a window of W, half of them when it
  alternates with full attention);
* **framework**: a profile of ``catalogs/frameworks.yaml`` chosen from the row's ``framework``
  text (NeMo, Megatron-Core, Megatron-LM by code year, Megatron-DeepSpeed, DeepSpeed with HF
  transformers, torchtitan, MaxText, NeMo Automodel);
* **strategy**: degrees, batch, ZeRO/FSDP (``fsdp: N`` shards over N ranks, replicating over the
  rest), sequence parallelism (Megatron-Core-based stacks turn it on with tp > 1 unless the row
  says otherwise), recomputation (``recompute`` text: none, full, Megatron's selective modules,
  MaxText remat policies), precision and fp8 recipe (``precision`` text: delayed, tensorwise or
  blockwise scaling, MXFP8; fp8 parameters where it names ``fp8_params`` / ``FP8_PARAMS`` /
  fp8 param gather and the profile keeps them), overlap switches the ``overlap`` text names (TP comm overlap,
  overlapped p2p, expert all-to-all overlap, CUDA graphs, of the attention block and router only where
  it says "CUDA graphs (attn, ...)"); FlexAttention where the ``framework`` text names it
  ("FlexAttn") and the profile launches it; an Automodel MoE row whose notes
  state its fake balanced gate routes each token to consecutive experts (``sim.layers.moe_routing``);
  a profile that runs one pipeline schedule per local batch (Automodel) with a stated local batch
  runs ``global_batch / (local_batch x dp)`` of them per step (``Plan.pipeline_flushes``);
* **published step time**: the iteration time as published; else global batch x sequence
  length over tokens/s; else the source's own FLOP count (its convention is stated in the row's
  notes: Narayanan eq. 3, Megatron's ``num_floating_point_operations``, NeMo's ``flops_formulas``)
  over TFLOP/s; else model FLOPs over the published MFU.

Unstated micro-batch sizes and interleaving depths are filled by one rule in
``planner.fitting.published`` (the fastest plan that fits, as the authors tuned theirs).  A row that
states too little, or needs a mechanism the model does not have, is ``NotSimulable`` with the
reason; it is listed, never dropped silently.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from sim.data.catalog import catalog_document, get_gpu
from sim.net.clusters import cluster_from_catalog
from sim.base.errors import InputError
from sim.cost.framework import Framework, get_framework
from sim.layers.ops import model_flops_per_step
from sim.data.hardware import Cluster
from sim.data.specs import Model, MoeSpec, Strategy
from sim.data.layout import megatron_layout
from sim.base.units import GIB

from planner.fitting.refcheck import check_row

FILES: tuple[tuple[str, str], ...] = (("published", "reference/published_runs.yaml"),
                                      ("dev", "reference/dev_runs.yaml"))


@dataclass(frozen=True, kw_only=True, slots=True)
class RefRun:
    """One reference row: its ``id``, the ``source`` it is scored with (leave-one-source-out
    groups), which ``file`` it comes from, and the raw record."""

    id: str
    source: str
    file: str
    raw: dict = field(compare=False, hash=False)


class NotSimulable(InputError):
    """A row that states too little to simulate, or needs a mechanism the model lacks."""

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__("run", run_id, reason)
        self.reason = reason
        self.args = (run_id, reason)


@functools.cache
def load_reference(file: str | None = None) -> tuple[RefRun, ...]:
    """Every reference row (or those of one ``file``: ``published`` or ``dev``), in file order."""
    out = []
    for name, path in FILES:
        if file is not None and name != file:
            continue
        for i, raw in enumerate(catalog_document(path)["runs"]):
            check_row(raw, file=path.rsplit("/", 1)[-1], index=i)  # file, row id and field on a bad value
            row = _thaw(raw)
            out.append(RefRun(id=row["id"], source=source_of(row), file=name, raw=row))
    return tuple(out)


def _thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value


def source_of(row: dict) -> str:
    """The source a row is scored with: the repository (development set) or the paper."""
    src = row["source"]
    if isinstance(src, dict):
        return src["repo"]
    text = str(src)
    for key, name in (("2104.04473", "narayanan2021"), ("Narayanan", "narayanan2021"),
                      ("2205.05198", "korthikanti2022"), ("Korthikanti", "korthikanti2022"),
                      ("torchtitan", "pytorch/torchtitan")):
        if key in text:
            return name
    raise InputError(f"run[{row.get('id')}].source", text[:60], "no source key for this row (reference.source_of)")


# --------------------------------------------------------------------------- hardware


_GPU_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("gb300",), "gb300-288gb"), (("gb200",), "gb200-186gb"), (("b300",), "b300-288gb"),
    (("b200",), "b200-180gb"), (("mi355x",), "mi355x-288gb"), (("mi350x",), "mi350x-288gb"),
    (("mi325x",), "mi325x-256gb"), (("mi300x",), "mi300x-192gb"), (("h800",), "h800-80gb"),
    (("a800",), "a800-80gb"), (("h200",), "h200-141gb"), (("h100", "96"), "h100-96gb"), (("h100",), "h100-80gb"),
    (("a100", "40"), "a100-40gb"), (("a100",), "a100-80gb"),
)


def gpu_id(row: dict) -> str:
    name = str(row["hardware"]["gpu"]).lower().replace(" ", "")
    for keys, gid in _GPU_RULES:
        if all(k in name for k in keys):
            return gid
    raise NotSimulable(row["id"], f"no catalog GPU for {row['hardware']['gpu']!r}")


def cluster_of(row: dict) -> Cluster:
    """The cluster a row ran on (module docstring: hardware rule)."""
    gpu = get_gpu(gpu_id(row))
    text = str(row.get("interconnect", "")).lower()
    nic = None
    if "hdr" in text or "200gb" in text.replace(" ", ""):
        nic = "ib-hdr-200"
    elif "roce" in text and "400" in text or ("rdma 400" in text and "infiniband" not in text):
        nic = "roce-400"
    elif "ndr" in text or "400" in text:
        nic = "ib-ndr-400"
    elif "roce" in text:
        nic = "roce-400"
    nics = None
    hit = re.search(r"(\d+)x connectx", text)
    if hit:
        nics = int(hit.group(1))
    gpn = int(row.get("gpus_per_node") or gpu.gpus_per_node)
    domain = 72 if "nvl72" in text else None
    if domain is None and gpn == gpu.gpus_per_node:
        domain = max(gpu.nvlink_domain_size, gpn)
    return cluster_from_catalog(gpu, int(row["num_gpus"]), gpus_per_node=gpn, nvlink_domain=domain, nic=nic,
                                nics_per_node=nics if nics is not None else (8 if nic == "ib-hdr-200" and gpn == 8
                                                                             else None))


# --------------------------------------------------------------------------- model


_GATED = ("swiglu", "geglu", "silu", "glu")


def model_of(row: dict) -> Model:
    """The row's model (module docstring: model rule)."""
    m = row["model"]
    name = str(m["name"])
    act = str(m.get("activation") or "").lower()
    llama_like = any(k in name.lower() for k in ("llama", "mistral", "mixtral", "qwen", "deepseek", "kimi"))
    if act:
        gated = any(k in act for k in _GATED) and "squared" not in act
    else:  # published rows without an activation key: GPT (GeLU, tied) or Llama (SwiGLU)
        gated = llama_like
    moe = None
    if m.get("moe"):
        spec = m["moe"]
        f_exp = int(spec["expert_ffn_hidden"])
        shared = int(spec.get("shared_experts") or 0)
        if shared and spec.get("shared_expert_ffn_hidden"):
            # shared experts wider than a routed one count as that many expert-sized ones
            shared = max(1, round(shared * int(spec["shared_expert_ffn_hidden"]) / f_exp))
        moe = MoeSpec(num_experts=int(spec["num_experts"]), top_k=int(spec["top_k"]), expert_ffn_hidden_size=f_exp,
                      num_shared_experts=shared, first_k_dense_layers=int(spec.get("dense_layers") or 0))
    mla = m.get("mla") or {}
    heads = int(m["heads"])
    tied = m.get("tied_embeddings")
    if tied is None:
        tied = not gated and not llama_like
    return Model(name=name, num_layers=int(m["layers"]), hidden_size=int(m["hidden"]), num_attention_heads=heads,
                 num_kv_heads=(int(m["kv_heads"]) if m.get("kv_heads") else None) if not mla else None,
                 head_dim=int(mla["qk_nope_head_dim"]) if mla else (int(m["head_dim"]) if m.get("head_dim") else None),
                 ffn_hidden_size=int(m.get("ffn_hidden") or (moe.expert_ffn_hidden_size if moe else 4 * m["hidden"])),
                 ffn_type="swiglu" if gated else "gelu", vocab_size=int(m["vocab"]), tied_embeddings=bool(tied),
                 moe=moe, position_embedding=m.get("position_embedding") or ("rope" if (gated or llama_like) else None),
                 dropout=m.get("dropout"),
                 q_lora_rank=int(mla["q_lora_rank"]) if mla.get("q_lora_rank") else None,
                 kv_lora_rank=int(mla["kv_lora_rank"]) if mla else None,
                 qk_rope_head_dim=int(mla.get("qk_rope_head_dim") or 0),
                 v_head_dim=int(mla["v_head_dim"]) if mla.get("v_head_dim") else None,
                 mtp_layers=_mtp_layers(row), linear_bias=_linear_bias(m, act, gated, llama_like),
                 **_local_attention(m))


def _local_attention(m: dict) -> dict:
    """Sliding-window layers (``Model.local_attention_window`` / ``local_attention_layers``) from
    the row's ``attention`` text: "sliding-window (W)" on every layer, or on half of them when
    it alternates with full attention (gpt-oss's config: ``layer_types`` alternating
    sliding_attention and full_attention, ``sliding_window`` 128)."""
    text = _text(m.get("attention"))
    hit = re.search(r"sliding[- ]window\D{0,3}(\d+)", text)
    if not hit:
        return {}
    layers = int(m["layers"])
    return {"local_attention_window": int(hit.group(1)),
            "local_attention_layers": layers // 2 if "alternating" in text else layers}


def _linear_bias(m: dict, act: str, gated: bool, llama_like: bool) -> bool:
    """Biased linears (``Model.linear_bias``): the row's ``linear_bias``, else a GPT row's (a plain
    GeLU MLP, not Llama-like): GPT-2/GPT-3 carry biases on every linear, as Megatron-LM's GPT does
    by default (``--add-bias-linear``; its Llama and Nemotron recipes pass ``--disable-bias-linear``,
    and Nemotron-4 has no biases, Parmar et al. 2024 Sec. 2)."""
    if m.get("linear_bias") is not None:
        return bool(m["linear_bias"])
    return not gated and not llama_like and "squared" not in act and "geglu" not in act


def _nemo_deepseek_v3_recipe(row: dict) -> bool:
    """A row run with NeMo 2.0's DeepSeek-V3 performance recipe whose notes say the pipeline split
    and MTP are that recipe's defaults (not restated by the source)."""
    return ("deepseek-v3" in _text(row["model"].get("name")) and "nemo" in _text(row.get("framework"))
            and bool(re.search(r"pp layout[^;]*?mtp[^;]*?recipe defaults", _text(row.get("notes")))))


def _mtp_layers(row: dict) -> int:
    """Multi-token-prediction depth: the row's ``mtp_layers``, else the recipe's default where the
    row says it ran one: NeMo 25.04's ``deepseek_v3.pretrain_recipe(use_mtp=True)`` builds
    ``DeepSeekV3Config(mtp_num_layers=1)`` (nemo/collections/llm/recipes/deepseek_v3.py, v2.3.0),
    which scripts/performance/llm/pretrain_deepseek_v3.py calls with its defaults."""
    stated = row["model"].get("mtp_layers")
    if stated is not None:
        return int(stated)
    return 1 if _nemo_deepseek_v3_recipe(row) else 0


# --------------------------------------------------------------------------- framework


def framework_of(row: dict) -> Framework:
    """The profile the row's ``framework`` text names (module docstring)."""
    text = str(row.get("framework", "")).lower()
    src = row["source"] if isinstance(row["source"], str) else ""
    if "torchtitan" in text:
        return get_framework("torchtitan-compile" if row["strategy"].get("torch_compile") else "torchtitan")
    if "maxtext" in text:
        return get_framework("maxtext")
    if "automodel" in text:
        return get_framework("automodel")
    if "hf transformers" in text and "deepspeed" in text:
        return get_framework("deepspeed-hf")
    if "megatron-deepspeed" in text:
        return get_framework("megatron-deepspeed-fa2" if "flash-attn" in text else "megatron-deepspeed")
    if "mlperf v5.1 nemo implementation" in text:  # NVIDIA's MLPerf NeMo 2 code of 2025 as submitted (Cisco v5.1)
        return get_framework("nemo-mlperf-2025")
    if "nemo" in text:
        # the container version decides the era profile (catalogs/frameworks.yaml, each with its source)
        version = re.search(r"(?:nemo(?:\s+framework)?|fw_version)\s*(2[45])\.(\d\d)", text)
        yy, mm = (int(version.group(1)), int(version.group(2))) if version else (0, 0)
        nemo1 = "launcher" in text or "launch.sh" in text  # NeMo Framework Launcher / NeMo 1 scripts
        if yy == 24 and 3 <= mm <= 7:  # NeMo Framework Launcher with cuDNN attention off
            return get_framework("nemo-launcher-2024")
        if yy == 24 and mm >= 9 and nemo1:  # NeMo 1 scripts: eager loss and MoE permutation
            return get_framework("nemo-launcher-2024h2")
        if yy == 25 and 2 <= mm <= 7:  # Transformer Engine 2.0-2.5: fused attention <= head dim 128 on Blackwell
            return get_framework("nemo-2025h1")
        return get_framework("nemo")
    if "megatron-core" in text or "core_v" in text or "flagscale" in text:
        return get_framework("megatron-core-fa2" if "flash-attn 2" in text else "megatron-core")
    if "megatron" in text:
        # Both published Megatron sources predate FlashAttention; they ran the code of their
        # year (SC'21: grad hook accumulation; 2022: gradient-accumulation fusion).
        return get_framework("megatron-lm-2022" if "2205.05198" in src else "megatron-lm-2021")
    raise NotSimulable(row["id"], f"no framework profile for {row.get('framework')!r}")


# --------------------------------------------------------------------------- strategy


@dataclass(frozen=True, kw_only=True, slots=True)
class Mapped:
    """What a row states, as the simulator's inputs: the ``Strategy`` keywords (``mbs`` / ``vp``
    absent where unstated), ``Plan`` keywords beyond the framework profile, and the assumptions
    made by rule."""

    strategy: dict[str, Any]
    plan: dict[str, Any]
    assumptions: tuple[str, ...]
    interleaved_unstated: bool = False  # the source says interleaved but not how many chunks


def _text(v: object) -> str:
    return "" if v is None else str(v).lower()


def precision_of(row: dict, fw: Framework) -> tuple[str, str]:
    """(precision, fp8 recipe) from the ``precision`` text (module docstring)."""
    t = _text(row["strategy"].get("precision"))
    if "mxfp8" in t:
        return "fp8", "mxfp8"
    if "fp8" in t or "float8" in t:
        if "block" in t:
            return "fp8", "blockwise"
        if "tensorwise" in t or "current" in t or "torchao" in t or fw.id.startswith("torchtitan"):
            return "fp8", "tensorwise"  # torchao float8's default (dynamic tensorwise scaling)
        return "fp8", "delayed"  # Transformer Engine / Megatron-Core default recipe
    if "fp16" in t and "bf16" not in t:
        return "fp16", "delayed"
    return "bf16", "delayed"


def fp8_params_of(row: dict) -> bool:
    """Whether the ``precision`` text names fp8 parameters (NeMo ``fp8_params``, MLPerf's
    ``FP8_PARAMS``, Megatron-Core's fp8 param gather)."""
    t = _text(row["strategy"].get("precision"))
    return "fp8_param" in t or "fp8 param" in t


def recompute_unstated(row: dict) -> bool:
    """Whether the row says nothing about recomputation (``planner.fitting.published`` then reads
    none, unless the plan cannot fit without it)."""
    return not _text(row["strategy"].get("recompute"))


def recompute_of(row: dict, fw: Framework) -> tuple[str, str | None]:
    """(recompute, selective policy or None for the framework's) from the ``recompute`` text."""
    t = _text(row["strategy"].get("recompute"))
    if not t or t.startswith("none") or t == "false":
        return "none", None
    if "save_dot_except_mlpwi" in t:
        return "selective", "mlp_up"  # MaxText remat: every dot output saved except the MLP input projection
    if "save_dot_except_mlp" in t:
        return "selective", "mlp"
    if "activation_checkpointing: true" in t or t.startswith("full") or "full" in t.split("(")[0]:
        return "full", None
    if "selective" in t:
        if "mla_up_proj" in t:
            return "selective", "mla_up_proj"
        if "moe_act" in t:
            return "selective", "moe_act"
        return "selective", None
    raise NotSimulable(row["id"], f"recomputation {row['strategy'].get('recompute')!r} not understood")


def _overlap(row: dict) -> dict[str, bool]:
    t = _text(row["strategy"].get("overlap"))
    out: dict[str, bool] = {}
    if "tp_comm_overlap" in t or "tp comm overlap" in t:
        out["tp_overlap"] = not re.search(r"no (tp|ub_tp)[ _]comm[ _]overlap|ub_tp_comm_overlap false|no tp overlap", t)
    elif "no tp overlap" in t:
        out["tp_overlap"] = False
    if "a2a_overlap=1" in t:
        out["ep_overlap"] = True
    if "overlap_p2p_comm" in t:
        out["pp_overlap"] = True
    if "cuda graph" in t or "cuda_graph=true" in t:
        out["cuda_graphs"] = not re.search(r"cuda graphs off|no cuda graph", t)
    return out


def strategy_of(row: dict, fw: Framework, *, unstated_vp_searched: bool) -> Mapped:
    """The strategy a row ran (module docstring: strategy rule).  ``unstated_vp_searched``: a
    pipelined row without ``vp`` states interleaving without its depth (the published file's
    Narayanan et al. rows: "interleaved 1F1B ... for all Table 1 runs"); in the development set
    the recipes print VP when they interleave, so no ``vp`` means none."""
    s = row["strategy"]
    notes: list[str] = []
    tp, pp, cp = int(s.get("tp") or 1), int(s.get("pp") or 1), int(s.get("cp") or 1)
    n = int(row["num_gpus"])
    dp = int(s.get("dp") or n // (tp * pp * cp))
    precision, recipe = precision_of(row, fw)
    recompute, policy = recompute_of(row, fw)
    values: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": int(s.get("ep") or 1),
                              "gbs": int(s["global_batch"]), "seq_len": int(row["model"]["seq_len"]),
                              "recompute": recompute, "precision": precision, "dp_overlap": fw.dp_overlap}
    if precision == "fp8":
        values["fp8_recipe"] = recipe
        if fp8_params_of(row) and fw.capabilities.fp8_params:
            values["fp8_params"] = True
        elif recipe in fw.fp8_params_recipes and fw.capabilities.fp8_params:
            values["fp8_params"] = True
            notes.append(f"fp8 parameters (the framework's {recipe} fp8 recipe default)")
    if s.get("etp"):
        values["etp"] = int(s["etp"])
    sp = s.get("sequence_parallel")
    if sp is None and tp > 1 and fw.sequence_parallel_default:
        sp = True
        notes.append("sequence parallelism on with tp > 1 (the framework's recipe default)")
    values["sp"] = bool(sp) and tp > 1
    fsdp = s.get("fsdp")
    if isinstance(fsdp, str) or fsdp is True:
        values["zero"] = 3
    elif isinstance(fsdp, int) and fsdp > 1:
        values["zero"] = 3
        if fsdp * cp < dp * cp and fsdp < dp:
            values["dp_shard"] = fsdp
    elif s.get("zero_stage") is not None:
        values["zero"] = int(s["zero_stage"])
    else:
        values["zero"] = fw.zero_default if dp * cp > 1 else 0
        if fw.zero_default:
            notes.append(f"ZeRO-{fw.zero_default} (the framework's distributed optimizer by default)")
    values.update(_overlap(row))
    if fw.tp_overlap_default and tp > 1 and "tp_overlap" not in values and values["sp"]:
        values["tp_overlap"] = True
        notes.append("TP communication overlap on (the framework's recipe default with tp > 1 and SP)")
    if s.get("micro_batch"):
        values["mbs"] = int(s["micro_batch"])
    elif s.get("local_batch"):
        values["mbs"] = int(s["local_batch"])
    interleaved_unstated = False
    if s.get("vp") and int(s["vp"]) > 1:
        values["vp"] = int(s["vp"])
        values["schedule"] = "interleaved"
    elif s.get("vp") is None and pp > 1 and unstated_vp_searched and not _interleaving_stated_for_others(row):
        interleaved_unstated = True
    elif pp > 1 or s.get("vp"):
        values["vp"] = 1
        if _interleaving_stated_for_others(row):
            notes.append("non-interleaved: the source states interleaving only for other model sizes")
    plan: dict[str, Any] = {}
    if policy is not None:
        plan["selective_policy"] = policy
    if values.get("cuda_graphs") and re.search(r"cuda graphs? \(attn\b", _text(s.get("overlap"))):
        # Megatron-Core --cuda-graph-scope attn moe_router moe_preprocess: the attention block and
        # the router are captured, the experts and their dispatch run eagerly
        plan["cuda_graph_scope"] = "attention"
        notes.append("CUDA graphs of the attention block and the MoE router only (--cuda-graph-scope attn "
                     "moe_router moe_preprocess)")
    if re.search(r"\bflex\s*-?\s*attn\b|\bflexattention\b|\bflex attention\b", _text(row.get("framework"))) \
            and "flex" in fw.attention_kernels:
        # the kernels the row names: FlexAttention (NeMo Automodel's gpt-oss configs: backend attn: flex)
        plan["attention"] = "flex"
        notes.append("FlexAttention (the row's kernels)")
    if row.get("nccl"):  # the run's NCCL release: its NVLS buffers and their scope (runtime.yaml nvls_by_release)
        plan["nccl"] = str(row["nccl"])
        notes.append(f"NCCL {row['nccl']}")
    if row["model"].get("moe") and fw.id == "automodel" and "fake balanced gate" in _text(row.get("notes")):
        # NeMo Automodel's FakeBalancedGate routes token t to experts (t k + j) mod E (sim.layers.moe_routing)
        plan["moe_routing"] = "contiguous"
        notes.append("routing of Automodel's FakeBalancedGate (consecutive experts per token)")
    if _nemo_deepseek_v3_recipe(row) and pp > 1 and not s.get("vp"):
        # scripts/performance/llm/pretrain_deepseek_v3.py (NeMo v2.3.0, lines 72-75): 64 // pp - 1
        # decoder layers on the first stage (it also embeds), 64 // pp - 2 on the last (loss and MTP)
        per = 64 // pp
        values["pipeline_layout"] = megatron_layout(int(row["model"]["layers"]), pp, first=per - 1, last=per - 2)
        notes.append(f"NeMo DeepSeek-V3 recipe's pipeline split: {per - 1} layers first, {per - 2} last, MTP depth 1")
    if _nemo_deepseek_v3_recipe(row):
        # NeMo 2's performance script for DeepSeek-V3 at dgxc-benchmarking 25.05's commit (7a8f1cc)
        # calls pretrain_recipe() without performance_mode, so its bf16 runs keep the recipe's fp32
        # gradient buffer (fp8 runs still get grad_reduce_in_fp32=False from set_primary_perf_configs)
        plan["state_layout"] = "megatron_remainders_fp32_grads"  # its bf16 runs: precision-aware optimizer too
        plan["fp8_state_layout"] = "megatron_bf16_grads"
    if fw.pipeline_schedule_per == "local_batch" and pp > 1 and s.get("local_batch"):
        # one pipeline schedule (fill and drain) per gradient-accumulation step (sim.cost.step.compose)
        flushes = int(s["global_batch"]) // (int(s["local_batch"]) * dp)
        if flushes > 1:
            plan["pipeline_flushes"] = flushes
            notes.append(f"{flushes} pipeline schedules per step, one per local batch of {s['local_batch']}")
    return Mapped(strategy=values, plan=plan, assumptions=tuple(notes), interleaved_unstated=interleaved_unstated)


def _interleaving_stated_for_others(row: dict) -> bool:
    """True when the notes say which model sizes used the interleaved schedule and this run's
    model is not one of them (Korthikanti et al.: "for 175B and 530B" only)."""
    hit = re.search(r"[Ii]nterleaved schedule[^.]*? for ([0-9A-Za-z., ]+?)(?:\.|$)", row.get("notes", ""))
    if not hit:
        return False
    sizes = re.findall(r"\d+(?:\.\d+)?[BT]", hit.group(1))
    name = row["model"]["name"]
    return bool(sizes) and not any(re.search(rf"\b{re.escape(x)}\b", name) for x in sizes)


# --------------------------------------------------------------------------- what was published



@dataclass(frozen=True, kw_only=True, slots=True)
class Published:
    step_time_s: float | None  # None: the row publishes no throughput (memory only)
    mfu: float | None
    hfu: float | None
    memory_bytes: float | None
    memory_kind: str  # "allocated" | "reserved" (PyTorch peaks) | "device" (nvidia-smi used) | "none"
    how: str  # how the step time was derived from what the source prints
    out_of_memory: bool = False  # the source reports the run did not fit


def narayanan_eq3_flops(gbs: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 eq. (3): ``96 B s l h^2 (1 + s/6h + V/16lh)`` (counts full
    recomputation)."""
    return 96 * gbs * seq * layers * hidden * hidden * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def megatron_flops(model: Model, gbs: int, seq: int) -> float:
    """Megatron-Core's ``num_floating_point_operations`` (megatron/training/training.py, 2025
    dev branch): 3 passes x 2 FLOPs per MAC over the MLP (dense layers, routed top-k and shared
    experts), attention projections (GQA or MLA), the causal half of the score and value
    products, and the logits."""
    h, L = model.hidden_size, model.num_layers
    ffn_mult = 3 if model.ffn_type == "swiglu" else 2
    moe = model.moe
    n_moe = model.num_moe_layers
    n_dense = L - n_moe
    mlp = model.ffn_hidden_size * ffn_mult * n_dense
    if moe is not None:
        mlp += (moe.expert_ffn_hidden_size * moe.top_k + moe.expert_ffn_hidden_size * moe.num_shared_experts) \
            * ffn_mult * n_moe
    a = model.num_attention_heads
    if model.is_mla:
        qk, rope, v, r = model.dim_per_head, model.qk_rope_head_dim, model.v_dim_per_head, model.kv_lora_rank
        rq = model.q_lora_rank
        q_term = h * a * (qk + rope) if rq is None else rq * (h + a * (qk + rope) + 1)
        attn = (q_term + r * (h + a * (qk + v) + 1) + h * rope + a * v * h
                + seq * a * (qk + rope) / 2 + seq * a * v / 2)
    else:
        d = model.dim_per_head
        q, kv = d * a, d * model.kv_heads
        attn = h * (q + 2 * kv) + q * seq / 2 * 2 + q * h
    per_token = 6 * (h * mlp + attn * L + h * model.vocab_size)
    return gbs * seq * per_token


def nemo_2403_llama_flops(model: Model, gbs: int, seq: int) -> float:
    """NeMo 24.03's Llama-2 model FLOPs (``flops_formulas.llama2``, before the causal factor
    arrived in NeMo 2.x): ``B s L h^2 (12 + 12 g/a + 18 f/h + 12 s/h + 6 V/(L h))``."""
    h, L = model.hidden_size, model.num_layers
    g, a = model.kv_heads, model.num_attention_heads
    return gbs * seq * L * h * h * (12 + 12 * g / a + 18 * model.ffn_hidden_size / h + 12 * seq / h
                                    + 6 * model.vocab_size / (L * h))


def published_of(row: dict, model: Model, strategy: Strategy) -> Published:
    """The published step time and memory (module docstring: published rule)."""
    me, n = row["measured"], int(row["num_gpus"])
    gbs, seq = strategy.gbs, strategy.seq_len
    mem = me.get("memory_gib_per_gpu")
    notes = str(row.get("notes", "")).lower()
    kind = str(me.get("memory_kind") or "")
    if mem is None:
        mem_kind = "none"
    elif "device" in kind or "nvidia-smi" in kind:
        mem_kind = "device"
    elif "reserved" in kind:
        mem_kind = "reserved"
    elif "allocated" in kind:
        mem_kind = "allocated"
    else:  # every row that publishes memory says at which level (catalogs/reference/README.md)
        raise NotSimulable(row["id"], f"memory_gib_per_gpu without a memory_kind (allocated, reserved or device): {kind!r}")
    mem_b = mem * GIB if mem is not None else None
    common = dict(mfu=me.get("mfu"), hfu=me.get("hfu"), memory_bytes=mem_b, memory_kind=mem_kind)
    if "out-of-memory" in notes or "out of memory" in notes:
        return Published(step_time_s=None, how="the source reports the run out of memory", out_of_memory=True,
                         **common)
    if me.get("iteration_time_s") is not None:
        return Published(step_time_s=float(me["iteration_time_s"]), how="iteration time as published", **common)
    if me.get("tokens_per_s_per_gpu") is not None:
        return Published(step_time_s=gbs * seq / (n * float(me["tokens_per_s_per_gpu"])),
                         how="gbs*seq/(N*tokens_per_s_per_gpu)", **common)
    if me.get("tflops_per_gpu") is not None:
        tflops = float(me["tflops_per_gpu"]) * 1e12 * n
        if "megatron flop convention" in notes:
            f, how = megatron_flops(model, gbs, seq), "Megatron num_floating_point_operations / (N * tflops_per_gpu)"
        elif "nemo tflops convention" in notes:
            f, how = nemo_2403_llama_flops(model, gbs, seq), "NeMo 24.03 llama2 FLOPs / (N * tflops_per_gpu)"
        else:
            m = row["model"]
            f = narayanan_eq3_flops(gbs, seq, int(m["layers"]), int(m["hidden"]), int(m["vocab"]))
            how = "Narayanan eq.(3) FLOPs / (N * tflops_per_gpu)"
        return Published(step_time_s=f / tflops, how=how, **common)
    if me.get("mfu") is not None:
        peak = row["hardware"].get("peak_dense_16bit_tflops_used_by_source") or get_gpu(gpu_id(row)).peak_flops_per_s(
            "bf16") / 1e12
        f = model_flops_per_step(model, strategy)  # the MFU numerator (PaLM / Korthikanti et al.)
        return Published(step_time_s=f / (n * peak * 1e12 * float(me["mfu"])),
                         how="model FLOPs / (N * peak * published MFU)", **common)
    raise NotSimulable(row["id"], "no throughput figure to compare with")
