"""FLOPs and memory against the closed forms of Narayanan et al. (2021) and Korthikanti et al. (2022)."""

import pytest

from sim.cost.memory import activation_bytes_per_layer, inflight_microbatches, model_state_bytes
from sim.layers.stages import StageParams, stage_layers
from sim.layers.ops import model_flops_per_step
from sim.data.specs import Model, MoeSpec, Strategy


def gpt(layers=48, h=6144, heads=64, vocab=51200):
    return Model(name="gpt", num_layers=layers, hidden_size=h, num_attention_heads=heads,
                 ffn_hidden_size=4 * h, vocab_size=vocab, ffn_type="gelu", tied_embeddings=True)


@pytest.mark.parametrize("layers,h,heads,s,B", [(24, 2304, 24, 2048, 512), (96, 12288, 96, 2048, 1536),
                                                (128, 25600, 160, 2048, 3072)])
def test_model_flops_match_narayanan_eq3(layers, h, heads, s, B):
    # Narayanan et al. 2021 eq. (3) counts 4 forward passes (full recompute): 96 B s l h^2 (...).
    # Without recompute the same derivation gives 72 B s l h^2 (1 + s/6h + V/(12 l h)).
    m = gpt(layers, h, heads)
    st = Strategy(gbs=B, mbs=1, dp=1, seq_len=s)
    expected = 72 * B * s * layers * h**2 * (1 + s / (6 * h) + 51200 / (12 * layers * h))
    assert model_flops_per_step(m, st) == pytest.approx(expected, rel=1e-9)


def test_model_flops_independent_of_sharding():
    m = gpt()
    a = model_flops_per_step(m, Strategy(tp=1, gbs=64, mbs=1))
    b = model_flops_per_step(m, Strategy(tp=8, pp=4, dp=2, gbs=64, mbs=2, sp=True, schedule="1f1b"))
    assert a == pytest.approx(b)


S, B, T = 2048, 4, 8


def korthikanti(model, t, sp, recompute):
    s, b, h, a = S, B, model.hidden_size, model.num_attention_heads
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    attn = 5 * a * s / h if recompute == "none" else 0.0
    if sp:
        return s * b * h / t * (34 + attn)
    return s * b * h * (10 + 24 / t + attn / t)


@pytest.mark.parametrize("t,sp,rc", [(1, False, "none"), (8, False, "none"), (8, True, "none"),
                                     (8, False, "selective"), (8, True, "selective"),
                                     (8, False, "full"), (8, True, "full")])
def test_activation_memory_matches_korthikanti_table2(t, sp, rc):
    m = gpt()
    st = Strategy(tp=t, mbs=B, gbs=B, seq_len=S, sp=sp, recompute=rc)
    got = activation_bytes_per_layer(m, st, attention="unfused", dropout=True)
    assert got == pytest.approx(korthikanti(m, t, sp, rc), rel=1e-9)


def test_flash_attention_removes_quadratic_term():
    m = gpt()
    st = Strategy(tp=8, mbs=1, gbs=1, seq_len=8192, sp=True)
    flash = activation_bytes_per_layer(m, st, attention="flash")
    unfused = activation_bytes_per_layer(m, st, attention="unfused")
    assert flash < unfused / 3


def test_inflight_microbatches_1f1b_and_interleaved():
    st = Strategy(pp=8, dp=1, mbs=1, gbs=64)
    assert [inflight_microbatches(st, i) for i in range(8)] == [8, 7, 6, 5, 4, 3, 2, 1]
    inter = Strategy(pp=8, vp=3, dp=1, mbs=1, gbs=64, schedule="interleaved")
    assert inflight_microbatches(inter, 0) == pytest.approx(8 * (1 + 7 / 24))
    gp = Strategy(pp=8, dp=1, mbs=1, gbs=64, schedule="gpipe")
    assert inflight_microbatches(gp, 3) == 64


def test_zero_stages_follow_rajbhandari_fig1():
    # 7.5B parameters on 64-way DP: ZeRO paper Fig. 1 gives 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    p = StageParams(7.5e9, 0.0)
    expected = {0: 120e9, 1: 31.4e9, 2: 16.6e9, 3: 1.9e9}
    for z, want in expected.items():
        st = Strategy(dp=64, zero=z, gbs=64)
        assert sum(model_state_bytes(p, st)) == pytest.approx(want, rel=0.02)


def test_stage_layers_cover_every_layer_once():
    m = gpt(layers=30)
    for pp in (1, 2, 4, 7, 30):
        st = Strategy(pp=pp, gbs=4 * pp)
        got = [i for stage in stage_layers(m, st) for i in stage]
        assert got == list(range(30))


def test_moe_parameter_count_and_active():
    m = Model(name="moe", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
              ffn_hidden_size=14336, vocab_size=32000, ffn_type="swiglu",
              moe=MoeSpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336))
    assert m.num_params == pytest.approx(46.7e9, rel=0.01)  # Mixtral 8x7B
    assert m.num_active_params == pytest.approx(12.9e9, rel=0.01)


def test_dropout_and_learned_positions_follow_the_model_not_its_family():
    """``Model.dropout``: a Llama-style model run with Megatron-LM's default dropout saves the two
    residual branches' 1-byte masks per element (Korthikanti's count: 2 sbh), a GPT without dropout
    none; ``position_embedding: learned`` puts a max(seq, max_seq_len) x h table, replicated over
    tensor parallelism, on the first stage, and RoPE none."""
    from dataclasses import replace

    from sim.layers.stages import position_embedding_params, stage_params

    llama = Model(name="l", num_layers=4, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=2816,
                  vocab_size=32000, ffn_type="swiglu")
    st = Strategy(tp=2, mbs=2, gbs=2, seq_len=4096, sp=True)
    masks = 2 * 2 * 4096 * 1024 / 2  # 2 bytes per element (two masks), micro-batch 2, sharded by SP
    assert not llama.has_dropout and replace(llama, dropout=True).has_dropout
    assert (activation_bytes_per_layer(replace(llama, dropout=True), st) - activation_bytes_per_layer(llama, st)
            == pytest.approx(masks))
    g = gpt(layers=4, h=1024, heads=8)
    assert g.has_dropout and not replace(g, dropout=False).has_dropout
    assert (activation_bytes_per_layer(g, st) - activation_bytes_per_layer(replace(g, dropout=False), st)
            == pytest.approx(masks))
    learned = replace(llama, position_embedding="learned", max_seq_len=2048)
    assert position_embedding_params(llama, st) == 0 and position_embedding_params(learned, st) == 4096 * 1024
    first = stage_params(learned, st, [0, 1], first=True, last=False).dense_params
    assert first - stage_params(llama, st, [0, 1], first=True, last=False).dense_params == 4096 * 1024
    assert stage_params(learned, st, [2, 3], first=False, last=True) == stage_params(llama, st, [2, 3], first=False,
                                                                                         last=True)
    # the table belongs to the embedding, not spread over the stage's layers (stage_memory's units)
    assert stage_params(learned, st, [0, 1], first=True, last=False).embedding_params == 32000 * 1024 / 2 + 4096 * 1024
    assert stage_params(learned, st, [2, 3], first=False, last=True).embedding_params == 0
