"""How long the what-if app takes to follow one changed input on a 1024-GPU design.

    .venv/bin/python scripts/bench_app.py [--browser]

Three numbers per change (median of the repeats):

* ``evaluate``: ``appkit.evaluate.evaluate`` with a cold cache (recommendation search, with
  and without event-engine re-ranking of the top 5), i.e. the server-side work of one change;
* ``rerun``: one full script run in Streamlit's AppTest after the change (the page with its
  charts, Plans tab open; caches warm for everything the change did not touch);
* ``browser`` (with ``--browser``): in chromium, from pressing Enter on the changed field to
  the app reporting its script run finished (all new elements delivered to the page).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHANGES = [  # (widget key, value) applied one after another to GPT-3 175B on 1024 A100
    ("nic", "ib-ndr-400"),
    ("seq_len", 4096),
    ("gpu", "h100-80gb"),
    ("oversubscription", 2.0),
    ("num_gpus", 2048),
]


def bench_evaluate(rerank: bool) -> list[tuple[str, float]]:
    from appkit.design import Design
    from appkit.evaluate import evaluate
    from sim.catalog import get_model

    base = dict(model=get_model("gpt3-175b"), model_ref="gpt3-175b", gpu="a100-80gb", num_gpus=1024, rerank=rerank)
    evaluate(Design(**base))  # imports, catalog and numpy warm-up
    out = []
    for key, value in CHANGES:
        base[key] = value
        t = time.perf_counter()
        evaluate(Design(**base))
        out.append((f"{key}={value}", time.perf_counter() - t))
    return out


def bench_rerun(rerank: bool) -> list[tuple[str, float]]:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    at.toggle(key="rerank").set_value(rerank)
    at.run()
    out = []
    for key, value in CHANGES:
        widget = next(w for w in at.sidebar.get("selectbox") + at.sidebar.get("number_input") if w.key == key)
        widget.set_value(value)
        t = time.perf_counter()
        at.run()
        out.append((f"{key}={value}", time.perf_counter() - t))
        assert not at.exception and not at.error, [e.value for e in at.error]
    return out


def bench_browser() -> list[tuple[str, float]]:
    import subprocess

    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests"))
    import test_app_browser as tb

    port = tb._free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                             "--server.address", "127.0.0.1", "--server.port", str(port),
                             "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = []
    try:
        for _ in range(200):
            try:
                if tb._get(f"http://127.0.0.1:{port}/_stcore/health").strip() == b"ok":
                    break
            except OSError:
                time.sleep(0.2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=tb._chromium(), args=tb.CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1300})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector('[data-testid="stMetric"]', timeout=120_000)
            tb.settle(page)
            # Record the app root's script-state flips with their browser timestamps.
            page.evaluate("""() => { window.__flips = [];
                const app = document.querySelector('[data-testid="stApp"]');
                new MutationObserver(() => window.__flips.push(
                    [performance.now(), app.getAttribute('data-test-script-state')]))
                  .observe(app, {attributes: true, attributeFilter: ['data-test-script-state']}); }""")
            for n in (512, 1024, 2048, 1024):
                field = page.locator('input[aria-label="Number of GPUs"]')
                field.fill(str(n))
                t0 = page.evaluate("performance.now()")
                field.press("Enter")
                tb.settle(page)
                flips = page.evaluate("window.__flips")
                done = [t for t, state in flips if t > t0 and state == "notRunning"]
                out.append((f"num_gpus={n}", (done[-1] - t0) / 1e3))
            browser.close()
    finally:
        proc.terminate()
        proc.wait(15)
    return out


PARTS = {
    "evaluate-event": ("evaluate (cold), event re-ranking", lambda: bench_evaluate(True)),
    "evaluate-analytic": ("evaluate (cold), analytic ranking", lambda: bench_evaluate(False)),
    "rerun-event": ("AppTest rerun, event re-ranking", lambda: bench_rerun(True)),
    "rerun-analytic": ("AppTest rerun, analytic ranking", lambda: bench_rerun(False)),
    "browser": ("browser (event re-ranking)", lambda: bench_browser()),
}


def main() -> None:
    import os
    import subprocess

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--browser", action="store_true", help="also time the change in chromium")
    ap.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:  # one part per process, so no part warms the caches of another
        name, fn = PARTS[args.part]
        rows = fn()
        print(f"{name}:")
        for label, s in rows:
            print(f"  {label:<24} {s:6.2f} s")
        print(f"  {'median':<24} {statistics.median(s for _, s in rows):6.2f} s", flush=True)
        return
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    for part in PARTS:
        if part == "browser" and not args.browser:
            continue
        out = subprocess.run([sys.executable, __file__, "--part", part], capture_output=True, text=True)
        print(out.stdout, end="")
        if out.returncode:
            print(out.stderr[-2000:])
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
