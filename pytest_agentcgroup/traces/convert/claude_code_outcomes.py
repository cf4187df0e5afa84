"""How a Claude Code tool call ended, as far as its source tells (tool_calls.json `result_preview`).

The dataset keeps per call only the head of what the tool returned (`result_preview`, cut at 500
characters and "..."): no exit code, no error flag. So a Bash call's `recorded_outcome` is derived
from that text, and only where the text says it (BASH_TELLS, first match), else None (unknown):

- "Command timed out after ..." (the runtime's own line): timeout;
- "Error" alone (the runtime's answer for a command that failed and printed nothing): failed;
- every line a shell error of the runtime's `eval`: with a parse error among them, exit 1 (the
  line did not parse, nothing ran); else ("(eval):1: command not found: X", "... no such file or
  directory: X") exit 127, for a command of one `&&` chain (as below: in a pipeline the last
  command's exit is the line's);
- then, only for a command with no `|`, `;`, `||`, `&` or line break outside quotes (so the output
  is the failing command's and its exit the command line's; `&&` chains stop at the failure):
  a first line that is a Python traceback or "No module named", pip's refusal
  ("error: externally-managed-environment", "ERROR: Could not find a version", "ERROR: No matching
  distribution"): exit 1; pytest's "ImportError while loading conftest" or "ERROR: file or
  directory not found": exit 4; and in a whole (uncut) output whose last line is pytest's summary
  line: exit 1 with failures or errors, 5 when no tests ran, else 0.

Everything else (a successful-looking output among them: the source does not say it exited 0) is
unknown. An Edit/Write call is ok when its preview is not the runtime's refusal ("<tool_use_error>"
, converted as a refused edit: failed). The rule is deterministic: the converter and `agentcgroup
tools recorded-outcomes` apply the same function.
"""
from __future__ import annotations

import re
import shlex

from ..ir import Outcome

CUT_MARK = "..."
PREVIEW_CHARS = 500
_EVAL = re.compile(r"^\(eval\):\d+: (command not found|no such file or directory|parse error)")
_PYTEST_LAST = re.compile(r"^=+ (.+?) in [0-9.]+ ?s(?: \([^)]*\))? =+$")
_SEPARATORS = {"|", ";", "||", "&", ";;", "|&"}

#: (first-line prefix, exit code) for commands of one `&&` chain (module docstring)
FIRST_LINE_TELLS = (
    ("Traceback (most recent call last):", 1),
    ("ImportError while loading conftest", 4),
    ("ERROR: file or directory not found:", 4),
    ("error: externally-managed-environment", 1),
    ("ERROR: Could not find a version that satisfies", 1),
    ("ERROR: No matching distribution found", 1),
)


def simple_chain(command: str) -> bool:
    """No `|`, `;`, `||`, `&` or line break outside quotes: one command, or an `&&` chain."""
    lex = shlex.shlex(command, posix=True, punctuation_chars="();<>|&\n")
    lex.whitespace = " \t\r"
    try:
        tokens = list(lex)
    except ValueError:                      # unbalanced quotes: not told
        return False
    return not any(t in _SEPARATORS or "\n" in t and not t.strip("\n") for t in tokens)


def _whole(preview: str) -> bool:
    return not (len(preview) >= PREVIEW_CHARS and preview.endswith(CUT_MARK))


def bash_outcome(command: str, preview) -> Outcome | None:
    """The recorded outcome of a Bash call (module docstring), None where the preview does not tell."""
    if not isinstance(preview, str):
        return None
    text = preview.strip()
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if text.startswith("Command timed out after"):
        return Outcome("timeout", None)
    if text == "Error":
        return Outcome("failed", None)
    if lines and _whole(preview) and all(_EVAL.match(x) or x.startswith("(eval):") for x in lines) \
            and any(_EVAL.match(x) for x in lines):
        if any(_EVAL.match(x).group(1) == "parse error" for x in lines if _EVAL.match(x)):
            return Outcome("failed", 1)             # the line did not parse: nothing of it ran
        return Outcome("failed", 127) if simple_chain(command) else None
    if not lines or not simple_chain(command):
        return None
    for prefix, code in FIRST_LINE_TELLS:
        if lines[0].startswith(prefix):
            return Outcome("failed", code)
    if re.match(r"^\S*python[0-9.]*: No module named ", lines[0]) or lines[0].startswith("No module named "):
        return Outcome("failed", 1)
    if _whole(preview):
        m = _PYTEST_LAST.match(lines[-1])
        if m:
            body = m.group(1)
            if re.search(r"\d+ (failed|errors?)\b", body):
                return Outcome("failed", 1)
            if "no tests ran" in body:
                return Outcome("failed", 5)
            return Outcome("ok", 0)
    return None


def edit_outcome(preview) -> Outcome | None:
    """An Edit/Write call: ok unless the runtime refused it (its preview a "<tool_use_error>")."""
    if not isinstance(preview, str):
        return None
    return Outcome("failed") if preview.startswith("<tool_use_error>") else Outcome("ok")
