"""playwright converter: the 3 real trace.zip archives, older single-`action` formats, chunk merging,
zip-bomb and oversized-member protection, bad input, fuzzing.

Expected steps were read off each archive's library-side `*.trace` members by hand: one step per
`before` event whose class is not `Test`.
"""
from __future__ import annotations

import json
from functools import partial
import zipfile

import pytest
from hypothesis import given, settings, strategies as st

from pytest_agentcgroup.traces import convert as registry
from pytest_agentcgroup.traces.convert import playwright as conv
from pytest_agentcgroup.traces.ir import TraceError, parse_trace
from converter_checks import (DATASETS, FUZZ, check_converter, expect_trace_error, json_values,
                              only_trace, real_sample)

FOLDER = DATASETS / "playwright-trace"
T137, LIB146, TEST1 = FOLDER / "trace-1.37.zip", FOLDER / "trace-library-1.46.zip", FOLDER / "test-trace1.zip"
needs_data = pytest.mark.skipif(not FOLDER.is_dir(), reason=f"real samples not present: {FOLDER}")


_one = partial(only_trace, conv)


@needs_data
@pytest.mark.parametrize("path", [T137, LIB146, TEST1], ids=lambda p: p.name)
def test_sniff(path):
    assert conv.sniff(path) and registry.sniff(path) == "playwright"


@needs_data
def test_trace_1_37():
    t = _one(T137)
    assert t.trace_id == "playwright/trace-1.37"
    # 0-trace.trace (v4): 6 library calls; 1-trace.trace is the test runner's (class Test) and adds none
    assert [s.native_tool for s in t.steps] == [
        "BrowserContext.newPage", "Page.setNetworkInterceptionPatterns", "Page.setNetworkInterceptionPatterns",
        "Frame.goto", "Route.fulfill", "Route.fulfill"]
    assert all(s.tool == "browser" for s in t.steps)
    assert t.steps[3].args == {"method": "Frame.goto", "api": "page.goto", "url": "https://playwright.dev/index.html"}
    assert t.steps[3].duration_ms.to_json() == {"value": 15.896, "provenance": "recorded"}   # 351.585 - 335.689
    assert t.source == {"format": "playwright", "dataset": "microsoft/playwright test assets",
                        "path": "playwright-trace/trace-1.37.zip", "licence": "Apache-2.0",
                        "origin": "microsoft/playwright@d4e1023f6c03a8dced50eb3db88c2217e7c1a86a"}


@needs_data
def test_trace_library_1_46():
    t = _one(LIB146)
    assert [(s.args["api"], s.args.get("selector")) for s in t.steps] == [
        ("page.setContent", None), ("locator.getAttribute", "div"), ("locator.isVisible", "div"),
        ("locator.getAttribute", "div"), ("locator.isVisible", "div")]
    assert [s.duration_ms.value for s in t.steps] == [6.903, 10.934, 1.205, 1.013, 0.864]


@needs_data
def test_test_trace1():
    t = _one(TEST1)
    # test.trace repeats these calls as Test steps (plus hooks, fixtures, expect): not counted twice
    assert [s.native_tool for s in t.steps] == ["BrowserContext.newPage", "Frame.goto"]
    assert t.steps[1].args["url"] == "https://playwright.dev/"
    assert t.steps[1].duration_ms.value == 663.064
    parse_trace(t.to_json())


# ---------------------------------------------------------------------------------------------
# Hand-built archives

def _zip(path, members: dict[str, str | bytes]):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _nd(*events):
    return "\n".join(json.dumps(e) for e in events) + "\n"


HEADER = {"version": 6, "type": "context-options", "browserName": "chromium", "options": {}}


def _before(cid, t, cls="Frame", method="click", **params):
    return {"type": "before", "callId": cid, "startTime": t, "class": cls, "method": method, "params": params}


def _after(cid, t):
    return {"type": "after", "callId": cid, "endTime": t}


def test_merges_chunks_in_time_order_and_reads_old_action_events(tmp_path):
    p = _zip(tmp_path / "t.zip", {
        "1-trace.trace": _nd(HEADER, _before("call@5", 50.0, "Frame", "fill", selector="#q", value="hi"),
                              _after("call@5", 52.5)),
        "0-trace.trace": _nd(HEADER, _before("call@1", 10.0, "Frame", "press", selector="#q", key="Enter"),
                              _after("call@1", 11.0),
                              _before("call@2", 20.0, "Tracing", "tracingStart"),  # bookkeeping: skipped
                              _before("call@3", 30.0, "Frame", "type", selector="#q", text="abc")),  # never ended
        "test.trace": _nd(_before("pw:api@1", 9.0, "Test", "step")),
        "0-trace.network": "",
    })
    t = _one(p)
    assert [s.args for s in t.steps] == [
        {"method": "Frame.press", "selector": "#q", "key": "Enter"},
        {"method": "Frame.type", "selector": "#q", "value": "abc"},
        {"method": "Frame.fill", "selector": "#q", "value": "hi"}]
    assert [s.duration_ms.value if s.duration_ms else None for s in t.steps] == [1.0, None, 2.5]


def test_v3_metadata_action_and_v4_single_action(tmp_path):
    v3 = {"type": "action", "metadata": {"id": "call@1", "startTime": 5, "endTime": 9, "type": "Frame",
                                         "method": "goto", "params": {"url": "https://a"}, "apiName": "page.goto",
                                         "snapshots": [], "log": []}}
    internal = {"type": "action", "metadata": {"id": "call@2", "startTime": 6, "endTime": 7, "type": "Frame",
                                               "method": "title", "params": {}, "internal": True}}
    v4 = {"type": "action", "callId": "call@3", "startTime": 10, "endTime": 13.25, "class": "Page",
          "method": "keyboardPress", "params": {"key": "Tab"}}
    t = _one(_zip(tmp_path / "old.zip", {"trace.trace": _nd({**HEADER, "version": 3}, v3, internal, v4)}))
    assert [s.args for s in t.steps] == [{"method": "Frame.goto", "api": "page.goto", "url": "https://a"},
                                         {"method": "Page.keyboardPress", "key": "Tab"}]
    assert [s.duration_ms.value for s in t.steps] == [4.0, 3.25]


def test_version_9_title_and_bounds(tmp_path):
    ev = {**_before("c1", 1.0, "Frame", "click", selector="a"), "title": "Click"}
    t = _one(_zip(tmp_path / "v9.zip", {"trace.trace": _nd({**HEADER, "version": 9}, ev, _after("c1", 2.0))}))
    assert t.steps[0].args == {"method": "Frame.click", "api": "Click", "selector": "a"}
    with pytest.raises(TraceError, match=r"field 'trace.trace line 1.version': trace format version 11 is not supported"):
        _one(_zip(tmp_path / "v11.zip", {"trace.trace": _nd({**HEADER, "version": 11}, ev)}))
    with pytest.raises(TraceError, match="version 2 is not supported"):
        _one(_zip(tmp_path / "v2.zip", {"trace.trace": _nd({**HEADER, "version": 2}, ev)}))


_err = partial(expect_trace_error, conv)


@pytest.mark.parametrize("members, expect", [
    ({"trace.trace": _nd(_before("c", 1.0))}, ["field 'context-options'", "no context-options header"]),
    ({"trace.trace": _nd(HEADER)}, ["field 'browser actions'", "empty"]),
    ({"trace.trace": _nd(HEADER) + '{"type": "before", "callId": "c",'}, ["field 'trace.trace line 2'", "invalid JSON"]),
    ({"trace.trace": _nd(HEADER, [1, 2])}, ["field 'trace.trace line 2'", "expected an event object"]),
    ({"trace.trace": _nd({**HEADER, "version": "6"})}, ["field 'trace.trace line 1.version'"]),
    ({"trace.trace": _nd(HEADER, {**_before("c", 1.0), "callId": 7})}, ["field 'trace.trace line 2.callId'"]),
    ({"trace.trace": _nd(HEADER, {**_before("c", 1.0), "class": None})}, ["field 'trace.trace line 2.method'"]),
    ({"trace.trace": _nd(HEADER, _before("c", -1.0))}, ["field 'trace.trace line 2.startTime'", ">= 0"]),
    ({"trace.trace": _nd(HEADER, _before("c", 1.0), {"type": "after", "callId": "c", "endTime": "late"})},
     ["field 'trace.trace line 3.endTime'"]),
    ({"trace.trace": _nd(HEADER, _before("c", 1.0, selector="a\u0000b"))}, ["field 'trace.trace line 2.params.selector'", "NUL"]),
    ({"trace.trace": b"\x00" + _nd(HEADER).encode()}, ["field 'zip member trace.trace'", "NUL byte"]),
    ({"trace.trace": b"\xff\xfe" + _nd(HEADER).encode()}, ["field 'zip member trace.trace'", "not UTF-8"]),
    ({"trace.network": ""}, ["no *.trace member"]),
    ({"trace.trace": _nd(HEADER, _before("c", 1.0, value="v" * (10 << 20)))}, ["params.value'", "limit"]),
])
def test_bad_archives(tmp_path, members, expect):
    _err(_zip(tmp_path / "bad.zip", members), expect)


def test_not_a_zip_and_truncated_zip(tmp_path):
    p = tmp_path / "no.zip"
    p.write_text("hello")
    assert not conv.sniff(p)
    _err(p, ["not a readable zip archive"])
    good = _zip(tmp_path / "good.zip", {"trace.trace": _nd(HEADER, _before("c", 1.0))})
    cut = tmp_path / "cut.zip"
    cut.write_bytes(good.read_bytes()[:-30])
    _err(cut, ["not a readable zip archive"])
    _err(tmp_path / "absent.zip", ["cannot read"])


def test_zip_bomb_member_is_refused(tmp_path):
    # 65 MiB of zeros deflates to ~65 KB: a real (small) bomb, over the 64 MiB per-member cap
    p = tmp_path / "bomb.zip"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("trace.trace", "w", force_zip64=True) as fh:
            fh.write(_nd(HEADER).encode())
            chunk = b"\n" * (1 << 20)
            for _ in range(65):
                fh.write(chunk)
    assert p.stat().st_size < 1 << 20
    e = _err(p, ["field 'zip member trace.trace'", "over the 67,108,864-byte limit", "zip bomb"])
    assert e.field == "zip member trace.trace"


def test_member_that_lies_about_its_size_is_refused(tmp_path, monkeypatch):
    # zipfile stops inflating at the declared size, so a member claiming 10 bytes fails its CRC check
    monkeypatch.setattr(conv, "MAX_MEMBER_BYTES", 1000)
    p = _zip(tmp_path / "liar.zip", {"trace.trace": _nd(HEADER, _before("c", 1.0)) + " " * 5000})
    # patch the sizes the archive declares (local header and central directory) to look small
    data = bytearray(p.read_bytes())
    info = zipfile.ZipFile(p).infolist()[0]
    real = info.file_size.to_bytes(4, "little")
    data = data.replace(real, (10).to_bytes(4, "little"))
    p.write_bytes(bytes(data))
    _err(p, ["field 'zip member trace.trace'", "cannot inflate: Bad CRC-32"])


def test_total_inflated_size_is_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(conv, "MAX_TOTAL_BYTES", 3000)
    body = _nd(HEADER, _before("c", 1.0)) + " " * 2000
    p = _zip(tmp_path / "many.zip", {"0-trace.trace": body, "1-trace.trace": body})
    _err(p, ["field 'zip member 1-trace.trace'", "total limit"])


def test_too_many_members(tmp_path, monkeypatch):
    monkeypatch.setattr(conv, "MAX_MEMBERS", 5)
    p = _zip(tmp_path / "wide.zip", {f"resources/{i}": "" for i in range(6)} | {"trace.trace": _nd(HEADER)})
    _err(p, ["7 entries, over the 5 limit"])


# ---------------------------------------------------------------------------------------------
# Fuzzing

json_value = json_values(
    ["before", "after", "action", "context-options", "Frame", "Test", "c1"],
    ["type", "version", "callId", "startTime", "endTime", "class", "method", "params", "selector", "url",
     "metadata", "id", "internal", "apiName"])


@FUZZ
@given(events=st.lists(json_value, max_size=6), header=st.booleans())
def test_fuzz_generated(fuzz_dir, events, header):
    lines = ([json.dumps(HEADER)] if header else []) + [json.dumps(e) for e in events]
    check_converter(conv, _zip(fuzz_dir / "gen.zip", {"0-trace.trace": "\n".join(lines)}))


@pytest.fixture(scope="module")
def real_lines():
    real_sample(LIB146)
    with zipfile.ZipFile(LIB146) as zf:
        return zf.read("trace.trace").decode().splitlines()


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_real_trace(fuzz_dir, real_lines, data):
    lines = list(real_lines)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        try:
            ev = json.loads(lines[i])
        except ValueError:  # already truncated by an earlier mutation
            ev = None
        op = data.draw(st.sampled_from(["replace-field", "delete-field", "replace-line", "truncate-line", "drop-line"]))
        if op == "replace-field" and isinstance(ev, dict) and ev:
            ev[data.draw(st.sampled_from(sorted(ev)))] = data.draw(json_value)
            lines[i] = json.dumps(ev)
        elif op == "delete-field" and isinstance(ev, dict) and ev:
            del ev[data.draw(st.sampled_from(sorted(ev)))]
            lines[i] = json.dumps(ev)
        elif op == "replace-line":
            lines[i] = json.dumps(data.draw(json_value))
        elif op == "truncate-line":
            lines[i] = lines[i][:data.draw(st.integers(0, len(lines[i])))]
        elif len(lines) > 1:
            del lines[i]
    check_converter(conv, _zip(fuzz_dir / "mut.zip", {"trace.trace": "\n".join(lines)}))


@settings(FUZZ, max_examples=50)
@given(cut=st.integers(0, 2000), flip=st.integers(0, 2000), byte=st.integers(0, 255))
def test_fuzz_corrupted_archive_bytes(fuzz_dir, cut, flip, byte):
    real_sample(LIB146)
    data = bytearray(LIB146.read_bytes())
    if flip < len(data):
        data[flip] = byte
    p = fuzz_dir / "corrupt.zip"
    p.write_bytes(bytes(data[:max(cut, 1)] if cut < len(data) else data))
    conv.sniff(p)
    check_converter(conv, p)
