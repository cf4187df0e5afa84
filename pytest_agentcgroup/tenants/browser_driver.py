"""The browser tenant's own process: serves the web app, drives chromium through Playwright, and
replays browser steps one at a time, in lockstep with the parent (tenants/browser.py).

It is started already inside the tenant's cgroup (joined before exec), so the site's thread,
Playwright's node driver and every chromium process it launches are accounted to the tenant.

Protocol (JSON lines). stdin, first line: the job
    {"traces": [{"trace_id": ..., "steps": [IR step, ...], "record": "out.zip" | null}, ...],
     "rounds": 1, "action_timeout_ms": 30000, "chromium": "/usr/bin/chromium", "args": [...]}
stdout: {"event": "ready", "launch_ms": ...}; then per step {"event": "step", "trace_id", "step_id",
"executed", "latency_ms", "page_load_ms", "ok", "error"}, after which it waits for one line on
stdin ("go") before the next step, so the parent can read the tenant's counters between steps;
finally {"event": "done"}. A browser that died ends the job with {"event": "fatal", "error"}.

Every URL a step names is rewritten to the local site (same path and query): replayed traces are
hostile input and name public sites. Chromium is also pointed at a dead proxy, so a page that
tries to reach anything but loopback fails instead of leaving the machine.
"""
from __future__ import annotations

import ctypes
import json
import signal
import sys
import time
from urllib.parse import urlsplit

from .webapp import serve

#: What `page.setContent` loads: the IR keeps no document content (the converter drops it).
SET_CONTENT_HTML = ('<!doctype html><title>set content</title><div id="d" data-kind="fixture" '
                    'style="width:10em">a div set by the replayed trace</div>')
NOT_REPLAYED = {
    "Page.setNetworkInterceptionPatterns": "network interception: the local site serves every page",
    "BrowserContext.setNetworkInterceptionPatterns": "network interception: the local site serves every page",
    "Route.fulfill": "network interception: the local site serves every page",
    "Route.continue": "network interception: the local site serves every page",
    "Route.abort": "network interception: the local site serves every page",
    "Frame.evaluateExpression": "the trace does not record the expression",
    "Frame.evaluateExpressionHandle": "the trace does not record the expression",
    "Frame.selectOption": "the trace does not record the option chosen",
    "Frame.waitForTimeout": "a pause, not a browser action",
}


class Skip(Exception):
    """The step is not replayed here; the message says why."""


def rewrite(url: str | None, base: str) -> str:
    """The local site's URL for any URL a trace names: same path, query and fragment."""
    if not url:
        raise Skip("the step has no URL")
    if url.startswith("about:"):
        return "about:blank"
    parts = urlsplit(url if "://" in url or url.startswith("/") else "/" + url)
    out = base + (parts.path or "/")
    if parts.query:
        out += "?" + parts.query
    return out


class Session:
    """One trace's browser context and its current page."""

    def __init__(self, browser, base: str, timeout_ms: float):
        self.base, self.timeout_ms = base, timeout_ms
        self.context = browser.new_context()
        self.context.set_default_timeout(timeout_ms)
        self.page = self.context.new_page()
        self.nav_origin = None

    def new_page(self):
        self.page = self.context.new_page()
        self.nav_origin = None

    def act(self, method: str, args: dict) -> None:
        if method in NOT_REPLAYED:
            raise Skip(NOT_REPLAYED[method])
        page, sel = self.page, args.get("selector")
        cls, _, name = method.partition(".")
        if method == "BrowserContext.newPage":
            return self.new_page()
        if name == "goto":
            page.goto(rewrite(args.get("url"), self.base))
            return None
        if method == "Page.reload":
            page.reload()
            return None
        if method in ("Page.goBack", "Page.goForward"):
            (page.go_back if name == "goBack" else page.go_forward)()
            return None
        if method == "Page.close":
            page.close()
            return self.new_page()
        if method == "Page.screenshot":
            page.screenshot()
            return None
        if method in ("Page.keyboardPress", "Page.keyboardDown"):
            page.keyboard.press(args.get("key") or "Enter")
            return None
        if method in ("Page.keyboardType", "Page.keyboardInsertText"):
            page.keyboard.type(args.get("value") or "")
            return None
        if name == "setContent":
            page.set_content(SET_CONTENT_HTML)
            return None
        if name == "title":
            page.title()
            return None
        if name == "waitForLoadState":
            page.wait_for_load_state()
            return None
        if cls not in ("Frame", "ElementHandle"):
            raise Skip(f"{method} is not a browser action this replayer knows")
        if not sel:
            raise Skip(f"{method} without a selector")
        loc = page.locator(sel).first
        actions = {
            "click": loc.click, "dblclick": loc.dblclick, "tap": loc.click, "hover": loc.hover,
            "focus": loc.focus, "check": loc.check, "uncheck": loc.uncheck,
            "fill": lambda: loc.fill(args.get("value") or ""),
            "type": lambda: loc.press_sequentially(args.get("value") or ""),
            "press": lambda: loc.press(args.get("key") or "Enter"),
            "waitForSelector": lambda: loc.wait_for(state="attached"),
            "textContent": loc.text_content, "innerText": loc.inner_text, "innerHTML": loc.inner_html,
            "inputValue": loc.input_value, "isVisible": loc.is_visible, "isHidden": loc.is_hidden,
            "isChecked": loc.is_checked, "isEnabled": loc.is_enabled,
            # The attribute's name is not in the IR: read `id`, the same round trip.
            "getAttribute": lambda: loc.get_attribute("id"),
            "queryCount": page.locator(sel).count, "querySelector": loc.count,
            "querySelectorAll": page.locator(sel).count,
        }
        if name not in actions:
            raise Skip(f"{method} is not a browser action this replayer knows")
        actions[name]()
        return None

    def page_load_ms(self) -> float | None:
        """Load time (Navigation Timing loadEventEnd, ms from the navigation's start) of a
        navigation the last step caused; None when it caused none."""
        try:
            if not self.page.url.startswith("http"):    # about:blank, setContent: no page was loaded
                return None
            origin = self.page.evaluate("performance.timeOrigin")
            if origin == self.nav_origin:
                return None
            self.page.wait_for_load_state("load")
            load = self.page.evaluate("(performance.getEntriesByType('navigation')[0] || {}).loadEventEnd || 0")
            self.nav_origin = origin
            return round(float(load), 3) if load else None
        except Exception:           # the page went away (closed, crashed): no load time
            self.nav_origin = None
            return None


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)       # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    _die_with_parent()
    job = json.loads(sys.stdin.readline())
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    server = serve()
    t0 = time.perf_counter()
    try:
        with sync_playwright() as pw:
            try:
                browser = pw.chromium.launch(executable_path=job["chromium"], args=job["args"], headless=True)
            except PlaywrightError as exc:
                _emit({"event": "fatal", "error": "chromium did not start: " + str(exc).splitlines()[0][:300]})
                return 1
            _emit({"event": "ready", "launch_ms": round((time.perf_counter() - t0) * 1000, 3), "site": server.url})
            for _round in range(job.get("rounds", 1)):
                for trace in job["traces"]:
                    if not _replay(browser, trace, server.url, job, PlaywrightError):
                        return 1
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    _emit({"event": "done"})
    return 0


def _replay(browser, trace: dict, base: str, job: dict, PlaywrightError) -> bool:
    try:
        session = Session(browser, base, job["action_timeout_ms"])
    except PlaywrightError as exc:
        _emit({"event": "fatal", "error": f"cannot open a browser context: {exc}"[:500]})
        return False
    if trace.get("record"):
        session.context.tracing.start(snapshots=False, screenshots=False)
    for step in trace["steps"]:
        args = step.get("args") or {}
        out = {"event": "step", "trace_id": trace["trace_id"], "step_id": step["step_id"], "executed": True,
               "ok": True, "error": None, "latency_ms": None, "page_load_ms": None}
        t = time.perf_counter()
        try:
            session.act(args.get("method") or step.get("native_tool") or "", args)
            out["latency_ms"] = round((time.perf_counter() - t) * 1000, 3)
        except Skip as why:
            out.update(executed=False, error=str(why))
        except PlaywrightError as exc:
            out.update(latency_ms=round((time.perf_counter() - t) * 1000, 3), ok=False,
                       error=str(exc).splitlines()[0][:300])
            if not browser.is_connected():
                _emit({**out, "event": "fatal"})
                return False
            if session.page.is_closed() or "crash" in str(exc).lower():
                session.new_page()        # a crashed renderer (e.g. OOM-killed): carry on in a new tab
        if out["executed"] and not trace.get("record"):   # its probes would be recorded as steps
            out["page_load_ms"] = session.page_load_ms()
        _emit(out)
        if sys.stdin.readline().strip() != "go":
            return False                  # the parent is gone or stopped us
    if trace.get("record"):
        session.context.tracing.stop(path=trace["record"])
    session.context.close()
    return True


if __name__ == "__main__":
    raise SystemExit(main())
