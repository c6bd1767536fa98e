"""How long the what-if app takes to follow an edit, a Run and a revisit on a 1024-GPU design.

    .venv/bin/python scripts/bench_app.py [--browser]

The app computes on request (docs/app.md): an edit only redraws the page and says what
changed; **Run** searches; a design seen before (or a change the search does not depend on)
comes back from the cache.  Numbers per change (medians at the end):

* ``evaluate``: ``appkit.evaluate.evaluate`` with a cold cache (the recommender's search, with
  and without event-engine re-ranking of the top 5), i.e. the server work of one Run;
* ``edit``: one Streamlit AppTest script run after the change, without Run (what every
  sidebar edit costs now; before the change it searched);
* ``run``: the same change, then Run pressed: search and page;
* ``revisit``: back to a design computed before, without Run (from the cache);
* ``browser`` (with ``--browser``): in chromium, Enter on the GPU count -> the page's script
  run finished (an edit), Run -> the first stage of the search on screen, Run -> finished.
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
    ("model", "llama3-70b"),
]


def bench_evaluate(rerank: bool) -> list[tuple[str, float]]:
    from appkit.design import Design
    from appkit.evaluate import evaluate
    from sim.data.catalog import get_model

    base = dict(model=get_model("gpt3-175b"), model_ref="gpt3-175b", gpu="a100-80gb", num_gpus=1024, rerank=rerank)
    evaluate(Design(**base))  # imports, catalog and numpy warm-up
    out = []
    for key, value in CHANGES:
        if key == "model":
            base.update(model=get_model(str(value)), model_ref=value)
        else:
            base[key] = value
        t = time.perf_counter()
        evaluate(Design(**base))
        out.append((f"{key}={value}", time.perf_counter() - t))
    return out


def _widget(at, key):
    return next(w for w in at.sidebar.get("selectbox") + at.sidebar.get("number_input") if w.key == key)


def bench_apptest(what: str) -> list[tuple[str, float]]:
    """``edit``, ``run`` or ``revisit`` per change (module docstring)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    out = []
    for key, value in CHANGES:
        before = _widget(at, key).value
        _widget(at, key).set_value(value)
        t = time.perf_counter()
        at.run()
        edit = time.perf_counter() - t
        t = time.perf_counter()
        at.button(key="run").click().run()
        run = time.perf_counter() - t
        assert not at.exception and not at.error, [e.value for e in at.error]
        _widget(at, key).set_value(before)  # a design computed before: no Run needed
        t = time.perf_counter()
        at.run()
        revisit = time.perf_counter() - t
        assert not [i for i in at.info if "not computed yet" in i.value]
        _widget(at, key).set_value(value)
        at.run()
        out.append((f"{key}={value}", {"edit": edit, "run": run, "revisit": revisit}[what]))
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
            # Record the app root's script-state flips and the status labels with browser timestamps.
            page.evaluate("""() => { window.__flips = []; window.__labels = [];
                const app = document.querySelector('[data-testid="stApp"]');
                new MutationObserver(() => window.__flips.push(
                    [performance.now(), app.getAttribute('data-test-script-state')]))
                  .observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
                new MutationObserver(() => document.querySelectorAll('[data-testid="stExpander"] summary')
                    .forEach(s => window.__labels.push([performance.now(), s.innerText.trim()])))
                  .observe(document.body, {subtree: true, childList: true, characterData: true}); }""")

            def finished(t0: float) -> float:
                tb.settle(page)
                done = [t for t, state in page.evaluate("window.__flips") if t > t0 and state == "notRunning"]
                return (done[-1] - t0) / 1e3

            for n in (512, 2048):
                field = page.locator('input[aria-label="Number of GPUs"]')
                field.fill(str(n))
                t0 = page.evaluate("performance.now()")
                field.press("Enter")
                out.append((f"edit num_gpus={n}", finished(t0)))
                t0 = page.evaluate("performance.now()")
                page.locator('[data-testid="stSidebar"]').get_by_role("button", name="Run", exact=True).click()
                total = finished(t0)
                first = [t for t, label in page.evaluate("window.__labels")
                         if t > t0 and label.startswith("Searching")]
                if first:
                    out.append((f"first stage shown {n}", (first[0] - t0) / 1e3))
                out.append((f"run num_gpus={n}", total))
            browser.close()
    finally:
        proc.terminate()
        proc.wait(15)
    return out


PARTS = {
    "evaluate-event": ("evaluate (cold), event re-ranking", lambda: bench_evaluate(True)),
    "evaluate-analytic": ("evaluate (cold), analytic ranking", lambda: bench_evaluate(False)),
    "edit": ("AppTest: an edit (no search)", lambda: bench_apptest("edit")),
    "run": ("AppTest: Run after the edit (search + page)", lambda: bench_apptest("run")),
    "revisit": ("AppTest: back to a computed design (cache)", lambda: bench_apptest("revisit")),
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
        groups: dict[str, list[float]] = {}
        for label, s in rows:
            groups.setdefault(label.rsplit(" ", 1)[0] if " " in label else "", []).append(s)
        for group, values in groups.items():
            print(f"  {('median ' + group).strip():<24} {statistics.median(values):6.2f} s", flush=True)
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
