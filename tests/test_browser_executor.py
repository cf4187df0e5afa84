"""The browser tenant: the shipped web app, URL rewriting, and real chromium replaying the shipped
browser traces inside a tenant cgroup (Debian's chromium through Playwright)."""
from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

from pytest_agentcgroup.metrics.records import METRICS, step_record
from pytest_agentcgroup.replay import ExecutorUnavailable
from pytest_agentcgroup.tenants.browser import BrowserTenant, missing
from pytest_agentcgroup.tenants.browser_driver import Skip, rewrite
from pytest_agentcgroup.tenants.webapp import serve
from pytest_agentcgroup.traces.corpus import Corpus
from pytest_agentcgroup.traces.ir import Step, Trace

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def site():
    server = serve()
    yield server.url
    server.shutdown()
    server.server_close()


def _opener():
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))


def _post(opener, url, **form):
    return opener.open(url, data=urllib.parse.urlencode(form).encode(), timeout=10)


def test_webapp_pages_forms_and_state(site):
    op = _opener()
    assert b"Browse the catalogue" in op.open(site + "/", timeout=10).read()
    assert b'id="next"' in op.open(site + "/catalogue?page=2", timeout=10).read()
    # Wrong password: back to the form with an error; right one: a session cookie and the account.
    assert b'id="error"' in _post(op, site + "/login", username="agent", password="nope").read()
    assert b"Welcome back, agent" in _post(op, site + "/login", username="agent", password="correct-horse").read()
    assert b"1 result" not in op.open(site + "/search?q=gadget", timeout=10).read()
    # Cart -> checkout -> order; the cart is empty afterwards.
    assert b'id="total">' in _post(op, site + "/cart", item="3", qty="2").read()
    assert b"confirmed" in _post(op, site + "/checkout", address="1 Loopback Lane").read()
    assert b'id="empty"' in op.open(site + "/cart", timeout=10).read()
    with pytest.raises(urllib.error.HTTPError) as err:
        op.open(site + "/no/such/page", timeout=10)
    assert err.value.code == 404


def test_webapp_refuses_non_loopback():
    with pytest.raises(ValueError, match="loopback only"):
        serve(host="0.0.0.0")


@pytest.mark.parametrize("url, expected", [
    ("https://playwright.dev/", "http://127.0.0.1:1/"),
    ("https://playwright.dev/index.html?x=1#top", "http://127.0.0.1:1/index.html?x=1"),
    ("http://10.0.0.1:8080/login", "http://127.0.0.1:1/login"),
    ("/search?q=a", "http://127.0.0.1:1/search?q=a"),
    ("about:blank", "about:blank"),
])
def test_every_url_is_rewritten_to_the_local_site(url, expected):
    assert rewrite(url, "http://127.0.0.1:1") == expected


def test_rewrite_without_url_skips():
    with pytest.raises(Skip, match="no URL"):
        rewrite(None, "http://127.0.0.1:1")


def test_missing_chromium_names_it():
    why = missing("/nonexistent/chromium")
    assert why and "chromium at /nonexistent/chromium" in why
    with pytest.raises(ExecutorUnavailable, match="chromium at /nonexistent/chromium"):
        BrowserTenant(chromium="/nonexistent/chromium")


def _need_browser():
    why = missing()
    if why:
        pytest.skip(why)


def _browser_traces():
    corpus = Corpus.open(REPO / "traces")
    return [corpus.load(t) for t in corpus.ids("browser")]


def _live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_shipped_browser_traces_replay_in_the_tenant_cgroup(tree):
    _need_browser()
    traces = _browser_traces()
    assert len(traces) >= 6
    cg = tree.workload("browser-tenant", inner=False)
    seen: dict[int, str] = {}

    def watch(result):
        for pid in cg.pids():
            try:
                seen[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                pass

    results = BrowserTenant(action_timeout_s=30).replay(traces, place=cg, on_step=watch)
    assert len(results) == sum(len(t.steps) for t in traces)
    failed = [(r.trace_id, r.step_id, r.cmd, r.error) for r in results if r.executed and r.exit_code != 0]
    assert not failed, failed
    executed = [r for r in results if r.executed]
    skipped = {r.cmd for r in results if not r.executed}
    # Only the network-interception plumbing of trace-1.37 is not replayed.
    assert skipped <= {"Page.setNetworkInterceptionPatterns", "Route.fulfill"}, skipped
    assert len(executed) >= 40
    loads = [r.measures["page_load_ms"] for r in executed if "page_load_ms" in r.measures]
    gotos = [r for r in executed if r.cmd.startswith("Frame.goto")]
    assert len(loads) >= len(gotos) >= 8 and all(x > 0 for x in loads)
    assert all(r.latency_ms > 0 for r in executed)
    # The tenant's own counters: the browser's memory and CPU are charged to the tenant cgroup.
    assert all(r.measures["tenant_mem_mb"] > 50 for r in results)
    assert sum(r.counters["cpu_usec"] for r in results) > 100_000
    assert sum(r.counters["oom_kills"] for r in results) == 0
    # Chromium and all its children lived in the tenant's cgroup (joined before exec), with
    # Playwright's node driver; none of them outlives the replay.
    names = list(seen.values())
    assert names.count("chromium") >= 3 and any(n.startswith("node") for n in names), names
    assert not [pid for pid in seen if _live(pid)]
    assert cg.pids() == []


def test_browser_step_records_carry_page_load_and_tenant_memory(tree):
    _need_browser()
    trace = Trace("playwright/unit", {"format": "synthetic"}, (
        Step(0, "browser", {"method": "Frame.goto", "url": "https://example.org/docs/intro"}),
        Step(1, "browser", {"method": "Frame.click", "selector": "#next"}),
        Step(2, "browser", {"method": "Frame.textContent", "selector": "#no-such-element"}),
        Step(3, "browser", {"method": "Frame.evaluateExpression"}),
    ))
    cg = tree.workload("browser-records", inner=False)
    results = BrowserTenant(action_timeout_s=2).replay([trace], place=cg)
    recs = [step_record(r, s, config="unlimited", time_scale=1.0, executor="browser")
            for r, s in zip(results, trace.steps)]
    assert recs[0]["page_load_ms"] > 0 and recs[1]["page_load_ms"] > 0     # goto and a navigating click
    assert recs[0]["exit_code"] == 0 and recs[1]["exit_code"] == 0
    assert recs[2]["exit_code"] == 1 and "Timeout" in recs[2]["error"]     # a selector that never appears
    assert recs[3]["executed"] is False and "expression" in recs[3]["error"]
    assert all(r["tenant_mem_mb"] > 50 and r["cpu_ms"] is not None for r in recs)
    assert {"page_load_ms", "tenant_mem_mb"} <= set(METRICS)


def test_browser_under_a_tight_memory_limit_is_oom_killed_and_cleaned_up(tree):
    """A tenant limit below what chromium needs for a heavy page: the kernel OOM-kills browser
    processes; the replay ends (no hang) with every step accounted for, failed or not reached with
    the reason; the kernel's count says so; nothing is left in the tenant's cgroup."""
    _need_browser()
    cg = tree.workload("browser-oom", inner=False)
    cg.set_memory_max(128 * 1024 * 1024)
    trace = Trace("playwright/oom", {"format": "synthetic"}, tuple(
        Step(i, "browser", {"method": "Frame.goto", "url": "/report?rows=20000"}) for i in range(3)))
    tenant = BrowserTenant(action_timeout_s=10)
    results = tenant.replay([trace], place=cg)
    assert [r.step_id for r in results] == [0, 1, 2]
    assert cg.counters().oom_kills > 0
    bad = [r for r in results if not r.executed or r.exit_code != 0]
    assert bad and all(r.error for r in bad)
    # Killed (crashed page, dead browser) or stuck reclaiming at the limit until the timeout.
    assert tenant.error or any("crash" in r.error.lower() for r in bad), [r.error for r in bad]
    assert cg.pids() == []


def test_shipped_browser_traces_match_manifest_and_say_their_origin():
    from pytest_agentcgroup.tools.browser_record import SCENARIOS, describe
    from pytest_agentcgroup.traces.convert import playwright
    import json
    manifest = json.loads((REPO / "traces" / "manifest.json").read_text())
    entries = {e["trace_id"]: e for e in manifest["traces"] if e["trace_id"].startswith("playwright/")}
    assert sorted(manifest["subsets"]["browser"]) == sorted(entries)
    assert {t.rsplit("/", 1)[1] for t in entries if "/recorded/" in t} == set(SCENARIOS)
    for tid, entry in entries.items():
        trace = Corpus.open(REPO / "traces").load(tid)
        assert describe(trace, entry["file"], entry["kind"]) == entry
        assert all(s.tool == "browser" and s.duration_ms.provenance == "recorded" for s in trace.steps)
        if entry["kind"] == "converted":
            assert trace.source["licence"] == "Apache-2.0"
            assert trace.source["origin"] == "microsoft/playwright@d4e1023f6c03a8dced50eb3db88c2217e7c1a86a"
        else:       # recorded here: the shipped zip converts to the same steps
            assert trace.source["licence"] == "MIT" and "synthetic" in trace.source["origin"]
            (again,) = playwright.convert(REPO / trace.source["path"])
            assert again.steps == trace.steps


def test_two_driver_lines_arriving_together_are_both_read_at_once():
    from pytest_agentcgroup.tenants.browser import _Lines
    r, w = os.pipe()
    with os.fdopen(r, "rb") as pipe:
        os.write(w, b'{"event": "ready"}\n{"event": "step"}\n{"event"')
        lines = _Lines(pipe)
        assert lines.next(1.0) == b'{"event": "ready"}\n'
        assert lines.next(0.0) == b'{"event": "step"}\n'      # already here: no wait, no timeout
        assert lines.next(0.05) is None                          # half a line: not a line yet
        os.close(w)
        assert lines.next(1.0) == b'{"event"' and lines.next(1.0) == b""
