"""Fetch N rows of a parquet dataset (by default HF `nebius/SWE-rebench-openhands-trajectories`)
without downloading the whole file.

How: the parquet file is opened through an fsspec filesystem (`huggingface_hub.HfFileSystem` for the
Hub, which reads byte ranges over HTTP; any fsspec filesystem in tests), its footer tells how many rows
each row group holds, and only the first row groups that cover N rows are read. Each row group read is
written at once to the cache directory as a chunk file (`chunk-FFFFF-GGGGG.parquet` or `.jsonl`; the
last one holds only the rows still needed), and `state.json` records the chunks written, so a fetch
that is interrupted (Ctrl-C, lost connection) and run again skips the row groups it already has.

Cache layout: CACHE/<repo with "/" as "__">/<commit>/ for the Hub (the revision is resolved to a
commit first, so a moving branch never mixes two versions in one cache directory), and
CACHE/local/<file name>-<hash of its path>/ for `--source FILE`.

Pinning: the Hub's answer for `--revision` (a branch, tag or full commit SHA) names the commit it
resolved to; that SHA, not the name asked for, is what every file the fetch writes records
(`state.json`; with `-o OUT`, `OUT.origin.json` beside OUT and, for parquet, the file's schema
metadata key `agentcgroup.origin`), together with the repository, the parquet paths read and the
command that repeats the fetch exactly (`--revision <sha>`). An answer without a commit is refused
rather than recorded as a moving name; a full SHA asked for must come back unchanged.

Errors are `FetchError`, a one-line message: "cannot reach the Hugging Face Hub (huggingface.co):
<reason>; use --source FILE for a local parquet file" when the Hub does not answer (a connect/read
timeout bounds the wait), "... not found" for a wrong repo/revision/path.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlparse

DEFAULT_REPO = "nebius/SWE-rebench-openhands-trajectories"
#: The revision fetched unless --revision says otherwise: a branch name, which the fetch resolves to a
#: commit; the cache directory and state file are keyed by that commit, so a cache never mixes
#: revisions. A commit SHA here would make the default reproducible.
DEFAULT_REVISION = "main"
DEFAULT_CACHE = Path(os.environ.get("AGENTCGROUP_CACHE", Path.home() / ".cache" / "agentcgroup"))
STATE = "state.json"
STATE_SCHEMA = "agentcgroup-fetch/1"
FORMATS = ("parquet", "jsonl")


class FetchError(RuntimeError):
    """A fetch that cannot go on; str() is one line fit for stderr."""


@dataclass
class FetchResult:
    dest: Path
    rows: int                                  # rows available for the request (== n unless the data is shorter)
    files: list[Path] = field(default_factory=list)   # chunk files holding those rows, in order
    fetched_row_groups: int = 0                # read this run
    reused_row_groups: int = 0                 # already in the cache
    total_rows: int = 0                        # rows in the source file(s)
    origin: dict[str, Any] = field(default_factory=dict)   # what was read: repo + commit, or the local file

    def as_dict(self) -> dict[str, Any]:
        return {"dest": str(self.dest), "rows": self.rows, "files": [str(f) for f in self.files],
                "fetched_row_groups": self.fetched_row_groups, "reused_row_groups": self.reused_row_groups,
                "total_rows": self.total_rows, "origin": self.origin}


ORIGIN_KEY = b"agentcgroup.origin"
_FULL_SHA = re.compile(r"[0-9a-f]{40}")


def pinned_commit(answer_sha: str | None, revision: str, repo: str) -> str:
    """The commit to pin, from the Hub's answer for `revision`: its SHA (lower-case, 40 hex digits).
    No SHA in the answer, or another commit than a full SHA asked for, is a FetchError."""
    sha = (answer_sha or "").strip().lower()
    if not _FULL_SHA.fullmatch(sha):
        raise FetchError(f"the Hub's answer for {repo}@{revision} names no commit SHA (got {answer_sha!r}); "
                         "the fetch could not be pinned and is not made")
    if _FULL_SHA.fullmatch(revision.lower()) and sha != revision.lower():
        raise FetchError(f"asked for commit {revision} of {repo}, the Hub answered with commit {sha}")
    return sha


def repeat_command(origin: dict, n: int) -> str:
    """The `agentcgroup traces fetch` command that reads exactly these rows again."""
    if origin.get("commit"):
        path = origin.get("path")
        return (f"agentcgroup traces fetch -n {n} --repo {origin['repo']} --revision {origin['commit']}"
                + (f" --path {path}" if path else ""))
    return f"agentcgroup traces fetch -n {n} --source {origin.get('source')}"


def _one_line(exc: BaseException, limit: int = 240) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Progress:
    """A tqdm bar of the rows fetched on stderr; nothing when disabled."""

    def __init__(self, total: int, enabled: bool, desc: str):
        self._bar = None
        if enabled:
            from tqdm import tqdm
            self._bar = tqdm(total=total, unit="row", desc=desc, file=sys.stderr, leave=True)

    def update(self, k: int) -> None:
        if self._bar is not None:
            self._bar.update(k)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _load_state(dest: Path, identity: dict) -> dict:
    path = dest / STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if state.get("schema") == STATE_SCHEMA and state.get("identity") == identity:
            return state
    except (OSError, ValueError):
        pass
    return {"schema": STATE_SCHEMA, "identity": identity, "chunks": {}}


def _save_state(dest: Path, state: dict) -> None:
    tmp = dest / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, dest / STATE)


def _write_chunk(table, path: Path, fmt: str) -> None:
    """Write atomically: a half-written chunk never looks complete."""
    tmp = path.with_name(path.name + ".part")
    if fmt == "parquet":
        import pyarrow.parquet as pq
        pq.write_table(table, tmp)
    else:
        with open(tmp, "w", encoding="utf-8") as fh:
            for batch in table.to_batches(max_chunksize=256):
                for row in batch.to_pylist():
                    fh.write(json.dumps(row, ensure_ascii=False, default=str))
                    fh.write("\n")
    os.replace(tmp, path)


def fetch_rows(fs, paths: Sequence[str], n: int, dest: str | Path, *, identity: dict | None = None,
               columns: Sequence[str] | None = None, fmt: str = "parquet", progress: bool = False,
               on_chunk: Callable[[int, int, int], None] | None = None, origin: dict | None = None) -> FetchResult:
    """Copy the first `n` rows of the parquet file(s) `paths` on fsspec filesystem `fs` into `dest`.

    Reads only the row groups needed, a row group at a time; resumes from `dest/state.json`.
    `identity` (source, revision, ...) is stored in the state: a state with another identity is
    ignored (started afresh). `on_chunk(chunks_done_this_run, file_index, row_group)` is called after
    each chunk is safely written (tests interrupt there).
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FetchError("fetching needs pyarrow: pip install 'pytest-agentcgroup[fetch]'") from None
    if fmt not in FORMATS:
        raise FetchError(f"unknown chunk format {fmt!r} (known: {', '.join(FORMATS)})")
    if n < 1:
        raise FetchError(f"number of rows must be at least 1, not {n}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    identity = dict(identity or {}, paths=list(paths), format=fmt, columns=list(columns) if columns else None)
    state = _load_state(dest, identity)
    if origin:
        state["origin"] = origin
    chunks: dict = state["chunks"]
    result = FetchResult(dest=dest, rows=0, origin=dict(origin or {}))
    bar = _Progress(n, progress, "fetch")
    done_this_run = 0
    try:
        for fi, path in enumerate(paths):
            if result.rows >= n:
                break
            with fs.open(path, "rb") as fh:
                pf = pq.ParquetFile(fh)
                meta = pf.metadata
                result.total_rows += meta.num_rows
                for rg in range(meta.num_row_groups):
                    need = n - result.rows
                    if need <= 0:
                        break
                    rg_rows = meta.row_group(rg).num_rows
                    want = min(need, rg_rows)
                    key = f"{fi}-{rg}"
                    name = f"chunk-{fi:05d}-{rg:05d}.{fmt}"
                    have = chunks.get(key)
                    if have and have["rows"] >= want and (dest / have["file"]).is_file():
                        result.reused_row_groups += 1
                        got = min(have["rows"], want)
                    else:
                        table = pf.read_row_group(rg, columns=list(columns) if columns else None)
                        if want < rg_rows:
                            table = table.slice(0, want)
                        _write_chunk(table, dest / name, fmt)
                        chunks[key] = {"file": name, "rows": want, "complete": want == rg_rows}
                        _save_state(dest, state)
                        result.fetched_row_groups += 1
                        done_this_run += 1
                        got = want
                        if on_chunk is not None:
                            on_chunk(done_this_run, fi, rg)
                    result.rows += got
                    result.files.append(dest / chunks[key]["file"])
                    bar.update(got)
    finally:
        bar.close()
    return result


def combine(result: FetchResult, out: str | Path) -> int:
    """Write exactly `result.rows` rows (the chunks, the last cut to size) into one .parquet or .jsonl."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    left = result.rows
    tables = []
    for f in result.files:
        if f.suffix == ".parquet":
            t = pq.read_table(f)
        else:
            import pyarrow.json as pj
            t = pj.read_json(f)
        tables.append(t.slice(0, left))
        left -= min(left, t.num_rows)
    table = pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
    origin = dict(result.origin, rows=table.num_rows, repeat=repeat_command(result.origin, table.num_rows))
    if out.suffix == ".parquet":
        meta = dict(table.schema.metadata or {})
        meta[ORIGIN_KEY] = json.dumps(origin, sort_keys=True).encode()
        table = table.replace_schema_metadata(meta)
    _write_chunk(table, out, "parquet" if out.suffix == ".parquet" else "jsonl")
    side = out.with_name(out.name + ".origin.json")
    tmp = side.with_name(side.name + ".part")
    tmp.write_text(json.dumps(origin, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, side)
    return table.num_rows


# ---------------------------------------------------------------------------------------------
# sources

def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


def fetch_local(source: str | Path, n: int, cache: str | Path = DEFAULT_CACHE, **kw) -> FetchResult:
    """`fetch_rows` for a local parquet file (the same code path, through fsspec's local filesystem)."""
    import fsspec
    source = Path(source).resolve()
    if not source.is_file():
        raise FetchError(f"{source}: no such file")
    dest = Path(cache) / "local" / f"{_safe(source.name)}-{hashlib.sha256(str(source).encode()).hexdigest()[:10]}"
    st = source.stat()
    try:
        return fetch_rows(fsspec.filesystem("file"), [str(source)], n, dest,
                          identity={"source": str(source), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
                          origin={"source": str(source), "size": st.st_size, "mtime_ns": st.st_mtime_ns}, **kw)
    except FetchError:
        raise
    except Exception as exc:  # pyarrow: not a parquet file, ...
        raise FetchError(f"{source}: cannot read as parquet: {_one_line(exc)}") from None


def _endpoint() -> str:
    try:
        from huggingface_hub import constants
        return constants.ENDPOINT
    except Exception:  # pragma: no cover
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _unreachable(exc: BaseException) -> FetchError:
    host = urlparse(_endpoint()).netloc or _endpoint()
    return FetchError(f"cannot reach the Hugging Face Hub ({host}): {_one_line(exc)}; "
                      "use --source FILE for a local parquet file")


def fetch_hub(n: int, *, repo: str = DEFAULT_REPO, path: str | None = None, revision: str = DEFAULT_REVISION,
              cache: str | Path = DEFAULT_CACHE, timeout: float = 10.0, **kw) -> FetchResult:
    """Fetch the first `n` rows of dataset `repo` at `revision` (parquet file `path` in the repo, or
    every *.parquet file of the repo in sorted order) through `HfFileSystem`."""
    # Bound every HTTP wait: an unreachable Hub must fail in seconds, not hang. (The library reads these
    # at import; they are set on its constants too in case it was imported already.)
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(max(1, int(timeout))))
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(max(1, int(timeout))))
    try:
        from huggingface_hub import HfApi, HfFileSystem, constants
        from huggingface_hub import errors as hf_errors
    except ImportError:
        raise FetchError("fetching from the Hub needs huggingface_hub and pyarrow: "
                         "pip install 'pytest-agentcgroup[fetch]' (or use --source FILE)") from None
    for name in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        if hasattr(constants, name):
            setattr(constants, name, timeout)
    api = HfApi()
    try:
        info = api.dataset_info(repo, revision=revision, timeout=timeout)
    except hf_errors.OfflineModeIsEnabled:
        raise FetchError("HF_HUB_OFFLINE is set, so the Hub is not contacted; unset it, or use --source FILE "
                         "for a local parquet file") from None
    except hf_errors.RevisionNotFoundError:
        raise FetchError(f"revision {revision!r} of dataset {repo} not found on the Hub") from None
    except hf_errors.RepositoryNotFoundError:
        raise FetchError(f"dataset {repo} not found on the Hub (or it is gated/private: log in with "
                         "`hf auth login`)") from None
    except hf_errors.HfHubHTTPError as exc:
        raise FetchError(f"the Hugging Face Hub ({urlparse(_endpoint()).netloc}) answered with an error for "
                         f"{repo}@{revision}: {_one_line(exc, 160)}; use --source FILE for a local parquet file") from None
    except Exception as exc:  # connect/read timeouts, DNS, refused, proxies: the network, whatever the library
        raise _unreachable(exc) from None
    sha = pinned_commit(getattr(info, "sha", None), revision, repo)
    fs = HfFileSystem(skip_instance_cache=True)
    return fetch_at_commit(fs, repo, sha, n, revision=revision, path=path, cache=cache, **kw)


def fetch_at_commit(fs, repo: str, sha: str, n: int, *, revision: str, path: str | None = None,
                    cache: str | Path = DEFAULT_CACHE, root: str = "datasets", **kw) -> FetchResult:
    """`fetch_rows` of dataset `repo` at commit `sha` on `fs`, laid out as the Hub's filesystem is
    (`<root>/<repo>@<sha>/<path>`; tests use a local directory in that layout). The result's
    origin (and the state and any output file) records repo, commit, the revision asked for and
    the parquet paths inside the repository."""
    base = f"{root}/{repo}@{sha}"
    try:
        if path:
            paths = [f"{base}/{path.lstrip('/')}"]
        else:
            paths = sorted(p for p in fs.glob(f"{base}/**/*.parquet"))
            if not paths:
                raise FetchError(f"dataset {repo}@{sha[:12]} has no *.parquet file (name one with --path)")
    except FetchError:
        raise
    except Exception as exc:
        raise _unreachable(exc) from None
    rel = [p.split(f"@{sha}/", 1)[-1] for p in paths]
    origin = {"repo": repo, "commit": sha, "revision_asked": revision, "paths": rel}
    if path:
        origin["path"] = path.lstrip("/")
    dest = Path(cache) / _safe(repo.replace("/", "__")) / _safe(sha)
    try:
        return fetch_rows(fs, paths, n, dest, identity={"repo": repo, "revision": sha}, origin=origin, **kw)
    except FetchError:
        raise
    except FileNotFoundError as exc:
        raise FetchError(f"{path or exc}: no such file in dataset {repo}@{sha[:12]}") from None
    except (OSError, ConnectionError, TimeoutError) as exc:
        raise FetchError(f"lost the Hugging Face Hub while reading: {_one_line(exc)}; run the same command "
                         "again to resume") from None
    except Exception as exc:
        name = type(exc).__module__ or ""
        if name.startswith(("httpx", "httpcore", "requests", "urllib3", "aiohttp", "huggingface_hub")):
            raise FetchError(f"lost the Hugging Face Hub while reading: {_one_line(exc)}; run the same command "
                             "again to resume") from None
        raise
