"""Where profiled traces go: OUT/<trace_id>.json and OUT/manifest.json. What may be written is
decided before anything runs (an input file or a file that is not a profiled trace is never
overwritten; an output directory that cannot be written or a manifest that does not read stops the
command first); each trace is written whole (a `.partial` file, then renamed), and its manifest
entry merged into the manifest (traces.corpus.update_manifest, merge mode)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..traces.corpus import MANIFEST, read_manifest, update_manifest
from ..traces.ir import Trace, TraceError, read_traces
from . import ProfileError

_SAFE_PART = re.compile(r"^[A-Za-z0-9._@+-]+$")


def output_path(out: Path, trace_id: str) -> Path:
    """OUT/<trace_id>.json; a trace id that is not a clean relative path is refused, not rewritten
    (two ids rewritten alike would overwrite each other's output)."""
    parts = trace_id.split("/")
    if not all(_SAFE_PART.match(p) and p not in (".", "..") for p in parts):
        raise ProfileError(f"trace {trace_id!r}: its id is not a clean relative path (letters, digits, ._@+-, "
                           "'/'-separated), so it cannot name an output file")
    return out.joinpath(*parts[:-1], parts[-1] + ".json")


def is_complete(path: Path, trace: Trace) -> bool:
    """Whether `path` holds this trace, profiled to its end by this command: the same steps (tool and
    arguments, in order) and a complete `source.profiled`."""
    try:
        done = list(read_traces(path))
    except TraceError:
        return False
    return (len(done) == 1 and done[0].trace_id == trace.trace_id
            and [(s.tool, s.args) for s in done[0].steps] == [(s.tool, s.args) for s in trace.steps]
            and (done[0].source.get("profiled") or {}).get("complete") is True)


def check_outputs(inputs: list[tuple[Path, Trace]], todo: list[tuple[Trace, Path]]) -> None:
    """Refuse, before anything runs, to write over an input file or over a file this command did not
    write: an existing output is replaced only when it does not parse or is a profiled trace (carries
    `source.profiled`). `traces profile traces/claude-code/... -o traces` would otherwise rewrite the
    shipped trace in place."""
    sources = {f.resolve(): f for f, _ in inputs}
    for trace, dst in todo:
        if dst.resolve() in sources:
            raise ProfileError(f"{dst}: the output of trace {trace.trace_id!r} is an input file "
                               f"({sources[dst.resolve()]}); not overwritten: choose another -o")
        if not dst.exists():
            continue
        try:
            there = list(read_traces(dst))
        except TraceError:
            continue                        # unparsable: a partial or broken output, profiled again
        if not all("profiled" in t.source for t in there):
            raise ProfileError(f"{dst}: the output of trace {trace.trace_id!r} exists and is not a profiled "
                               "trace (no source.profiled); not overwritten: choose another -o or remove it")


def check_writable(out: Path) -> None:
    """Create -o and write (then remove) a file in it: an output directory that cannot take the traces
    is said before any trace is profiled, not after the first."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".agentcgroup-profile-{os.getpid()}.probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ProfileError(f"-o {out}: cannot write there ({exc.strerror})") from None


def check_manifest(out: Path) -> dict:
    try:
        return read_manifest(out)
    except TraceError as exc:
        raise ProfileError(f"{exc}; not touched: fix or remove it, or choose another -o") from None


def write_profiled(trace: Trace, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".partial")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(trace.dumps() + "\n", encoding="utf-8")
        os.replace(tmp, dst)
    except OSError as exc:
        raise ProfileError(f"{dst}: cannot write the profiled trace {trace.trace_id!r} ({exc.strerror})") from None


def add_to_manifest(out: Path, written: list[tuple[Trace, Path]], subset: str) -> None:
    """OUT/manifest.json with these traces listed (and in `subset`), merged into their entries if they
    have some (their other keys kept); everything else in the manifest kept."""
    entries = []
    for trace, dst in written:
        rows = [s for s in trace.steps if s.outcome is not None]
        entries.append({"trace_id": trace.trace_id, "file": dst.relative_to(out).as_posix(),
                        "steps": len(trace.steps), "profiled_steps": len(rows),
                        "outcomes": {k: sum(1 for s in rows if s.outcome.status == k)
                                     for k in sorted({s.outcome.status for s in rows})},
                        "peak_mb": max((s.profile.peak_mb.value for s in rows if s.profile.peak_mb), default=0.0),
                        "total_step_ms": round(sum(s.duration_ms.value for s in rows if s.duration_ms))})
    try:
        update_manifest(out, (), entries, {subset: [e["trace_id"] for e in entries]}, merge=True)
    except TraceError as exc:
        raise ProfileError(f"{exc}; not touched") from None
    except OSError as exc:
        raise ProfileError(f"{out / MANIFEST}: cannot write it ({exc.strerror})") from None


def step_line(trace_id: str, k: int, n: int, step) -> str:
    """A profiled step as the progress shows it: `trace: step k/n status[ duration]`."""
    status = step.outcome.status if step.outcome else "not a command"
    secs = f" {step.duration_ms.value / 1000:.1f} s" if step.outcome and step.duration_ms else ""
    return f"{trace_id}: step {k}/{n} {status}{secs}"
