"""Parse a ``Model`` from a project model file or a Hugging Face ``config.json`` (and the YAML/JSON
file reader the catalog loader uses); ``sim.data.models.load_model`` adds catalog ids.  It imports
nothing of the catalog, so ``sim.data.catalog`` builds its models with ``model_from_dict``.

The project schema (YAML or JSON) is the one
in ``catalogs/models.yaml`` and ``docs/interface.md``; unknown keys are rejected so that a typo
(``hiden_size``) does not silently fall back to a default.  Hugging Face configs carry dozens
of keys that do not matter here, so unknown keys are ignored there; the architecture is
recognised by its keys:

* Llama / Mistral / Mixtral / Qwen2 / Qwen3 (+MoE) / Gemma / Phi-3: ``num_hidden_layers``,
  ``hidden_size``, ``intermediate_size``, ``num_key_value_heads``, ``head_dim``; their MLP is
  gated (3 matrices), which ``Model`` calls ``swiglu`` whatever the activation.
* DeepSeek-V2/V3: the above plus multi-head latent attention (``q_lora_rank``,
  ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``) and MoE
  (``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``,
  ``first_k_dense_replace``, ``moe_layer_freq``).  The multi-token-prediction module
  (``num_nextn_predict_layers``) is not part of the model.
* GPT-2 / GPT-J / BigCode: ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (default 4h).
* GPT-NeoX / Pythia: Llama-style key names with a plain GELU MLP.
* Sliding-window attention (Mistral, Gemma 2/3, gpt-oss): ``sliding_window`` on the layers
  ``layer_types`` marks ``sliding_attention``, else all but every ``sliding_window_pattern``-th,
  every other for Gemma 2, or all; ignored where ``use_sliding_window`` is false (Qwen2/3).

Every malformed input raises ``InputError`` naming the key (``model.hidden_size``) and the
value; nothing else escapes.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from sim.base.errors import InputError, printable_value
from sim.base.checks import MAX_DIM
from sim.data.specs import FFN_TYPES, Model, MoeSpec

MAX_FILE_BYTES = 4 * 1024 * 1024
"""Model files larger than this are rejected (a config.json is a few kB)."""

MAX_SEQ_LEN = 1 << 30

MODEL_KEYS: tuple[str, ...] = (
    "name", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
    "ffn_hidden_size", "ffn_type", "vocab_size", "tied_embeddings", "moe", "max_seq_len",
    "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "mtp_layers", "linear_bias",
    "dropout", "position_embedding", "local_attention_window", "local_attention_layers", "source",
)
"""Keys of the project model schema (see catalogs/README.md for defaults)."""

METADATA_KEYS: tuple[str, ...] = (
    "id", "aliases", "notes", "published_params_b", "published_active_params_b",
)
"""Catalog bookkeeping keys, accepted in model files and ignored."""

MOE_KEYS: tuple[str, ...] = (
    "num_experts", "top_k", "expert_ffn_hidden_size", "num_shared_experts", "layer_frequency",
    "first_k_dense_layers",
)

# Hugging Face model types whose MLP is gated (gate, up, down projections).
_GATED_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
    "deepseek_v3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo", "olmo2", "olmoe", "granite",
    "granitemoe", "cohere", "internlm2", "yi", "baichuan", "minicpm", "stablelm", "exaone",
    "dbrx", "jamba", "glm", "glm4", "hunyuan", "ernie4_5",
})
# ... and those whose MLP is a plain two-matrix one.
_PLAIN_MLP_MODEL_TYPES = frozenset({
    "gpt2", "gptj", "gpt_neo", "gpt_neox", "gpt_bigcode", "opt", "bloom", "falcon", "starcoder2",
    "phi", "mpt", "codegen",
})
# tie_word_embeddings default when a config omits it (the model class's own default).
_TIED_BY_DEFAULT = frozenset({"gpt2", "gpt_neo", "gpt_bigcode", "gemma", "gemma2", "gemma3_text",
                              "opt", "bloom", "falcon", "mpt", "starcoder2"})
# Model classes whose four linears (QKV, projection, both MLP linears) carry biases unless the
# config says otherwise (``Model.linear_bias``): GPT-2 (Conv1D with bias), GPT-BigCode, OPT
# (enable_bias, default true), BLOOM, Phi, StarCoder2 (use_bias, default true), GPT-NeoX
# (attention_bias, default true).  Models that bias only some linears (Qwen2's QKV, GPT-J's MLP)
# are read as unbiased: the model prices all four or none.
_BIASED_BY_DEFAULT = frozenset({"gpt2", "gpt_bigcode", "opt", "bloom", "phi", "starcoder2", "gpt_neox"})
_BIAS_SWITCHES = ("enable_bias", "use_bias", "bias")  # OPT, StarCoder2, Falcon


def _hf_linear_bias(d: Mapping[str, Any], where: str, model_type: str | None) -> bool:
    """Whether every linear of a Hugging Face config's layer is biased (``Model.linear_bias``):
    Llama-style ``attention_bias`` and ``mlp_bias`` both set, MPT's ``no_bias`` false, a model
    class's own switch (``_BIAS_SWITCHES``), else the class default (``_BIASED_BY_DEFAULT``)."""
    if "attention_bias" in d and "mlp_bias" in d:
        return _bool(d, "attention_bias", where, default=False) and _bool(d, "mlp_bias", where, default=False)
    if "no_bias" in d:
        return not _bool(d, "no_bias", where, default=True)
    for key in _BIAS_SWITCHES:
        if key in d:
            return _bool(d, key, where, default=False)
    return model_type in _BIASED_BY_DEFAULT


_HF_MARKERS = ("model_type", "architectures", "transformers_version", "num_hidden_layers",
               "n_layer", "n_embd", "text_config")


# --------------------------------------------------------------------------- public API


def model_from_dict(d: Mapping[str, Any], *, where: str = "model", default_name: str | None = None) -> Model:
    """Build a ``Model`` from a parsed project-schema or Hugging Face mapping.

    ``where`` (a file name, a catalog id) prefixes error messages.  The name defaults to
    ``default_name``, else ``where``'s stem, when the mapping has none.
    """
    return _from_mapping(d, where=where, default_name=default_name or Path(str(where)).stem or "model")


# libyaml's parser with PyYAML's safe constructor (the same values as yaml.safe_load, ~10x
# faster: the catalogs are parsed on every command) where PyYAML was built with it
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_structured_file(path: str | os.PathLike[str], *, field: str = "file",
                         max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Parse a YAML or JSON file (by suffix; YAML otherwise) with size and type guards.

    Raises ``InputError(field, path, ...)`` for a missing, special, oversized, binary or
    unparsable file.  Returns whatever the document holds (the caller checks its shape).
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise _err(field, str(p), "is not a regular file")
        size = p.stat().st_size
        if size > max_bytes:
            raise _err(field, str(p), f"is {size} bytes; files over {max_bytes} bytes are rejected")
        with open(p, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except InputError:
        raise
    except (OSError, ValueError) as exc:
        raise _err(field, str(p), f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if len(raw) > max_bytes:
        raise _err(field, str(p), f"is larger than {max_bytes} bytes")
    if b"\x00" in raw:
        raise _err(field, str(p), "is a binary file, not YAML or JSON text")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _err(field, str(p), f"is not UTF-8 text (byte {exc.start})") from None
    if p.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except Exception as exc:  # ValueError, RecursionError, too-long integers
            raise _err(field, str(p), f"is not valid JSON: {_first_line(exc)}") from None
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)
    except Exception as exc:  # yaml.YAMLError, RecursionError, bad timestamps (ValueError)
        raise _err(field, str(p), f"is not valid YAML: {_first_line(exc)}") from None


# --------------------------------------------------------------------------- dispatch


def _from_mapping(d: Any, *, where: str, default_name: str) -> Model:
    if not isinstance(d, Mapping):
        raise _err("model", _type_name(d), f"{where}: must be a mapping of keys to values, got {_type_name(d)}")
    for key in d:
        if not isinstance(key, str):
            raise _err(f"model.{printable_value(key)}", d[key], f"{where}: keys must be strings")
    if any(k in d for k in _HF_MARKERS):
        return _from_hf(d, where=where, default_name=default_name)
    return _from_project(d, where=where, default_name=default_name)


# --------------------------------------------------------------------------- project schema


def _from_project(d: Mapping[str, Any], *, where: str, default_name: str) -> Model:
    allowed = set(MODEL_KEYS) | set(METADATA_KEYS)
    for key in d:
        if key not in allowed:
            raise _err(f"model.{key}", d[key], f"{where}: unknown key{_suggest(key, MODEL_KEYS)}")
    name = _str(d, "name", where, default=None)
    if name is None:
        ident = d.get("id")
        name = ident if isinstance(ident, str) and ident.strip() else default_name
    num_layers = _int(d, "num_layers", where)
    hidden = _int(d, "hidden_size", where)
    heads = _int(d, "num_attention_heads", where)
    ffn_type = _choice(d, "ffn_type", where, FFN_TYPES, default="gelu")
    moe = _moe_from_project(d.get("moe"), where) if d.get("moe") is not None else None
    ffn = _int(d, "ffn_hidden_size", where, required=False)
    if ffn is None:
        if ffn_type == "gelu":
            ffn = 4 * hidden
        elif moe is not None and moe.first_k_dense_layers == 0:
            ffn = moe.expert_ffn_hidden_size
        else:
            raise _err("model.ffn_hidden_size", None,
                             f"{where}: required for ffn_type=swiglu (defaults to 4*hidden_size only for gelu)")
    kwargs: dict[str, Any] = dict(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=_int(d, "num_kv_heads", where, required=False),
        head_dim=_int(d, "head_dim", where, required=False),
        ffn_hidden_size=ffn,
        ffn_type=ffn_type,
        vocab_size=_int(d, "vocab_size", where),
        tied_embeddings=_bool(d, "tied_embeddings", where, default=False),
        moe=moe,
        max_seq_len=_int(d, "max_seq_len", where, required=False, maximum=MAX_SEQ_LEN),
        q_lora_rank=_int(d, "q_lora_rank", where, required=False),
        kv_lora_rank=_int(d, "kv_lora_rank", where, required=False),
        qk_rope_head_dim=_int(d, "qk_rope_head_dim", where, required=False, minimum=0) or 0,
        v_head_dim=_int(d, "v_head_dim", where, required=False),
        mtp_layers=_int(d, "mtp_layers", where, required=False, minimum=0) or 0,
        linear_bias=_bool(d, "linear_bias", where, default=False),
        dropout=_bool(d, "dropout", where, default=None),
        position_embedding=_str(d, "position_embedding", where, default=None),
        local_attention_window=_int(d, "local_attention_window", where, required=False),
        local_attention_layers=_int(d, "local_attention_layers", where, required=False, minimum=0) or 0,
        source=_str(d, "source", where, default="") or "",
    )
    if kwargs["q_lora_rank"] is not None and kwargs["kv_lora_rank"] is None:
        raise _err("model.q_lora_rank", kwargs["q_lora_rank"], f"{where}: needs kv_lora_rank (MLA)")
    # Metadata keys: check their types so a catalog typo does not pass unnoticed.
    _str(d, "id", where, default=None)
    _str(d, "notes", where, default=None)
    if d.get("aliases") is not None and (not isinstance(d["aliases"], list)
                                         or not all(isinstance(a, str) for a in d["aliases"])):
        raise _err("model.aliases", d["aliases"], f"{where}: must be a list of strings")
    for key in ("published_params_b", "published_active_params_b"):
        if d.get(key) is not None:
            _positive_number(d, key, where)
    return _build(kwargs, where, {})


def _moe_from_project(m: Any, where: str) -> MoeSpec:
    if not isinstance(m, Mapping):
        raise _err("model.moe", m, f"{where}: must be a mapping with {', '.join(MOE_KEYS)}")
    for key in m:
        if key not in MOE_KEYS:
            raise _err(f"model.moe.{key}", m[key], f"{where}: unknown key{_suggest(str(key), MOE_KEYS)}")
    return _build_moe(dict(
        num_experts=_int(m, "num_experts", where, prefix="model.moe"),
        top_k=_int(m, "top_k", where, prefix="model.moe"),
        expert_ffn_hidden_size=_int(m, "expert_ffn_hidden_size", where, prefix="model.moe"),
        num_shared_experts=_int(m, "num_shared_experts", where, prefix="model.moe", required=False,
                                minimum=0) or 0,
        layer_frequency=_int(m, "layer_frequency", where, prefix="model.moe", required=False) or 1,
        first_k_dense_layers=_int(m, "first_k_dense_layers", where, prefix="model.moe", required=False,
                                  minimum=0) or 0,
    ), where, {})


# --------------------------------------------------------------------------- Hugging Face


_HF_FIELD_NAMES = {
    "model.num_layers": "model.num_hidden_layers",
    "model.num_kv_heads": "model.num_key_value_heads",
    "model.ffn_hidden_size": "model.intermediate_size",
    "model.max_seq_len": "model.max_position_embeddings",
    "model.tied_embeddings": "model.tie_word_embeddings",
    "model.local_attention_window": "model.sliding_window",
    "model.local_attention_layers": "model.layer_types",
}
_GPT2_FIELD_NAMES = {
    "model.num_layers": "model.n_layer",
    "model.hidden_size": "model.n_embd",
    "model.num_attention_heads": "model.n_head",
    "model.ffn_hidden_size": "model.n_inner",
    "model.max_seq_len": "model.n_positions",
}


def _from_hf(d: Mapping[str, Any], *, where: str, default_name: str, nested: bool = False) -> Model:
    text_config = d.get("text_config")
    if "num_hidden_layers" not in d and "n_layer" not in d and text_config is not None and not nested:
        if not isinstance(text_config, Mapping):
            raise _err("model.text_config", text_config, f"{where}: must be a mapping")
        for key in text_config:
            if not isinstance(key, str):
                raise _err(f"model.text_config.{printable_value(key)}", text_config[key], f"{where}: keys must be strings")
        return _from_hf(text_config, where=f"{where} (text_config)", default_name=default_name, nested=True)
    model_type = d.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise _err("model.model_type", model_type, f"{where}: must be a string")
    model_type = (model_type or "").lower()
    name = d.get("_name_or_path")
    if not isinstance(name, str) or not name.strip():
        name = default_name
    name = name.strip().rstrip("/").split("/")[-1] or default_name
    if "n_layer" in d or "n_embd" in d:
        return _from_hf_gpt2(d, where=where, name=name, model_type=model_type)

    num_layers = _int(d, "num_hidden_layers", where)
    hidden = _int(d, "hidden_size", where)
    heads = _int(d, "num_attention_heads", where)
    act = d.get("hidden_act", d.get("hidden_activation"))
    if model_type in _GATED_MODEL_TYPES:
        gated = True
    elif model_type in _PLAIN_MLP_MODEL_TYPES:
        gated = False
    else:
        gated = isinstance(act, str) and act.lower() in ("silu", "swish", "swiglu")
    mla = d.get("kv_lora_rank") is not None
    moe = _hf_moe(d, where)
    ffn = _int(d, "intermediate_size", where, required=False)
    if ffn is None:
        if moe is not None:
            ffn = moe.expert_ffn_hidden_size
        elif not gated:
            ffn = 4 * hidden
        else:
            raise _err("model.intermediate_size", None, f"{where}: missing required key")
    kwargs: dict[str, Any] = dict(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=None if mla else _int(d, "num_key_value_heads", where, required=False),
        head_dim=_int(d, "qk_nope_head_dim" if mla else "head_dim", where, required=mla),
        ffn_hidden_size=ffn,
        ffn_type="swiglu" if gated else "gelu",
        vocab_size=_int(d, "vocab_size", where),
        tied_embeddings=_bool(d, "tie_word_embeddings", where, default=model_type in _TIED_BY_DEFAULT),
        linear_bias=_hf_linear_bias(d, where, model_type),
        moe=moe,
        max_seq_len=_int(d, "max_position_embeddings", where, required=False, maximum=MAX_SEQ_LEN),
        source=f"Hugging Face config ({where})",
    )
    kwargs["local_attention_window"], kwargs["local_attention_layers"] = _hf_sliding_window(d, where, model_type,
                                                                                            num_layers)
    if mla:
        kwargs.update(
            q_lora_rank=_int(d, "q_lora_rank", where, required=False),
            kv_lora_rank=_int(d, "kv_lora_rank", where),
            qk_rope_head_dim=_int(d, "qk_rope_head_dim", where, required=False, minimum=0) or 0,
            v_head_dim=_int(d, "v_head_dim", where, required=False),
        )
        kwargs["field_map"] = {"model.head_dim": "model.qk_nope_head_dim"}
    field_map = {**_HF_FIELD_NAMES, **kwargs.pop("field_map", {})}
    return _build(kwargs, where, field_map)


# Hugging Face model types whose sliding window applies to every other layer when the config
# lists no layer_types (transformers' Gemma 2: even layers local)
_ALTERNATING_WINDOW_MODEL_TYPES = frozenset({"gemma2"})


def _hf_sliding_window(d: Mapping[str, Any], where: str, model_type: str, num_layers: int) -> tuple[int | None, int]:
    """``(local_attention_window, local_attention_layers)`` of a Hugging Face config: the
    ``sliding_window`` on the layers ``layer_types`` marks ``sliding_attention`` (gpt-oss,
    recent transformers' Gemma 2/3), else on every layer but each ``sliding_window_pattern``-th
    (Gemma 3), every other layer (Gemma 2), or all of them (Mistral); none when
    ``use_sliding_window`` is false (Qwen2/3 configs carry a window they do not use)."""
    window = d.get("sliding_window")
    if window is None or d.get("use_sliding_window") is False:
        return None, 0
    window = _int(d, "sliding_window", where)
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise _err("model.layer_types", types, f"{where}: must be a list of strings")
        local = sum(t == "sliding_attention" for t in types)
    elif d.get("sliding_window_pattern") is not None:
        period = _int(d, "sliding_window_pattern", where)
        local = num_layers - num_layers // period
    elif model_type in _ALTERNATING_WINDOW_MODEL_TYPES:
        local = num_layers // 2
    else:
        local = num_layers
    return (window, min(local, num_layers)) if local else (None, 0)


def _from_hf_gpt2(d: Mapping[str, Any], *, where: str, name: str, model_type: str) -> Model:
    num_layers = _int(d, "n_layer", where)
    hidden = _int(d, "n_embd", where)
    kv_heads = 1 if d.get("multi_query") is True else None
    kwargs = dict(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=_int(d, "n_head", where),
        num_kv_heads=kv_heads,
        ffn_hidden_size=_int(d, "n_inner", where, required=False) or 4 * hidden,
        ffn_type="gelu",
        vocab_size=_int(d, "vocab_size", where),
        tied_embeddings=_bool(d, "tie_word_embeddings", where, default=model_type != "gptj"),
        linear_bias=_hf_linear_bias(d, where, model_type),
        max_seq_len=_int(d, "n_positions", where, required=False, maximum=MAX_SEQ_LEN),
        source=f"Hugging Face config ({where})",
    )
    return _build(kwargs, where, _GPT2_FIELD_NAMES)


def _hf_moe(d: Mapping[str, Any], where: str) -> MoeSpec | None:
    """MoE block of a HF config (Mixtral, Qwen-MoE, OLMoE, DeepSeek); None when dense."""
    p = "model"
    if d.get("n_routed_experts") is not None:  # DeepSeek-V2/V3
        experts = _int(d, "n_routed_experts", where, minimum=0)
        if experts == 0:
            return None
        return _build_moe(dict(
            num_experts=experts,
            top_k=_int(d, "num_experts_per_tok", where),
            expert_ffn_hidden_size=_int(d, "moe_intermediate_size", where),
            num_shared_experts=_int(d, "n_shared_experts", where, required=False, minimum=0) or 0,
            layer_frequency=_int(d, "moe_layer_freq", where, required=False) or 1,
            first_k_dense_layers=_int(d, "first_k_dense_replace", where, required=False, minimum=0) or 0,
        ), where, {"model.moe.num_experts": "model.n_routed_experts", "model.moe.top_k": "model.num_experts_per_tok"})
    key = "num_local_experts" if d.get("num_local_experts") is not None else "num_experts"
    if d.get(key) is None:
        return None
    experts = _int(d, key, where, prefix=p, minimum=0)
    if experts == 0:
        return None
    if key == "num_local_experts":  # Mixtral: every layer, experts as wide as intermediate_size
        expert_ffn = _int(d, "intermediate_size", where)
        shared = 0
        first_dense = 0
        freq = 1
    else:  # Qwen2-MoE / Qwen3-MoE / OLMoE
        expert_ffn = _int(d, "moe_intermediate_size", where, required=False)
        if expert_ffn is None:
            expert_ffn = _int(d, "intermediate_size", where)
        shared = 0
        shared_size = _int(d, "shared_expert_intermediate_size", where, required=False, minimum=0)
        if shared_size:
            if shared_size % expert_ffn:
                raise _err("model.shared_expert_intermediate_size", shared_size,
                                 f"{where}: must be a multiple of moe_intermediate_size={expert_ffn} "
                                 "(shared experts are modelled as experts of that width)")
            shared = shared_size // expert_ffn
        freq = _int(d, "decoder_sparse_step", where, required=False) or 1
        first_dense = _leading_dense_layers(d.get("mlp_only_layers"), where)
    return _build_moe(dict(
        num_experts=experts,
        top_k=_int(d, "num_experts_per_tok", where),
        expert_ffn_hidden_size=expert_ffn,
        num_shared_experts=shared,
        layer_frequency=freq,
        first_k_dense_layers=first_dense,
    ), where, {"model.moe.num_experts": f"model.{key}", "model.moe.top_k": "model.num_experts_per_tok",
               "model.moe.layer_frequency": "model.decoder_sparse_step"})


def _leading_dense_layers(value: Any, where: str) -> int:
    """Qwen-MoE ``mlp_only_layers``: only a leading block ``[0, 1, ..., k-1]`` is expressible."""
    if value is None:
        return 0
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _err("model.mlp_only_layers", value, f"{where}: must be a list of layer indices")
    if sorted(value) != list(range(len(value))):
        raise _err("model.mlp_only_layers", value,
                         f"{where}: only a leading block of dense layers (0..k-1) is supported")
    return len(value)


# --------------------------------------------------------------------------- construction


def _build(kwargs: dict[str, Any], where: str, field_map: Mapping[str, str]) -> Model:
    try:
        return Model(**kwargs)
    except InputError as exc:
        raise InputError(_rename(exc.field, field_map), exc.value, f"{where}: {exc.message}") from None


def _build_moe(kwargs: dict[str, Any], where: str, field_map: Mapping[str, str]) -> MoeSpec:
    try:
        return MoeSpec(**kwargs)
    except InputError as exc:
        raise InputError(_rename(exc.field, field_map), exc.value, f"{where}: {exc.message}") from None


def _rename(field: str, field_map: Mapping[str, str]) -> str:
    if field.startswith("moe."):
        field = "model." + field
    return field_map.get(field, field)


# --------------------------------------------------------------------------- typed getters


def _err(field: str, value: Any, message: str) -> InputError:
    """An ``InputError`` whose value is safe to print (bounded, never an expanding YAML alias graph)."""
    return InputError(field, printable_value(value), message)



def _int(d: Mapping[str, Any], key: str, where: str, *, prefix: str = "model", required: bool = True,
         minimum: int = 1, maximum: int = MAX_DIM) -> int | None:
    """``d[key]`` as a bounded int; None when absent/null and not required."""
    field = f"{prefix}.{key}"
    value = d.get(key)
    if value is None:
        if required:
            raise _err(field, None, f"{where}: missing required key")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(field, value, f"{where}: must be an integer, got {_type_name(value)}")
    if value < minimum:
        raise _err(field, value, f"{where}: must be >= {minimum}")
    if value > maximum:
        raise _err(field, value, f"{where}: must be <= {maximum}")
    return value


def _bool(d: Mapping[str, Any], key: str, where: str, *, default: bool | None) -> bool | None:
    value = d.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _err(f"model.{key}", value, f"{where}: must be true or false")
    return value


def _str(d: Mapping[str, Any], key: str, where: str, *, default: str | None) -> str | None:
    value = d.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _err(f"model.{key}", value, f"{where}: must be a string")
    if len(value) > 10_000:
        raise _err(f"model.{key}", value, f"{where}: is too long")
    return value.strip() or default


def _choice(d: Mapping[str, Any], key: str, where: str, choices: tuple[str, ...], *, default: str) -> str:
    value = d.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or value not in choices:
        raise _err(f"model.{key}", value, f"{where}: must be one of {', '.join(choices)}")
    return value


def _positive_number(d: Mapping[str, Any], key: str, where: str) -> float:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _err(f"model.{key}", value, f"{where}: must be a positive number")
    return float(value)


def _suggest(key: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, known, n=1) if len(key) <= 64 else []
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{hint}; known keys: {', '.join(known)}"


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
