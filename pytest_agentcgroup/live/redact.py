"""Secrets out of what a live session records: tokens in commands and outputs replaced by a marker
before the trace is written (environment values are never written at all: session.py).

Replaced: the values of the call's environment that appear literally (at least MIN_SECRET_CHARS
long: a short value like `1` or `C` would blank out ordinary text), and common token shapes —
API keys (`sk-...`), GitHub tokens (`ghp_...`, `github_pat_...`), AWS access key ids (`AKIA...`),
Slack tokens (`xox?-...`), `Bearer ...`, `password=...` / `token: ...` / `api_key=...` assignments,
and the value after `--token`, `--password`, `--api-key`, `--secret` (`--token X`, `--token=X`).
"""
from __future__ import annotations

import re
from typing import Iterable

MARKER = "[REDACTED]"
MIN_SECRET_CHARS = 8

_SHAPES = [
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
]
# a keyword, then the value that follows it (kept: the keyword; replaced: the value)
_AFTER = [
    re.compile(r"(\bBearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE),
    re.compile(r"(\b(?:password|passwd|secret|token|api[_-]?key|access[_-]?key)\s*[=:]\s*)['\"]?[^\s'\"&;]+",
               re.IGNORECASE),
    re.compile(r"(--(?:token|password|api-key|secret)(?:=|\s+))['\"]?[^\s'\"]+", re.IGNORECASE),
]


def redact(text: str | None, secrets: Iterable[str] = ()) -> str | None:
    """`text` with every secret value and token shape replaced by MARKER (None stays None)."""
    if text is None:
        return None
    for value in sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True):
        text = text.replace(value, MARKER)
    for shape in _SHAPES:
        text = shape.sub(MARKER, text)
    for after in _AFTER:
        text = after.sub(lambda m: m.group(1) + MARKER, text)
    return text
