"""End to end: the what-if app served by ``streamlit run`` on 127.0.0.1, driven in Debian's
chromium through playwright (never ``playwright install``).

One browser session walks what a user does: read the recommended plan, change the GPUs and
the network, keep two designs and compare them, open the timeline and the topology, type a
bad strategy, upload a Hugging Face config.json, download the JSON.  Screenshots go to the
test's tmp_path; with UPDATE_DOC_SCREENSHOTS=1 the overview, compare, timeline, topology and
error ones are copied to docs/img/.
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


@pytest.mark.timeout(240)
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

            # 1. The default design: GPT-3 175B on 1024 A100-80GB, recommended plans.
            body = page.inner_text("body")
            assert "Traceback" not in body
            assert re.fullmatch(r"\d+(\.\d+)?%", metric(page, "MFU"))
            a100_step = metric(page, "Step time")
            assert page.locator(".js-plotly-plot").count() >= 2  # step-time bar and memory chart
            assert "Where the step time goes" in body and "Memory per GPU vs capacity" in body
            shot(page, tmp_path, "overview", docs=True)

            # 2. Change one input after another: 512 H100 on InfiniBand NDR, keep it.
            choose(page, "GPU", "h100-80gb")
            set_number(page, "Number of GPUs", 512)
            choose(page, "NIC", "ib-ndr-400")
            assert metric(page, "Step time") != a100_step
            page.get_by_role("button", name="Keep for comparison").click()
            settle(page)
            # ... and 1024 A100 on 100 GbE, keep that too.
            choose(page, "GPU", "a100-80gb")
            set_number(page, "Number of GPUs", 1024)
            choose(page, "NIC", "eth-100")
            page.get_by_role("button", name="Keep for comparison").click()
            settle(page)
            open_tab(page, "Compare")
            table = page.locator('[data-testid="stDataFrame"], [data-testid="stTable"]').first
            table.wait_for(timeout=30_000)
            text = page.inner_text("body")
            assert "512 x h100-80gb / ib-ndr-400" in text and "1024 x a100-80gb / eth-100" in text
            shot(page, tmp_path, "compare", docs=True)

            # 3. The event engine's timeline of one step, and the topology.
            open_tab(page, "Timeline")
            page.wait_for_selector("text=Event engine: step", timeout=90_000)
            assert page.locator(".js-plotly-plot").count() >= 1
            shot(page, tmp_path, "timeline", docs=True)
            open_tab(page, "Topology")
            page.wait_for_selector("text=graph nodes", timeout=60_000)
            assert "bisection" in page.inner_text("body")
            shot(page, tmp_path, "topology", docs=True)

            # 4. Hand-off: the JSON download is the chosen plan.
            open_tab(page, "Hand-off")
            with page.expect_download(timeout=30_000) as dl:
                page.get_by_role("button", name="Download result (JSON)").click()
            doc = json.loads(Path(dl.value.path()).read_text())
            assert doc["design"]["nic"] == "eth-100" and doc["design"]["num_gpus"] == 1024
            assert doc["plan"]["strategy"] == doc["plans"][0]["strategy"]
            shot(page, tmp_path, "handoff")

            # 5. A bad strategy: a clear message next to the field, no traceback.
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

            # 6. Upload a Hugging Face config.json instead of a catalog model.
            page.get_by_text("Upload file", exact=True).click()
            settle(page)
            page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(
                str(ROOT / "tests" / "data" / "hf_llama3_8b_config.json"))
            page.wait_for_selector("text=B parameters, 32 layers", timeout=60_000)
            settle(page)
            page.wait_for_selector('[data-testid="stMetric"]', timeout=90_000)
            assert re.fullmatch(r"\d+(\.\d+)?%", metric(page, "MFU"))
            shot(page, tmp_path, "upload")
        finally:
            browser.close()
