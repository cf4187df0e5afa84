"""The file editor a trace's edit steps are applied with, inside the step's sandbox or container.

An agent's edit tool is not a shell command: the agent runtime writes the file itself. A replay
applies the recorded edit as that tool would, as the step's own unprivileged user inside the
step's own sandbox (a previous step may have made any path of the workspace a symlink to anything:
resolved in there, it reaches only what the step could reach anyway), so this is a script on its
own: the executors pass its source to the sandbox's `python3 -I -S -c`, then the edit as JSON, cut
into as many arguments as the kernel needs (at most 128 KiB each), joined here. Standard library
only, and Python 3.6 syntax (a task's image may have an old python3).

    {"op": "create" | "write" | "str_replace" | "multi_edit" | "insert" | "undo_edit"
           | "replace_lines" | "append",
     "path": "/abs/file", "file_text": ..., "old_str": ..., "new_str": ..., "replace_all": bool,
     "edits": [{"old_str": ..., "new_str": ..., "replace_all": bool}, ...], "insert_line": N,
     "start_line": N, "end_line": M, "line_ends": bool, "expand_tabs": bool, "clamp_line": bool,
     "history": "/dir"}

OpenHands' `str_replace_editor`: `create` writes a new file (its directories made; an existing file
is an error, as there), `str_replace` replaces the one occurrence of `old_str` (none or several is
an error), `insert` puts `new_str` after line `insert_line` (0: at the top), `undo_edit` puts back
the file as it was before its last edit (kept in `history`). Claude Code's Write is `write` (a new
file or a whole new content), its Edit `str_replace` (with `replace_all`: every occurrence, at least
one), its MultiEdit `multi_edit`: the edits in order, each on the result of the one before, and
the file written only when every one applied (none is, otherwise, as there). SWE-agent's windowed
tools: `edit N:M` is `replace_lines` (lines N to M, from 1, replaced by the lines of `new_str`:
that tool's slice assignment; `line_ends`: every line written back with a newline, as its 0.x
bash function does), `insert TEXT` without a line is `append` (after the file's text, less one final
newline of each, as that tool joins them); its `str_replace_editor` expands tabs in the file and
in both strings first (`expand_tabs`).
Exit 0 and the tool's message when the edit applied; exit 1 and `ERROR: why` when it did not, which
a replay counts as a divergence from a trajectory whose edit applied.
"""
import hashlib
import json
import os
import sys

MAX_HISTORY = 20            # earlier versions kept per file for undo_edit


def _history_file(history, path, n):
    return os.path.join(history, hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest() + "." + str(n))


def _remember(history, path, text):
    """Keep `text` (the file before an edit) as the newest version of `path` in `history`."""
    if not history:
        return
    os.makedirs(history, exist_ok=True)
    n = 0
    while n < MAX_HISTORY and os.path.exists(_history_file(history, path, n)):
        n += 1
    if n == MAX_HISTORY:
        for i in range(1, MAX_HISTORY):
            os.replace(_history_file(history, path, i), _history_file(history, path, i - 1))
        n -= 1
    with open(_history_file(history, path, n), "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)


def _read(path):
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        return f.read()


def _write(path, text):
    with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
        f.write(text)


def _replace(text, edit, path):
    """(text with `old_str` replaced, None), or (text, "ERROR: why") when it does not apply: none, or
    several without `replace_all`."""
    old, new = edit.get("old_str"), edit.get("new_str") or ""
    if not isinstance(old, str) or not old:
        return text, "ERROR: Parameter `old_str` is required for command: str_replace."
    if not isinstance(new, str):
        return text, "ERROR: Parameter `new_str` must be a string."
    if new == old:              # both tools refuse an edit that changes nothing
        return text, "ERROR: No replacement was performed: `new_str` and `old_str` are the same."
    count = text.count(old)
    if count == 0:
        return text, ("ERROR: No replacement was performed, old_str `{}` did not appear verbatim in {}."
                      .format(old[:200], path))
    if edit.get("replace_all") is True:
        return text.replace(old, new), None
    if count > 1:
        return text, ("ERROR: No replacement was performed. Multiple occurrences of old_str `{}` in {}."
                      .format(old[:200], path))
    return text.replace(old, new, 1), None


def _bash_lines(text):
    """`text` as bash's `mapfile -t` / `read -r` reads it: a last line without its newline counts."""
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n") if text else []


def _replace_lines(text, edit, path, history):
    """SWE-agent's `edit N:M`: its list slice assignment, so a range past the end appends, as there.
    `line_ends` (its 0.x bash function): the file and `new_str` read as lines that each end with a
    newline (a last one without counts too), every line written back with one."""
    start, end, new = edit.get("start_line"), edit.get("end_line"), edit.get("new_str")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (start, end)) or start < 1 or end < 0:
        return 1, "ERROR: Invalid line range {!r}:{!r}: lines count from 1.".format(start, end)
    if not isinstance(new, str):
        return 1, "ERROR: Parameter `new_str` is required for command: replace_lines."
    _remember(history, path, text)
    if edit.get("line_ends") is True:       # its arrays: lines[0:N-1] + new + lines[M:], printf "%s\n"
        lines = _bash_lines(text)
        _write(path, "".join(x + "\n" for x in lines[:start - 1] + _bash_lines(new) + lines[end:]) or "\n")
    else:
        lines = text.split("\n")
        lines[start - 1:end] = new.split("\n") if new else []
        _write(path, "\n".join(lines))
    return 0, "File updated: {} lines {}:{} replaced.".format(path, start, end)


def apply(edit):
    """(exit code, message) of applying `edit` (the JSON object above)."""
    op, path, history = edit.get("op"), edit.get("path"), edit.get("history")
    if not isinstance(path, str) or not os.path.isabs(path):
        return 1, "ERROR: Invalid `path` parameter: {!r}. The path should be an absolute path.".format(path)
    if op in ("create", "write"):       # a whole content: `create` only where there is no file yet
        if op == "create" and os.path.lexists(path):
            return 1, "ERROR: File already exists at: {}. Cannot overwrite files using command `create`.".format(path)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if os.path.isfile(path):
            _remember(history, path, _read(path))
        _write(path, edit.get("file_text") or "")
        return 0, "File {} successfully at: {}".format("created" if op == "create" else "written", path)
    if op not in ("str_replace", "multi_edit", "insert", "undo_edit", "replace_lines", "append"):
        return 1, "ERROR: unknown edit operation {!r}".format(op)
    if not os.path.isfile(path):
        return 1, "ERROR: Invalid `path` parameter: {}. The path {} does not exist.".format(path, path)
    text = _read(path)
    if edit.get("expand_tabs") is True and op in ("str_replace", "insert"):     # SWE-agent's str_replace_editor
        text = text.expandtabs()
        edit = dict(edit, **{k: edit[k].expandtabs() for k in ("old_str", "new_str") if isinstance(edit.get(k), str)})
    if op == "undo_edit":
        n = 0
        while history and os.path.exists(_history_file(history, path, n)):
            n += 1
        if n == 0:
            return 1, "ERROR: No edit history found for {}.".format(path)
        last = _history_file(history, path, n - 1)
        _write(path, _read(last))
        os.remove(last)
        return 0, "Last edit to {} undone successfully.".format(path)
    if op in ("str_replace", "multi_edit"):
        edits = [edit] if op == "str_replace" else edit.get("edits")
        if not isinstance(edits, list) or not edits or not all(isinstance(e, dict) for e in edits):
            return 1, "ERROR: Parameter `edits` (a list of edits) is required for command: multi_edit."
        new_text = text
        for k, one in enumerate(edits):
            new_text, error = _replace(new_text, one, path)
            if error:
                return 1, error if op == "str_replace" else "ERROR: edit {} of {}: {}".format(k + 1, len(edits), error[len("ERROR: "):])
        _remember(history, path, text)
        _write(path, new_text)
        return 0, "The file {} has been edited.".format(path)
    if op == "append":
        new = edit.get("new_str")
        if not isinstance(new, str):
            return 1, "ERROR: Parameter `new_str` is required for command: append."
        _remember(history, path, text)
        _write(path, (text[:-1] if text.endswith("\n") else text) + "\n" + new if text else new)
        return 0, "The file {} has been edited.".format(path)
    if op == "replace_lines":
        return _replace_lines(text, edit, path, history)
    lines = text.split("\n")
    at, new = edit.get("insert_line"), edit.get("new_str")
    if edit.get("clamp_line") is True and isinstance(at, int) and at > len(lines):
        at = len(lines)                 # SWE-agent's windowed insert: list.insert appends past the end
    if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at <= len(lines):
        return 1, ("ERROR: Invalid `insert_line` parameter: {!r}. It should be within the range of lines "
                   "of the file: [0, {}]".format(at, len(lines)))
    if not isinstance(new, str):
        return 1, "ERROR: Parameter `new_str` is required for command: insert."
    _remember(history, path, text)
    _write(path, "\n".join(lines[:at] + new.split("\n") + lines[at:]))
    return 0, "The file {} has been edited.".format(path)


def main(argv):
    try:
        edit = json.loads("".join(argv)) if argv else None
    except ValueError:
        edit = None
    if not isinstance(edit, dict):
        print("ERROR: usage: editor.py EDIT_JSON [its continuation ...]", file=sys.stderr)
        return 2
    try:
        code, message = apply(edit)
    except OSError as exc:
        code, message = 1, "ERROR: {}: {}".format(exc.filename or edit.get("path"), exc.strerror or exc)
    print(message)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
