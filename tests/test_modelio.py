"""Model files: project schema, Hugging Face config.json, and malformed input -> InputError only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.data import catalog
from sim.base.errors import InputError
from sim.data.modelio import METADATA_KEYS, MODEL_KEYS, MOE_KEYS, model_from_dict
from sim.data.models import load_model
from sim.data.specs import Model

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _default_catalog(monkeypatch):
    monkeypatch.delenv(catalog.ENV_VAR, raising=False)


def _same_shape(a: Model, b: Model) -> None:
    for attr in ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "dim_per_head",
                 "ffn_hidden_size", "ffn_type", "vocab_size", "tied_embeddings", "moe", "q_lora_rank",
                 "kv_lora_rank", "qk_rope_head_dim", "v_dim_per_head", "max_seq_len"):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert a.num_params == b.num_params


# --------------------------------------------------------------------------- ids and project files


def test_catalog_id_via_load_model():
    assert load_model("LLAMA3-70B") is catalog.get_model("llama3-70b")


def test_project_yaml_file():
    m = load_model(str(DATA / "gpt_22b.yaml"))
    assert m.name == "gpt-22b"
    _same_shape(m, catalog.get_model("gpt-22b"))


def test_project_json_file_with_moe():
    m = load_model(DATA / "tiny_moe.json")
    assert m.moe.num_experts == 8 and m.moe.num_shared_experts == 1
    assert m.moe.layer_frequency == 2 and m.moe.first_k_dense_layers == 1
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert m.kv_heads == 2 and m.ffn_type == "swiglu"


def test_project_defaults():
    m = model_from_dict({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100},
                        where="mini.yaml")
    assert m.name == "mini" and m.ffn_hidden_size == 256 and m.ffn_type == "gelu"
    assert m.kv_heads == 4 and m.dim_per_head == 16 and m.tied_embeddings is False


def test_catalog_records_roundtrip_through_model_from_dict():
    for rec in catalog.catalog_records("models"):
        assert model_from_dict(rec, where=rec["id"]) == catalog.get_model(rec["id"])


# --------------------------------------------------------------------------- Hugging Face configs


def test_hf_llama3_8b():
    m = load_model(str(DATA / "hf_llama3_8b_config.json"))
    _same_shape(m, catalog.get_model("llama3-8b"))
    assert m.num_params == pytest.approx(8.03e9, rel=0.002)


def test_hf_mixtral():
    m = load_model(str(DATA / "hf_mixtral_8x7b_config.json"))
    _same_shape(m, catalog.get_model("mixtral-8x7b"))
    assert m.num_active_params == pytest.approx(12.9e9, rel=0.01)


def test_hf_deepseek_v3_mla_and_moe():
    m = load_model(str(DATA / "hf_deepseek_v3_config.json"))
    _same_shape(m, catalog.get_model("deepseek-v3"))
    assert m.num_kv_heads is None  # MLA: num_key_value_heads in the config is not GQA
    assert m.num_params == pytest.approx(671e9, rel=0.005)


def test_hf_gpt2_small():
    m = load_model(str(DATA / "hf_gpt2_config.json"))
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size) == (12, 768, 12, 3072)
    assert m.ffn_type == "gelu" and m.tied_embeddings and m.vocab_size == 50257 and m.max_seq_len == 1024
    # 124.4M with biases and position embeddings (0.79M + 0.1M), which Model does not count
    assert m.num_params == pytest.approx(124.4e6, rel=0.01)


def test_hf_qwen2_7b():
    m = load_model(str(DATA / "hf_qwen2_7b_config.json"))
    assert m.ffn_type == "swiglu" and m.kv_heads == 4 and not m.tied_embeddings
    assert m.num_params == pytest.approx(7.62e9, rel=0.005)  # Qwen2 report: 7.6B (QKV biases uncounted)


def test_hf_qwen3_moe():
    m = load_model(str(DATA / "hf_qwen3_30b_a3b_config.json"))
    assert m.dim_per_head == 128 and m.q_size == 4096 != m.hidden_size
    assert m.moe.num_experts == 128 and m.moe.top_k == 8 and m.moe.expert_ffn_hidden_size == 768
    assert m.num_params == pytest.approx(30.5e9, rel=0.01)       # model card: 30.5B total
    assert m.num_active_params == pytest.approx(3.3e9, rel=0.03)  # 3.3B activated


def test_hf_gpt_neox_pythia():
    m = load_model(str(DATA / "hf_pythia_160m_config.json"))
    assert m.ffn_type == "gelu" and not m.tied_embeddings
    assert m.num_params == pytest.approx(162.3e6, rel=0.01)  # Pythia-160M: 162,322,944 params


def test_hf_directory_with_config(tmp_path):
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text((DATA / "hf_llama3_8b_config.json").read_text())
    m = load_model(str(d))
    assert m.name == "Meta-Llama-3-8B" and m.num_layers == 32


def test_hf_unknown_keys_ignored_and_text_config():
    cfg = json.loads((DATA / "hf_llama3_8b_config.json").read_text())
    cfg["some_future_key"] = {"x": 1}
    assert model_from_dict(cfg, where="x.json").num_layers == 32
    wrapped = {"model_type": "llava", "text_config": cfg, "vision_config": {}}
    assert model_from_dict(wrapped, where="x.json").hidden_size == 4096


def test_hf_qwen2_moe_shared_experts():
    cfg = {"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
           "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408,
           "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
           "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False,
           "hidden_act": "silu"}
    m = model_from_dict(cfg, where="qwen1.5-moe")
    assert m.moe.num_shared_experts == 4
    assert m.num_params == pytest.approx(14.3e9, rel=0.01)  # Qwen1.5-MoE-A2.7B: 14.3B total


# --------------------------------------------------------------------------- malformed input


@pytest.mark.parametrize("fixture, field", [
    ("bad_truncated.yaml", "model"),
    ("bad_typo_key.yaml", "model.hiden_size"),
    ("bad_list_top.yaml", "model"),
    ("bad_negative.yaml", "model.num_layers"),
    ("bad_bool.yaml", "model.num_layers"),
    ("bad_huge.json", "model.vocab_size"),
    ("bad_binary.bin", "model"),
])
def test_malformed_fixture_files(fixture, field):
    with pytest.raises(InputError) as err:
        load_model(str(DATA / fixture))
    assert err.value.field == field


def test_typo_key_suggests_the_right_one():
    with pytest.raises(InputError) as err:
        load_model(str(DATA / "bad_typo_key.yaml"))
    assert "did you mean hidden_size" in err.value.message


def test_nonexistent_path_and_unknown_id():
    with pytest.raises(InputError) as err:
        load_model("no/such/model.yaml")
    assert err.value.field == "model" and "llama3-8b" in err.value.message


def test_directory_without_config(tmp_path):
    with pytest.raises(InputError, match="directory"):
        load_model(str(tmp_path))


def test_special_file_rejected():
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    with pytest.raises(InputError, match="regular file"):
        load_model("/dev/zero")


def test_oversized_file(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "#" * (5 * 1024 * 1024))
    with pytest.raises(InputError, match="bytes"):
        load_model(str(big))


@pytest.mark.parametrize("spec", ["", "   ", None, 3, ["llama3-8b"], "bad\x00name"])
def test_bad_spec_types(spec):
    with pytest.raises(InputError):
        load_model(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize("content, suffix, field", [
    ("", ".yaml", "model"),                                   # empty document -> null
    ("42", ".yaml", "model"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n", ".yaml", "model.vocab_size"),
    ("{\"num_layers\": 2,", ".json", "model"),                # truncated JSON
    ("\ufeff{\"num_layers\": 1e400}", ".json", "model.num_layers"),
    ("num_layers: 2.0\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n", ".yaml", "model.num_layers"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 5\nvocab_size: 10\n", ".yaml", "model.num_attention_heads"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nnum_kv_heads: 3\nvocab_size: 10\n", ".yaml",
     "model.num_kv_heads"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\nffn_type: relu\n", ".yaml",
     "model.ffn_type"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\nffn_type: swiglu\n", ".yaml",
     "model.ffn_hidden_size"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\nmoe: {num_experts: 2, top_k: 3,"
     " expert_ffn_hidden_size: 8}\n", ".yaml", "model.moe.top_k"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\nmoe: {num_expert: 2}\n", ".yaml",
     "model.moe.num_expert"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\nmoe: [1]\n", ".yaml", "model.moe"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\ntied_embeddings: 1\n", ".yaml",
     "model.tied_embeddings"),
    ("num_layers: 9\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\nmoe: {num_experts: 2, top_k: 1,"
     " expert_ffn_hidden_size: 8, first_k_dense_layers: 10}\n", ".yaml", "model.moe.first_k_dense_layers"),
    ("a: &a [*a]\n", ".yaml", "model.a"),                     # recursive alias
    ("{model_type: llama, num_hidden_layers: 2}\n", ".yaml", "model.hidden_size"),
    ("{model_type: llama, num_hidden_layers: 2, hidden_size: 64, num_attention_heads: 4, vocab_size: 10,"
     " intermediate_size: 128, num_key_value_heads: 3}\n", ".yaml", "model.num_key_value_heads"),
    ("{model_type: llama, num_hidden_layers: '2', hidden_size: 64}\n", ".yaml", "model.num_hidden_layers"),
    ("{model_type: gpt2, n_layer: 2, n_embd: 64, n_head: 5, vocab_size: 10}\n", ".yaml", "model.n_head"),
    ("{model_type: 7}\n", ".yaml", "model.model_type"),
    ("{1: 2}\n", ".yaml", "model.1"),
    ("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[" * 400, ".yaml", "model"),
])
def test_malformed_content(tmp_path, content, suffix, field):
    path = tmp_path / f"m{suffix}"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_model(str(path))
    assert err.value.field == field, err.value


def test_non_utf8_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(InputError, match="UTF-8"):
        load_model(str(path))


def test_yaml_alias_bomb_is_cheap(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    lines += ["hidden_size: *a8"]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:  # 10**9 leaves if anything walked or printed it all
        load_model(str(path))
    assert len(str(err.value)) < 2000


def test_recursive_text_config(tmp_path):
    path = tmp_path / "config.json.yaml"
    path.write_text("cfg: &c {model_type: llava, text_config: *c}\nmodel_type: llava\ntext_config: *c\n")
    with pytest.raises(InputError):
        load_model(str(path))


def test_huge_python_int_in_dict():
    with pytest.raises(InputError) as err:
        model_from_dict({"num_layers": 10**5000, "hidden_size": 64, "num_attention_heads": 4,
                         "vocab_size": 10}, where="t")
    assert err.value.field == "model.num_layers" and "bit integer" in str(err.value)


def test_model_from_dict_rejects_non_mapping():
    for value in (None, [], "x", 3, {1, 2}):
        with pytest.raises(InputError):
            model_from_dict(value, where="t")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- fuzzing

_FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.integers(min_value=0, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["gelu", "swiglu", "silu", "llama", "gpt2", "mixtral", "deepseek_v3"]),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=8)
_HF_KEYS = ["model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "hidden_act",
            "max_position_embeddings", "num_local_experts", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
            "moe_layer_freq", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim", "n_layer", "n_embd", "n_head", "n_inner", "text_config", "mlp_only_layers",
            "shared_expert_intermediate_size", "decoder_sparse_step", "multi_query"]
_keys = st.one_of(st.sampled_from(list(MODEL_KEYS) + list(METADATA_KEYS) + _HF_KEYS), st.text(max_size=10))
_moe = st.dictionaries(st.one_of(st.sampled_from(MOE_KEYS), st.text(max_size=6)), _values, max_size=6)
_docs = st.dictionaries(_keys, st.one_of(_values, _moe), max_size=14)


def _only_input_error(fn, *args, **kwargs):
    try:
        result = fn(*args, **kwargs)
    except InputError:
        return None
    assert isinstance(result, Model)
    return result


@_FUZZ
@given(doc=_docs)
def test_fuzz_model_from_dict(doc):
    _only_input_error(model_from_dict, doc, where="fuzz")


@_FUZZ
@given(data=st.binary(max_size=400), suffix=st.sampled_from([".yaml", ".json", ".txt"]))
def test_fuzz_random_bytes(tmp_path, data, suffix):
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(data)
    _only_input_error(load_model, str(path))


@_FUZZ
@given(doc=_docs, as_json=st.booleans())
def test_fuzz_serialised_documents(tmp_path, doc, as_json):
    if as_json:
        path = tmp_path / "fuzz.json"
        path.write_text(json.dumps(doc, allow_nan=True))
    else:
        path = tmp_path / "fuzz.yaml"
        path.write_text(yaml.safe_dump(doc))
    _only_input_error(load_model, str(path))


@_FUZZ
@given(text=st.text(max_size=300), suffix=st.sampled_from([".yaml", ".json"]))
def test_fuzz_random_text(tmp_path, text, suffix):
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    _only_input_error(load_model, str(path))


@_FUZZ
@given(cut=st.integers(min_value=0, max_value=4000), name=st.sampled_from(
    ["hf_deepseek_v3_config.json", "hf_qwen3_30b_a3b_config.json", "gpt_22b.yaml", "tiny_moe.json"]))
def test_fuzz_truncated_real_files(tmp_path, cut, name):
    raw = (DATA / name).read_bytes()
    path = tmp_path / name
    path.write_bytes(raw[: cut % (len(raw) + 1)])
    _only_input_error(load_model, str(path))


def test_linear_bias_from_files_and_configs():
    """Model.linear_bias: the project key; Hugging Face configs by class default (GPT-2, Pythia)
    or by their switches (Llama's attention_bias and mlp_bias, OPT's enable_bias); partial biases
    (Qwen2's QKV only) read as unbiased; the catalog's GPTs are biased, its Llamas not."""
    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}
    assert model_from_dict({**base, "linear_bias": True}, where="m.yaml").linear_bias is True
    assert model_from_dict(base, where="m.yaml").linear_bias is False
    with pytest.raises(InputError) as e:
        model_from_dict({**base, "linear_bias": "yes"}, where="m.yaml")
    assert e.value.field == "model.linear_bias"
    assert load_model(str(DATA / "hf_gpt2_config.json")).linear_bias is True
    assert load_model(str(DATA / "hf_pythia_160m_config.json")).linear_bias is True
    assert load_model(str(DATA / "hf_llama3_8b_config.json")).linear_bias is False
    assert load_model(str(DATA / "hf_qwen2_7b_config.json")).linear_bias is False
    llama = json.loads((DATA / "hf_llama3_8b_config.json").read_text())
    assert model_from_dict({**llama, "attention_bias": True, "mlp_bias": True}, where="c.json").linear_bias is True
    assert model_from_dict({**llama, "attention_bias": True, "mlp_bias": False}, where="c.json").linear_bias is False
    opt = {**llama, "model_type": "opt", "enable_bias": False}
    assert model_from_dict(opt, where="c.json").linear_bias is False
    assert catalog.get_model("gpt3-175b").linear_bias and catalog.get_model("gpt-1.7b").linear_bias
    assert not catalog.get_model("llama3-70b").linear_bias


def test_dropout_from_files():
    """Model.dropout: the project key (true/false; absent = the family's default, GPT with dropout,
    Llama without), one line naming the key when it is not a boolean."""
    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, "ffn_type": "swiglu",
            "ffn_hidden_size": 176}
    assert model_from_dict({**base, "dropout": True}, where="m.yaml").has_dropout is True
    assert model_from_dict(base, where="m.yaml").dropout is None
    assert model_from_dict(base, where="m.yaml").has_dropout is False
    assert model_from_dict({**base, "ffn_type": "gelu", "ffn_hidden_size": 256}, where="m.yaml").has_dropout is True
    with pytest.raises(InputError) as e:
        model_from_dict({**base, "dropout": 0.1}, where="m.yaml")
    assert e.value.field == "model.dropout"
    assert not model_from_dict({**base, "position_embedding": "learned"}, where="m.yaml").uses_rope
    with pytest.raises(InputError) as e:
        model_from_dict({**base, "position_embedding": "alibi"}, where="m.yaml")
    assert e.value.field == "model.position_embedding"
