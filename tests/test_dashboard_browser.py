"""Headless Chromium against `specfinops dashboard` running as a subprocess on a free port.

Loads every page over HTTP, finds the Overview KPIs, checks that no page shows a traceback or an exception
element, and saves full-page screenshots (into tmp_path, and var/screenshots/ when that folder exists).

The store comes from the `browser_store_url` fixture, filled by a real bench run on the bundled model.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# url path -> page title (st.Page derives the path from the file name; the default page is "/")
PAGES = {
    "": "Overview",
    "latency": "Latency",
    "speculation": "Speculation",
    "energy": "Energy",
    "cost": "Cost & capacity",
    "runs": "Runs",
}
OVERVIEW_KPIS = ("Cost per 1M tokens", "Speedup", "Acceptance rate")


@contextmanager
def report_page(page_file: Path):
    """A report's HTML page open in headless Chromium at 1280 x 900, its tables drawn."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(page_file.as_uri())
            page.wait_for_selector("table")
            yield page
        finally:
            browser.close()


def _skip_reason() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"playwright is not importable: {exc}"
    return None


@pytest.fixture
def browser_store_url(sqlite_url, tmp_path) -> str:
    """The store the dashboard shows: filled by a real `specfinops bench` run on the bundled model
    (power labelled as a TDP estimate, so the Energy page has data to draw)."""
    from app.cli import main
    from serving.models import pull

    pull(say=lambda m: None, verify=False)
    rc = main(["bench", "--workload", "mixed", "--mode", "both", "--limit", "3", "--max-new-tokens", "24",
               "--db", sqlite_url, "--power", "estimate", "--tdp-w", "65", "--json", str(tmp_path / "b.json")])
    assert rc == 0
    return sqlite_url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(base: str, proc: subprocess.Popen, log: Path, limit_s: float = 90.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"dashboard exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(base + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"dashboard not healthy after {limit_s:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def dashboard(browser_store_url, tmp_path):
    """`specfinops dashboard --db URL --port N` as a subprocess; yields its base URL."""
    reason = _skip_reason()
    if reason:
        print(f"SKIP browser test: {reason}")
        pytest.skip(reason)
    port = _free_port()
    log = tmp_path / "dashboard.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("SPECFINOPS_DB_URL", None)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "dashboard", "--db", browser_store_url, "--port", str(port)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc, log)
        assert f"Dashboard: {base}" in log.read_text()
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _settle(page) -> None:
    """Wait until the script run has finished and charts are drawn."""
    page.wait_for_selector("h1", timeout=60_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " && !document.querySelector('[data-testid=\"stSkeleton\"]')",
        timeout=60_000,
    )
    page.wait_for_timeout(1500)  # let Plotly finish drawing before the screenshot


def test_every_page_loads_in_chromium(dashboard, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = tmp_path / "screenshots"
    shots.mkdir()
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh user-data-dir
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 2800},
        )
        outside: set[str] = set()  # the dashboard must work offline (an air-gapped cluster): nothing fetched elsewhere
        try:
            page = browser.new_page()
            page.on("request", lambda r: None if r.url.startswith((dashboard, "data:", "blob:"))
                    else outside.add(r.url.split("?")[0]))
            # a deep link first, on the server's first session: before any session has run the entry file
            # Streamlit navigates by what it finds on disk (a `pages/` folder would list its file names)
            for path, title in sorted(PAGES.items(), key=lambda item: item[0] == ""):
                page.goto(f"{dashboard}/{path}", wait_until="domcontentloaded")
                _settle(page)
                h1 = page.locator("h1").first.inner_text()
                text = page.locator("body").inner_text()
                name = path or "overview"
                page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
                if title not in h1:
                    problems.append(f"/{path}: title {h1!r}, expected {title!r}")
                if "Traceback" in text:
                    problems.append(f"/{path}: a traceback is shown")
                # a deep link gets the app's navigation, not a listing of the page files ("main", "cost", ...)
                nav = [line.strip() for line in page.locator('[data-testid="stSidebarNav"]').inner_text().splitlines()]
                if not set(PAGES.values()) <= set(nav) or "main" in nav:
                    problems.append(f"/{path}: the navigation lists {[n for n in nav if n]}")
                n_exc = page.locator('[data-testid="stException"]').count()
                if n_exc:
                    problems.append(f"/{path}: {n_exc} exception element(s)")
                n_err = page.locator('[data-testid="stAlertContentError"]').count()
                if n_err:
                    problems.append(f"/{path}: {n_err} error message(s)")
                if path == "":
                    missing = [k for k in OVERVIEW_KPIS if k not in text]
                    if missing:
                        problems.append(f"Overview: KPI labels missing: {missing}")
                    if page.locator('[data-testid="stMetric"]').count() < 6:
                        problems.append("Overview: fewer than 6 KPI metrics")
                if path in ("latency", "speculation", "energy", "cost") and page.locator(".js-plotly-plot").count() == 0:
                    problems.append(f"/{path}: no chart rendered")
        finally:
            browser.close()
    if outside:  # the page favicon ':material/...:' came from fonts.gstatic.com
        problems.append(f"requests outside the dashboard's server: {sorted(outside)}")
    keep = ROOT / "var" / "screenshots"
    if keep.is_dir():
        for png in shots.glob("*.png"):
            shutil.copy2(png, keep / png.name)
    assert not problems, problems
    assert len(list(shots.glob("*.png"))) == len(PAGES)


def test_report_page_fits_the_window_in_chromium(sqlite_url, tmp_path):
    """An HTML report opened in Chromium at a laptop's width: the page itself never scrolls sideways (the
    cost-per-run table, ~20 columns, made the whole report 2,700 px wide); a wide table scrolls in its box."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from datetime import timedelta

    from app.cli import main
    from telemetry.store import open_store
    from tests.test_report import D0, add_day

    add_day(open_store(sqlite_url), D0)
    out = tmp_path / "reports"
    assert main(["report", "--db", sqlite_url, "--out", str(out), "--period", "daily",
                 "--until", (D0 + timedelta(days=1)).date().isoformat()]) == 0
    [page_file] = out.glob("*/report.html")
    with report_page(page_file) as page:
        widths = page.evaluate("() => ({page: document.documentElement.scrollWidth, window: window.innerWidth,"
                               " tables: [...document.querySelectorAll('table')].map(t => t.scrollWidth),"
                               " boxed: [...document.querySelectorAll('table')].every("
                               "t => getComputedStyle(t.parentElement).overflowX === 'auto')})")
    assert max(widths["tables"]) > widths["window"]  # the widest table is wider than the window ...
    assert widths["page"] <= widths["window"]  # ... and the page still fits it
    assert widths["boxed"]
