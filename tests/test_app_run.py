"""The what-if app computes on request, keeps a design in its address, shows the search's
stages, and tells the same story as the CLI (issue 20 part 5, issue 21 item 7).

AppTest drives the page; the background jobs, the link codec and the presentation helpers are
tested directly.  The browser round trip through a shared URL is in ``tests/test_app_browser.py``.
"""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
from streamlit.testing.v1 import AppTest

from appkit import engines, present
from appkit.design import Design, cluster_of
from appkit.evaluate import evaluate
from appkit.jobs import Cancelled, JobStore
from appkit.links import MAX_LINK_MODEL_CHARS, decode_upload, encode_upload, ignored_values
from planner.exports import FORMATS
from sim.data.catalog import get_model
from sim.base.errors import InputError

from tests.test_app import APP, DATA, _by_key, error_next_to, fresh, metric, open_tab, plain, set_inputs

GPT3 = get_model("gpt3-175b")


def status_labels(at: AppTest) -> list[str]:
    return [s.label for s in at.get("status")]


def timed(at: AppTest) -> int:
    """Candidates the search timed, from its summary line."""
    [line] = [c.value for c in at.caption if c.value.startswith("Search: ")]
    return int(re.match(r"Search: ([\d,]+) candidates timed", line).group(1).replace(",", ""))


def infos(at: AppTest) -> list[str]:
    return [plain(i.value) for i in at.info]


# --------------------------------------------------------------------------- compute on request


def test_an_edit_waits_for_run_and_run_computes():
    import appkit.ui

    at = fresh()
    before = metric(at, "Step time")
    set_inputs(at, run=False, oversubscription=3.0)
    # nothing was searched: the page says what changed and still shows the computed design
    assert any("changes not computed yet" in i and "oversubscription 1 → 3" in i for i in infos(at)), infos(at)
    assert metric(at, "Step time") == before
    pending = at.session_state["shown"].with_(oversubscription=3.0)
    assert appkit.ui.job_store().get(appkit.ui.search_key(pending)) is None
    at.button(key="run").click().run()
    assert not at.exception and not infos(at)
    assert metric(at, "Step time") != before
    [label] = status_labels(at)
    assert label.startswith("Computed in") and "searching" in label and "re-ranking" in label
    # a design seen before comes back without Run; so does a change the search does not depend on
    set_inputs(at, run=False, oversubscription=1.0)
    assert metric(at, "Step time") == before and not infos(at)
    days = metric(at, "Time to train")
    set_inputs(at, run=False, token_budget=100.0)
    assert metric(at, "Time to train") != days and not infos(at)


def test_run_main_button_and_bad_input_without_traceback():
    at = fresh()
    set_inputs(at, run=False, rerank=False)
    assert any("event re-ranking True → False" in i for i in infos(at))
    at.button(key="run_main").click().run()  # the banner's Run does the same
    assert at.session_state["shown"].rerank is False and not infos(at)
    set_inputs(at, run=False, nvlink_domain=3)  # caught before any search, next to its field
    assert "nvlink_domain = 3" in error_next_to(at, "nvlink_domain") and not at.exception


def test_search_stages_reach_the_progress_callback():
    stages: list[str] = []
    out = engines.recommend(get_model("llama3-8b"), cluster_of(Design(model=get_model("llama3-8b"),
                            model_ref="llama3-8b", gpu="h100-80gb", num_gpus=16)),
                            gbs=64, seq_len=2048, top=3, precisions=("bf16",), progress=stages.append)
    assert out["plans"]
    words = [s.split(" ")[0] for s in stages]  # each default profile is searched (and its layouts priced)
    assert words[-3:] == ["ranking", "re-ranking", "explaining"] and set(words[:-3]) == {"searching", "pricing"}
    assert stages[0] == "searching the strategy space on 16 GPUs (megatron-core)"


# --------------------------------------------------------------------------- background jobs


def test_job_store_runs_once_per_key_and_keeps_errors():
    store = JobStore(max_done=2)
    gate = threading.Event()
    calls = []

    def work(progress):
        calls.append(1)
        progress("one")
        gate.wait(5)
        progress("two")
        return 42

    a = store.start("k", work)
    assert store.start("k", work) is a and not a.done
    gate.set()
    assert a.wait(5) and a.result == 42 and calls == [1]
    assert [s.name for s in a.snapshot()] == ["one", "two"] and all(s.ended is not None for s in a.snapshot())

    def bad(progress):
        raise InputError("gbs", 7, "does not divide")

    b = store.start("bad", bad)
    assert b.wait(5) and isinstance(b.error, InputError)
    for k in ("x", "y"):
        store.start(k, lambda progress: k).wait(5)
    assert store.get("k") is None and store.finished("y")  # least recently used out


def test_job_store_cancels_at_the_next_stage():
    store = JobStore()
    gate = threading.Event()

    def work(progress):
        progress("long")
        gate.wait(5)
        progress("never reached")
        return 1

    job = store.start("k", work)
    time.sleep(0.05)
    store.cancel("k")
    gate.set()
    assert job.wait(5) and isinstance(job.error, Cancelled) and job.result is None
    again = store.start("k", lambda progress: 2)  # a cancelled key starts afresh
    assert again is not job and again.wait(5) and again.result == 2


# --------------------------------------------------------------------------- the design in the URL


def test_link_opens_the_same_design_with_plan_and_tab():
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({"gpu": "h100-80gb", "num_gpus": "256", "nic": "ib-ndr-400", "seq_len": "4096",
                            "pricing": "cloud", "strategy": "tp=8,pp=4,mbs=1,gbs=256,recompute=selective",
                            "plan": "1", "tab": "Hand-off"})
    at.run()
    assert not at.exception and not at.error
    d = at.session_state["shown"]
    assert (d.gpu, d.num_gpus, d.nic, d.seq_len, d.pricing) == ("h100-80gb", 256, "ib-ndr-400", 4096, "cloud")
    assert d.strategy == "tp=8,pp=4,mbs=1,gbs=256,recompute=selective"
    assert at.selectbox(key=at.session_state["plan_choice_key"]).value.startswith("#1")
    assert "--gpu h100-80gb --num-gpus 256" in at.code[0].value  # the Hand-off tab is open
    assert metric(at, "Cost to train (cloud)").startswith("$")


def test_uploaded_model_travels_in_the_link():
    data = (DATA / "hf_llama3_8b_config.json").read_bytes()
    at = fresh(model_source="Upload file", num_gpus=16, strategy="tp=1,pp=1,mbs=1,gbs=16,zero=3,recompute=full")
    at.get("file_uploader")[0].upload("config.json", data, "application/json")
    at.button(key="run").click().run()
    link = dict(at.query_params)
    assert link["model_file"] == "config.json" and decode_upload(link["model_data"]) == data
    other = AppTest.from_file(APP, default_timeout=120)  # a colleague opens the link
    other.query_params.update({"model_source": "Upload file", "num_gpus": "16",
                               "strategy": "tp=1,pp=1,mbs=1,gbs=16,zero=3,recompute=full",
                               "model_file": link["model_file"], "model_data": link["model_data"]})
    other.run()
    assert not other.exception and not other.error
    assert other.session_state["shown"].model == at.session_state["shown"].model
    assert metric(other, "Step time") == metric(at, "Step time")
    assert any("using config.json" in c.value for c in other.sidebar.caption)


def test_bad_link_gets_one_message_not_a_traceback():
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({"topology": "bogus", "num_gpus": "-5", "model_source": "Upload file",
                            "model_data": "not-a-model"})
    at.run()
    assert not at.exception
    [warn] = [plain(w.value) for w in at.warning]
    assert "topology = bogus" in warn and "num_gpus = -5" in warn
    assert "model_data = not-a-model: is not a model file" in error_next_to(at, "model_file")


def test_link_codec():
    data = (DATA / "hf_mixtral_8x7b_config.json").read_bytes()
    text = encode_upload(data)
    assert text is not None and len(text) < len(data) and decode_upload(text) == data
    for broken in (text[: len(text) // 2], text + "!", "", "A" * (MAX_LINK_MODEL_CHARS + 1)):
        with pytest.raises(InputError, match="model_data"):
            decode_upload(broken)
    assert encode_upload(os.urandom(20_000)) is None  # incompressible: too long for an address
    assert ignored_values({"gpu": "h100-80gb", "num_gpus": "512", "fp8": "true", "gbs": "x", "plan": "2"},
                          {"gpu": "h100-80gb", "num_gpus": 512, "fp8": False, "gbs": None}) == ["fp8 = true", "gbs = x"]


# --------------------------------------------------------------------------- the same story as the CLI


def test_one_verdict_on_what_bounds_the_plan():
    ev = evaluate(Design(model=GPT3, model_ref="gpt3-175b", gpu="a100-80gb", num_gpus=1024))
    first = present.ranked(ev.plans)[0]
    assert ev.search["explanation"]["lines"][0] == present.verdict(first)  # "Why #1" and the page agree
    at = fresh()
    page = "\n".join(plain(m.value) for m in at.markdown)
    assert f"**Plan #1** is {present.verdict(first)}." in page
    assert set(re.findall(r"bound by [^\n]*? of the step", page)) == {present.verdict(first)}


def test_pcie_workstation_is_shown_as_pcie():
    at = fresh(gpu="rtx4090-24gb", num_gpus=4, model="llama3-8b", gbs=16)
    domain = _by_key(at, "nvlink_domain")
    assert domain.disabled and domain.proto.placeholder == "none: PCIe card"
    built = [plain(c.value) for c in at.sidebar.caption if c.value.startswith("As built")]
    assert built and "on PCIe" in built[0] and "NVLink domain" not in built[0] and "no scale-out" in built[0]
    open_tab(at, "Topology")
    names = list(at.table[0].value["metric"])
    assert "NVLink domains" not in names and any(n.startswith("PCIe nodes") for n in names)


def test_handoff_of_the_default_recommendation_never_crashes():
    at = open_tab(fresh(), "Hand-off")
    assert not at.exception
    # the plan's line names its framework, precision and the engine that timed it; then the search's
    simulate_line, search_line = (c.value for c in at.code[:2])
    assert simulate_line.startswith("planner simulate --model gpt3-175b") and "--framework " in simulate_line
    assert "precision=bf16" in simulate_line and re.search(r"--engine (event|analytic)", simulate_line)
    assert search_line.startswith("planner recommend --model gpt3-175b") and "--precision" not in search_line
    labels = [b.label for b in at.get("download_button")]
    assert "Download result (JSON)" in labels
    if "Download all launch configs (zip)" not in labels:  # no format runs #1: reasons and ways out
        refused = next(d.value for d in at.dataframe if "why not" in d.value.columns)
        assert len(refused) == len(FORMATS) and refused["why not"].str.len().min() > 0
        at.button(key="handoff_fw_megatron-core").click().run()
        assert not at.exception and at.session_state["shown"].framework == "megatron-core"
        labels = [b.label for b in at.get("download_button")]
    assert "Download all launch configs (zip)" in labels
    assert any(lab.startswith("megatron/") for lab in labels)
    rows = open_tab(at, "Plans").dataframe[0].value
    assert "megatron-core" in set(rows["framework"])


def test_fp8_is_opt_in():
    """bf16 unless asked; the fp8 alternative said with its gain and recipe, one button opts in;
    fp8 plans' MFU against the fp8 peak and the bf16 peak, labelled, never above 100%; the
    memory headroom control is --memory-headroom (device level)."""
    at = fresh(model="llama3-8b", gpu="a100-80gb", num_gpus=16)
    assert _by_key(at, "fp8").disabled  # no fp8 tensor cores
    assert _by_key(at, "memory_headroom").value is None  # auto: the measured default
    set_inputs(at, gpu="h100-80gb", memory_headroom=0.3)
    rows = at.dataframe[0].value
    assert set(rows["precision"]) == {"bf16"} and rows["MFU (fp8 peak)"].isna().all()
    assert at.session_state["shown"].precisions is None  # the GPU's own (bf16), as recommend without --precision
    assert at.session_state["shown"].memory_headroom == 0.3
    assert any("memory headroom: 30% of GPU memory kept free (--memory-headroom)" in plain(c.value) for c in at.caption)
    assert (rows[present.MEMORY_COLUMN] <= 0.7 * 80 * (1 + 1e-3)).all()  # device level, 30% kept free
    [alt] = [i for i in infos(at) if i.startswith("fp8 alternative")]
    assert re.search(r"fp8 would be \d+% faster .* megatron-core's delayed recipe", alt)
    bf16_timed = timed(at)
    at.button(key="search_fp8").click()  # "Allow fp8 and search again"
    at.run()
    assert not at.exception
    assert at.session_state["shown"].precisions == ("bf16", "fp8") and _by_key(at, "fp8").value
    assert timed(at) > bf16_timed  # the search covered the fp8 candidates too
    rows = at.dataframe[0].value
    assert set(rows["precision"]) <= {"bf16", "fp8 (delayed)", "fp8 (tensorwise)",
                                      "fp8 (blockwise)", "fp8 (mxfp8)"}
    assert not [i for i in infos(at) if i.startswith("fp8 alternative")]  # fp8 is searched now
    shown = [v for col in ("MFU (bf16 peak)", "MFU (fp8 peak)") for v in rows[col].dropna()]
    assert shown and max(shown) <= 1.0
    if rows["precision"].iloc[0] != "bf16":  # an fp8 #1: both peaks, labelled
        assert metric(at, "MFU (fp8 peak)").endswith("%")
        assert any("of the bf16 peak" in plain(c.value) for c in at.caption)