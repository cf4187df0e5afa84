"""Bad input through the real entry points: an impossible number in a trace is one
message at load naming file, step and field (`agentcgroup traces validate`, and the plugin loading
the trace); a step needing more memory than this host has fails its test at setup naming both
figures, the run's other records kept; an impossible number in the experiment configuration (or on
the command line) is one message when it is loaded, naming the file and the key. Never a traceback.

Self-contained (its own tiny study on disk), so it does not depend on conftest's helpers."""
from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import cgroups_or_skip, run_study

from pytest_agentcgroup import cli
from pytest_agentcgroup import config as cfgmod
from pytest_agentcgroup.harness.fixtures import beyond_host, host_memory_mb
from pytest_agentcgroup.traces import ir
from pytest_agentcgroup.traces.ir import TraceError, check_trace, parse_trace
from pytest_agentcgroup.traces.numbers import MAX_IO_BYTES, MAX_MEMORY_MB, MAX_TIME_MS, NUMBERS

REPO = Path(__file__).resolve().parents[1]
PEAK_FIELD = "profile.peak_mb.value"


def step(step_id: int, peak_mb: float, duration_ms: float = 50.0) -> dict:
    return {"step_id": step_id, "tool": "bash", "args": {"command": "true", "timeout_ms": 60000},
            "duration_ms": {"value": duration_ms, "provenance": "synthetic"},
            "profile": {"peak_mb": {"value": peak_mb, "provenance": "synthetic"},
                        "ramp_ms": {"value": duration_ms / 2, "provenance": "synthetic"},
                        "cpu_ms": {"value": 1.0, "provenance": "synthetic"},
                        "io_bytes": {"value": 0, "provenance": "synthetic"},
                        "curve": {"t_ms": [0, 10], "mb": [1.0, 2.0], "provenance": "synthetic"}},
            "outcome": {"status": "ok", "exit_code": 0},
            "original": {"duration_ms": {"value": duration_ms, "provenance": "recorded"},
                         "profile": {"peak_mb": {"value": 2.0, "provenance": "derived"}}}}


def trace(trace_id: str, peaks) -> dict:
    return {"schema": ir.SCHEMA, "trace_id": trace_id, "source": {"format": "synthetic"},
            "steps": [step(i, p) for i, p in enumerate(peaks)]}


def write_corpus(root: Path, traces: dict[str, dict]) -> Path:
    """`traces`: file name -> trace; all in subset smoke, in that order."""
    d = root / "traces"
    d.mkdir(parents=True)
    for name, t in traces.items():
        (d / name).write_text(json.dumps(t))     # allow_nan: NaN/Infinity as Python's json writes them
    ids = [t["trace_id"] for t in traces.values()]
    (d / "manifest.json").write_text(json.dumps({
        "schema": "agentcgroup-manifest/1", "subsets": {"smoke": ids},
        "traces": [{"trace_id": t["trace_id"], "file": name} for name, t in traces.items()]}))
    return d


# ---------------------------------------------------------------------------------------------
# Traces: the rules, one table

def test_every_measure_and_number_of_the_ir_has_a_rule():
    assert set(NUMBERS) >= {*ir.PROFILE_FIELDS, "duration_ms", "t_ms", "mb", "timeout_ms", "exit_code"}
    assert MAX_MEMORY_MB == 2 ** 52 / 2 ** 20 == 4294967296       # 4 PiB in MiB


def test_ir_bounds_are_what_the_emulator_takes():
    """A trace that validates replays: the IR's time and io bounds are the emulator's own."""
    src = (REPO / "pytest_agentcgroup" / "replay" / "emulator.c").read_text()
    max_bytes = re.search(r"#define MAX_BYTES \(\(double\)\(1L << (\d+)\)\)", src)
    max_ms = re.search(r"#define MAX_MS (\S+)", src)
    assert max_bytes and max_ms
    assert MAX_IO_BYTES == 2 ** int(max_bytes.group(1))
    assert MAX_TIME_MS == float(max_ms.group(1))


def _set(raw: dict, path: str, value) -> dict:
    """raw with the value at `path` (a/b/0/c) replaced."""
    *parents, last = path.split("/")
    node = raw
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[int(last) if isinstance(node, list) else last] = value
    return raw


# (JSON path, NUMBERS key, field named)
NUMERIC_FIELDS = [
    ("steps/1/duration_ms/value", "duration_ms", "duration_ms.value"),
    ("steps/1/profile/peak_mb/value", "peak_mb", PEAK_FIELD),
    ("steps/1/profile/ramp_ms/value", "ramp_ms", "profile.ramp_ms.value"),
    ("steps/1/profile/cpu_ms/value", "cpu_ms", "profile.cpu_ms.value"),
    ("steps/1/profile/io_bytes/value", "io_bytes", "profile.io_bytes.value"),
    ("steps/1/profile/curve/t_ms/1", "t_ms", "profile.curve.t_ms"),
    ("steps/1/profile/curve/mb/0", "mb", "profile.curve.mb"),
    ("steps/1/args/timeout_ms", "timeout_ms", "args.timeout_ms"),
    ("steps/1/outcome/exit_code", "exit_code", "outcome.exit_code"),
    ("steps/1/original/duration_ms/value", "duration_ms", "original.duration_ms.value"),
    ("steps/1/original/profile/peak_mb/value", "peak_mb", "original.profile.peak_mb.value"),
]


def bad_values(key: str) -> list:
    rule = NUMBERS[key]
    return [rule.least - 1, math.nan, math.inf, -math.inf, rule.most * 10, 1e300, "12", True, [1]] + \
        ([1e12] if 1e12 > rule.most else []) + ([2.5] if rule.integer else [])


CASES = [(path, key, field, v) for path, key, field in NUMERIC_FIELDS for v in bad_values(key)]


@pytest.mark.parametrize("path, key, field, value", CASES, ids=[f"{c[2]}={c[3]!r}" for c in CASES])
def test_an_impossible_number_is_one_trace_error_naming_file_step_and_field(path, key, field, value):
    raw = _set(trace("t/x", [1.0, 2.0]), path, value)
    text = json.dumps(raw)                      # NaN/Infinity written as Python's json writes them
    with pytest.raises(TraceError) as err:
        parse_trace(json.loads(text), file="f.json")
    e = err.value
    assert (e.file, e.step, e.field) == ("f.json", 1, field)
    assert str(e).startswith(f"f.json, step 1, field '{field}': ")
    assert key in str(e)


@pytest.mark.parametrize("path, key, field, value", [c for c in CASES if isinstance(c[3], (int, float))],
                         ids=[f"{c[2]}={c[3]!r}" for c in CASES if isinstance(c[3], (int, float))])
def test_check_trace_refuses_the_same_numbers_on_objects(path, key, field, value):
    """What converters emit (objects, no JSON) is checked by the same rules, naming the same field."""
    good = parse_trace(trace("t/x", [1.0, 2.0]))
    st_ = good.steps[1]
    p, o = st_.profile, st_.original
    new = {
        "duration_ms": lambda: replace(st_, duration_ms=ir.Measure(value, "synthetic")),
        "peak_mb": lambda: replace(st_, profile=replace(p, peak_mb=ir.Measure(value, "synthetic"))),
        "ramp_ms": lambda: replace(st_, profile=replace(p, ramp_ms=ir.Measure(value, "synthetic"))),
        "cpu_ms": lambda: replace(st_, profile=replace(p, cpu_ms=ir.Measure(value, "synthetic"))),
        "io_bytes": lambda: replace(st_, profile=replace(p, io_bytes=ir.Measure(value, "synthetic"))),
        "t_ms": lambda: replace(st_, profile=replace(p, curve=ir.Curve((0.0, value), (1.0, 2.0), "synthetic"))),
        "mb": lambda: replace(st_, profile=replace(p, curve=ir.Curve((0.0, 10.0), (value, 2.0), "synthetic"))),
        "timeout_ms": lambda: replace(st_, args={**st_.args, "timeout_ms": value}),
        "exit_code": lambda: replace(st_, outcome=ir.Outcome("ok", value)),
    }
    if field.startswith("original."):
        changed = (replace(o, duration_ms=ir.Measure(value, "recorded")) if key == "duration_ms" else
                   replace(o, profile=replace(o.profile, peak_mb=ir.Measure(value, "derived"))))
        bad = replace(st_, original=changed)
    else:
        bad = new[key]()
    with pytest.raises(TraceError) as err:
        check_trace(replace(good, steps=(good.steps[0], bad)), file="f.json")
    assert (err.value.step, err.value.field) == (1, field)


_beyond = st.one_of(st.floats(min_value=MAX_MEMORY_MB, exclude_min=True), st.floats(max_value=0, exclude_max=True),
                    st.just(math.nan), st.text(max_size=5), st.booleans(), st.none())


@settings(max_examples=60, deadline=None)
@given(peak=_beyond)
def test_any_impossible_peak_is_refused_and_any_possible_one_kept(peak):
    raw = trace("t/x", [1.0, 2.0])
    raw["steps"][0]["profile"]["peak_mb"]["value"] = peak
    with pytest.raises(TraceError) as err:
        parse_trace(raw, file="f.json", record=2)
    assert str(err.value).startswith(f"f.json, record 2, step 0, field '{PEAK_FIELD}': ")


@settings(max_examples=60, deadline=None)
@given(peak=st.floats(min_value=0, max_value=MAX_MEMORY_MB), io=st.integers(0, int(MAX_IO_BYTES)),
       ms=st.floats(min_value=0, max_value=MAX_TIME_MS))
def test_numbers_within_the_bounds_load(peak, io, ms):
    raw = trace("t/x", [peak])
    raw["steps"][0]["profile"]["io_bytes"]["value"] = io
    raw["steps"][0]["profile"]["cpu_ms"]["value"] = ms
    assert parse_trace(raw).steps[0].profile.peak_mb.value == peak


def test_validate_names_file_step_and_field_of_an_impossible_peak(tmp_path, capsys):
    """The issue's case: a peak of 1e12 MiB passed validation, then failed every replay with exit 2."""
    d = write_corpus(tmp_path, {"ok.json": trace("t/ok", [1.0]), "big.json": trace("t/big", [1.0, 1e12])})
    assert cli.main(["traces", "validate", str(d)]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"{d / 'big.json'}, step 1, field '{PEAK_FIELD}': 1e+12 MiB cannot be: peak_mb is at most 4294967296 MiB "
        "(4 PiB, x86-64's 52-bit physical address limit: more than any machine can hold)"]
    assert "Traceback" not in out + err and f"{d / 'ok.json'}: ok, 1 trace(s)" in out


@pytest.mark.parametrize("path, value", [("steps/0/duration_ms/value", -5), ("steps/0/profile/curve/mb/1", math.nan),
                                         ("steps/0/profile/cpu_ms/value", math.inf),
                                         ("steps/0/args/timeout_ms", "60s")])
def test_validate_jsonl_names_the_record_too(tmp_path, capsys, path, value):
    f = tmp_path / "many.jsonl"
    f.write_text(json.dumps(trace("t/a", [1.0])) + "\n" + json.dumps(_set(trace("t/b", [1.0]), path, value)) + "\n")
    assert cli.main(["traces", "validate", str(f)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{f}, record 2, step 0, field '") and "Traceback" not in line


def test_shipped_corpus_still_validates(capsys):
    assert cli.main(["traces", "validate", str(REPO / "traces")]) == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------
# This host's memory

def test_beyond_host_names_the_first_step_above_memtotal(tmp_path):
    t = parse_trace(trace("t/x", [10.0, 5000.0, 9000.0]))
    assert beyond_host(t, 4096.0) == (1, PEAK_FIELD, 5000.0)
    assert beyond_host(t, 10000.0) is None
    curved = parse_trace(_set(trace("t/y", [1.0]), "steps/0/profile/curve/mb/1", 6000.0))
    assert beyond_host(curved, 4096.0) == (0, "profile.curve.mb", 6000.0)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemFree:  10 kB\nMemTotal:       24683652 kB\n")
    assert host_memory_mb(str(meminfo)) == 24683652 / 1024
    assert host_memory_mb(str(tmp_path / "none")) is None


# ---------------------------------------------------------------------------------------------
# The plugin: pytester runs of a study

EXP = '''
import pytest
pytestmark = pytest.mark.experiment(name="exp1")

def test_exp1(agentcgroup_run):
    agentcgroup_run()
'''


def write_config(root: Path, defaults: str = "time_scale = 1.0", experiment: str = "") -> Path:
    config = root / "study.toml"
    config.write_text(textwrap.dedent(f"""\
        traces = "traces"
        [defaults]
        {defaults}
        [arms.unlimited]
        [arms.static-toolcall]
        memory_max_mb = 256
        [experiments.exp1]
        subset = "smoke"
        arms = ["unlimited"]
        {experiment}
        """))
    return config


def records(pytester) -> list[dict]:
    files = sorted(pytester.path.joinpath("out").rglob("metrics.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def one_error_line(result, text: str) -> None:
    """`text` said (once in the failure's own report, once in the short summary at most), no traceback."""
    out = "\n".join(result.outlines + result.errlines)
    assert text in out, out
    assert "Traceback" not in out and "def agentcgroup_" not in out, out     # no traceback, no fixture dump
    assert "During handling of the above exception" not in out, out          # said once, not chained again


def test_plugin_refuses_an_impossible_peak_at_load_and_keeps_the_other_traces_records(pytester):
    cgroups_or_skip()
    write_corpus(pytester.path, {"ok.json": trace("t/ok", [1.0, 2.0]), "big.json": trace("t/big", [1.0, 1e12])})
    write_config(pytester.path)
    pytester.makepyfile(test_exp1=EXP)
    result = run_study(pytester)
    result.assert_outcomes(passed=1, errors=1)
    one_error_line(result, f"trace t/big: {pytester.path / 'traces' / 'big.json'}, step 1, field '{PEAK_FIELD}': "
                           "1e+12 MiB cannot be: peak_mb is at most 4294967296 MiB")
    assert "exit code 2" not in result.stdout.str()
    assert {(r["trace_id"], r["step_id"]) for r in records(pytester)} == {("t/ok", 0), ("t/ok", 1)}


def test_plugin_fails_a_step_beyond_this_hosts_memory_at_setup_naming_both_figures(pytester):
    cgroups_or_skip()
    total = host_memory_mb()
    if total is None:
        pytest.skip("no MemTotal in /proc/meminfo")
    need = math.ceil(total * 2)             # possible on some machine, not on this one
    write_corpus(pytester.path, {"ok.json": trace("t/ok", [1.0, 2.0]), "big.json": trace("t/big", [1.0, need])})
    write_config(pytester.path)
    pytester.makepyfile(test_exp1=EXP)
    result = run_study(pytester)
    result.assert_outcomes(passed=1, errors=1)
    one_error_line(result, f"{pytester.path / 'traces' / 'big.json'}, step 1, field '{PEAK_FIELD}': the step needs "
                           f"{need:g} MiB, more than this host's memory (MemTotal {total:.0f} MiB in /proc/meminfo)")
    assert "exit code 2" not in result.stdout.str()
    assert {(r["trace_id"], r["step_id"]) for r in records(pytester)} == {("t/ok", 0), ("t/ok", 1)}


@pytest.mark.parametrize("defaults, experiment, key", [
    ("time_scale = 0", "", "defaults.time_scale: expected a positive number, got 0"),
    ("time_scale = 1.0", "time_scale = 0", "experiments.exp1.time_scale: expected a positive number, got 0"),
    ("time_scale = 1.0", "time_scale = -0.5", "experiments.exp1.time_scale: expected a positive number, got -0.5"),
    ("time_scale = nan", "", "defaults.time_scale: nan cannot be a setting"),
    ("step_timeout_s = 0", "", "defaults.step_timeout_s: expected a positive number, got 0"),
    ("time_scale = 1.0", "[experiments.exp1.matrix]\nsizes = [{ name = 'q', time_scale = 0 }]",
     "experiments.exp1.matrix.sizes[0].time_scale: expected a positive number, got 0"),
    ("executor = 'emulator'", "", "defaults.executor: unknown executor 'emulator'"),
])
def test_impossible_config_numbers_are_one_message_at_load(pytester, defaults, experiment, key):
    write_corpus(pytester.path, {"ok.json": trace("t/ok", [1.0])})
    write_config(pytester.path, defaults, experiment)
    pytester.makepyfile(test_exp1=EXP)
    result = run_study(pytester)
    assert result.ret != 0
    one_error_line(result, f"{pytester.path / 'study.toml'}: {key}")
    out = "\n".join(result.outlines)
    assert out.count(f"study.toml: {key}") <= 2, out      # the collection error (and its summary line), no more
    assert not any(" PASSED" in line or " FAILED" in line for line in result.outlines)


def test_impossible_time_scale_on_the_command_line_is_a_usage_error(pytester):
    write_corpus(pytester.path, {"ok.json": trace("t/ok", [1.0])})
    write_config(pytester.path)
    pytester.makepyfile(test_exp1=EXP)
    result = run_study(pytester, "--agentcgroup-time-scale", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--agentcgroup-time-scale (ini agentcgroup_time_scale): expected a positive number, got 0.0" in \
        "\n".join(result.errlines)


@pytest.mark.parametrize("toml, message", [
    ("[arms.a]\nmemory_max_mb = nan\n", "arms.a.memory_max_mb: nan cannot be a setting"),
    ("[arms.a]\nmemory_high_mb = inf\n", "arms.a.memory_high_mb: inf cannot be a setting"),
    ("[arms.a]\nmemory_max_mb = 1e12\n", "arms.a.memory_max_mb: 1000000000000.0 is above 4294967296"),
    ("[arms.a]\npids_max = 2.5\n", "arms.a.pids_max: expected an integer >= 1, got 2.5"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\nwindow_ms = 0\n",
     "arms.a.rules.window_ms: expected a positive number, got 0"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\nfreeze_hold_ms = nan\n",
     "arms.a.rules.freeze_hold_ms: nan cannot be a setting"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\nraise_step_mb = -64\n",
     "arms.a.rules.raise_step_mb: expected a number >= 0, got -64"),
    ("[arms.a]\n[experiments.e]\nstep_timeout_s = 'long'\n",
     "experiments.e.step_timeout_s: expected a positive number, got 'long'"),
    ("[arms.a]\n[experiments.e.matrix]\nablations = [{ name = 'x', arms = { a = { memory_max_mb = -1 } } }]\n",
     "experiments.e.matrix.ablations[0].arms.a.memory_max_mb: expected a positive number, got -1"),
    ("[arms.a]\n[experiments.e.matrix]\nsizes = [{ name = 'x', executor = 'vm' }]\n",
     "experiments.e.matrix.sizes[0].executor: unknown executor 'vm'"),
])
def test_impossible_config_numbers_name_file_and_key(tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_shipped_configurations_still_load():
    for name in ("agentcgroup.toml", "exp1-paper.toml"):
        assert cfgmod.load(REPO / "experiments" / name).experiments
