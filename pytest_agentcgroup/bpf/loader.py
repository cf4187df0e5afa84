"""Load one of our BPF programs (bpf/*.bpf.c, see programs_dir()) with bcc, and always unload it.

    with load("memcg_observer", cflags=["-DAGCG_PGFAULT"]) as prog:
        prog.attach_tracepoint("vmscan:mm_vmscan_memcg_reclaim_begin", "agcg_obs_rcl_beg")
        ...

`Loaded.close()` (run by the context manager on any exit: return, exception, KeyboardInterrupt)
detaches every tracepoint, destroys every cgroup link and frees the bcc module, so nothing of ours
stays loaded. Cgroup programs are attached with BPF_LINK_CREATE rather than bcc's BPF_PROG_ATTACH:
a link belongs to its file descriptor, so even a SIGKILLed run cannot leave a filter attached.

Each program has its user-space side in the module named after it (bpf/<name>.py), built on
ProgramSide (load, attach, set up, unload on failure) or, for a program that posts events and acts
on marked cgroups, RingBufferProgram (the ring buffer, the event's cast, polling, marking).

bcc compiles the C source at load time with the running kernel's headers from
/lib/modules/$(uname -r)/build (`make setup` links them). Our programs read no kernel structs, so a
header version that differs from the running kernel is harmless. Compiling is most of a load's cost
(seconds here, ten times that in an emulated guest), so a closed module is kept compiled for the next
load of the same source and flags in this process: close() still detaches everything and unloads
every program from the kernel, and empties every map, so what the next user gets is what a fresh
compile would give it; only the compiled module and its (emptied) maps outlive the with-block. bcc can load tracepoint, cgroup
and other classic program types but not struct_ops (sched_ext schedulers, memcg_bpf_ops): those
need an external loader (see external.ExternalLoader).
"""
from __future__ import annotations

import ctypes
import errno
import io
import os
import signal
from contextlib import contextmanager
from pathlib import Path

from ..programs import require
from .syscall import bpf

PREFIX = "agcg_"                    # every program function is named agcg_*


def programs_dir() -> Path:
    """Where the eBPF C sources (<name>.bpf.c, common.h) are. In the checkout they live in the
    top-level bpf/, which is where a checkout or an editable install (the package imported from the
    checkout) reads them; the build copies them into the package as pytest_agentcgroup/bpf/programs/
    (setup.py), which is where an installed wheel reads them. The packaged copy wins, so a
    site-packages directory named bpf/ is never looked at. Neither there: the packaged path, so that
    source_path() names it in its FileNotFoundError."""
    here = Path(__file__).resolve().parent                 # .../pytest_agentcgroup/bpf
    packaged, checkout = here / "programs", here.parents[1] / "bpf"
    for candidate in (packaged, checkout):
        if (candidate / "common.h").is_file():
            return candidate
    return packaged


# found once; source_path() and the compiler's include path read it (a test may point it elsewhere)
BPF_DIR = programs_dir()

_BPF_LINK_CREATE = 28
_ATTACH_TYPES = {"cgroup_inet_egress": 1, "cgroup_inet_ingress": 0}


class BPFUnavailable(RuntimeError):
    """bcc or the kernel cannot load this program for want of a feature or privilege (no bcc, no
    BPF syscall, lockdown's EPERM, a missing tracepoint); the message says what is missing. Tests
    skip on it."""


class BPFBuildError(RuntimeError):
    """Our program is at fault: the compiler rejected it, or the kernel's verifier did. Not a
    missing feature, so never a skip: the message names the program and what the compiler or
    kernel said."""


# errnos of a load that mean "this host does not allow or offer it", not "the program is wrong"
_UNAVAILABLE_ERRORS = (os.strerror(errno.EPERM), os.strerror(errno.ENOSYS), os.strerror(errno.EOPNOTSUPP),
                       os.strerror(errno.ENOENT))


def _load_failure(what: str, exc: Exception) -> RuntimeError:
    """BPFUnavailable when bcc's message carries an errno of a missing feature or privilege, else
    BPFBuildError (the verifier's EACCES/EINVAL: the program is wrong)."""
    text = str(exc)
    cls = BPFUnavailable if any(e in text for e in _UNAVAILABLE_ERRORS) else BPFBuildError
    return cls(f"{what}: {text}")


def import_bcc():
    try:
        import bcc  # noqa: F401  (Debian's python3-bpfcc, made importable by `make setup`)
        return bcc
    except ImportError as exc:
        raise BPFUnavailable(f"bcc is not importable ({exc}); run `make setup` "
                             "(installs python3-bpfcc and links it into the venv)") from None


def source_path(name: str | os.PathLike) -> Path:
    """<name>.bpf.c of BPF_DIR (programs_dir()); a path to a .bpf.c file is taken as it is."""
    if os.path.isabs(name):
        path = Path(name)
    else:
        path = BPF_DIR / (name if str(name).endswith(".bpf.c") else f"{name}.bpf.c")
    if not path.exists():
        raise FileNotFoundError(f"no BPF program {path}")
    return path


#: compiled modules not in use, by (source, its and common.h's mtime, flags): Loaded.close() puts
#: them here emptied (no program loaded, every map empty), the next Loaded of the same key takes one
_IDLE: dict[tuple, list] = {}


def _compiled_key(path: Path, cflags) -> tuple:
    stamps = tuple(p.stat().st_mtime_ns for p in (path, path.parent / "common.h") if p.exists())
    return str(path), stamps, tuple(cflags)


def _map_names(lib, module) -> list[bytes]:
    """The names of every map of a compiled bcc module (libbcc's table list; python bcc declares
    no signature for it, so the module pointer would be cut to an int)."""
    lib.bpf_num_tables.argtypes, lib.bpf_num_tables.restype = [ctypes.c_void_p], ctypes.c_size_t
    lib.bpf_table_name.argtypes, lib.bpf_table_name.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_char_p
    return [lib.bpf_table_name(module, i) for i in range(lib.bpf_num_tables(module))]


class _LinkCreateAttr(ctypes.Structure):
    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("_pad", ctypes.c_uint8 * 112)]



def link_create(prog_fd: int, target_fd: int, attach_type: str) -> int:
    attr = _LinkCreateAttr(prog_fd=prog_fd, target_fd=target_fd,
                           attach_type=_ATTACH_TYPES[attach_type], flags=0)
    try:
        return bpf(_BPF_LINK_CREATE, attr)
    except OSError as exc:
        raise OSError(exc.errno, f"BPF_LINK_CREATE ({attach_type}): {exc.strerror}") from None


class ClosedOnExit:
    """Closed when its with-block ends, however it ends (return, exception, KeyboardInterrupt)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Loaded(ClosedOnExit):
    """A compiled, loaded bcc module plus everything we attached; `close()` undoes all of it."""

    def __init__(self, name: str, cflags=()):
        bcc = import_bcc()
        self.name = name
        self.path = source_path(name)
        self._key = _compiled_key(self.path, cflags)
        self.bpf = _IDLE.get(self._key, []).pop() if _IDLE.get(self._key) else None
        if self.bpf is None:
            self.bpf = self._compile(bcc, cflags)
        self._links: list[int] = []
        self._cgroup_fds: list[int] = []
        self._tracepoints: list[tuple[str, str]] = []
        self._ring_open = False
        self.closed = False

    def _compile(self, bcc, cflags):
        # clang prints its diagnostics on fd 2 and bcc raises only "Failed to compile": capture
        # them, so that a build error names what the compiler said.
        with _stderr_captured() as diagnostics:
            try:
                return bcc.BPF(src_file=str(self.path).encode(),
                               cflags=[f"-I{BPF_DIR}", "-Wno-unused-function", *cflags])
            except Exception as exc:
                failure = exc
        said = diagnostics.getvalue().strip()
        if "Failed to compile" in str(failure):
            raise BPFBuildError(f"cannot compile {self.path.name}: {failure}" + (f"\n{said}" if said else "")) from None
        raise _load_failure(f"cannot load {self.path.name}", failure) from None

    def __getitem__(self, map_name):
        return self.bpf[map_name.encode() if isinstance(map_name, str) else map_name]

    def attach_tracepoint(self, tp: str, fn_name: str) -> None:
        """`category:name`, or `raw:name` for the raw tracepoint: the program gets the tracepoint's
        arguments as they are instead of a record the kernel first fills for it (cheaper on a
        tracepoint as hot as a page fault; for a program that reads no argument)."""
        assert fn_name.startswith(PREFIX), fn_name
        bcc = import_bcc()
        raw = tp.startswith("raw:")
        self._load_func(fn_name, bcc.BPF.RAW_TRACEPOINT if raw else bcc.BPF.TRACEPOINT)
        try:
            if raw:
                self.bpf.attach_raw_tracepoint(tp=tp[4:].encode(), fn_name=fn_name.encode())
            else:
                self.bpf.attach_tracepoint(tp=tp.encode(), fn_name=fn_name.encode())
        except Exception as exc:          # no such tracepoint on this kernel, or no tracefs
            raise BPFUnavailable(f"cannot attach {fn_name} of {self.path.name} to tracepoint {tp}: {exc}") from None
        self._tracepoints.append((tp, fn_name))

    def _load_func(self, fn_name: str, prog_type):
        """Load one function; the verifier's log (printed by libbpf on fd 2) joins a build error."""
        with _stderr_captured() as log:
            try:
                return self.bpf.load_func(fn_name.encode(), prog_type)
            except Exception as exc:       # the verifier's verdict, or a load the host refuses
                failure = exc
        err = _load_failure(f"cannot load {fn_name} of {self.path.name}", failure)
        said = log.getvalue().strip()
        if isinstance(err, BPFBuildError) and said:
            err = BPFBuildError(f"{err}\n{said[-2000:]}")
        raise err from None

    def attach_cgroup(self, fn_name: str, cgroup_dir: str | os.PathLike,
                      attach_type: str = "cgroup_inet_egress") -> None:
        assert fn_name.startswith(PREFIX), fn_name
        bcc = import_bcc()
        fn = self._load_func(fn_name, bcc.BPF.CGROUP_SKB)
        cg_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._cgroup_fds.append(cg_fd)
        self._links.append(link_create(fn.fd, cg_fd, attach_type))

    def open_ring_buffer(self, map_name: str, callback) -> None:
        self[map_name].open_ring_buffer(callback)
        self._ring_open = True

    def poll(self, timeout_ms: int = 0) -> None:
        """Run the ring-buffer callbacks for what is there (waits up to timeout_ms; -1 = forever)."""
        self.bpf.ring_buffer_poll(timeout_ms)

    def consume(self) -> None:
        self.bpf.ring_buffer_consume()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        # Not interruptible half-way: a Ctrl-C here would leave things attached.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for fd in self._links + self._cgroup_fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._links, self._cgroup_fds = [], []
            for tp, fn in self._tracepoints:
                try:
                    if tp.startswith("raw:"):
                        self.bpf.detach_raw_tracepoint(tp=tp[4:].encode())
                    else:
                        self.bpf.detach_tracepoint(tp=tp.encode())
                except Exception:
                    pass
            self._tracepoints = []
            if not self._emptied_for_reuse():
                self.bpf.cleanup()      # frees ring buffers, closes program and map fds
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _emptied_for_reuse(self) -> bool:
        """Unload every program (their fds closed: with the links and tracepoints gone, the kernel
        frees them), free the ring buffer's reader, empty every map, and keep the compiled module
        for the next load of the same source and flags. False (nothing kept) where any of it fails."""
        try:
            bcc = import_bcc()
            for fn in self.bpf.funcs.values():
                os.close(fn.fd)
            self.bpf.funcs.clear()
            if self.bpf._ringbuf_manager:
                self.bpf.ring_buffer_consume()          # to the old owner's callback, not the next one's
                bcc.lib.bpf_free_ringbuf(self.bpf._ringbuf_manager)
                self.bpf._ringbuf_manager = None
            self.bpf.tables.clear()                     # the tables' objects hold ring-buffer callbacks
            for name in _map_names(bcc.lib, self.bpf.module):
                self.bpf.get_table(name).clear()
            self.bpf.tables.clear()
        except Exception:
            return False
        _IDLE.setdefault(self._key, []).append(self.bpf)
        return True

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class ProgramSide(ClosedOnExit):
    """The user-space side of one program of bpf/, in the module named after it (memcg_observer.py
    loads memcg_observer.bpf.c). Constructing it loads `program`, attaches its `tracepoints`
    ((tracepoint, function) pairs) and runs `_set_up`; if any of that fails, nothing stays loaded.
    close() or the end of a with-block detaches and unloads it."""
    program: str                       # bpf/<program>.bpf.c
    prog: Loaded

    def __init__(self, *, tracepoints=(), cflags=()):
        self.prog = Loaded(self.program, cflags)
        try:
            for tp, fn in tracepoints:
                self.prog.attach_tracepoint(tp, fn)
            self._set_up()
        except BaseException:
            self.prog.close()
            raise

    def _set_up(self) -> None:
        """What the program needs once attached (its maps filled, its ring buffer opened)."""

    def _forget(self, key, *maps: str) -> None:
        """`key` deleted from each of these maps, where it is."""
        for name in maps:
            try:
                del self.prog[name][key]
            except KeyError:
                pass

    def close(self) -> None:
        self.prog.close()


class RingBufferProgram(ProgramSide):
    """A program that acts on the cgroups user space marks in its hash map `cgroups` (u64 cgroup id
    -> what to do for it) and posts events on its ring buffer `ring`. Each event is read as
    `event_struct` (the C struct's layout) and made a record by `_record`; poll() collects the
    records, also kept in `.events`."""
    ring: str
    cgroups: str
    event_struct: type[ctypes.Structure]

    def __init__(self, *, tracepoints, cflags=()):
        self.events: list = []
        super().__init__(tracepoints=tracepoints, cflags=cflags)

    def _set_up(self) -> None:
        self.prog.open_ring_buffer(self.ring, self._on_event)

    def _on_event(self, ctx, data, size) -> None:
        self.events.append(self._record(ctypes.cast(data, ctypes.POINTER(self.event_struct)).contents))

    def _record(self, event):
        """The record of one event, `event` as read from the ring buffer (valid during the call only)."""
        raise NotImplementedError

    def poll(self, timeout_ms: int = 0) -> list:
        """Collect the pending events (waits up to timeout_ms; -1 = forever); returns the new records."""
        n = len(self.events)
        self.prog.poll(timeout_ms)
        return self.events[n:]

    def _mark(self, cgroup_id: int, value) -> None:
        self.prog[self.cgroups][ctypes.c_uint64(cgroup_id)] = value

    def _marked(self, cgroup_id: int):
        """The cgroup's value in the mark map, None when it is not marked."""
        return self.prog[self.cgroups].get(ctypes.c_uint64(cgroup_id))

    def _unmark(self, cgroup_id: int, *per_cgroup_maps: str) -> None:
        """The cgroup out of the mark map and out of these maps the program keeps per cgroup."""
        self._forget(ctypes.c_uint64(cgroup_id), self.cgroups, *per_cgroup_maps)


@contextmanager
def _stderr_captured():
    """What is written to file descriptor 2 meanwhile (clang writes there, not to sys.stderr);
    passed on to the real stderr afterwards too, so nothing is hidden."""
    buf = io.StringIO()
    import tempfile
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield buf
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read().decode("utf-8", "replace")
            buf.write(data)
            if data:
                os.write(2, data.encode())


@contextmanager
def load(name: str, cflags=()):
    prog = Loaded(name, cflags)
    try:
        yield prog
    finally:
        prog.close()


def our_programs(held_by=None) -> list[dict]:
    """Programs currently loaded in the kernel whose name starts with agcg_ (via bpftool), each
    {"id", "name", "pids": [...]}; with `held_by` (pids), only those one of these processes holds —
    other sessions on the host may have theirs loaded. Raises BPFUnavailable when bpftool is missing.

    bpftool lists holders only when built with BPF skeletons (Debian 12's is not), so the holders
    are also read from /proc/PID/fdinfo: a program or link fd there names its `prog_id`."""
    import json
    import subprocess
    tool = require("bpftool", error=BPFUnavailable, needed_by="listing the loaded BPF programs")
    out = subprocess.run([tool, "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    progs = json.loads(out or "[]")
    ours = [{"id": p.get("id"), "name": p.get("name", ""),
             "pids": [x.get("pid") for x in p.get("pids", [])]}
            for p in progs if str(p.get("name", "")).startswith(PREFIX)]
    if held_by is not None:
        held_by = set(held_by)
        ids = _prog_ids_held_by(held_by)
        ours = [p for p in ours if held_by & set(p["pids"]) or p["id"] in ids]
    return ours


def _prog_ids_held_by(pids) -> set[int]:
    ids = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fdinfo").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                text = fd.read_text()
            except OSError:
                continue
            ids.update(int(line.split()[1]) for line in text.splitlines() if line.startswith("prog_id:"))
    return ids
