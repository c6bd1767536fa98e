"""The what-if app: every input path and error path through Streamlit's AppTest, and the
``appkit`` logic behind it (known answers and invariants).

The browser end-to-end test is ``tests/test_app_browser.py``.
"""

from __future__ import annotations

import io
import json
import math
import re
import shlex
import zipfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Block, Widget

from appkit import charts, compare, engines, present
from appkit.design import WIDGETS, Design, cluster_of, model_from_upload, widget_for_error
from appkit.evaluate import cli_command, evaluate, result_document, simulate_strategy
from appkit.topoview import summarize_topology, topology_figure
from sim.data.catalog import get_model
from sim.base.errors import InfeasibleError, InputError
from sim.net.topology import build_topology

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
DATA = ROOT / "tests" / "data"
STRATEGY = "tp=8,pp=16,vp=3,mbs=1,sp=1,recompute=selective"
GPT3 = get_model("gpt3-175b")


# --------------------------------------------------------------------------- helpers


def fresh(**inputs) -> AppTest:
    """The app after its first run (which computes the default design), then with ``inputs``
    set (widget key -> value) and **Run** pressed."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    if inputs:
        set_inputs(at, **inputs)
    return at


def set_inputs(at: AppTest, *, run: bool = True, **inputs) -> AppTest:
    """Set widgets, then press Run (``run``) or just let the page rerun as an edit does."""
    for key, value in inputs.items():
        _by_key(at, key).set_value(value)
    if run:
        at.button(key="run").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _by_key(at: AppTest, key: str) -> Widget:
    for node in walk(at.sidebar) + walk(at.main):
        if isinstance(node, Widget) and node.key == key:
            return node
    raise KeyError(key)


def walk(node) -> list:
    out = []
    for child in getattr(node, "children", {}).values():
        out.append(child)
        if isinstance(child, Block):
            out += walk(child)
    return out


def plain(markdown: str) -> str:
    """Undo the app's Markdown escaping (``tp\\*pp`` -> ``tp*pp``), as a reader sees it."""
    return re.sub(r"\\(.)", r"\1", markdown)


def sidebar_errors(at: AppTest) -> list[str]:
    return [plain(e.value) for e in at.sidebar.error]


def error_next_to(at: AppTest, key: str) -> str:
    """The error drawn right under widget ``key`` (at most its row neighbour in between)."""
    nodes = walk(at.sidebar)
    idx = next(i for i, n in enumerate(nodes) if isinstance(n, Widget) and n.key == key)
    between = 0
    for n in nodes[idx + 1:]:
        if type(n).__name__ == "Error":
            return plain(n.value)
        if isinstance(n, Widget):
            between += 1
            if between > 1:
                break
    raise AssertionError(f"no error next to {key}; sidebar errors: {sidebar_errors(at)}")


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def open_tab(at: AppTest, name: str) -> AppTest:
    at.session_state["tab"] = name
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def design(**kw) -> Design:
    base = dict(model=GPT3, model_ref="gpt3-175b", gpu="a100-80gb", num_gpus=1024)
    base.update(kw)
    return Design(**base)


# --------------------------------------------------------------------------- AppTest: input paths


def test_default_page_recommends_for_the_catalog_design():
    at = fresh()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    assert [t.label for t in at.tabs] == ["Plans", "Timeline", "Topology", "Compare", "Hand-off"]
    rows = at.dataframe[0].value
    # the recommender's plans in its rank order, numbered as `planner recommend` numbers them
    assert list(rows["rank"]) == [f"#{i + 1}" for i in range(len(rows))] and len(rows) >= 2
    assert set(rows["fits"]) == {True} and set(rows["precision"]) == {"bf16"}  # bf16 unless asked
    assert rows["framework"].str.len().min() > 0
    assert metric(at, "MFU").endswith("%")
    assert len(at.get("plotly_chart")) == 2  # breakdown and memory
    # the band sits next to the time as a caption (not a metric delta with an arrow)
    assert not [m for m in at.metric if m.label == "Step time" and m.delta]
    low, high = rows["80% band (s)"].iloc[0].split(" .. ")
    assert f"80% band {low} s .. {high} s" in [c.value for c in at.caption]  # 10-100 s steps: same digits
    # the search's stages, collapsed once done
    [status] = [s.label for s in at.get("status")]
    assert status.startswith("Computed in") and "searching" in status and "ranking" in status


def test_fixed_strategy_matches_the_simulator():
    at = fresh(strategy=STRATEGY)
    rows = at.dataframe[0].value
    assert rows["rank"].iloc[0] == "yours"
    expected = simulate_strategy(design(), cluster_of(design()), STRATEGY + ",gbs=512")
    # the default gbs of a pipelined STRATEGY without gbs is 4*pp micro-batches per replica
    assert rows["gbs"].iloc[0] == 512
    assert rows["step time (s)"].iloc[0] == pytest.approx(expected["step_time_s"], abs=1e-4)
    assert metric(at, "Step time") == charts.fmt_s(expected["step_time_s"])
    assert not sidebar_errors(at)


def test_changing_one_input_recomputes():
    at = fresh(strategy="tp=8,pp=16,mbs=1,gbs=1024,sp=1,recompute=selective")
    before = at.dataframe[0].value.iloc[0]
    set_inputs(at, num_gpus=512)
    after = at.dataframe[0].value.iloc[0]
    assert (before["dp"], after["dp"]) == (8, 4)
    # half the GPUs, same global batch: each replica does twice the micro-batches
    assert after["step time (s)"] > 1.6 * before["step time (s)"]
    set_inputs(at, gpu="h100-80gb")
    h100 = at.dataframe[0].value.iloc[0]
    assert h100["step time (s)"] < after["step time (s)"]


def test_cluster_widgets_reach_the_cluster():
    at = fresh(strategy="tp=8,pp=4,mbs=1,gbs=512,recompute=full", gpu="h100-80gb", num_gpus=256,
               nic="roce-400", nics_per_node=4, topology="rail-optimized", oversubscription=2.0, seq_len=4096)
    open_tab(at, "Hand-off")
    code = at.code[0].value
    for flag in ("--gpu h100-80gb", "--num-gpus 256", "--nic roce-400", "--nics-per-node 4",
                 "--topology rail-optimized", "--oversubscription 2", "--seq-len 4096"):
        assert flag in code
    assert len(at.get("download_button")) >= 1


@pytest.mark.parametrize("fname", ["hf_llama3_8b_config.json", "gpt_22b.yaml", "tiny_moe.json"])
def test_upload_model_file(fname):
    data = (DATA / fname).read_bytes()
    model = model_from_upload(fname, data)
    at = fresh(model_source="Upload file", num_gpus=16, strategy="tp=1,pp=1,mbs=1,gbs=16,zero=3,recompute=full")
    assert any("upload a model file" in e for e in sidebar_errors(at))
    at.get("file_uploader")[0].upload(fname, data, "application/json")
    at.button(key="run").click().run()
    assert not at.exception
    captions = [c.value for c in at.sidebar.caption]
    assert any(c.startswith(f"{model.name}: {model.num_params / 1e9:,.1f} B parameters") for c in captions), captions
    rows = at.dataframe[0].value
    assert rows["rank"].iloc[0] == "yours" and rows["zero"].iloc[0] == 3
    assert not sidebar_errors(at)


@pytest.mark.parametrize("fname,content,needle", [
    ("typo.yaml", (DATA / "bad_typo_key.yaml").read_bytes(), "model.hiden_size"),
    ("bad.json", b"{\"num_hidden_layers\": 2,", "is not valid JSON"),
    ("bin.json", b"\x00\x01\x02", "binary"),
    ("list.yaml", b"- 1\n- 2\n", "must be a mapping"),
    ("neg.yaml", (DATA / "bad_negative.yaml").read_bytes(), "model."),
])
def test_bad_upload_shows_field_and_value_next_to_the_uploader(fname, content, needle):
    at = fresh(model_source="Upload file")
    at.get("file_uploader")[0].upload(fname, content, "application/octet-stream").run()
    assert not at.exception
    msg = error_next_to(at, "model_file")
    assert needle in msg
    assert "Traceback" not in msg
    assert not at.metric  # no results from a bad model


@pytest.mark.parametrize("inputs,widget,needle", [
    ({"strategy": "tp=3"}, "strategy", "not divisible by tp*pp*cp"),
    ({"strategy": "tp=64,pp=8"}, "strategy", "tp = 64: must divide num_attention_heads=96"),
    ({"strategy": "tp=8,foo=1"}, "strategy", "unknown key"),
    ({"strategy": "tp=8,pp=16,mbs=1,gbs=100"}, "strategy", "gbs = 100"),
    ({"strategy": "tp=8,pp=16,mbs=1", "gbs": 100}, "gbs", "gbs = 100"),
    ({"nvlink_domain": 3}, "nvlink_domain", "nvlink_domain = 3"),
    ({"num_gpus": 1020}, "num_gpus", "must be a multiple of gpus_per_node"),
    ({"strategy": "tp=8,pp=16,precision=fp8"}, "strategy", "fp8"),
    ({"token_budget": 0.0}, "token_budget", "token_budget"),
])
def test_bad_input_shows_a_clear_message_next_to_the_field(inputs, widget, needle):
    at = fresh(**inputs)
    msg = error_next_to(at, widget)
    assert needle in msg, msg
    assert "Traceback" not in msg
    assert any("Please fix" in e.value for e in at.main.error)
    assert not at.exception


def test_internal_error_is_one_line_not_a_traceback(monkeypatch):
    import appkit.ui

    def boom(*a, **k):
        raise RuntimeError("simulated failure\nwith a second line")

    monkeypatch.setattr(appkit.ui, "compute", boom)
    at = fresh()
    assert not at.exception
    [err] = [plain(e.value) for e in at.error]
    assert "RuntimeError: simulated failure" in err and "second line" not in err


def test_plan_choice_drives_the_headline():
    at = fresh()
    box = at.selectbox(key=at.session_state["plan_choice_key"])
    labels = box.options
    assert len(labels) >= 2 and labels[0].startswith("#1") and labels[1].startswith("#2")
    rows = at.dataframe[0].value
    # the table keeps 4 decimals (appkit.evaluate), the headline formats the plan's own value to
    # 3: compare the numbers, not the strings (20.29952 s shows as 20.300 s, its row as 20.2995;
    # 21.71749 s as 21.717 s, its row 21.7175 as 21.718 s)
    shown = float(metric(at, "Step time").split()[0])
    assert shown == pytest.approx(rows["step time (s)"].iloc[0], abs=1.01e-3)
    box.select(labels[1]).run()
    shown = float(metric(at, "Step time").split()[0])
    assert shown == pytest.approx(at.dataframe[0].value["step time (s)"].iloc[1], abs=1.01e-3)
    # a fixed strategy makes a new plan list: the choice starts again at the top, the user's
    # plan, labelled "yours" (the recommender's #1 stays #1, as in "Why #1")
    set_inputs(at, strategy=STRATEGY)
    box = at.selectbox(key=at.session_state["plan_choice_key"])
    assert box.value.startswith("yours") and box.options[1].startswith("#1")


def test_token_budget_sets_time_to_train():
    at = fresh(strategy=STRATEGY, token_budget=300.0)
    tps = at.dataframe[0].value["tokens/s"].iloc[0]
    days = float(metric(at, "Time to train").split()[0].replace(",", ""))
    goodput = float(metric(at, "Goodput").rstrip("%")) / 100  # planner tco: failures and checkpoints
    assert 0.5 < goodput <= 1
    assert days == pytest.approx(300e9 / tps / goodput / 86400, rel=0.01)


# --------------------------------------------------------------------------- AppTest: tabs


def test_topology_tab_draws_the_graph_summary():
    at = open_tab(fresh(strategy=STRATEGY), "Topology")
    assert len(at.get("plotly_chart")) == 1
    table = at.table[0].value
    vals = dict(zip(table["metric"], table["value"]))
    assert vals["nodes"] == "128" and vals["NICs"] == "1,024"
    assert any("graph nodes" in c.value and "aggregated" in c.value for c in at.caption)


def test_timeline_tab_shows_the_event_engine_gantt():
    at = open_tab(fresh(strategy="tp=8,pp=4,mbs=1,gbs=64,recompute=selective", num_gpus=64), "Timeline")
    assert len(at.get("plotly_chart")) == 1
    assert any(c.value.startswith("Event engine: step") for c in at.caption)


def test_compare_keeps_at_most_three_designs_and_marks_differences():
    at = fresh(strategy="tp=8,pp=8,mbs=1,gbs=512,recompute=selective", num_gpus=512, gpu="h100-80gb",
               nic="ib-ndr-400")
    at.button(key="keep").click().run()
    set_inputs(at, num_gpus=1024, gpu="a100-80gb", nic="eth-100")
    at.button(key="keep").click().run()
    kept = at.session_state["compare"]
    assert [k["inputs"]["GPUs"] for k in kept] == [512, 1024]
    names, values, differ, best = compare.compare_rows(kept)
    assert {"GPU", "GPUs", "NIC", "step time (s)"} <= differ and "model" not in differ
    assert best["time to train (days)"] == 0  # the H100 / NDR design trains faster
    open_tab(at, "Compare")
    table = at.table[0].value
    assert list(table.columns) == [k["label"] for k in kept]
    assert table.loc["GPU"].tolist() == ["h100-80gb", "a100-80gb"]
    assert len(at.get("plotly_chart")) == 1
    for n in (256, 128):
        set_inputs(at, num_gpus=n)
        at.button(key="keep").click().run()
    assert [k["inputs"]["GPUs"] for k in at.session_state["compare"]] == [1024, 256, 128]
    at.button(key="clear_compare").click().run()
    assert at.session_state["compare"] == []


def test_handoff_offers_json_and_launch_configs():
    at = open_tab(fresh(strategy=STRATEGY), "Hand-off")
    labels = [b.label for b in at.get("download_button")]
    assert "Download result (JSON)" in labels
    assert "Download all launch configs (zip)" in labels


# --------------------------------------------------------------------------- appkit logic


def test_cluster_of_uses_the_cli_defaults():
    c = cluster_of(design(gpu="gb200-186gb", num_gpus=144))
    assert (c.gpus_per_node, c.nvlink_domain) == (4, 72)
    c = cluster_of(design(gpus_per_node=4, num_gpus=64))
    assert (c.gpus_per_node, c.nvlink_domain, c.nic.id) == (4, 4, "ib-hdr-200")


@pytest.mark.parametrize("exc,fixed,widget", [
    (InputError("model.hidden_size", 0, "x"), None, "model"),
    (InputError("moe.top_k", 9, "x"), None, "model"),
    (InputError("nvlink_domain", 3, "x"), None, "nvlink_domain"),
    (InputError("gpu", "zz", "x"), None, "gpu"),
    (InputError("seq_len", 0, "x"), None, "seq_len"),
    (InputError("gbs", 5, "x"), "tp=8", "gbs"),
    (InputError("gbs", 5, "x"), "tp=8,gbs=5", "strategy"),
    (InputError("tp", 3, "x"), "tp=3", "strategy"),
    (InputError("strategy.tp", 3, "x"), "tp=3,tp=4", "strategy"),
    (InfeasibleError("gpu_count", "num_gpus", 1024, "x"), "tp=3", "strategy"),
    (InputError("num_gpus", 1020, "x"), None, "num_gpus"),
    (InputError("something_else", 1, "x"), None, None),
])
def test_widget_for_error(exc, fixed, widget):
    assert widget_for_error(exc, design(strategy=fixed)) == widget
    assert widget is None or widget in WIDGETS


def test_every_error_target_is_a_sidebar_widget():
    at = fresh()
    for key in WIDGETS:
        assert isinstance(_by_key(at, key), Widget), key


def test_model_from_upload_matches_load_model():
    from sim.data.models import load_model

    for fname in ("hf_llama3_8b_config.json", "hf_mixtral_8x7b_config.json", "gpt_22b.yaml"):
        up = model_from_upload(fname, (DATA / fname).read_bytes())
        ref = load_model(str(DATA / fname))
        assert up.num_params == ref.num_params and up.moe == ref.moe
    with pytest.raises(InputError, match="upload a .json or .yaml"):
        model_from_upload("model.txt", b"{}")
    with pytest.raises(InputError, match="not UTF-8"):
        model_from_upload("m.yaml", b"\xff\xfe\xfa")
    with pytest.raises(InputError, match="rejected"):
        model_from_upload("m.json", b" " * (4 * 1024 * 1024 + 1))


def test_cli_command_reproduces_the_plan(capsys):
    from planner.cli import main

    d = design(gpu="h100-80gb", num_gpus=256, nic="roce-400", topology="rail-optimized", oversubscription=2.0,
               strategy="tp=8,pp=4,mbs=1,gbs=256,recompute=selective", seq_len=4096)
    ev = evaluate(d)
    plan = ev.plans[0]
    argv = shlex.split(cli_command(ev, plan, catalog_model=True))[1:] + ["--engine", "analytic", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-12)
    doc = json.loads(json.dumps(result_document(ev, plan, engines.simple_economics(ev.cluster, plan, tokens=1e12))))
    assert doc["plan"]["strategy"] == plan["strategy"] and doc["design"]["nic"] == "roce-400"
    assert doc["economics"]["time_to_train_s"] == pytest.approx(1e12 / plan["tokens_per_s"])


@pytest.mark.parametrize("strategy", [STRATEGY, "tp=4,pp=8,mbs=2,gbs=1024,zero=1,recompute=full",
                                      "tp=8,pp=1,mbs=1,gbs=512,zero=3,recompute=full"])
def test_breakdown_parts_sum_to_the_step(strategy):
    r = simulate_strategy(design(), cluster_of(design()), strategy)
    parts = charts.breakdown_parts(r)
    assert sum(parts.values()) == pytest.approx(r["step_time_s"], rel=1e-9)
    assert all(v >= -1e-12 for v in parts.values())
    mem = charts.memory_parts_gib(r)
    assert sum(mem.values()) == pytest.approx(r["memory_device_bytes"] / charts.GIB, rel=1e-9)
    fig = charts.breakdown_figure([("a", r)])
    assert sum(sum(t.x) for t in fig.data) == pytest.approx(r["step_time_s"], rel=1e-9)


def test_plans_table_rows():
    ev = evaluate(design(strategy=STRATEGY))
    rows = present.plans_table(ev.plans, ev.cluster, 2048, framework="default")
    row = rows[0]
    assert row["rank"] == "yours" and row["precision"] == "bf16" and row["framework"] == "megatron-core"  # resolved
    assert row["timed by"] == "analytic" and {r["timed by"] for r in rows[1:]} <= {"event", "analytic"}
    assert (row["tp"], row["pp"], row["dp"], row["vp"], row["schedule"]) == (8, 16, 8, 3, "interleaved")
    assert [r["rank"] for r in rows[1:]] == [f"#{i}" for i in range(1, len(rows))]
    assert rows[1]["vs #1"] == "" and all(r["vs #1"].startswith(("+", "-")) for r in rows[2:])


TINY_TRACE = {"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "stage 0"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "compute"}},
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "stage 1"}},
    {"ph": "X", "name": "F0", "cat": "forward", "pid": 0, "tid": 1, "ts": 0.0, "dur": 10.0},
    {"ph": "X", "name": "F0", "cat": "forward", "pid": 1, "tid": 1, "ts": 10.0, "dur": 10.0},
    {"ph": "X", "name": "B0", "cat": "backward", "pid": 1, "tid": 1, "ts": 20.0, "dur": 20.0},
    {"ph": "X", "name": "B0", "cat": "backward", "pid": 0, "tid": 1, "ts": 40.0, "dur": 20.0},
    {"ph": "X", "name": "all-reduce c0 layers", "cat": "dp", "pid": 0, "tid": 2, "ts": 45.0, "dur": 30.0},
    {"ph": "X", "name": "W0", "cat": "compute", "pid": 1, "tid": 1, "ts": 40.0, "dur": 5.0},
    {"ph": "X", "name": "broken", "pid": 0, "tid": 1, "ts": "x", "dur": 1.0},
    {"ph": "B", "name": "ignored", "pid": 0, "tid": 1, "ts": 0.0},
]}


def test_gantt_bars_golden():
    bars = charts.gantt_bars(TINY_TRACE)
    got = [(b.track, round(b.start_s * 1e6, 6), round(b.dur_s * 1e6, 6), b.category) for b in bars]
    assert got == [
        ("stage 0 / compute", 0.0, 10.0, "forward"),
        ("stage 1 / tid 1", 10.0, 10.0, "forward"),
        ("stage 1 / tid 1", 20.0, 20.0, "backward"),
        ("stage 0 / compute", 40.0, 20.0, "backward"),
        ("stage 0 / tid 2", 45.0, 30.0, "dp"),
        ("stage 1 / tid 1", 40.0, 5.0, "weight-grad"),
    ]
    fig = charts.timeline_figure(charts.merge_bars(bars))
    assert {t.name for t in fig.data} == {"forward", "backward", "weight-grad", "dp"}
    assert list(fig.layout.yaxis.categoryarray) == ["stage 0 / compute", "stage 0 / tid 2", "stage 1 / tid 1"]


def test_merge_bars_closes_only_sub_pixel_gaps():
    touching = [charts.GanttBar(f"stage {s}", i * 1.0, 1.0, "F", "forward") for s in range(4) for i in range(3000)]
    merged = charts.merge_bars(touching)
    assert len(merged) == 4 and all(b.dur_s == pytest.approx(3000.0) and b.start_s == 0.0 for b in merged)
    # a stream busy 5% of the time with visible gaps stays 5% busy
    sparse = [charts.GanttBar("tp", i * 1.0, 0.05, "tp 1", "tp") for i in range(200)]
    kept = charts.merge_bars(sparse)
    assert len(kept) == 200 and sum(b.dur_s for b in kept) == pytest.approx(10.0)
    # beyond max_bars the shortest go first
    mixed = sparse + [charts.GanttBar("tp", 500.0, 3.0, "long", "tp")]
    assert [b.name for b in charts.merge_bars(mixed, max_bars=1)] == ["long"]


@pytest.mark.parametrize("gpu,n,topology", [
    ("a100-80gb", 1024, "fat-tree"), ("h100-80gb", 8, "star"), ("h100-80gb", 256, "rail-optimized"),
    ("gb200-186gb", 288, "fat-tree"), ("a100-80gb", 128, "torus"), ("a100-80gb", 64, "mesh"),
    ("h100-80gb", 4096, "tree"),
])
def test_topology_summary_conserves_nodes_and_links(gpu, n, topology):
    g = build_topology(cluster_of(design(gpu=gpu, num_gpus=n, topology=topology)))
    s = summarize_topology(g, max_boxes=12)
    for level, boxes in s.levels().items():
        assert len(boxes) <= 12, (level, len(boxes))
    kinds: dict[str, int] = {}
    for _, a in g.nodes(data=True):
        kinds[a["kind"]] = kinds.get(a["kind"], 0) + 1
    folded: dict[str, int] = {}
    for b in s.boxes:
        folded[b.kind] = folded.get(b.kind, 0) + b.members
    assert folded == kinds
    links = sum(int(a.get("num_links", 1)) for _, _, a in g.edges(data=True))
    assert sum(e.num_links for e in s.edges) + sum(s.internal_links.values()) == links
    assert s.aggregated == (n > 12)
    fig = topology_figure(s)
    assert len(fig.data) >= 3


def test_compare_rows_and_cap():
    def snap(n, t, cost):
        return {"label": f"{n} GPUs", "inputs": {"GPUs": n, "model": "m"},
                "metrics": {"step time (s)": t, "cost to train (USD)": cost, "fits memory": True},
                "breakdown": {"compute": t}, "step_time_s": t}

    kept = []
    for n, t in ((512, 2.0), (1024, 1.0), (2048, 0.6), (1024, 1.0)):
        kept = compare.add_snapshot(kept, snap(n, t, 100.0 * n))
    assert [k["inputs"]["GPUs"] for k in kept] == [512, 2048, 1024]  # duplicate moved to the end
    names, values, differ, best = compare.compare_rows(kept)
    assert differ == {"GPUs", "step time (s)", "cost to train (USD)"}
    assert best == {"step time (s)": 1, "cost to train (USD)": 0}
    styled = compare.compare_frame(kept).to_html()
    assert "#d4edda" in styled and "#fff3cd" in styled


def test_simple_economics_known_answer():
    c = cluster_of(design())
    eco = engines.simple_economics(c, {"tokens_per_s": 1e6}, tokens=3.6e12)
    assert eco["time_to_train_s"] == pytest.approx(3.6e6)
    assert eco["gpu_hours"] == pytest.approx(1024 * 1000)
    assert eco["cost_to_train_usd"] == pytest.approx(1024 * 1000 * c.gpu.price_usd_per_hour)


def test_zip_bytes_round_trip():
    files = {"slurm/train.sbatch": b"#!/bin/bash\n", "deepspeed/ds.json": b"{}"}
    with zipfile.ZipFile(io.BytesIO(engines.zip_bytes(files))) as zf:
        assert {n: zf.read(n) for n in zf.namelist()} == files
    assert engines.zip_bytes(files) == engines.zip_bytes(dict(reversed(list(files.items()))))


def test_design_validation():
    with pytest.raises(InputError, match="token_budget"):
        design(token_budget_tokens=-1.0)
    with pytest.raises(InputError, match="strategy"):
        design(strategy="  ")
    with pytest.raises(InputError, match="num_gpus"):
        design(num_gpus=0)
    assert design().token_budget == pytest.approx(20 * GPT3.num_params)
    assert math.isfinite(design(token_budget_tokens=1e12).token_budget)


def test_nothing_fits_says_why_and_what_would():
    # 8 GPUs: even offloading the 175B model (18 B per parameter) overflows the node's host memory
    at = fresh(gpu="a100-40gb", num_gpus=8, gbs=64)
    assert not at.exception and not at.error
    warn = " ".join(plain(w.value) for w in at.warning)
    assert "No strategy fits" in warn and "oom" in warn
    sugg = at.dataframe[0].value
    assert len(sugg) >= 1 and sugg["change"].str.len().min() > 0
    assert [t.label for t in at.tabs] == ["Topology", "Compare"]


def test_export_files_cover_every_format_and_zip():
    from appkit.evaluate import plan_of
    from planner.exports import FORMATS

    d = design(strategy=STRATEGY)
    ev = evaluate(d)
    files, warnings = engines.export_files(plan_of(d, ev.cluster, ev.plans[0]), steps=1000, time_limit_s=3600.0)
    written = {name.split("/", 1)[0] for name in files}
    skipped = {w.split(":", 1)[0] for w in warnings if "not exported" in w}
    assert written | skipped == set(FORMATS) and not written & skipped and "megatron" in written
    megatron = files["megatron/megatron_args.sh"].decode()
    for arg in ("--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 16", "TRAIN_ITERS=${TRAIN_ITERS:-1000}",
                '--train-iters "${TRAIN_ITERS}"'):
        assert arg in megatron  # the chosen plan and the token budget's steps reach the config
    with zipfile.ZipFile(io.BytesIO(engines.zip_bytes(files))) as zf:
        assert sorted(zf.namelist()) == sorted(files)


def test_pcie_card_gets_its_server_in_the_app():
    at = fresh(gpu="rtx4090-24gb", num_gpus=8)
    assert not _by_key(at, "server").disabled
    set_inputs(at, server="srv-8gpu-1root-gen5-switch", p2p="pcie")
    d = design(gpu="rtx4090-24gb", num_gpus=8, server="srv-8gpu-1root-gen5-switch", p2p="pcie")
    c = cluster_of(d)
    assert c.server.design == "srv-8gpu-1root-gen5-switch" and c.server.p2p == "pcie"
    assert _by_key(fresh(), "server").disabled  # the SXM default keeps the PCIe widgets disabled
