"""Claims: an experiment's hypotheses as data, in one small language for every experiment, parsed
and checked against the experiment's arms and metrics when the config loads, and evaluated against
what a run measured.

    [experiments.exp2]
    claims = ["ebpf_kernel.ran_on_lower_pct <= 1",
              "poll_50ms.p50_ms >= 10 * ebpf_kernel.p50_ms"]
    [experiments.exp3]
    claims = ["agentcgroup.b_latency_p95_ms <= 4 * agentcgroup.b_solo_latency_p95_ms + 250",
              "*.probe_p99_ms <= 1000"]          # `*`: every arm of the experiment, each on its own

    claim   := side OP side                 OP: <  <=  >  >=  ==  !=
    side    := term (('+' | '-') term)*
    term    := number | operand | number '*' operand
    operand := <arm>.<metric>               an arm of the experiment (exp2: a controller), and a
                                            metric the experiment measures (metric_names)

A verdict is one of: `holds`, `refuted` (the comparison is false), `not measured` (an arm that ran
has no value for the metric: nothing to compare, which fails like a refutation), `not checked`
(an arm of the claim did not run: deselected or skipped; neither a pass nor a failure, printed
with the reason). Where a verdict is given depends on the experiment: see docs/configuration.md ("Claims").

May import: nothing of the package (pure).
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Callable, Collection

OPERATORS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
             "<": operator.lt, ">": operator.gt}
EVERY_ARM = "*"
HOLDS, REFUTED, NOT_MEASURED, NOT_CHECKED = "holds", "refuted", "not measured", "not checked"

_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_OPERAND = r"(?:\*|[A-Za-z0-9_][A-Za-z0-9_.-]*?)\.[A-Za-z_][A-Za-z0-9_]*"
_TERM = re.compile(rf"^\s*(?:(?P<coef>{_NUMBER})\s*\*\s*(?P<scaled>{_OPERAND})|(?P<operand>{_OPERAND})"
                   rf"|(?P<number>{_NUMBER}))\s*$")


class ClaimError(ValueError):
    """A claim that cannot be checked; the message names the claim and what is wrong with it."""


@dataclass(frozen=True)
class Operand:
    arm: str
    metric: str

    def __str__(self) -> str:
        return f"{self.arm}.{self.metric}"


@dataclass(frozen=True)
class Term:
    sign: int                       # +1 | -1: the side's + or - before it
    coef: float
    operand: Operand | None         # None: the term is the number `coef`


@dataclass(frozen=True)
class Claim:
    text: str
    left: tuple[Term, ...]
    op: str
    right: tuple[Term, ...]

    @property
    def operands(self) -> list[Operand]:
        return [t.operand for t in (*self.left, *self.right) if t.operand is not None]

    @property
    def arms(self) -> list[str]:
        """The arms the claim reads, in order, once each."""
        return list(dict.fromkeys(o.arm for o in self.operands))

    @property
    def metrics(self) -> list[str]:
        return list(dict.fromkeys(o.metric for o in self.operands))

    def for_arm(self, arm: str) -> "Claim":
        """The claim with `*` read as `arm` (a claim without `*` is itself)."""
        if EVERY_ARM not in self.arms:
            return self
        swap = lambda side: tuple(Term(t.sign, t.coef, Operand(arm, t.operand.metric))   # noqa: E731
                                  if t.operand is not None and t.operand.arm == EVERY_ARM else t for t in side)
        return Claim(self.text.replace(f"{EVERY_ARM}.", f"{arm}."), swap(self.left), self.op, swap(self.right))


def parse(text, where: str, arms: Collection[str], metrics: Collection[str]) -> Claim:
    """One claim, checked: its arms among `arms` (or `*`), its metrics among `metrics`.
    ClaimError names `where` and the claim."""
    if not isinstance(text, str) or not text.strip():
        raise ClaimError(f"{where}: expected a claim such as \"agentcgroup.oom_kills < static-toolcall.oom_kills\", "
                         f"got {text!r}")
    name = f"{where}: claim {text!r}"
    found = [(m.start(), m.group()) for m in re.finditer(r"<=|>=|==|!=|<|>", text)]
    if len(found) != 1:
        raise ClaimError(f"{name}: expected exactly one comparison ({' '.join(OPERATORS)}), found "
                         f"{len(found) or 'none'}")
    at, op = found[0]
    left, right = _side(text[:at], name), _side(text[at + len(op):], name)
    claim = Claim(text.strip(), left, op, right)
    if not claim.operands:
        raise ClaimError(f"{name}: compares numbers only; a claim reads at least one <arm>.<metric>")
    for o in claim.operands:
        if o.arm != EVERY_ARM and o.arm not in arms:
            raise ClaimError(f"{name}: {o}: no arm {o.arm!r} in this experiment (its arms: {', '.join(arms)})")
        if o.metric not in metrics:
            raise ClaimError(f"{name}: {o}: no metric {o.metric!r} in this experiment (its metrics: "
                             f"{', '.join(metrics)})")
    if EVERY_ARM in claim.arms and len(claim.arms) > 1:
        raise ClaimError(f"{name}: `*` (every arm, each on its own) cannot be mixed with a named arm")
    return claim


def _side(text: str, name: str) -> tuple[Term, ...]:
    # split on + and - between terms (not in a number's exponent, not an arm name's hyphen: a
    # separator has a space or a digit/letter boundary around it, so require spaces around it)
    parts = re.split(r"\s+([+-])\s+", " " + text.strip() + " ")
    terms, sign = [], 1
    for i, part in enumerate(parts):
        if i % 2:
            sign = 1 if part == "+" else -1
            continue
        if i == 0 and not part.strip() and len(parts) > 1:
            continue                    # ' - a.b ...': the sign before the first term
        body = part.strip()
        if body[:1] in ("+", "-") and not _TERM.match(body):
            sign, part = (-sign if body[0] == "-" else sign), body[1:]   # '-a.b': a sign, not a number's
        m = _TERM.match(part)
        if not part.strip():
            raise ClaimError(f"{name}: a side of the comparison is empty or ends in ' + ' / ' - ' with no term")
        if not m:
            raise ClaimError(f"{name}: cannot read {part.strip()!r}: expected a number, <arm>.<metric> or "
                             "<number> * <arm>.<metric> (terms joined by ' + ' or ' - ')")
        if m.group("number") is not None:
            terms.append(Term(sign, float(m.group("number")), None))
        else:
            ref = m.group("scaled") or m.group("operand")
            arm, metric = ref.rsplit(".", 1)
            terms.append(Term(sign, float(m.group("coef")) if m.group("coef") else 1.0, Operand(arm, metric)))
    return tuple(terms)


def parse_all(raw, where: str, arms: Collection[str], metrics: Collection[str]) -> tuple[Claim, ...]:
    """A `claims = [...]` list, each claim checked (ClaimError names the claim)."""
    if not isinstance(raw, list):
        raise ClaimError(f"{where}: expected a list of claims (strings), got {raw!r}")
    return tuple(parse(text, f"{where}[{i}]", arms, metrics) for i, text in enumerate(raw))


def expand(claims, arms: Collection[str]) -> list[Claim]:
    """Every claim with `*` as one claim per arm in `arms`; the others as they are."""
    return [c.for_arm(a) for c in claims for a in (arms if EVERY_ARM in c.arms else [None])] \
        if claims else []


# -- verdicts ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    claim: Claim
    state: str                # holds | refuted | not measured | not checked
    detail: str               # the values as compared, or why not checked / not measured

    @property
    def fails(self) -> bool:
        return self.state in (REFUTED, NOT_MEASURED)

    def __str__(self) -> str:
        if self.state == NOT_CHECKED:
            return f"claim {self.claim.text}: {self.detail}"
        return f"claim {self.claim.text}: {self.detail} -> {self.state}"


def evaluate(claim: Claim, value: Callable[[str, str], float | None], absent: dict[str, str]) -> Verdict:
    """`value(arm, metric)` is what the run measured (None: no value); `absent` maps each arm
    that did not run to why (deselected, skipped: ...)."""
    for arm in claim.arms:
        if arm in absent:
            return Verdict(claim, NOT_CHECKED, f"not checked: arm {arm} {absent[arm]}")
    got = {str(o): value(o.arm, o.metric) for o in claim.operands}
    missing = [k for k, v in got.items() if v is None or (isinstance(v, float) and math.isnan(v))]
    if missing:
        return Verdict(claim, NOT_MEASURED, f"{', '.join(missing)}: no value measured")
    left, lshown = _total(claim.left, got)
    right, rshown = _total(claim.right, got)
    holds = OPERATORS[claim.op](left, right)
    return Verdict(claim, HOLDS if holds else REFUTED, f"{lshown} {claim.op} {rshown}")


def _total(side: tuple[Term, ...], got: dict) -> tuple[float, str]:
    total, shown = 0.0, []
    for i, t in enumerate(side):
        v = t.coef * (got[str(t.operand)] if t.operand is not None else 1.0)
        total += t.sign * v
        piece = _num(t.coef) if t.operand is None else (
            _num(got[str(t.operand)]) if t.coef == 1 else f"{_num(t.coef)} * {_num(got[str(t.operand)])}")
        shown.append(piece if i == 0 and t.sign > 0 else f"{'+' if t.sign > 0 else '-'} {piece}")
    text = " ".join(shown)
    if len(side) > 1 or side[0].coef != 1 and side[0].operand is not None:
        text += f" (= {_num(total)})"
    return total, text


def _num(v: float) -> str:
    # 10 significant digits: :g's 6 would show 1234567 as 1.23457e+06 and 0.1000004 as 0.1, so a
    # refuted claim could print as if it held
    return f"{v:.10g}" if isinstance(v, float) else str(v)


def check(claims, figures: dict[str, dict], absent: dict[str, str]) -> list[Verdict]:
    """Each claim against `figures` (arm -> metric -> value) and the arms that did not run."""
    return [evaluate(c, lambda arm, metric: figures.get(arm, {}).get(metric), absent) for c in claims]


def summary(verdicts: list[Verdict]) -> str:
    """`claims: 2 hold, 1 refuted, 1 not checked` (empty without claims)."""
    if not verdicts:
        return ""
    n = {s: sum(v.state == s for v in verdicts) for s in (HOLDS, REFUTED, NOT_MEASURED, NOT_CHECKED)}
    return "claims: " + ", ".join(f"{k} {'hold' if s == HOLDS and k > 1 else s}" for s, k in n.items() if k)
