"""The HTML report in a real browser: Debian chromium driven by Playwright opens index.html served
on loopback, sorts the runs table by clicking a heading, and the rows come out in order. A
screenshot is kept (its path is printed and recorded as the test's `screenshot` property)."""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pandas", reason="pandas is not installed (the `report` extra)")

from helpers import step_rec, write_results  # noqa: E402

from pytest_agentcgroup.tenants.browser import CHROMIUM, CHROMIUM_ARGS, missing  # noqa: E402
from pytest_agentcgroup.reports import build_report  # noqa: E402

def sync_playwright_or_skip():
    """Playwright's sync API, or a skip naming what the host lacks (tenants/browser.py `missing`)."""
    why = missing()
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright
    return sync_playwright


@pytest.fixture
def served_report(tmp_path):
    """A report of 6 traces × 2 arms with distinct p95 latencies, served over http on 127.0.0.1."""
    recs = [step_rec(trace_id=f"t/trace-{n}", config=arm, step_id=i, latency_ms=lat * (i + 1),
                     oom_kills=int(arm == "static-toolcall" and n == 3 and i == 1))
            for n, lat in enumerate((30.0, 7.0, 120.0, 55.0, 9.5, 300.0))
            for arm, factor in (("unlimited", 1.0), ("static-toolcall", 1.3))
            for i, lat in [(i, lat * factor) for i in range(3)]]
    build_report(write_results(tmp_path / "results", recs), tmp_path / "report")
    handler = functools.partial(_QuietHandler, directory=str(tmp_path / "report"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _heading(page, text: str):
    """The runs table's heading starting with `text` (strict: exactly one, or the click fails)."""
    return page.locator("#runs thead th").filter(has_text=re.compile("^" + re.escape(text)))


def _column(page, heading: str) -> list[str]:
    return page.eval_on_selector("#runs", """(t, heading) => {
        const col = Array.from(t.tHead.rows[0].cells).findIndex(th => th.firstChild.textContent.trim() === heading);
        return Array.from(t.tBodies[0].rows, r => r.cells[col].textContent.trim()); }""", heading)


def test_runs_table_sorts_in_chromium(served_report, tmp_path, record_property):
    sync_playwright = sync_playwright_or_skip()
    marker = f"--agentcgroup-test={uuid.uuid4().hex}"       # finds our browser's processes afterwards
    errors: list[str] = []
    shot = tmp_path / "report-sorted-by-p95.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, marker], headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(served_report)
            assert page.title() == "pytest-agentcgroup report"
            broken = page.eval_on_selector_all("img", "imgs => imgs.filter(i => !i.naturalWidth).map(i => i.src)")
            assert broken == [], "figures that did not load"

            before = [float(x) for x in _column(page, "p95 latency")]
            assert before != sorted(before), "the table must not start sorted, or sorting proves nothing"
            _heading(page, "p95 latency").click()
            ascending = [float(x) for x in _column(page, "p95 latency")]
            assert ascending == sorted(before)
            assert _heading(page, "p95 latency").get_attribute("aria-sort") == "ascending"
            _heading(page, "p95 latency").click()
            assert [float(x) for x in _column(page, "p95 latency")] == sorted(before, reverse=True)
            # Rows move whole: the slowest trace's row still holds its own trace and arm.
            top = page.eval_on_selector("#runs tbody tr", "r => Array.from(r.cells, c => c.textContent.trim())")
            assert top[1:3] == ["t/trace-5", "static-toolcall"]

            _heading(page, "OOM kills").click()
            _heading(page, "OOM kills").click()
            kills = _column(page, "OOM kills")
            assert kills[0] == "1" and set(kills[1:]) == {"0"}
            _heading(page, "trace").click()
            traces = _column(page, "trace")
            assert traces == sorted(traces)
            _heading(page, "p95 latency").click()
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert errors == [], f"console errors: {errors}"
    assert shot.stat().st_size > 10_000
    record_property("screenshot", str(shot))
    keep = os.environ.get("AGENTCGROUP_ARTEFACTS")
    if keep:                                   # e.g. results/artefacts, for a person to look at
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    print(f"screenshot: {shot}")
    left = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, marker)]
    assert left == [], f"chromium processes left behind: {left}"


def _cmdline_has(pid: str, token: str) -> bool:
    try:
        return token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
