"""What the two SWE-agent converters (swe_agent_rows.py, swe_agent_traj.py) share: the command of
a model response (its last fenced block) and what an ACI command does (read, edit, search, noop,
or a shell command). Not a format of its own."""
from __future__ import annotations

import re

from ..ir import Measure, Step
from ._common import Where, check_str

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
        if word == "edit" and rng:
            args["start_line"], args["end_line"] = int(rng.group(1)), int(rng.group(2))
        return tool, word, args
    return "bash", "bash", {"command": action}


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
                   open_file: str | None, duration: Measure | None = None) -> Step:
    """One IR step from a SWE-agent action string, validating the strings we keep."""
    action = check_str(action, where, step=index, field=field).strip("\n")
    tool, native, args = aci_step_fields(action)
    if args.get("op") == "edit" and "path" not in args and open_file:
        args["path"] = open_file
    if cwd is not None:
        args["cwd"] = check_str(cwd, where, step=index, field="cwd")
    for key in ("path",):
        if key in args:
            check_str(args[key], where, step=index, field=field)
    return Step(step_id=index, tool=tool, native_tool=native, args=args, duration_ms=duration)
