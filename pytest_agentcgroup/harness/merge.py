"""`agentcgroup merge`: the N runs of a sharded session (`--agentcgroup-shard K/N`, one per CI job)
joined into one run directory that reads as the unsharded run would: its metrics.jsonl holds every
shard's records, its summary.json their summaries, and the claims comparing arms, which no shard
could check alone, are checked once here on the merged records (studies/kinds.py session_claims,
the controller's function) with the arms' outcomes and exp3's figures each shard kept in its
complete.json.

The merged run is a new run of the output results directory (NNNN_<time>/, `latest` points at it),
so `agentcgroup compare`, `agentcgroup report` and `--agentcgroup-baseline` take it as any run. Its
run.json is the first shard's with `merged_from` (each shard's run, shard and start) and without
`shard`; its complete.json holds the claims' verdicts, the shards' hosts and an exit status: the first
failing shard's, else 1 when a claim is refuted or not measured, else 0.

Refused (MergeError, naming the runs and what differs): a run that is not a sharded run of the
plugin (no run.json, or no shard in it), shards of different N, one shard given twice, shards run
from different code (package version, checkout commit), config (sha256) or corpus (trace directory's
manifest sha256), a test (experiment, arm, trace, seed, params) in two shards; unless `partial`, a
missing shard or an unfinished one (no complete.json).

May import: config, metrics (store), studies (kinds, claims) and the harness's environment.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .. import config as cfgmod
from ..metrics import store
from ..studies import claims as claimlang
from ..studies import kinds
from . import environment

SHARD_OPTION = "--agentcgroup-shard"


class MergeError(ValueError):
    """Runs that cannot be merged; the message names the runs and what is wrong."""


@dataclass
class Shard:
    path: Path
    facts: dict                    # run.json
    complete: dict | None          # complete.json, None when the run did not finish
    records: list[dict]
    k: int
    n: int


@dataclass
class Merged:
    run: Path
    tests: int
    records: int
    missing: list[int] = field(default_factory=list)       # shards not given (partial)
    lines: list[str] = field(default_factory=list)         # "<experiment>: <verdict>" per claim
    verdicts: list = field(default_factory=list)
    failed_shards: list[str] = field(default_factory=list)   # a shard's session failed (a test, a budget)

    @property
    def claims_failed(self) -> bool:
        return any(v.fails for v in self.verdicts)


def read_shard(path: str | Path) -> Shard:
    try:
        run = store.resolve_run(path)
    except store.NoRun as exc:
        raise MergeError(str(exc)) from None
    facts = store.read_run_file(run)
    if not facts:
        raise MergeError(f"{run}: no readable {store.RUN_FILE}: not a run the plugin wrote")
    text = facts.get("shard")
    try:
        k, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise MergeError(f"{run}: not a sharded run ({store.RUN_FILE} has no shard: it was not run with "
                         f"{SHARD_OPTION} K/N); there is nothing to merge it with") from None
    try:
        complete = json.loads((run / store.COMPLETE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        complete = None
    except (OSError, ValueError) as exc:
        raise MergeError(f"{run / store.COMPLETE_FILE}: cannot read: {exc}") from None
    # a run killed under an older version may still hold its xdist workers' files: read them as a
    # resume would, writing nothing
    if not (run / store.METRICS_FILE).is_file() and (run / store.PACKED_METRICS_FILE).is_file():
        raise MergeError(f"{run}: a published run, its records gzip'd ({store.PACKED_METRICS_FILE}); "
                         f"gunzip it into {store.METRICS_FILE} to merge it")
    records = store.merged_records(run, keep=store.read_records(run / store.METRICS_FILE))
    return Shard(run, facts, complete if isinstance(complete, dict) else None, records, k, n)


def _same(shards: list[Shard], what: str, get) -> None:
    """Every shard's `get(facts)` is the same where recorded, else MergeError naming two runs."""
    seen = [(s, get(s.facts)) for s in shards if get(s.facts) is not None]
    for s, value in seen[1:]:
        if value != seen[0][1]:
            raise MergeError(f"{seen[0][0].path} and {s.path} ran from different {what} ({seen[0][1]} vs {value}): "
                             "the shards of one run share the code, the config and the corpus")


def check(shards: list[Shard], *, partial: bool) -> list[int]:
    """What makes the shards one run; returns the shards missing (only with `partial`)."""
    if not shards:
        raise MergeError("no run to merge")
    ns = {s.n for s in shards}
    if len(ns) > 1:
        raise MergeError("shards of different N: " + ", ".join(f"{s.path} is {s.k}/{s.n}" for s in shards))
    given: dict[int, Shard] = {}
    for s in shards:
        if s.k in given:
            raise MergeError(f"shard {s.k}/{s.n} given twice: {given[s.k].path} and {s.path}")
        given[s.k] = s
    n = shards[0].n
    missing = [k for k in range(1, n + 1) if k not in given]
    unfinished = [s for s in shards if s.complete is None]
    if not partial and missing:
        raise MergeError(f"shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing (given: "
                         f"{', '.join(f'{s.k}/{n}' for s in sorted(shards, key=lambda s: s.k))}); "
                         "--partial merges the shards given")
    if not partial and unfinished:
        raise MergeError(f"{unfinished[0].path}: unfinished (no {store.COMPLETE_FILE}: killed or still running); "
                         "finish it (--agentcgroup-resume) or merge with --partial")
    _same(shards, "package versions", lambda f: (f.get("host") or {}).get("packages", {}).get("pytest-agentcgroup"))
    _same(shards, "checkouts", lambda f: (f.get("checkout") or {}).get("commit"))
    _same(shards, "configs (sha256)", lambda f: f.get("config_sha256"))
    _same(shards, "corpora (manifest sha256)", lambda f: (f.get("corpus") or {}).get("manifest_sha256"))
    owner: dict[tuple, Path] = {}
    for s in shards:
        for key in dict.fromkeys(store.record_key(r) for r in s.records):
            if key in owner:
                exp, arm, trace, seed, params = key
                raise MergeError(f"test {exp} {arm}:{trace} (seed {seed}, params {params}) is in two shards: "
                                 f"{owner[key]} and {s.path}; shards of one run hold each test once")
            owner[key] = s.path
    return missing


def load_config(shards: list[Shard], given: str | Path | None) -> cfgmod.Config:
    """The experiment config the claims are read from: `given`, else the one run.json names
    (relative to where pytest was started); it must be the file the shards ran with (its sha256)."""
    facts = shards[0].facts
    path = Path(given) if given is not None else (
        Path(facts.get("cwd") or ".", facts["config"]) if facts.get("config") else None)
    if path is None:
        raise MergeError(f"{shards[0].path / store.RUN_FILE} names no config file: give it (--config)")
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise MergeError(f"config {path}: cannot read ({exc.strerror}); give the file the shards ran with "
                         "(--config)") from None
    if facts.get("config_sha256") and digest != facts["config_sha256"]:
        raise MergeError(f"config {path} is not the file the shards ran with (sha256 {digest}, they recorded "
                         f"{facts['config_sha256']}); give that file (--config)")
    try:
        return cfgmod.load(path)
    except cfgmod.ConfigError as exc:
        raise MergeError(str(exc)) from None


def _arms(shards: list[Shard]) -> tuple[dict, dict]:
    """experiment -> arm -> "ran" | why not, and exp3's figures, over the shards: an arm ran when
    it ran in any shard (or left records); else the first shard's reason."""
    arms: dict[str, dict[str, str]] = {}
    figures: dict[str, dict] = {}
    for s in shards:
        kept = (s.complete or {}).get("claims") or {}
        for exp, of in (kept.get("arms") or {}).items():
            for arm, why in of.items():
                mine = arms.setdefault(exp, {})
                if mine.get(arm) != "ran":
                    mine[arm] = why if arm not in mine or why == "ran" else mine[arm]
        for exp, of in (kept.get("figures") or {}).items():
            figures.setdefault(exp, {}).update(of)
        for r in s.records:
            if r.get("experiment"):
                arms.setdefault(r["experiment"], {})[r["config"]] = "ran"
    return arms, figures


def _run_facts(shards: list[Shard], missing: list[int]) -> dict:
    facts = {k: v for k, v in shards[0].facts.items() if k not in ("shard", "run", "started")}
    args, out = facts.get("pytest_args") or [], []
    skip = False
    for a in args:                                  # the command less its shard: what each shard ran
        if skip or a == SHARD_OPTION or a.startswith(SHARD_OPTION + "="):
            skip = a == SHARD_OPTION
            continue
        out.append(a)
    return {"started": min(str(s.facts.get("started")) for s in shards), **facts, "pytest_args": out,
            "merged": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "merged_from": [{"run": str(s.path), "shard": f"{s.k}/{s.n}", "started": s.facts.get("started"),
                             "finished": (s.complete or {}).get("finished")} for s in sorted(shards, key=lambda s: s.k)],
            **({"missing_shards": [f"{k}/{shards[0].n}" for k in missing]} if missing else {})}


def merge(runs: list[str | Path], out: str | Path, *, config: str | Path | None = None,
          partial: bool = False) -> Merged:
    """Merge the shards' runs into a new run of the results directory `out`. MergeError when they
    cannot be merged (nothing is written then)."""
    shards = [read_shard(r) for r in runs]
    missing = check(shards, partial=partial)
    conf = load_config(shards, config)
    shards.sort(key=lambda s: s.k)
    records = [r for s in shards for r in s.records]
    arms, figures = _arms(shards)
    verdicts, lines = [], []
    absent = "is in none of the merged runs" + (f" (shard(s) {', '.join(f'{k}/{shards[0].n}' for k in missing)} "
                                                 "missing)" if missing else "")
    for name, of in arms.items():
        exp = conf.experiments.get(name)
        for arm in exp.arms if exp is not None else ():
            of.setdefault(arm, absent)
        mine = kinds.session_claims(exp, of, figures.get(name, {}), records) if exp is not None else []
        verdicts += mine
        lines += [f"{name}: {v}" for v in mine]
    failed = [s.complete["exitstatus"] for s in shards if (s.complete or {}).get("exitstatus")]
    status = failed[0] if failed else int(any(v.fails for v in verdicts))
    trees = [s.complete["run_tree"] for s in shards if (s.complete or {}).get("run_tree")]
    hosts = {name: machine for s in shards for name, machine in ((s.complete or {}).get("hosts") or {}).items()}
    results = Path(out)
    while True:                                     # a new run, never over another (store.claim)
        run = store.new_run(results)
        try:
            fd = store.claim(run, new=True)
            break
        except FileExistsError:
            continue
    try:
        store.write_run_file(run, {**_run_facts(shards, missing), "run": str(run)})
        store.write_results(run, records)
        store.mark_finished(run, status, environment.merge_run_trees(trees), hosts=hosts,
                            claims={"verdicts": [{"claim": v.claim.text, "state": v.state, "detail": v.detail}
                                                 for v in verdicts]})
        store.point_latest(run)
    finally:
        store.release(fd)
    merged = Merged(run, len({store.record_key(r) for r in records}), len(records), missing, lines, verdicts)
    merged.failed_shards = [f"shard {s.k}/{s.n} ({s.path}) ended with pytest exit status {s.complete['exitstatus']}"
                            for s in shards if (s.complete or {}).get("exitstatus")]
    return merged


def summary(merged: Merged) -> str:
    """The claims' one-line count (claims.summary), or that there were none to check."""
    return claimlang.summary(merged.verdicts) or "no claim comparing arms to check"
