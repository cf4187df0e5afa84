"""Claude Code's file edits as a step's arguments, for the Claude Code converter (claude_code.py).

Edit, Write and MultiEdit are kept in full, in the terms of the replay's editor (replay/editor.py),
so that a replay applies them: Edit is `str_replace` (`old_str`, `new_str`, `replace_all`), Write is
`write` (`file_text`), MultiEdit is `multi_edit` (`edits`, each `old_str`, `new_str`,
`replace_all`). `path` is the call's `file_path`; `bytes` the UTF-8 size of what the edit writes.
An edit whose text cannot be a program's argument (a NUL, an unpaired surrogate, more than
MAX_ARG_BYTES) keeps its path and size only, `not_kept` saying why: the trace still converts, and a
replay does not apply it. A NotebookEdit keeps its size only (the editor edits no notebooks).
"""
from __future__ import annotations

from typing import Any

from ..ir import TraceError
from ._common import MAX_ARG_BYTES

_MISSING = object()
_EDIT_TEXTS = {"Write": (("content", "file_text"),), "Edit": (("old_string", "old_str"), ("new_string", "new_str"))}


def edit_args(native: str, inp: dict, args: dict[str, Any], where: dict) -> dict[str, Any]:
    """`args` (the call's small identifying keys, already checked) completed with the edit."""
    if native == "NotebookEdit":
        args["bytes"] = len(_text(inp.get("new_source", ""), "input.new_source", where).encode("utf-8", "surrogatepass"))
        return args
    # checked with the call's other kept keys when it is a string; missing or null is said here
    args["path"] = _text(args.pop("file_path", inp.get("file_path", _MISSING)), "input.file_path", where)
    if native == "MultiEdit":
        edits = inp.get("edits", _MISSING)
        if edits is _MISSING or edits is None:
            raise TraceError("missing", field="input.edits", **where)
        if not isinstance(edits, list) or not edits:
            raise TraceError(f"expected a non-empty list, got {type(edits).__name__} {edits!r:.40}",
                             field="input.edits", **where)
        spec = {"op": "multi_edit", "edits": [_one_edit(e, f"input.edits[{k}]", where) for k, e in enumerate(edits)]}
        texts = [(f"input.edits[{k}].{key}", e[ir]) for k, e in enumerate(spec["edits"])
                 for key, ir in (("old_string", "old_str"), ("new_string", "new_str"))]
        written = [e["new_str"] for e in spec["edits"]]
    else:
        spec = {"op": "write" if native == "Write" else "str_replace"}
        for key, ir in _EDIT_TEXTS[native]:
            spec[ir] = _text(inp.get(key, _MISSING), f"input.{key}", where)
        if native == "Edit" and args.get("replace_all") is not None:
            spec["replace_all"] = args.pop("replace_all")
        texts = [(f"input.{key}", spec[ir]) for key, ir in _EDIT_TEXTS[native]]
        written = [spec["new_str" if native == "Edit" else "file_text"]]
    args["bytes"] = sum(len(t.encode("utf-8", "surrogatepass")) for t in written)
    why = next((f"{field} {problem}" for field, t in texts if (problem := _unkeepable(t))), None)
    if why:                 # kept as its size only: a replay does not apply it
        args["not_kept"] = why
    else:
        args.update(spec)
    return args


def _text(val: Any, field: str, where: dict) -> str:
    if val is _MISSING:
        raise TraceError("missing", field=field, **where)
    if not isinstance(val, str):
        raise TraceError(f"expected str, got {type(val).__name__}", field=field, **where)
    return val


def _unkeepable(text: str) -> str | None:
    """Why an edit's text cannot be kept in a step's arguments (then only its size is), or None."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"contains an unpaired surrogate at offset {exc.start}"
    return f"is over {MAX_ARG_BYTES:,} bytes" if size > MAX_ARG_BYTES else None


def _one_edit(e: Any, field: str, where: dict) -> dict[str, Any]:
    """One of a MultiEdit's edits in the editor's terms."""
    if not isinstance(e, dict):
        raise TraceError(f"expected an object, got {type(e).__name__}", field=field, **where)
    one = {"old_str": _text(e.get("old_string", _MISSING), f"{field}.old_string", where),
           "new_str": _text(e.get("new_string", _MISSING), f"{field}.new_string", where)}
    if e.get("replace_all") is not None:
        if not isinstance(e["replace_all"], bool):
            raise TraceError(f"expected bool, got {type(e['replace_all']).__name__}", field=f"{field}.replace_all",
                             **where)
        one["replace_all"] = e["replace_all"]
    return one
