"""Catalog loader: every interface id resolves, numbers convert to SI, models match their papers."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import textwrap

import pytest

from sim.data import catalog
from sim.base.errors import InputError
from sim.data.hardware import Gpu, Link
from sim.data.specs import Model

INTERFACE_GPUS = ("v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h100-96gb", "h800-80gb",
                  "h200-141gb", "b200-180gb", "gb200-186gb", "gb300-288gb", "mi250x-128gb",
                  "mi300x-192gb")
INTERFACE_NICS = ("ib-hdr-200", "ib-ndr-400", "ib-xdr-800", "roce-100", "roce-200", "roce-400",
                  "eth-10", "eth-25", "eth-40", "eth-100", "efa-400")
INTERFACE_MODELS = ("gpt3-175b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b",
                    "mixtral-8x7b", "deepseek-v3")


@pytest.fixture(autouse=True)
def _default_catalog(monkeypatch):
    monkeypatch.delenv(catalog.ENV_VAR, raising=False)


# --------------------------------------------------------------------------- ids


@pytest.mark.parametrize("gpu_id", INTERFACE_GPUS)
def test_interface_gpus_load(gpu_id):
    gpu = catalog.get_gpu(gpu_id)
    assert isinstance(gpu, Gpu) and gpu.id == gpu_id
    assert gpu.source
    assert catalog.get_nic(gpu.default_nic).kind == "nic"
    assert catalog.get_link(gpu.nvlink_generation).kind == "scale-up"
    assert gpu.nvlink_domain_size % gpu.gpus_per_node == 0 or gpu.gpus_per_node % gpu.nvlink_domain_size == 0


@pytest.mark.parametrize("nic_id", INTERFACE_NICS)
def test_interface_nics_load(nic_id):
    nic = catalog.get_nic(nic_id)
    assert isinstance(nic, Link) and nic.kind == "nic" and nic.source


@pytest.mark.parametrize("model_id", INTERFACE_MODELS + ("llama3.1-8b", "llama3.1-70b"))
def test_interface_models_load(model_id):
    model = catalog.get_model(model_id)
    assert isinstance(model, Model) and model.source


def test_ids_and_aliases_are_case_insensitive():
    assert catalog.get_gpu("H100-SXM") is catalog.get_gpu("h100-80gb")
    assert catalog.get_gpu("  A100-SXM4-80GB ") is catalog.get_gpu("a100-80gb")
    assert catalog.get_nic("NDR") is catalog.get_nic("ib-ndr-400")
    assert catalog.get_model("Llama-3.1-405B") is catalog.get_model("llama3.1-405b")
    assert catalog.get_link("infinity-fabric").id == "infinity-fabric-mi300x"


@pytest.mark.parametrize("getter, field", [(catalog.get_gpu, "gpu"), (catalog.get_nic, "nic"),
                                           (catalog.get_link, "link"), (catalog.get_model, "model")])
def test_unknown_id_lists_known_ids(getter, field):
    with pytest.raises(InputError) as err:
        getter("h100-80gbx")
    assert err.value.field == field and err.value.value == "h100-80gbx"
    assert "known:" in err.value.message


def test_unknown_gpu_message_names_all_gpus_and_suggests():
    with pytest.raises(InputError) as err:
        catalog.get_gpu("h100-80")
    for gpu_id in INTERFACE_GPUS:
        assert gpu_id in err.value.message
    assert "did you mean" in err.value.message


def test_non_string_id_is_input_error():
    with pytest.raises(InputError):
        catalog.get_gpu(None)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        catalog.get_model(42)  # type: ignore[arg-type]


def test_scale_up_link_is_not_a_nic():
    with pytest.raises(InputError) as err:
        catalog.get_nic("nvlink4")
    assert err.value.field == "nic" and "not a network adapter" in err.value.message


def test_list_links_by_kind():
    kinds = {link.kind for link in catalog.list_links()}
    assert kinds == {"nic", "scale-up", "pcie"}
    assert {link.id for link in catalog.list_links("pcie")} == {"pcie3", "pcie4", "pcie5", "pcie6"}
    assert {"nvlink2", "nvlink3", "nvlink4", "nvlink5"} <= {link.id for link in catalog.list_links("scale-up")}
    with pytest.raises(InputError):
        catalog.list_links("wifi")


def test_list_gpus_and_models_order_and_types():
    gpus = catalog.list_gpus()
    assert [g.id for g in gpus[: len(INTERFACE_GPUS)]] == list(INTERFACE_GPUS)
    models = catalog.list_models()
    assert all(isinstance(mid, str) and isinstance(m, Model) for mid, m in models)
    assert set(INTERFACE_MODELS) <= {mid for mid, _ in models}


# --------------------------------------------------------------------------- records


@pytest.mark.parametrize("kind", ["gpus", "links", "models"])
def test_every_record_has_source(kind):
    records = catalog.catalog_records(kind)
    assert records
    for rec in records:
        assert isinstance(rec.get("source"), str) and len(rec["source"].strip()) > 20, rec["id"]


def test_catalog_records_are_copies_and_json_safe():
    recs = catalog.catalog_records("gpus")
    recs[0]["name"] = "mutated"
    assert catalog.catalog_records("gpu")[0]["name"] != "mutated"
    json.dumps({k: catalog.catalog_records(k) for k in ("gpus", "links", "models", "nics")})
    assert all(r["kind"] == "nic" for r in catalog.catalog_records("nics"))


def test_catalog_records_unknown_kind():
    with pytest.raises(InputError) as err:
        catalog.catalog_records("gpuz")
    assert err.value.field == "catalog" and "gpus" in err.value.message
    with pytest.raises(InputError):
        catalog.catalog_records("../pyproject")


def test_catalog_dir_points_at_project_catalogs():
    assert (catalog.catalog_dir() / "gpus.yaml").is_file()


# --------------------------------------------------------------------------- numbers


def test_h100_converted_to_si():
    g = catalog.get_gpu("h100-80gb")
    assert g.dense_flops_per_s["bf16"] == pytest.approx(989.5e12)
    assert g.dense_flops_per_s["fp8"] == pytest.approx(1979e12)
    assert g.peak_flops_per_s("fp16") == pytest.approx(989.5e12)
    assert g.hbm_bytes == 80 * 2**30
    assert g.hbm_bytes_per_s == pytest.approx(3.35e12)
    assert g.nvlink_bytes_per_s_per_direction == pytest.approx(450e9)
    assert g.tdp_w == 700 and g.gpus_per_node == 8 and g.nics_per_node == 8
    assert g.achievable_matmul_fraction("bf16") == pytest.approx(0.803)
    assert g.achievable_matmul_fraction("fp8") == pytest.approx(0.709)


@pytest.mark.parametrize("gpu_id, bf16_tflops, hbm_gib, tb_s, nvlink_gb_s", [
    # data-sheet values (sparse tensor figures halved); see catalogs/gpus.yaml sources
    ("v100-32gb", 125.0, 32, 0.9, 150),
    ("a100-40gb", 312.0, 40, 1.555, 300),
    ("a100-80gb", 312.0, 80, 2.039, 300),
    ("h100-96gb", 912.5, 96, 2.4, 450),
    ("h800-80gb", 989.5, 80, 3.35, 200),
    ("h200-141gb", 989.5, 141, 4.8, 450),
    ("b200-180gb", 2250.0, 180, 8.0, 900),
    ("gb200-186gb", 2500.0, 186, 8.0, 900),
    ("gb300-288gb", 2500.0, 288, 8.0, 900),
    ("mi250x-128gb", 383.0, 128, 3.2768, 400),
    ("mi300x-192gb", 1307.4, 192, 5.3, 448),
])
def test_gpu_data_sheet_values(gpu_id, bf16_tflops, hbm_gib, tb_s, nvlink_gb_s):
    g = catalog.get_gpu(gpu_id)
    assert g.dense_flops_per_s["bf16"] == pytest.approx(bf16_tflops * 1e12)
    assert g.hbm_bytes == pytest.approx(hbm_gib * 2**30)
    assert g.hbm_bytes_per_s == pytest.approx(tb_s * 1e12)
    assert g.nvlink_bytes_per_s_per_direction == pytest.approx(nvlink_gb_s * 1e9)


def test_h100_96gb_peak_between_sxm_and_nvl():
    # torchtitan: "the actual peak TFLOPs number is between SXM and NVL" (NVL dense BF16 835.5).
    peak = catalog.get_gpu("h100-96gb").dense_flops_per_s["bf16"]
    assert 835.5e12 < peak < catalog.get_gpu("h100-80gb").dense_flops_per_s["bf16"]
    assert catalog.get_gpu("h100-96gb").tdp_w == 500


@pytest.mark.parametrize("gpu_id, precision, fraction", [
    # stas00/ml-engineering "Maximum Achievable Matmul FLOPS" table (MAMF / theory)
    ("a100-80gb", "bf16", 271.2 / 312),
    ("h100-80gb", "bf16", 794.5 / 989),
    ("h100-80gb", "fp8", 1402.6 / 1979),
    ("h200-141gb", "fp8", 1453.4 / 1979),
    ("b200-180gb", "bf16", 1745.0 / 2250),
    ("b200-180gb", "fp8", 3432.5 / 4500),
    ("gb200-186gb", "bf16", 1822.0 / 2500),
    ("gb200-186gb", "fp8", 3615.6 / 5000),
    ("mi300x-192gb", "bf16", 668.4 / 1300),
])
def test_matmul_efficiency_matches_mamf_table(gpu_id, precision, fraction):
    assert catalog.get_gpu(gpu_id).matmul_efficiency[precision] == pytest.approx(fraction, abs=0.0015)


# Data sheets whose printed peaks are not exactly 1:2:4 (the record keeps what is printed and
# says so in its notes): the tolerance for these is the sheet's own inconsistency.
RATIO_EXCEPTIONS = {"l40s-48gb": 0.03}  # BF16 362.05 dense, yet FP8 733 (= 2 x 366.5) and TF32 183


def test_dense_peaks_are_consistent():
    for g in catalog.list_gpus():
        p = g.dense_flops_per_s
        rel = RATIO_EXCEPTIONS.get(g.id, 1e-3)
        assert p["bf16"] > p["fp32"], g.id
        if "fp8" in p:
            assert p["fp8"] == pytest.approx(2 * p["bf16"], rel=rel), g.id
        if "tf32" in p:
            assert p["tf32"] == pytest.approx(p["bf16"] / 2, rel=rel), g.id
        assert set(g.matmul_efficiency) <= set(p), g.id
        assert 0.5 <= g.hbm_efficiency <= 0.95, g.id


def test_pre_hopper_has_no_fp8_and_v100_bf16_is_fp16():
    for gpu_id in ("v100-32gb", "a100-40gb", "a100-80gb", "mi250x-128gb"):
        assert "fp8" not in catalog.get_gpu(gpu_id).dense_flops_per_s
    v100 = catalog.get_gpu("v100-32gb")
    assert v100.dense_flops_per_s["bf16"] == v100.dense_flops_per_s["fp16"] == 125e12
    assert "no bf16" in v100.notes


def test_links_converted_to_si():
    assert catalog.get_nic("ib-ndr-400").bytes_per_s_per_direction == pytest.approx(50e9)
    assert catalog.get_nic("eth-10").bytes_per_s_per_direction == pytest.approx(1.25e9)
    assert catalog.get_link("nvlink5").bytes_per_s_per_direction == pytest.approx(900e9)
    assert catalog.get_link("pcie5").bytes_per_s_per_direction == pytest.approx(63e9)
    assert catalog.get_nic("ib-hdr-200").latency_s == pytest.approx(1.5e-6)
    assert catalog.get_nic("eth-100").latency_s > catalog.get_nic("roce-100").latency_s \
        > catalog.get_nic("ib-hdr-200").latency_s
    assert catalog.get_nic("ib-ndr-400").switch_radix == 64


def test_gpu_objects_hash_pickle_and_serialise():
    g = catalog.get_gpu("b200-180gb")
    assert hash(g) == hash(pickle.loads(pickle.dumps(g)))
    assert pickle.loads(pickle.dumps(g)) == g
    assert copy.deepcopy(g) == g
    json.dumps(dataclasses.asdict(g))
    with pytest.raises(TypeError):
        g.dense_flops_per_s["bf16"] = 1.0  # type: ignore[index]


# --------------------------------------------------------------------------- models vs papers

# (id, published total in billions, tolerance, why)
PARAM_COUNTS = [
    ("gpt3-175b", 174.6, 0.005, "Brown et al. 2020: 175B label; exact weight count 174.6B"),
    ("gpt-175b", 175.0, 0.01, "Korthikanti Table 3 label"),
    ("llama2-70b", 68.98, 0.005, "released weights (label 70B)"),
    ("llama2-7b", 6.738, 0.001, "released weights (label 7B)"),
    ("llama2-13b", 13.016, 0.001, "released weights (label 13B)"),
    ("llama3-8b", 8.03, 0.005, "released weights"),
    ("llama3-70b", 70.6, 0.005, "released weights"),
    ("llama3.1-405b", 405.8, 0.005, "released weights"),
    ("mixtral-8x7b", 46.7, 0.005, "Jiang et al. 2024"),
    ("deepseek-v3", 671.0, 0.005, "DeepSeek-V3 report: 671B without the 14B MTP module"),
    ("qwen3-235b-a22b", 235.0, 0.01, "Qwen3 report label (235B; QK-norm weights uncounted)"),
    ("qwen3-30b-a3b", 30.5, 0.01, "Qwen3-30B-A3B model card: 30.5B total"),
    ("mistral-7b", 7.2417, 0.001, "mistralai/Mistral-7B-v0.1: 7,241,732,096 weights"),
    ("gpt-oss-120b", 116.83, 0.002, "gpt-oss model card Table 1 (biases and attention sinks uncounted)"),
    ("gpt-oss-20b", 20.91, 0.002, "gpt-oss model card Table 1 (biases and attention sinks uncounted)"),
    ("gpt-22b", 22.0, 0.01, "Korthikanti Table 3 label"),
    ("gpt-1t", 1008.0, 0.005, "Narayanan Table 1"),
    ("gpt-530b", 529.6, 0.005, "Narayanan Table 1"),
    # Narayanan et al. 2021 Table 1 (labels rounded to 3 significant digits; 1.7B is 1.65B by
    # the paper's own eq. (2), hence the looser tolerance)
    ("gpt-1.7b", 1.7, 0.035, "label rounded from 1.65B"),
    ("gpt-3.6b", 3.6, 0.02, "Narayanan Table 1"),
    ("gpt-7.5b", 7.5, 0.02, "Narayanan Table 1"),
    ("gpt-18.4b", 18.4, 0.02, "Narayanan Table 1"),
    ("gpt-39.1b", 39.1, 0.02, "Narayanan Table 1"),
    ("gpt-76.1b", 76.1, 0.02, "Narayanan Table 1"),
    ("gpt-145.6b", 145.6, 0.02, "Narayanan Table 1"),
    ("gpt-310.1b", 310.1, 0.02, "Narayanan Table 1"),
]


@pytest.mark.parametrize("model_id, billions, rel, why", PARAM_COUNTS)
def test_param_counts_match_published(model_id, billions, rel, why):
    assert catalog.get_model(model_id).num_params == pytest.approx(billions * 1e9, rel=rel), why


@pytest.mark.parametrize("model_id, billions, rel", [
    ("mixtral-8x7b", 12.9, 0.01),   # Jiang et al.: "13B active"; HF card 12.9B
    ("deepseek-v3", 37.0, 0.02),    # DeepSeek-V3 report: 37B activated (latent norms, router bias uncounted)
    ("qwen3-235b-a22b", 22.0, 0.02),  # Qwen3 report: 22B activated
    ("qwen3-30b-a3b", 3.3, 0.03),     # model card: 3.3B activated
    # gpt-oss model card: 5.13B / 3.61B active, counting the unembedding but not the embedding
    # (Model.num_active_params counts both: 0.58B more)
    ("gpt-oss-120b", 5.13 + 0.579, 0.002),
    ("gpt-oss-20b", 3.61 + 0.579, 0.003),
])
def test_active_params_match_published(model_id, billions, rel):
    assert catalog.get_model(model_id).num_active_params == pytest.approx(billions * 1e9, rel=rel)


def test_narayanan_models_match_their_eq2():
    """P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), Narayanan et al. 2021 eq. (2)."""
    for model_id, model in catalog.list_models():
        if not model_id.startswith("gpt-") or model.moe is not None:  # Megatron's GPTs, not gpt-oss
            continue
        l, h, v, s = model.num_layers, model.hidden_size, model.vocab_size, model.max_seq_len
        eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
        # eq. (2) also counts the 13h of biases and LayerNorm parameters per layer (Model counts
        # the 2h norm weights) and the s*h position embeddings; the final LayerNorm it omits.
        unmodelled = 11 * l * h + s * h - h
        assert model.num_params + unmodelled == pytest.approx(eq2, rel=1e-12), model_id
        assert model.num_params == pytest.approx(eq2, rel=0.004), model_id


def test_catalog_published_sizes_are_consistent():
    for rec in catalog.catalog_records("models"):
        model = catalog.get_model(rec["id"])
        assert model.num_params == pytest.approx(rec["published_params_b"] * 1e9, rel=0.035), rec["id"]
        if "published_active_params_b" in rec:
            assert model.moe is not None


def test_deepseek_v3_shapes():
    m = catalog.get_model("deepseek-v3")
    assert m.is_mla and m.q_lora_rank == 1536 and m.kv_lora_rank == 512
    assert m.qk_head_dim == 192 and m.v_dim_per_head == 128
    assert m.num_moe_layers == 58 and m.num_dense_layers == 3
    assert m.moe.num_experts == 256 and m.moe.top_k == 8 and m.moe.num_shared_experts == 1


# --------------------------------------------------------------------------- catalog override


def _write_catalog(tmp_path, gpus: str, links: str | None = None, models: str | None = None):
    src = catalog.catalog_dir()
    (tmp_path / "gpus.yaml").write_text(textwrap.dedent(gpus))
    (tmp_path / "links.yaml").write_text(links if links is not None else (src / "links.yaml").read_text())
    (tmp_path / "models.yaml").write_text(models if models is not None else (src / "models.yaml").read_text())


GOOD_GPU = """\
    schema_version: 1
    records:
      - id: toy-1
        name: Toy GPU
        dense_tflops: {bf16: 100}
        hbm_gib: 16
        hbm_tb_per_s: 1.0
        nvlink_gb_per_s_per_direction: 50
        nvlink_generation: nvlink3
        nvlink_domain_size: 4
        pcie_generation: 4
        tdp_w: 300
        gpus_per_node: 4
        nics_per_node: 1
        default_nic: roce-100
        matmul_efficiency: {bf16: 0.7}
        hbm_efficiency: 0.8
        source: "test fixture"
"""


def test_env_override_loads_other_catalog(tmp_path, monkeypatch):
    _write_catalog(tmp_path, GOOD_GPU)
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path))
    assert catalog.catalog_dir() == tmp_path.resolve()
    assert [g.id for g in catalog.list_gpus()] == ["toy-1"]
    assert catalog.get_gpu("TOY-1").hbm_bytes == 16 * 2**30


@pytest.mark.parametrize("edit, field_part", [
    (("hbm_gib: 16", "hbm_gb: 16"), "hbm_gb"),                          # unknown (typo) key
    (("hbm_gib: 16", "hbm_gib: -16"), "hbm_gib"),                       # negative
    (("hbm_gib: 16", "hbm_gib: true"), "hbm_gib"),                      # bool where a number goes
    (("default_nic: roce-100", "default_nic: nvlink4"), "default_nic"),  # not a NIC
    (("dense_tflops: {bf16: 100}", "dense_tflops: {bf17: 100}"), "bf17"),
    (("dense_tflops: {bf16: 100}", "dense_tflops: {fp32: 100}"), "dense_tflops"),  # no bf16
    (("        source: \"test fixture\"\n", ""), "catalog"),             # missing source
    (("gpus_per_node: 4", "gpus_per_node: 4.5"), "gpus_per_node"),
])
def test_malformed_gpu_record_is_input_error(tmp_path, monkeypatch, edit, field_part):
    _write_catalog(tmp_path, GOOD_GPU.replace(*edit))
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path))
    with pytest.raises(InputError) as err:
        catalog.list_gpus()
    assert field_part in err.value.field or field_part in err.value.message


@pytest.mark.parametrize("content", ["", "records: 3\n", "- a\n- b\n", "records: [\n", "records:\n  - 1\n"])
def test_malformed_catalog_file_is_input_error(tmp_path, monkeypatch, content):
    _write_catalog(tmp_path, content)
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path))
    with pytest.raises(InputError) as err:
        catalog.list_gpus()
    assert err.value.field == "catalog"


def test_duplicate_alias_rejected(tmp_path, monkeypatch):
    gpus = GOOD_GPU + GOOD_GPU.split("records:\n")[1].replace("id: toy-1", "id: toy-2\n        aliases: [TOY-1]")
    _write_catalog(tmp_path, gpus)
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path))
    with pytest.raises(InputError, match="already used"):
        catalog.list_gpus()


def test_missing_catalog_dir_is_input_error(tmp_path, monkeypatch):
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(InputError):
        catalog.get_gpu("h100-80gb")


def test_load_yaml_records_helper(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text("schema_version: 1\nrecords:\n  - {id: a, source: s}\n  - {id: b, source: s}\n")
    assert [r["id"] for r in catalog.load_yaml_records(path)] == ["a", "b"]
    path.write_text("records:\n  - {id: a}\n")
    with pytest.raises(InputError):
        catalog.load_yaml_records(path)
    assert catalog.load_yaml_records(path, require_source=False) == [{"id": "a"}]
