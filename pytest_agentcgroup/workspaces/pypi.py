"""What the workspaces take from PyPI, and only with a sha256 to check it against: a project's
releases and their files (the JSON API), one sdist (a file of the simple index, checked against its
pin: nothing is built, no build backend fetched), its unpacking, and pip run by the interpreter
whose environment it fills (`python -m pip`, wheels only, every one pinned). Network is used by
`agentcgroup traces lock` and by the first build of a workspace, never by a replay.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import ssl
import subprocess
import tarfile
import urllib.error
import urllib.request
import zipfile
from functools import lru_cache
from pathlib import Path

from .lock import RegistryUnreachable, WorkspaceError
from .roots import CERT_INSIDE, host_cert, run_in

SIMPLE_INDEX = "https://pypi.org/simple"          # PEP 503: each file's link carries #sha256=
JSON_INDEX = "https://pypi.org/pypi"              # the JSON API: releases, files, upload times
PIP_TIMEOUT_S = 1800
#: an HTTP answer that says the index behind it was not reached (a proxy's or gateway's), not that it refused
GATEWAY_ERRORS = (502, 503, 504)
#: what pip prints when it could not reach its index (urllib3's connection errors, after its retries)
PIP_UNREACHABLE = re.compile(r"connection broken by|Failed to establish a new connection|Max retries exceeded|"
                             r"Temporary failure in name resolution|Read timed out|ConnectTimeoutError")


class NoSuchProject(WorkspaceError):
    """PyPI answered that it has no project of that name (404), not that it could not be asked."""


def download_sdist(project: str, filename: str, sha256: str, index: str = SIMPLE_INDEX,
                   cache: Path | None = None) -> bytes:
    """The file `filename` of `project`, found on the simple index page and checked against `sha256`
    (the link's own hash and the bytes'); no build, nothing else fetched. RegistryUnreachable when
    the index cannot be reached, WorkspaceError when the file is not there or not the pinned one.
    `cache`: a directory keeping each file under its sha256, checked again when read."""
    kept = cache / f"{sha256}-{filename}" if cache is not None else None
    if kept is not None and kept.is_file():
        data = kept.read_bytes()
        if hashlib.sha256(data).hexdigest() == sha256:
            return data
    data = _download(project, filename, sha256, index)
    if kept is not None:                # best effort: a cache that cannot be written is no error
        part = kept.with_name(kept.name + f".{os.getpid()}.part")
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            part.write_bytes(data)
            part.replace(kept)
        except OSError:
            try:
                part.unlink()
            except OSError:
                pass
    return data


def _download(project: str, filename: str, sha256: str, index: str) -> bytes:
    page_url = f"{index}/{project}/"
    try:
        with urllib.request.urlopen(page_url, timeout=60) as r:
            page = r.read().decode("utf-8", "replace")
        link = next((u for u in re.findall(r'href="([^"]+)"', page)
                     if u.split("#")[0].rsplit("/", 1)[-1] == filename), None)
        if link is None:
            raise WorkspaceError(f"{page_url} lists no {filename}")
        url, _, frag = link.partition("#")
        if frag and frag != f"sha256={sha256}":
            raise WorkspaceError(f"{page_url}: {filename} is listed with {frag}, not the pinned sha256={sha256}")
        url = urllib.request.urljoin(page_url, url)
        with urllib.request.urlopen(url, timeout=120) as r:
            data = r.read()
    except (urllib.error.URLError, OSError) as exc:
        why = (f"cannot download {filename} from {page_url} ({exc}); building the workspace "
               "needs PyPI once (an already built workspace is kept)")
        if _unreachable(exc):
            raise RegistryUnreachable(why, index) from None
        raise WorkspaceError(why) from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise WorkspaceError(f"{url}: sha256 {got}, not the pinned {sha256}; not used")
    return data


@lru_cache(maxsize=None)
def releases(project: str, index: str = JSON_INDEX) -> dict[str, list[dict]]:
    """version -> its files ({filename, packagetype, digests.sha256, upload_time_iso_8601,
    requires_python, url}), from the JSON API. WorkspaceError when PyPI has no such project."""
    url = f"{index}/{project}/json"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            data = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NoSuchProject(f"PyPI has no project named {project!r} ({url})") from None
        if _unreachable(exc):
            raise RegistryUnreachable(f"cannot read {url}: {exc}", index) from None
        raise WorkspaceError(f"cannot read {url}: {exc}") from None
    except (urllib.error.URLError, OSError) as exc:
        why = f"cannot read {url} ({exc}); locking a workspace needs PyPI"
        raise (RegistryUnreachable(why, index) if _unreachable(exc) else WorkspaceError(why)) from None
    except ValueError as exc:
        raise WorkspaceError(f"{url}: not JSON ({exc})") from None
    out = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(out, dict):
        raise WorkspaceError(f"{url}: no releases in the answer")
    return {v: [f for f in files if isinstance(f, dict)] for v, files in out.items() if isinstance(files, list)}


def _unreachable(exc: OSError) -> bool:
    """Whether a urllib error says the index was not reached (no connection, no name, a timeout, a
    gateway's error), rather than that it answered otherwise or its certificate was refused here."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in GATEWAY_ERRORS
    return not isinstance(getattr(exc, "reason", exc), ssl.SSLCertVerificationError)


def sdist_of(files: list[dict]) -> dict | None:
    """The release's sdist file entry, if it has one."""
    return next((f for f in files if f.get("packagetype") == "sdist"), None)


def uploaded(files: list[dict]) -> str | None:
    """When a release was uploaded (its first file's ISO 8601 time), None without files."""
    times = [f.get("upload_time_iso_8601") or f.get("upload_time") for f in files]
    times = [t for t in times if isinstance(t, str)]
    return min(times) if times else None


def unpack_sdist(data: bytes, filename: str, dest: Path) -> Path:
    """Unpack an sdist (tar or zip) into `dest` with its one top-level directory stripped, member by
    member as data (no links out, no devices: tarfile's `data` filter); `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if filename.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                names = z.namelist()
                top = _top(names, filename)
                for info in z.infolist():
                    rel = info.filename[len(top):].lstrip("/")
                    if not rel or info.is_dir():
                        continue
                    target = (dest / rel).resolve()
                    if not str(target).startswith(str(dest.resolve()) + os.sep):
                        raise WorkspaceError(f"{filename}: member {info.filename!r} points outside the sdist")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(info))
            return dest
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = tar.getmembers()
            top = _top([m.name for m in members], filename)
            keep = []
            for m in members:
                rel = m.name[len(top):].lstrip("/")
                if rel:
                    m.name = rel
                    if m.islnk():               # a hard link names its target by its path in the archive
                        m.linkname = m.linkname[len(top):].lstrip("/")
                    keep.append(m)
            tar.extractall(dest, members=keep, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, OSError, KeyError) as exc:
        raise WorkspaceError(f"{filename}: cannot unpack: {exc}") from None
    return dest


def _top(names: list[str], filename: str) -> str:
    tops = {n.split("/", 1)[0] for n in names if n.strip("/")}
    if len(tops) != 1:
        raise WorkspaceError(f"{filename}: expected one top-level directory, found {len(tops)}")
    return tops.pop()


def sdist_files(data: bytes, filename: str, only: set[str] | None = None) -> dict[str, str]:
    """relative path -> text of every UTF-8 text file of an sdist (its top directory stripped; `only`:
    of those paths), read in memory: what choose.py compares a trajectory's edits with."""
    out: dict[str, str] = {}
    try:
        if filename.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                items = [(i.filename, lambda i=i: z.read(i)) for i in z.infolist() if not i.is_dir()]
                return _texts(items, out, only)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:    # in order: a compressed tar seeks back slowly
            return _texts(((m.name, lambda m=m: tar.extractfile(m).read()) for m in tar if m.isfile()), out, only)
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        raise WorkspaceError(f"{filename}: cannot read: {exc}") from None


def _texts(items, out: dict[str, str], only: set[str] | None) -> dict[str, str]:
    for name, read in items:
        rel = name.split("/", 1)[1] if "/" in name else ""
        if not rel or only is not None and rel not in only:
            continue
        try:
            out[rel] = read().decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out


def pip(python: str, args: list[str], *, what: str, root: Path | None = None,
        writable: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """`python -m pip ARGS` against PyPI (pip's own configuration and environment ignored, so a lock
    made here resolves as it would elsewhere); WorkspaceError naming `what` and pip's last lines,
    RegistryUnreachable when those say pip could not reach its index.
    `root`: `python` is of that system root, run inside it with `writable` (roots.run_in)."""
    cert = host_cert()
    if cert and root is not None:
        cert = CERT_INSIDE
    argv = [python, "-m", "pip", "--isolated", "--disable-pip-version-check", "--no-input",
            *(["--cert", cert] if cert else []), *args]
    if root is not None:
        argv = run_in(root, argv, writable=writable)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkspaceError(f"{what}: pip could not run: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
        why = f"{what}: pip failed (exit {done.returncode}):\n{tail}"
        if PIP_UNREACHABLE.search(tail):
            index = args[args.index("--index-url") + 1] if "--index-url" in args[:-1] else "PyPI"
            raise RegistryUnreachable(why, index)
        raise WorkspaceError(why)
    return done
