"""End to end: the what-if app served by ``streamlit run`` on 127.0.0.1, driven in Debian's
chromium through playwright (never ``playwright install``).

One browser session walks what a user does: read the recommended plan, edit the GPUs and the
network (the page waits, saying what changed), press Run and watch the search's stages pass,
keep two designs and compare them, send the page's address to a colleague (a second session
opens the same design and plan), open the timeline and the topology, hand off the default
recommendation (its launch configs, or why none and a search that has them), type a bad
strategy, upload a Hugging Face config.json and opt in to fp8.  Every wait is bounded.
Screenshots go to the test's tmp_path; with UPDATE_DOC_SCREENSHOTS=1 the overview, pending,
compare, timeline, topology and error ones are copied to docs/img/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

# serial: a Streamlit server and a browser under a start-up deadline; `make test` runs these after the parallel phase (pyproject markers)
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent
DOCS_IMG = ROOT / "docs" / "img"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310  loopback only
        return r.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("chromium not found (/usr/bin/chromium or on PATH); scripts/setup_test_env.sh installs it")
    pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "streamlit.log"
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
           "--server.address", "127.0.0.1", "--server.port", str(port), "--server.fileWatcherType", "none",
           "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if _get(f"{base}/_stcore/health").strip() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.25)
        _get(f"{base}/", timeout=10)  # warm the static files; the browser warm-up follows
        yield {"url": base, "chromium": chromium, "log": log}
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        if "Traceback" in log.read_text(errors="replace"):
            print(log.read_text(errors="replace")[-4000:])


def settle(page, timeout_ms: int = 90_000) -> None:
    """Wait until the script run triggered by the last interaction has finished (the app root
    carries ``data-test-script-state``: running -> notRunning)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector('[data-testid="stApp"][data-test-script-state="running"]', timeout=1500)
    except PlaywrightTimeout:
        pass  # a quick rerun may have finished already
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_ms)
    page.wait_for_timeout(400)  # let plotly draw


def metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()


def set_number(page, label: str, value) -> None:
    field = page.locator(f'input[aria-label="{label}"]')
    field.fill(str(value))
    field.press("Enter")
    settle(page)


def choose(page, label: str, option: str) -> None:
    page.get_by_role("combobox", name=label, exact=True).click()
    page.get_by_role("option", name=re.compile(rf"^{re.escape(option)}\b")).first.click()
    settle(page)


def run(page) -> list[str]:
    """Press Run; return the labels the search's status showed while it ran (its stages)."""
    page.evaluate("""() => { window.__labels = [];
        new MutationObserver(() => document.querySelectorAll('[data-testid="stExpander"] summary')
            .forEach(s => window.__labels.push(s.innerText.trim())))
          .observe(document.body, {subtree: true, childList: true, characterData: true}); }""")
    page.locator('[data-testid="stSidebar"]').get_by_role("button", name="Run", exact=True).click()
    settle(page)
    page.wait_for_selector('[data-testid="stExpander"] summary >> text=/^Computed in/', timeout=90_000)
    return page.evaluate("window.__labels")


def pending_text(page) -> str:
    box = page.locator('[data-testid="stAlertContentInfo"]').filter(has_text="changes not computed yet")
    return box.first.inner_text() if box.count() else ""


def selected(page, label: str) -> str:
    """The option a selectbox shows."""
    return page.get_by_role("combobox", name=label, exact=True).input_value()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()
    settle(page)


def shot(page, tmp_path: Path, name: str, *, docs: bool = False) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000  # a blank page compresses to a few kB
    if docs and os.environ.get("UPDATE_DOC_SCREENSHOTS") == "1":  # never write into the repo by default
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMG / f"app-{name}.png")
    return path


@pytest.mark.timeout(300)
def test_what_if_session_in_a_real_browser(server, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=server["chromium"], args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1300}, accept_downloads=True)
            # Warm-up: the first render of a cold server can be blank; load once, then reload.
            page.goto(server["url"], wait_until="domcontentloaded")
            page.wait_for_selector("text=Cluster what-if", timeout=90_000)
            settle(page)
            page.reload(wait_until="domcontentloaded")
            page.wait_for_selector('[data-testid="stMetric"]', timeout=90_000)
            settle(page)

            # 1. The default design, computed as the page opens: GPT-3 175B on 1024 A100-80GB.
            body = page.inner_text("body")
            assert "Traceback" not in body
            assert re.fullmatch(r"\d+(\.\d+)?%", metric(page, "MFU"))
            a100_step = metric(page, "Step time")
            assert re.search(r"80% band \d", body)  # the band next to the time
            assert page.locator(".js-plotly-plot").count() >= 2  # step-time bar and memory chart
            assert "Where the step time goes" in body and "Memory per GPU vs capacity" in body
            shot(page, tmp_path, "overview", docs=True)

            # 2. Edits wait for Run: 512 H100 on InfiniBand NDR.
            choose(page, "GPU", "h100-80gb")
            set_number(page, "Number of GPUs", 512)
            choose(page, "NIC", "ib-ndr-400")
            waiting = pending_text(page)
            assert "GPU a100-80gb → h100-80gb" in waiting and "GPUs 1024 → 512" in waiting, waiting
            assert metric(page, "Step time") == a100_step  # nothing computed yet
            shot(page, tmp_path, "pending", docs=True)
            labels = run(page)
            assert any(lab.startswith("Searching the strategy space on 512 GPUs") for lab in labels), labels
            assert not pending_text(page) and metric(page, "Step time") != a100_step
            page.get_by_role("button", name="Keep for comparison").click()
            settle(page)

            # 3. The page's address is the design: a colleague opening it sees the same plan.
            choose(page, "Plan to inspect and export", "#2")
            h100_step = metric(page, "Step time")
            shared = page.url
            assert all(q in shared for q in ("gpu=h100-80gb", "num_gpus=512", "nic=ib-ndr-400", "plan=2")), shared
            colleague = browser.new_context(viewport={"width": 1500, "height": 1300}).new_page()
            colleague.goto(shared, wait_until="domcontentloaded")
            colleague.wait_for_selector('[data-testid="stMetric"]', timeout=90_000)
            settle(colleague)
            assert metric(colleague, "Step time") == h100_step
            assert selected(colleague, "GPU") == "h100-80gb" and selected(colleague, "NIC") == "ib-ndr-400"
            assert selected(colleague, "Plan to inspect and export").startswith("#2  ")
            colleague.context.close()

            # ... and 1024 A100 on 100 GbE, kept too.
            choose(page, "GPU", "a100-80gb")
            set_number(page, "Number of GPUs", 1024)
            choose(page, "NIC", "eth-100")
            run(page)
            page.get_by_role("button", name="Keep for comparison").click()
            settle(page)
            open_tab(page, "Compare")
            table = page.locator('[data-testid="stDataFrame"], [data-testid="stTable"]').first
            table.wait_for(timeout=30_000)
            text = page.inner_text("body")
            assert "512 x h100-80gb / ib-ndr-400" in text and "1024 x a100-80gb / eth-100" in text
            shot(page, tmp_path, "compare", docs=True)

            # 4. The event engine's timeline of one step, and the topology.
            open_tab(page, "Timeline")
            page.wait_for_selector("text=Event engine: step", timeout=90_000)
            assert page.locator(".js-plotly-plot").count() >= 1
            shot(page, tmp_path, "timeline", docs=True)
            open_tab(page, "Topology")
            page.wait_for_selector("text=graph nodes", timeout=60_000)
            assert "bisection" in page.inner_text("body")
            shot(page, tmp_path, "topology", docs=True)

            # 5. Hand-off of the recommendation: the JSON is the chosen plan; launch configs, or
            # why no format runs it and a search restricted to one framework's plans.
            open_tab(page, "Hand-off")
            with page.expect_download(timeout=30_000) as dl:
                page.get_by_role("button", name="Download result (JSON)").click()
            doc = json.loads(Path(dl.value.path()).read_text())
            assert doc["design"]["nic"] == "eth-100" and doc["design"]["num_gpus"] == 1024
            assert doc["plan"]["strategy"] == doc["plans"][0]["strategy"]
            body = page.inner_text("body")  # the plan's command line (its engine and framework) and the search's
            assert f"--engine {doc['plan']['engine']}" in body and f"--framework {doc['plan']['framework']}" in body
            assert "planner recommend --model gpt3-175b" in body
            if not page.get_by_role("button", name="Download all launch configs (zip)").count():
                assert "No launch config for plan #1" in page.inner_text("body")
                page.get_by_role("button", name=re.compile(r"^Search megatron-core plans")).click()
                settle(page)
                page.wait_for_selector('[data-testid="stExpander"] summary >> text=/^Computed in/', timeout=90_000)
            page.get_by_role("button", name="Download all launch configs (zip)").wait_for(timeout=60_000)
            assert "Traceback" not in page.inner_text("body")
            shot(page, tmp_path, "handoff")

            # 6. A bad strategy: a clear message next to the field, no traceback.
            field = page.locator('input[aria-label="Fixed strategy (optional)"]')
            field.fill("tp=3,pp=16")
            field.press("Enter")
            settle(page)
            sidebar = page.locator('[data-testid="stSidebar"]')
            err = sidebar.locator('[data-testid="stAlertContentError"]').first
            err.wait_for(timeout=30_000)
            assert "not divisible by tp*pp*cp" in err.inner_text()
            assert "Traceback" not in page.inner_text("body")
            err.scroll_into_view_if_needed()
            shot(page, tmp_path, "error", docs=True)
            field.fill("")
            field.press("Enter")
            settle(page)

            # 7. Upload a Hugging Face config.json, on 64 H100, then opt in to fp8.
            page.get_by_text("Upload file", exact=True).click()
            settle(page)
            page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(
                str(ROOT / "tests" / "data" / "hf_llama3_8b_config.json"))
            page.wait_for_selector("text=B parameters, 32 layers", timeout=60_000)
            settle(page)
            choose(page, "GPU", "h100-80gb")
            set_number(page, "Number of GPUs", 64)
            run(page)
            assert re.fullmatch(r"\d+(\.\d+)?%", metric(page, "MFU"))
            assert "model_data=" in page.url  # the uploaded file travels in the link
            bf16_step = metric(page, "Step time")
            page.get_by_text("Allow fp8 (opt in)").click()
            settle(page)
            assert "precisions bf16 → bf16+fp8" in pending_text(page)
            run(page)
            assert "fp8=true" in page.url and metric(page, "Step time") != bf16_step
            assert "precision=fp8" in selected(page, "Plan to inspect and export")
            shot(page, tmp_path, "upload")
        finally:
            browser.close()
