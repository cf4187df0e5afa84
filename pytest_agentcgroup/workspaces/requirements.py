"""What an sdist asks for, read from its files without running any of them: PKG-INFO's
Requires-Dist, setup.cfg, pyproject.toml, requirements.txt, and a setup.py's install_requires /
tests_require / extras_require where they are built from literals (strings and lists, `%`, `+` and
f-strings of them), with the `test`/`tests`/`testing` extras. What only running setup.py would tell
is left out. choose.py resolves what this finds.
"""
from __future__ import annotations

import ast
import configparser
import re
import tomllib

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

TEST_EXTRAS = ("test", "tests", "testing")


def requirements(files: dict[str, str], project: str) -> list[str]:
    """The sdist's requirements with its test extras (module docstring), as PEP 508 strings."""
    found: list[str] = []
    for line in files.get("PKG-INFO", "").splitlines():
        if line.startswith("Requires-Dist:"):
            found.append(line.split(":", 1)[1].strip())
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(files.get("setup.cfg", ""))
        found += cfg.get("options", "install_requires", fallback="").splitlines()
        found += [x for k in TEST_EXTRAS for x in cfg.get("options.extras_require", k, fallback="").splitlines()]
        found += cfg.get("options", "tests_require", fallback="").splitlines()
    except configparser.Error:
        pass
    try:
        proj = tomllib.loads(files.get("pyproject.toml", "")).get("project", {})
        found += list(proj.get("dependencies") or [])
        found += [x for k in TEST_EXTRAS for x in (proj.get("optional-dependencies") or {}).get(k, [])]
    except (tomllib.TOMLDecodeError, AttributeError, TypeError):
        pass
    found += _setup_py(files.get("setup.py", ""))
    if not any(x.strip() for x in found):
        found += [x for x in files.get("requirements.txt", "").splitlines() if x.strip() and not x.startswith(("-", "#"))]
    out, me = [], canonicalize_name(project)
    for raw in found:
        req = requirement(raw.split("#", 1)[0].strip())
        if req is None:
            continue
        marker = str(req.marker) if req.marker else ""
        extra = re.search(r'extra == "([^"]+)"', marker)
        if canonicalize_name(req.name) == me or (extra and extra.group(1) not in TEST_EXTRAS):
            continue
        req.marker = None if extra else req.marker
        if str(req) not in out:
            out.append(str(req))
    return out


def requirement(text: str) -> Requirement | None:
    """`text` as a requirement; one today's parser refuses but the tools of its time took (a version
    ending in a dot: `xarray<=2022.03.`) with that dot dropped, else its bare name; None for none."""
    for attempt in (text, re.sub(r"(\d)\.(?=\s*(?:,|;|$))", r"\1", text)):
        try:
            return Requirement(attempt)
        except InvalidRequirement:
            pass
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", text)
    return Requirement(name.group(0)) if name else None


def _setup_py(text: str) -> list[str]:
    """The literal install_requires, tests_require and test extras of a setup.py (names bound at
    its top level to literals are followed); its code is never run."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    names = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}

    def literal(node, depth=0):
        """The value of an expression built from literals (and names bound to them) with lists,
        tuples, dicts, `%`, `+` and f-strings; None for anything else, or for a string no
        requirement would be (a hostile sdist cannot make a huge one)."""
        node = names.get(node.id, node) if isinstance(node, ast.Name) else node
        if depth > 8:
            return None
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, (str, int, float)) and not isinstance(node.value, bool) else None
        if isinstance(node, (ast.List, ast.Tuple)):          # ['mpmath>=%s' % min_version, ...]
            items = [literal(x, depth + 1) for x in node.elts]
            return None if any(x is None for x in items) else items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Dict) and None not in node.keys:          # extras_require={...}
            keys = [literal(k, depth + 1) for k in node.keys]
            return {k: literal(v, depth + 1) for k, v in zip(keys, node.values) if isinstance(k, str)}
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
            left, right = literal(node.left, depth + 1), literal(node.right, depth + 1)
            if left is None or right is None or isinstance(left, str) and re.search(r"%[-#0 +]*\d{3}", left):
                return None
            try:
                val = left % right if isinstance(node.op, ast.Mod) and isinstance(left, str) \
                    and not isinstance(right, (list, dict)) \
                    else left + right if isinstance(left, (str, list, tuple)) and type(left) is type(right) else None
            except Exception:                # a format that does not fit its values
                return None
            return val if not isinstance(val, str) or len(val) <= 1000 else None
        if isinstance(node, ast.JoinedStr):                 # f'mpmath>={min_version}'
            parts = []
            for v in node.values:
                x = v.value if isinstance(v, ast.Constant) else literal(v.value, depth + 1) \
                    if isinstance(v, ast.FormattedValue) and v.format_spec is None and v.conversion == -1 else None
                if not isinstance(x, (str, int, float)) or isinstance(x, bool):
                    return None
                parts.append(str(x))
            return "".join(parts)
        return None

    def strings(val) -> list[str]:
        return [val] if isinstance(val, str) else [x for x in val if isinstance(x, str)] \
            if isinstance(val, (list, tuple)) else []
    out: list[str] = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        for kw in call.keywords:
            val = literal(kw.value) if kw.arg in ("install_requires", "tests_require", "extras_require") else None
            if kw.arg == "extras_require":
                val = [x for k in TEST_EXTRAS for x in strings(val.get(k))] if isinstance(val, dict) else None
            out += [line for x in strings(val) for line in x.splitlines()]
    return out
