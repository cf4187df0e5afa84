"""What the two SWE-agent converters (swe_agent_rows.py, swe_agent_traj.py) share: the command of
a model response (its last fenced block), what an ACI command does (read, edit, search, noop, or a
shell command) and an edit in the replay editor's terms (replay/editor.py). Not a format of its own.

**Edits** (`edit_spec`; the tools' own code: SWE-agent 0.7's `config/commands/edit_linting.sh`,
1.1's `tools/windowed*` and `edit_anthropic`):

* `edit N:M` + lines + `end_of_edit` (v0, and v1's windowed_edit_linting) on the open file:
  `replace_lines` of lines N to M; v0's bash function writes every line back with a newline
  (`line_ends`), v1's Python joins them as they were;
* `edit SEARCH REPLACE [REPLACE_ALL]` (v1's windowed_edit_replace, shell-quoted arguments) on the open
  file: `str_replace`; its third argument is read by argparse's `type=bool`, so any non-empty word
  (`False` too) means every occurrence, as there. That tool looks in the displayed window only;
  a replay, which has no window, looks in the whole file (so where the text is also elsewhere,
  the replay refuses what the tool applied: a divergence);
* `insert TEXT [LINE]` (v1.1): `insert` before line LINE (past the end: at the end, `clamp_line`),
  or `append` at the end; one final newline of TEXT dropped, as there; a line under 1 (its own
  start-of-file rule) is not kept. SWE-agent's main branch since June 2026 (still calling itself
  1.1.0) inserts after line LINE: its trajectories would land one line low;
* `create PATH` (relative to the step's directory): `create` of a file holding one empty line
  (v0's `printf "\n"`), or none where the tool's answer says `(0 lines total)` (v1's `touch`);
* `str_replace_editor CMD /PATH --file_text .. --old_str .. --new_str .. --insert_line N` (v1's
  edit_anthropic, shell-quoted): the editor's own terms, with `expand_tabs` for str_replace and
  insert (that tool expands tabs in the file and in both strings); a relative path, which it
  refuses, is not kept.

What the tool answered (the observation) says whether it applied the edit: `recorded_outcome` ok or
failed, `recorded_output` its head. The tools refuse edits for reasons a replay cannot always
reproduce (the windowed tools' window and flake8 run, str_replace_editor's rules of its own): an
edit its tool refused keeps its action only, `not_kept` saying why, and is applied nowhere, so the
files stay as the agent's were. An `append` tool or an edit whose arguments cannot be parsed keeps
its action only too.
"""
from __future__ import annotations

import posixpath
import re
import shlex

from ..ir import Measure, Outcome, Step
from ._common import Where, check_str, output_head

_FENCE = re.compile(r"^```(\S*)\s*\n|^```\s*$", re.MULTILINE)


def last_fenced_block(text: str) -> str | None:
    """The last top-level fenced block of `text` (SWE-agent's ThoughtActionParser rule), or None."""
    stack: list[re.Match] = []
    last = None
    for m in _FENCE.finditer(text):
        if stack and not m.group(1):
            start = stack.pop()
            if not stack:
                last = (start, m)
        elif m.group(1) is not None:
            stack.append(m)
    if last is None:
        return None
    start, end = last
    return text[start.end():end.start()]


#: SWE-agent ACI commands by what they do. Anything not listed runs in the shell (bash).
ACI_READ = frozenset({"open", "goto", "scroll_up", "scroll_down", "filemap"})
ACI_EDIT = frozenset({"create", "edit", "insert", "append"})
ACI_SEARCH = frozenset({"search_dir", "search_file", "find_file"})
ACI_NOOP = frozenset({"submit", "exit_forfeit", "exit_cost", "exit_context", "exit_format", "exit_error",
                      "exit_api", "skip"})
_FIRST_WORD = re.compile(r"\s*(\S+)")
_EDIT_RANGE = re.compile(r"edit\s+(\d+)\s*:\s*(\d+)\s*$")
_LINE_DIGITS = 9            # a line number longer than this is no line (and no int() of 5000 digits)
_LINE = re.compile(r"\s*[-+]?\d{1,%d}\s*" % _LINE_DIGITS)
#: How the tools' answers begin when they did not apply an edit: the windowed tools (a lint
#: refusal, no open file, a search not found, an existing file) and str_replace_editor (its
#: `No replacement was performed`, `The path ... is not an absolute path` / `does not exist`,
#: `The parent directory ...`, `Parameter ...`, `Invalid ...`), argparse's usage errors.
_REFUSED = ("Your proposed edit has introduced new syntax error", "Your edit was not applied", "No file open",
            "Usage:", "usage:", "Error", "ERROR", "Warning: File", "Your search and replace strings are the same",
            "No replacement was performed", "The path ", "The parent directory ", "File already exists",
            "Parameter `", "Invalid `", "Unrecognized command", "No edit history")
#: How they begin when they applied it: a window of the file, or the tool's own words.
_APPLIED = re.compile(r"\[File: |File updated|Text replaced|Replaced \d+ occurrences|File created successfully"
                      r"|The file .* has been edited|Last edit to .* undone successfully")
_NO_LINES = re.compile(r"^\[File: [^\n]*\(0 lines total\)\]")
_EDITOR_OPS = ("create", "str_replace", "insert", "undo_edit")
_READ_EDITS = ("edit", "insert", "create", "str_replace_editor")      # the edit tools edit_spec reads


def aci_step_fields(action: str) -> tuple[str, str, dict]:
    """(tool, native_tool, args) of one SWE-agent action string (without cwd).

    ACI commands are run by SWE-agent's own tools, not as plain shell commands; we keep the raw text
    in ``args.action`` (never ``args.command``, which replay would execute) plus what we can parse:
    ``op``, ``path`` (open/create/str_replace_editor) and ``start_line``/``end_line`` (``edit N:M``).
    """
    text = action.strip()
    m = _FIRST_WORD.match(text)
    if not m:
        return "noop", "(empty)", {"action": action}
    word = m.group(1)
    rest = text[m.end():].strip()
    first_line = text.split("\n", 1)[0].strip()
    if word == "str_replace_editor":
        parts = rest.split(None, 2)
        sub = parts[0] if parts else ""
        args = {"op": sub or "?", "action": action}
        if len(parts) > 1:
            args["path"] = parts[1].strip("'\"")
        return ("read" if sub == "view" else "edit"), word, args
    if word in ACI_READ | ACI_EDIT | ACI_SEARCH | ACI_NOOP:
        tool = ("read" if word in ACI_READ else "edit" if word in ACI_EDIT
                else "search" if word in ACI_SEARCH else "noop")
        args = {"op": word, "action": action}
        if word in ("open", "create") and rest:
            args["path"] = rest.split("\n", 1)[0].split()[0].strip("'\"")
        rng = _EDIT_RANGE.match(first_line)
        if word == "edit" and rng and max(len(rng.group(1)), len(rng.group(2))) <= _LINE_DIGITS:
            args["start_line"], args["end_line"] = int(rng.group(1)), int(rng.group(2))
        return tool, word, args
    return "bash", "bash", {"command": action}


def edit_outcome(observation: str | None) -> Outcome | None:
    """ok or failed by what an edit tool answered; None where it says neither (or was not kept)."""
    if not isinstance(observation, str):
        return None
    text = observation.lstrip()
    if text.startswith(_REFUSED):
        return Outcome("failed")
    return Outcome("ok") if _APPLIED.match(text) else None


def edit_spec(action: str, *, cwd: str | None, open_file: str | None, observation: str | None = None,
              v0: bool = False) -> dict | None:
    """The edit `action` makes, in the replay editor's terms (module docstring), or None where it
    cannot be said: an argument that does not parse, no open file, a relative path with no cwd.
    `v0`: SWE-agent 0.x, whose `edit N:M` is a bash function that writes every line back with
    a newline."""
    text = action.strip()
    m = _FIRST_WORD.match(text)
    word, rest = (m.group(1), text[m.end():]) if m else ("", "")
    try:
        if word == "str_replace_editor":
            return _editor_spec(shlex.split(rest))
        if word == "create":
            path = _absolute(shlex.split(rest)[0], cwd)
            empty = observation is not None and _NO_LINES.match(observation.lstrip())
            return {"op": "create", "path": path, "file_text": "" if empty else "\n"} if path else None
        if word not in ("edit", "insert") or not (path := _absolute(open_file, cwd)):
            return None
        first, _, body = text.partition("\n")
        rng = _EDIT_RANGE.match(first.strip())
        if word == "edit" and rng:
            lines = body.split("\n")
            if "end_of_edit" not in lines:
                return None
            lines = lines[:lines.index("end_of_edit")]
            spec = {"op": "replace_lines", "path": path, "start_line": _line(rng.group(1)), "end_line": _line(rng.group(2))}
            if v0:          # its lines each with their newline: "" is none, "\n" one empty line
                return {**spec, "new_str": "".join(x + "\n" for x in lines), "line_ends": True}
            return {**spec, "new_str": "\n".join(lines)}
        argv = shlex.split(rest)
        if word == "edit" and len(argv) in (2, 3):
            return {"op": "str_replace", "path": path, "old_str": argv[0], "new_str": argv[1],
                    "replace_all": len(argv) == 3 and argv[2] != ""}
        if word == "insert" and len(argv) in (1, 2) and argv[0]:
            new = argv[0][:-1] if argv[0].endswith("\n") else argv[0]
            if len(argv) == 1:
                return {"op": "append", "path": path, "new_str": new}
            line = _line(argv[1])       # SWE-agent 1.1 inserts before line N (at N - 1); 0: its own rule
            return ({"op": "insert", "path": path, "insert_line": line - 1, "new_str": new, "clamp_line": True}
                    if line >= 1 else None)
    except (ValueError, IndexError):         # unbalanced quotes, a missing or non-integer argument
        return None
    return None


def _editor_spec(argv: list[str]) -> dict | None:
    """str_replace_editor's arguments: CMD PATH (absolute: it refuses any other), then `--name value`
    and `--view_range A B`. It expands tabs in the file and in both strings before it looks
    (`expand_tabs`)."""
    if len(argv) < 2 or argv[0] not in _EDITOR_OPS or not posixpath.isabs(argv[1]):
        return None
    spec: dict = {"op": argv[0], "path": posixpath.normpath(argv[1])}
    rest = argv[2:]
    while rest:
        name, rest = rest[0], rest[1:]
        if name == "--view_range":          # its numbers, joined by spaces: nothing an edit uses
            while rest and _LINE.fullmatch(rest[0]):
                rest = rest[1:]
        elif name in ("--insert_line", "--file_text", "--old_str", "--new_str") and rest:
            value, rest = rest[0], rest[1:]
            spec[name[2:]] = _line(value) if name == "--insert_line" else value
        else:
            return None
    return {**spec, "expand_tabs": True} if argv[0] in ("str_replace", "insert") else spec


def _line(text: str) -> int:
    """A line number as the tools' argparse reads it, at most _LINE_DIGITS digits (else ValueError)."""
    if not _LINE.fullmatch(text):
        raise ValueError(f"not a line number: {text[:20]!r}")
    return int(text)


def _absolute(path: str | None, cwd: str | None) -> str | None:
    if not path:
        return None
    if posixpath.isabs(path):
        return posixpath.normpath(path)
    return posixpath.normpath(posixpath.join(cwd, path)) if cwd and posixpath.isabs(cwd) else None


_CWD_FOOTER = re.compile(r"\(Current directory: ([^\n)]*)\)")
_OPEN_FOOTER = re.compile(r"\(Open file: ([^\n)]*)\)")


def swe_footer(text: str) -> tuple[str | None, str | None]:
    """(cwd, open file) from the last SWE-agent prompt footer in `text`, None where absent/'n/a'."""
    cwds = _CWD_FOOTER.findall(text)
    opens = _OPEN_FOOTER.findall(text)
    cwd = cwds[-1].strip() if cwds else None
    opened = opens[-1].strip() if opens else None
    if opened in ("n/a", "", "<path>"):
        opened = None
    if cwd in ("", "<cwd>"):
        cwd = None
    return cwd, opened


def swe_agent_step(action: str, index: int, where: Where, field: str, *, cwd: str | None,
                   open_file: str | None, duration: Measure | None = None, observation: str | None = None,
                   v0: bool = False) -> Step:
    """One IR step from a SWE-agent action string, validating the strings we keep; an edit's
    `observation` (what its tool answered) gives its recorded outcome (module docstring)."""
    action = check_str(action, where, step=index, field=field).strip("\n")
    tool, native, args = aci_step_fields(action)
    if args.get("op") in ("edit", "insert") and "path" not in args and open_file:
        args["path"] = open_file
    if cwd is not None:
        args["cwd"] = check_str(cwd, where, step=index, field="cwd")
    for key in ("path",):
        if key in args:
            check_str(args[key], where, step=index, field=field)
    outcome = output = None
    if tool == "edit":
        outcome = edit_outcome(observation)
        output = output_head(observation) if outcome is not None else None
        spec = edit_spec(action, cwd=cwd, open_file=open_file, observation=observation, v0=v0)
        if spec is None:
            args["not_kept"] = ("its arguments could not be read as that tool reads them" if native in _READ_EDITS
                                else f"the replay editor has no `{native}`")
        elif outcome is not None and outcome.status == "failed":
            args["not_kept"] = "the tool did not apply it there"
        else:
            args.update(spec)
    return Step(step_id=index, tool=tool, native_tool=native, args=args, duration_ms=duration,
                recorded_outcome=outcome, recorded_output=output)
