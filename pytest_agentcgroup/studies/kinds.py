"""Which kind of study has which settings tables, which arms and which claim metrics: the part of
loading `[experiments.<name>]` that differs between kinds (config.py does the rest). An
experiment's `kind` names its study, its name is the user's (exp2 is `kind = "timescale"`):

    replay       (the default) a trace x arm experiment (exp1, exp4, ...): one test per trace x arm,
                 so a claim that compares arms is checked at the end of the session on the run's
                 merged records, each metric the sum over the arm's tests of a per-test metric of
                 metrics/registry.py (SUMMED)
    timescale    tables burst, probe (timescale.py); its arms are controllers; claims checked in its test
    multitenant  tables tenants, probe (multitenant.py); one test per arm, each checks its arm's
                 claims; a claim comparing arms is checked at the end of the session on the figures
                 each arm's test published (session_verdicts_from_figures)
    density      tables density, replication (density.py); each of its two tests checks the claims
                 on its metrics
    fidelity     the emulator against recorded steps: no settings, arms or claims of its own (its
                 goals are metrics/fidelity.py's)

What each kind does when its test runs: procedures/ (the pytest side), keyed by the same names.

May import: studies (timescale, multitenant, density, tables, claims), metrics (registry, compare).
"""
from __future__ import annotations

from . import claims as claimlang
from . import density, multitenant, timescale
from ..metrics.compare import test_key, test_values
from ..metrics.registry import REGISTRY
from .tables import TableError

REPLAY = "replay"                       # the default kind: a trace x arm experiment


class Fidelity:
    """The fidelity kind's declaration: its test reads only the experiment's description."""
    ARMS = False
    KEYS = ()                           # no arms, no claims: metrics/fidelity.py's goals are its verdict
    TABLES = ()
    CLAIM_METRICS: dict[str, str] = {}

    @staticmethod
    def validate(tables: dict, where: str, arms: dict) -> dict:
        return {}


#: kind -> its declaration (None: a trace x arm experiment, whose keys and claims config.py and this
#: module's SUMMED know)
KINDS = {REPLAY: None, "timescale": timescale, "multitenant": multitenant, "density": density, "fidelity": Fidelity}
SESSION = "the end of the session"        # where a trace x arm experiment's claims are checked
#: per-test metrics a sum over an arm's tests means something for (counts, totals, GiB·s); not
#: percentiles, ratios or peaks
SUMMED = tuple(m for m in REGISTRY if not m.startswith("latency_p") and not m.endswith("_max")
               and m not in ("utilization", "reserved_vs_oracle", "peak_rss_mb"))


def check_kind(kind, where: str) -> str:
    """An experiment's `kind`, checked (TableError naming the key): one of KINDS."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise TableError(f"{where}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kind


def has_arms(kind: str) -> bool:
    """The kind's tests run arms and check claims on them (every kind but fidelity)."""
    return getattr(KINDS[kind], "ARMS", True)


def keys(kind: str, generic) -> tuple[str, ...]:
    """The keys `[experiments.<name>]` of `kind` may hold: `generic` (a trace x arm experiment's:
    subset, budgets, matrix, executor, ...) and `kind`, unless the kind is a study of its own, whose
    test reads only its description, arms, claims, tables and the few settings it uses (KEYS)."""
    of = KINDS[kind]
    if of is None:
        return (*generic, "kind")
    return ("description", *(("arms", "claims") if has_arms(kind) else ()), *of.TABLES, *of.KEYS, "kind")


def kind_of_tables(names) -> str | None:
    """The kind whose tables `names` are (the hint for a table put under an experiment of another kind)."""
    return next((k for k, of in KINDS.items() if of is not None and set(names) & set(of.TABLES)), None)


def own_arms(kind: str) -> bool:
    """The experiment's arms are its own (timescale's controllers), not arms of [arms]: it names them."""
    return hasattr(KINDS[kind], "check_arms")


def check_arms(kind: str, arm_names, where: str, defined: dict) -> None:
    """The experiment's `arms`: arms of `[arms]`, except a timescale study's (controllers). TableError."""
    of = KINDS[kind]
    if hasattr(of, "check_arms"):
        of.check_arms(arm_names, where)
        return
    for a in arm_names:
        if a not in defined:
            raise TableError(f"{where}: no arm named {a!r} (defined: {', '.join(defined)})")


def validate_tables(kind: str, spec: dict, where: str, defined: dict) -> dict:
    of = KINDS[kind]
    if of is None:
        return {}
    return of.validate({k: spec[k] for k in of.TABLES if k in spec}, where, defined)


def claim_metrics(kind: str) -> dict[str, str]:
    """metric -> where it is measured (which of the kind's tests, or SESSION)."""
    of = KINDS[kind]
    return dict(of.CLAIM_METRICS) if of else {m: SESSION for m in SUMMED}


def parse_claims(kind: str, raw, where: str, arm_names, tables: dict | None = None) -> tuple[claimlang.Claim, ...]:
    """The experiment's `claims`, parsed and checked against its arms and metrics; a claim reads the
    metrics of one test, and names only arms that test runs (`tables`: the experiment's checked
    tables, for a kind whose test runs arms of its own, density's replication). ClaimError names the claim."""
    if raw is None:
        return ()
    metrics = claim_metrics(kind)
    out = claimlang.parse_all(raw, where, arm_names, metrics)
    for i, claim in enumerate(out):
        at = f"{where}[{i}]: claim {claim.text!r}"
        tests = {metrics[m] for m in claim.metrics}
        if len(tests) > 1:
            raise claimlang.ClaimError(f"{at}: reads metrics of different tests ("
                                       + "; ".join(f"{m}: the {metrics[m]} test" for m in claim.metrics)
                                       + "), so no test can check it")
        runs = arms_measuring(kind, claim.metrics[0], tables or {}, where.rpartition(".")[0])
        if runs is not None:
            for arm in claim.arms:
                if arm != claimlang.EVERY_ARM and arm not in runs[1]:
                    raise claimlang.ClaimError(f"{at}: {claim.metrics[0]} is measured only for the arms of "
                                               f"{runs[0]} ({', '.join(runs[1])}), not {arm}")
    return out


def arms_measuring(kind: str, metric: str, tables: dict, where: str) -> tuple[str, list[str]] | None:
    """(which table's arms, arms) when the test measuring `metric` runs arms of its own table rather
    than the experiment's `arms` (density's replication); else None. `where`: experiments.<name>."""
    of = getattr(KINDS[kind], "claim_arms", None)
    return of(metric, tables, where) if of else None


def per_arm_test(kind: str) -> bool:
    """Each arm of the experiment is its own test (multitenant): claims comparing arms wait for the session end."""
    return getattr(KINDS[kind], "PER_ARM_TEST", False)


def claims_of(experiment, test: str | None = None, arm: str | None = None, arms=None) -> list[claimlang.Claim]:
    """The experiment's claims that `test` checks (all when None; a test is named as the kind's
    CLAIM_METRICS name it), `*` read as each of `arms` (the experiment's arms when None; density's
    replication: its own), only the claims on `arm` alone when given."""
    metrics = claim_metrics(experiment.kind)
    mine = [c for c in experiment.claims if test is None or metrics[c.metrics[0]] == test]
    out = claimlang.expand(mine, [arm] if arm is not None else list(arms if arms is not None else experiment.arms))
    return [c for c in out if arm is None or c.arms == [arm]]


def runnable_arms(experiment, defined: dict) -> list[str]:
    """What `--agentcgroup-arms` may select for the experiment: any arm of [arms]; a timescale study
    its controllers."""
    return list(experiment.arms) if own_arms(experiment.kind) else list(defined)


# -- claims comparing arms that separate tests measured, at the end of the session ---------------

def session_claims(experiment, arms: dict[str, str], figures: dict[str, dict], records: list[dict], *,
                   unchecked: str | None = None) -> list[claimlang.Verdict]:
    """The verdicts of the experiment's claims checked at the end of a session (the controller's),
    or of the merged runs of a sharded one (`agentcgroup merge`): [] for an experiment whose
    claims its tests check. `arms`: arm -> "ran" or why it did not (its skip reason); `figures`:
    what a one-test-per-arm experiment's tests published (arm -> metric -> value); `records`: the
    run's step records. `unchecked`: why none is checked here, each claim then says so."""
    kind = experiment.kind
    if not experiment.claims or (KINDS[kind] is not None and not per_arm_test(kind)):
        return []
    if unchecked is not None:
        mine = claimlang.expand(experiment.claims, list(experiment.arms))
        return [claimlang.Verdict(c, claimlang.NOT_CHECKED, f"not checked: {unchecked}")
                for c in mine if not per_arm_test(kind) or len(c.arms) > 1]
    why = {a: w for a, w in arms.items() if w != "ran"}
    if per_arm_test(kind):
        why.update({a: "ran, but its test ended before it measured anything" for a, w in arms.items()
                    if w == "ran" and a not in figures})
        return session_verdicts_from_figures(experiment, figures, why)
    # an arm with records has no `why`: only one without them is named
    why.update({a: "ran, but wrote no step records" for a, w in arms.items() if w == "ran"})
    return session_verdicts(experiment, records, why)


def session_verdicts_from_figures(experiment, figures: dict[str, dict],
                                  why_absent: dict[str, str]) -> list[claimlang.Verdict]:
    """The claims of a one-test-per-arm experiment (multitenant) that compare arms, against the figures
    each arm's test published (arm -> metric -> value)."""
    cross = [c for c in claimlang.expand(experiment.claims, list(experiment.arms)) if len(c.arms) > 1]
    absent = {a: why_absent.get(a, "did not run in this session (deselected)") for a in experiment.arms
              if a not in figures}
    return claimlang.check(cross, figures, absent)


def session_verdicts(experiment, records: list[dict], why_absent: dict[str, str]) -> list[claimlang.Verdict]:
    """The claims of a trace x arm experiment against the run's step records: `<arm>.<metric>` is
    the sum over the arm's tests (trace x matrix point) of the test's metric (compare.test_values).
    A claim is checked only when each of its arms ran the same tests (same traces, seeds, params),
    each complete (every step of its trace recorded): else it says which arm ran what, or which
    test is incomplete. `why_absent`: arm -> why it did not run (its skip reason)."""
    mine = [r for r in records if r.get("experiment") == experiment.name]
    tests: dict[str, set] = {}
    sums: dict[str, dict] = {}
    for (exp, arm, trace, seed, params), vals in test_values(mine).items():
        tests.setdefault(arm, set()).add((trace, seed, params))
        arm_sums = sums.setdefault(arm, {})
        for m in SUMMED:
            v = vals.get(m)
            # one test without the value leaves the sum unknown (None), never a partial sum
            arm_sums[m] = None if v is None or (m in arm_sums and arm_sums[m] is None) else arm_sums.get(m, 0) + v
    steps = _steps_recorded(mine)
    out = []
    for claim in claimlang.expand(experiment.claims, list(experiment.arms)):
        absent = {a: why_absent.get(a, "did not run in this session (deselected)") for a in claim.arms if a not in tests}
        ran = [a for a in claim.arms if a in tests]
        if not absent and len({frozenset(tests[a]) for a in ran}) > 1:
            first = ran[0]
            absent = {a: f"ran {len(tests[a])} test(s), {first} {len(tests[first])}: the claim compares the arms "
                         "over the same traces" for a in ran[1:] if tests[a] != tests[first]}
        if not absent:
            absent = _incomplete(ran, steps)
        out.append(claimlang.evaluate(claim, lambda a, m: sums.get(a, {}).get(m), absent))
    return out


def _steps_recorded(records: list[dict]) -> dict[tuple, tuple[int, int | None]]:
    """(arm, trace, seed, params) -> (distinct steps recorded, the trace's step count where the
    records say it: `trace_steps`)."""
    ids: dict[tuple, set] = {}
    total: dict[tuple, int | None] = {}
    for r in records:
        key = test_key(r)[1:]
        ids.setdefault(key, set()).add(r.get("step_id"))
        total[key] = r.get("trace_steps", total.get(key))
    return {k: (len(v), total[k]) for k, v in ids.items()}


def _incomplete(arms: list[str], steps: dict) -> dict[str, str]:
    """arm -> which of its tests is incomplete: fewer steps recorded than its trace has (e.g. a
    resumed run whose arm skipped this time keeps a partial earlier attempt), or, where the records
    do not say the trace's length, fewer than another arm recorded for the same test."""
    out = {}
    for arm in arms:
        for (a, trace, seed, params), (n, total) in steps.items():
            if a != arm:
                continue
            want = total if total is not None else max(steps.get((b, trace, seed, params), (0, None))[0] for b in arms)
            if n < want:
                point = (f" seed {seed}" if seed else "") + (f" {params}" if params != "{}" else "")
                out[arm] = (f"has an incomplete test: {trace}{point}, {n} of {want} steps recorded; the claim "
                            "compares complete tests only")
                break
    return out
