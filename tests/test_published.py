"""Accuracy against the reference runs, locked on the leave-one-source-out figures.

Every row of ``catalogs/reference/`` (30 published runs, 81 development-set runs, 11 sources)
is predicted by the model fitted without its source's data (``planner check-published
--loso``).  Each source's median and worst |step-time error| must stay within its recorded
tolerance; the tolerance and the reason for it are data here.  A change that makes a source
worse than its tolerance, or the overall figures worse than recorded, fails CI.  The in-sample
figures of the 30 published rows are locked too.
"""

import pytest

from planner.fitting.published import compare_all, load_runs, summary, summary_by_source

# source -> (median tolerance, worst-row tolerance, why)
TOLERANCES = {
    "narayanan2021": (0.04, 0.10, "Narayanan et al. 2021 Table 1: mbs/vp unstated (filled by rule); with the A100's "
                                  "sustained GEMM clock -8..+4%, the smallest runs (TP 1-2) the slowest"),
    "korthikanti2022": (0.02, 0.05, "Korthikanti et al. 2022: its Table 4 feeds no fitted value (the GEMM shape "
                                    "factor comes from GEMM sweeps); rows -3..+3%"),
    "pytorch/torchtitan": (0.07, 0.35, "torchtitan on 500 W H100 HBM2e (peak unknown, +-8%); context-parallel rows at "
                                       "131k-262k tokens run ~30% slower than FlashAttention-2 plus the ring's per-step "
                                       "cost; eager rows +3/+4% at the measured eager traffic; compiled rows -5/-6%, "
                                       "compiled float8 +0/-1% (and the context-parallel 32k/64k rows -12/-6%) with "
                                       "torchao's casts and the complex rotary embedding at the bytes inductor's "
                                       "kernels move (median 5.6%)"),
    "NVIDIA/dgxc-benchmarking": (0.05, 0.35, "NeMo recipes: DeepSeek-V3 on GB200 (25.05) runs at 10% MFU: -32/-30% with "
                                             "its recipe's MTP and pipeline split, TE 2.x's unfused MLA attention on "
                                             "Blackwell and the shape factor of its 192-wide batched score GEMMs (was "
                                             "-62/-60%); on H100 -4/-10% since MTP is priced"),
    "NVIDIA-NeMo/Automodel": (0.16, 0.33, "Automodel: DeepEP sends one copy per destination rank/node and the "
                                          "benchmark's FakeBalancedGate puts a token's experts on 1-2 ranks; the "
                                          "gpt-oss rows run the ep_size of their linked configs; a pipeline flush "
                                          "per accumulation step with FSDP's reduce-scatter after each, TE-fused "
                                          "norms/RoPE/permute, eager residual adds at their measured traffic "
                                          "(validate/eager_traffic.py) and the configs' loss on bf16 logits "
                                          "(MaskedCrossEntropy fp32_upcast: false, 2-3 points faster than the "
                                          "upcast: Qwen3-30B -9%, gpt-oss-20b -10%); the 70B row read with its "
                                          "config's full recomputation (+4%); the gpt-oss rows' FlexAttention at its "
                                          "measured speed (-9 / -28%); DeepSeek-V3 1024 -22%, Kimi-K2 -19%, "
                                          "DeepSeek-V3 256 -13%: a cost of multi-node MoE missing"),
    "yanring/Megatron-MoE-ModelZoo": (0.13, 0.23, "Qwen3-235B on GB200/GB300 with CUDA graphs runs 0-11% fast (A2A "
                                                  "overlap's unpaired warm-up/cool-down passes priced); the "
                                                  "128k-token row's activation offload is not modelled (+21%)"),
    "NVIDIA/NeMo": (0.10, 0.18, "NeMo 24.03 long-sequence: TFLOPS-only rows (FLOP convention counts the full "
                                "attention square); NeMo Framework Launcher ran flash-attn 2 (NVTE_FUSED_ATTN=0), "
                                "-0.3..+15%, the 1M-token row (CP 32) the furthest"),
    "FlagOpen/FlagPerf": (0.04, 0.30, "FlagPerf: Mixtral row's README states EP inconsistently (-24%); "
                                      "Megatron-DeepSpeed rows -12/-14% (eager SwiGLU/RoPE at their measured traffic); "
                                      "with the A100's sustained GEMM clock the Hugging Face + ZeRO-3 rows -3..0% and "
                                      "the Megatron-Core A800 rows on 8 GPUs -4..0%"),
    "mlcommons/training_results_v4.1": (0.07, 0.12, "MLPerf GPT-3 175B: H100 256-GPU row +8%, B200 -7% (Blackwell's "
                                                    "GEMM fraction read with the shape factor taken out of TE's "
                                                    "profiled GEMMs)"),
    "mlcommons/training_results_v5.0": (0.06, 0.13, "MLPerf Llama 3.1 405B on H100/GB200 (CUDA graphs): H100 within "
                                                    "-1..+6%, GB200 512/2496 -12/-10% with the cuDNN <= 9.13 "
                                                    "attention of their containers"),
    "mlcommons/training_results_v5.1": (0.08, 0.18, "MLPerf Llama 3.1 8B: Cisco's 64/128 H100 rows run NVIDIA's MLPerf "
                                                    "NeMo 2 code (bf16 gradients, a NaN-checked gradient bucket per "
                                                    "tensor, no comm-overlap callback): -10/-15%; Dell B300 +7% and "
                                                    "MI350X / MI355X -7 / +1% with Megatron-Core's NaN check per bucket"),
}
# p90 0.30 -> 0.22 with DeepEP dedup; median 0.061 -> 0.048, p90 0.226 -> 0.176 with issue 23's fourth pass;
# fifth pass: 0.048 / 0.176, signed -0.039 -> -0.037
# sixth pass (GEMM shape factor from GEMM sweeps): 0.047 / 0.167, signed -0.031
# seventh pass (eager element-wise traffic measured per op, eager kernels' achieved bandwidth, NeMo 2's fused
# cross-entropy at its benchmark): 0.044 / 0.163, signed -0.031
# twelfth pass (FlexAttention, Megatron-Core's per-bucket NaN check, the MLPerf NeMo 2 code as Cisco ran it):
# 0.043 / 0.155, signed -0.025
# thirteenth pass (A2A overlap's passes without a partner, the A100's sustained GEMM clock): 0.039 / 0.143,
# signed -0.015
OVERALL = {"median_abs_step_error": 0.045, "p90_abs_step_error": 0.15}
# The lean (issue 23): the median signed error must stay inside this band.
SIGNED_MEDIAN = (-0.025, 0.02)
MEMORY_MEDIAN = 0.11  # device-level (FlagPerf nvidia-smi) and reserved (torchtitan) memory, all rows; 10.6% with
# NCCL's NVLS buffers per communicator on NVLink4 NVSwitch (Hopper rows); 12.5% with the FSDP2
# reduce-scatter stream pool, Megatron's extra communicators and TE's fp8 weight cache (was 14.8%)


@pytest.fixture(scope="module")
def loso(loso_rows):
    rows, skipped = loso_rows
    return {r.run_id: r for r in rows}, skipped


@pytest.fixture(scope="module")
def in_sample():
    return {r.run_id: r for r in compare_all(file="published")}


def test_every_row_is_scored_or_listed_with_a_reason(loso):
    rows, skipped = loso
    ids = {r["id"] for r in load_runs()}
    assert len(ids) == 111
    assert ids == set(rows) | {s.run_id for s in skipped}
    assert all(s.reason for s in skipped)


@pytest.mark.parametrize("source", sorted(TOLERANCES))
def test_loso_per_source_within_tolerance(loso, source):
    rows, _ = loso
    s = summary_by_source(list(rows.values()))[source]
    median_tol, worst_tol, _ = TOLERANCES[source]
    assert s["median_abs_step_error"] <= median_tol, (source, s)
    assert s["max_abs_step_error"] <= worst_tol, (source, s)


def test_every_source_has_a_tolerance(loso):
    rows, _ = loso
    assert set(summary_by_source(list(rows.values()))) == set(TOLERANCES)


def test_loso_overall_does_not_regress(loso):
    rows, _ = loso
    s = summary(list(rows.values()))
    assert s["num_runs"] >= 108
    for key, tol in OVERALL.items():
        assert s[key] <= tol, (key, s)
    assert SIGNED_MEDIAN[0] <= s["signed_median_step_error"] <= SIGNED_MEDIAN[1], s
    assert s["median_abs_memory_error"] <= MEMORY_MEDIAN


def test_in_sample_published_rows(in_sample):
    s = summary(list(in_sample.values()))
    assert s["num_runs"] == 30
    assert s["median_abs_step_error"] <= 0.08
    # torchtitan peak reserved memory.  Issue 22: the allocated level is now checked tensor by
    # tensor against PyTorch's tracker (planner validate memory); the published reserved peaks
    # sit 3-11% above the reserved prediction (every row under: the sharded gradients in FSDP2's
    # reduce-scatter stream pool are now counted; eager torchtitan's extra cached activation
    # blocks (-9/-10% vs -3% compiled) and the long-sequence CP rows' ring-attention buffers
    # are not modelled).  Was 0.13 / 0.16 before the stream pool; 0.06 / 0.10 when the
    # activation count over-estimated by about as much as the allocator slack.
    assert s["median_abs_memory_error"] <= 0.10
    assert s["max_abs_memory_error"] <= 0.12


def test_utilisation_follows_source_definition(in_sample):
    # Narayanan's "% of peak" counts recomputation: compare with our HFU, which must be close.
    r = in_sample["megatron-sc21-t1-gpt18.4b-256gpu"]
    assert r.published.hfu == pytest.approx(0.43)
    assert r.predicted.hfu == pytest.approx(r.published.hfu, rel=0.06)
    assert r.predicted.mfu < r.predicted.hfu  # full recomputation
    k = in_sample["korthikanti22-175b-sp-selective-64gpu"]
    assert k.predicted.mfu == pytest.approx(k.published.mfu, rel=0.12)


def test_event_engine_agrees_on_memory_and_roughly_on_time(in_sample):
    """Both engines report memory through sim.cost.memory.plan_memory (framework policy included)."""
    rid = "torchtitan-2412-t1-llama31-8b-8gpu-fsdp-seq8192"
    ev = compare_all(engine="event", ids=[rid])[0]
    an = in_sample[rid]
    assert ev.predicted.memory_peak_bytes == pytest.approx(an.predicted.memory_peak_bytes, rel=1e-12)
    assert ev.predicted.step_time_s == pytest.approx(an.predicted.step_time_s, rel=0.05)


def test_loso_refits_only_the_sources_the_fit_reads(loso):
    """Sources whose data the fit never reads are predicted by the catalog's fit; Korthikanti
    et al.'s rows by the fit without its Table 4 (planner.fitting.fit), which since the shape
    factor comes from GEMM sweeps fits the same values."""
    from planner.fitting.published import fitted_without
    from sim.layers.compute import catalog_fitted

    assert fitted_without("FlagOpen/FlagPerf") is catalog_fitted() or \
        fitted_without("FlagOpen/FlagPerf") == catalog_fitted()
    assert fitted_without("korthikanti2022")["excluded_sources"] == ["korthikanti2022"]


def test_unstated_batch_split_falls_back_to_the_least_memory_when_nothing_fits():
    """A run that ran did fit: when no unstated micro-batch size fits our memory model, the row is
    scored at the one closest to fitting (the least memory), not at the fastest."""
    from planner.fitting.published import compare_run
    row = next(r for r in load_runs() if r["id"] == "nemo-longseq-llama2-7b-fp8-h100-4k")
    c = compare_run(row)
    assert not c.predicted.fits_memory
    assert c.plan.strategy.mbs == 1
    assert any("least memory" in a for a in c.assumptions)


def test_unstated_recomputation_is_read_as_full_only_when_activations_alone_cannot_fit():
    """A run that ran recomputed when its saved activations alone exceed the GPU (Automodel's
    Llama 3 70B benchmark config sets activation_checkpointing: True; the table omits it); rows
    that only come close keep no recomputation."""
    from planner.fitting.published import compare_run
    rows = {r["id"]: r for r in load_runs()}
    c = compare_run(rows["automodel-llama3-70b-bf16-h100-64"])
    assert c.plan.strategy.recompute == "full" and c.predicted.fits_memory
    assert any("unstated recomputation read as full" in a for a in c.assumptions)
    near = compare_run(rows["dgxc2505-nemotron4-15b-bf16-h100-16"])  # near the GPU's memory, fits as it ran
    assert near.plan.strategy.recompute == "none"
    assert near.predicted.memory.activations_bytes < near.plan.cluster.gpu.hbm_bytes
    assert near.predicted.fits_memory  # the precision-aware optimizer's 4 + 10/d (was 4 + 16/d: over by 3.9 GiB)


def test_nemo_performance_script_rows_read_fp8_parameters_and_bf16_gradients():
    """dgxc-benchmarking 25.05 runs NeMo's scripts/performance: fp8 runs get bf16_with_fp8_mixed
    (fp8_param_gather) and grad_reduce_in_fp32=False."""
    from planner.fitting.published import compare_run
    c = compare_run(next(r for r in load_runs() if r["id"] == "dgxc2505-nemotron4-15b-fp8-h100-16"))
    assert c.plan.strategy.fp8_params and c.plan.model_states_layout == "megatron_bf16_grads"
    assert any("fp8 parameters" in a for a in c.assumptions)
