"""Run-time guards against reward hacking, installed in the candidate's process by its server.

Diagnostics, not the verdict. They run inside the candidate's process, where its code can reach
and switch them off, so they only ever fail a candidate (with a clear message): what decides a
pass is the trusted harness (env_pool/trusted/harness.py), which times and verifies from outside. The
OS sandbox (env_pool/isolation/sandbox.py) enforces no network and no writes outside the scratch folder;
these catch what the OS cannot see (torch compute ops, monkeypatching, imports of the
reference) and name every violation. They are armed after the server's own trusted work
(env_pool/candidate/serve.py), before the candidate's code loads. Known to be evadable (see the `hard`
cases of tests/env_corpus/): their state is reachable, the torch profiler that the fallback
detector reads can be stopped and started again (a secret marker tells only a careless restart),
native code can switch its RecordFunction off or redispatch past it (the Python switches are
tripped), and numpy, a library called from native code, or an ATen kernel called directly
(at::native::) never reach the detector.
"""
from __future__ import annotations

import functools
import importlib.abc
import os
import re
import secrets
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd import profiler_legacy

from protocol.results import Violation

# Ops ModelNew.forward may call: allocation, views, layout and plain copies. Anything else is
# torch computing the answer for the candidate. Names are aten overload packets.
ALLOWED_OPS = frozenset(
    """
    empty empty_like empty_strided new_empty new_empty_strided new_zeros zeros zeros_like zero_ fill_
    view _unsafe_view reshape as_strided t transpose permute expand unsqueeze squeeze select slice
    unbind split chunk narrow detach detach_ alias contiguous clone copy_ _to_copy lift_fresh
    _local_scalar_dense is_same_size resize_ set_ sym_size sym_stride sym_numel
    """.split()
)

# Modules a candidate may not import: the environment's own code and the task definitions.
FORBIDDEN_IMPORTS = ("env_pool", "tasks", "reference", "actors", "learner", "rollout", "launch", "configs")

# Attributes whose identity must survive the candidate: what verification and timing rely on.
WATCHED = {
    "torch": ("allclose", "isclose", "equal", "isfinite", "isnan", "empty", "empty_like"),
    "torch.testing": ("assert_close",),
    "torch.Tensor": ("__eq__", "__ne__", "allclose", "equal", "clone", "copy_", "cpu", "to", "data_ptr"),
    "torch.cuda": ("synchronize", "Event", "current_stream"),
    "time": ("perf_counter", "perf_counter_ns", "time", "monotonic"),
}

# Ways to reach the runner's locals (timings, reference weights) from inside ModelNew. sys._getframe
# is not among them: namedtuple, enum and logging call it on ordinary paths.
INTROSPECTION_EVENTS = ("sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents")

# C++ symbols (mangled) that switch the fallback detector's record off or run a kernel past it, looked
# up through ctypes: RecordFunction's switches and callbacks, the profiler's, at::redispatch::, at::native::.
HIDING_SYMBOL = re.compile(r"RecordFunction|Callbacks?E|Profiler|2at10redispatch|2at6native")

PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty", "pty.spawn", "os.spawn")


@dataclass
class GuardState:
    scratch: Path  # the only folder the candidate may write to
    read_roots: tuple[str, ...]  # folders the candidate may read: its scratch, Python, its libraries
    path_dirs: frozenset[str] = frozenset()  # sys.path's folders: listed by the import system (its finder's cache refresh), never read
    armed: bool = False
    violations: list[Violation] = field(default_factory=list)

    def flag(self, guard: str, reason: str) -> None:
        if not any(v.guard == guard and v.reason == reason for v in self.violations):
            self.violations.append(Violation(guard, reason))


def _resolve(name: str) -> Any:
    obj: Any = sys.modules.get(name.split(".")[0])
    for part in name.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def snapshot_watched() -> dict[tuple[str, str], Any]:
    snap = {}
    for owner, attrs in WATCHED.items():
        target = _resolve(owner)
        for attr in attrs:
            snap[(owner, attr)] = target.__dict__.get(attr, getattr(target, attr, None)) if isinstance(target, type) else getattr(target, attr, None)
    return snap


def check_tamper(state: GuardState, before: dict[tuple[str, str], Any]) -> None:
    now = snapshot_watched()
    for key, original in before.items():
        if now[key] is not original:
            state.flag("tamper", f"{key[0]}.{key[1]} was replaced")


class _ImportBlocker(importlib.abc.MetaPathFinder):
    def __init__(self, state: GuardState):
        self.state = state

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 - importlib protocol
        if self.state.armed and fullname.split(".")[0] in FORBIDDEN_IMPORTS:
            self.state.flag("import_reference", f"imported {fullname!r}: the reference and the environment are off limits")
            raise ImportError(f"{fullname} may not be imported by a candidate")
        return None


def _audit_hook(state: GuardState):
    proc_self = (f"/proc/{os.getpid()}", "/proc/self", "/proc/thread-self")

    def hook(event: str, args: tuple) -> None:
        if not state.armed:
            return
        if event.startswith(PROCESS_EVENTS):
            state.flag("subprocess", f"tried to start a process ({event})")
            raise PermissionError("candidates may not start processes")
        if event in INTROSPECTION_EVENTS:
            # Flagged, not refused: refusing would break library code that looks at frames legitimately.
            state.flag("tamper", f"inspected the environment's frames or objects ({event})")
            return
        if event == "ctypes.dlsym" and len(args) > 1 and isinstance(args[1], str) and HIDING_SYMBOL.search(args[1]):
            state.flag("tamper", f"looked up {args[1]} through ctypes: it would hide torch ops from the fallback detector")
            raise PermissionError("candidates may not reach torch's op recording")
        if event.startswith("socket.") and event not in ("socket.gethostname",):
            state.flag("network", f"tried to use the network ({event})")
            raise PermissionError("candidates have no network")
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            _check_open(state, os.fsdecode(args[0]), args[1] if len(args) > 1 else "r", args[2] if len(args) > 2 else 0, proc_self)
        elif event in ("os.listdir", "os.scandir") and args and args[0] is not None:
            folder = os.fsdecode(args[0]) if not isinstance(args[0], int) else "."
            if os.path.realpath(folder) not in state.path_dirs:  # a lazy import re-lists a changed sys.path folder
                _check_read(state, folder, proc_self)

    return hook


def _check_open(state: GuardState, path: str, mode: Any, flags: int, proc_self: tuple[str, ...]) -> None:
    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND)
    )
    full = os.path.realpath(path)
    if writing and not (full.startswith(str(state.scratch)) or full.startswith("/dev/")):
        state.flag("filesystem", f"tried to write {path!r} outside its folder")
        raise PermissionError("candidates may write only in their own folder")
    if not writing:
        _check_read(state, path, proc_self)


def _check_read(state: GuardState, path: str, proc_self: tuple[str, ...]) -> None:
    full = os.path.realpath(path)
    if full.startswith("/proc/") and not full.startswith(proc_self):
        state.flag("filesystem", f"tried to read another process's {full!r}")
        raise PermissionError("candidates may not inspect other processes")
    if _is_package_metadata(full) or not os.path.exists(full):
        return  # importlib.metadata scans every sys.path entry; a path the sandbox hides reveals nothing
    if not (full.startswith(state.read_roots) or full.startswith(("/proc/", "/dev/", "/sys/", "/usr/", "/lib", "/etc/"))):
        state.flag("filesystem", f"tried to read {path!r} outside its folder")
        raise PermissionError("candidates may read only their own folder and installed libraries")


def _is_package_metadata(path: str) -> bool:
    parts = path.split(os.sep)
    return any(p.endswith((".dist-info", ".egg-info")) for p in parts[-3:-1]) or path.endswith((".dist-info", ".egg-info"))


def install(scratch: Path) -> GuardState:
    """Install the import blocker and the audit hook, unarmed; call arm() before candidate code runs."""
    roots = {str(scratch), sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(torch.__file__)}
    roots.update(p for p in sys.path if p and os.path.isdir(p) and not _is_project_dir(p))
    state = GuardState(scratch=scratch, read_roots=tuple(sorted(os.path.realpath(r) for r in roots)),
                       path_dirs=frozenset(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)))
    sys.meta_path.insert(0, _ImportBlocker(state))
    sys.addaudithook(_audit_hook(state))
    trip_switches(state)
    return state


def _is_project_dir(path: str) -> bool:
    """The source tree of cuda-agent itself (an editable install puts it on sys.path)."""
    return any(os.path.isdir(os.path.join(path, pkg)) for pkg in ("env_pool", "tasks")) and os.path.isdir(os.path.join(path, "env_pool"))


def forget_environment_modules() -> None:
    """Drop the runner's own packages from sys.modules so that a candidate cannot reach them by name."""
    for name in list(sys.modules):
        if name.split(".")[0] in FORBIDDEN_IMPORTS:
            sys.modules.pop(name, None)


# The profiler's switches, bound before any candidate code runs, held in a tuple: trip_switches
# replaces every module attribute that is one of them, and the detector must keep the real ones.
_PROFILER = (torch._C._autograd._enable_profiler_legacy, torch._C._autograd._disable_profiler_legacy)


@functools.cache
def prepare_detector() -> tuple[frozenset[str], Any]:
    """The fallback detector's tables, made on its first use, in trusted code before any candidate's
    (the server's warm-up): the composite ops, "ns::op" whose every overload only calls other ops
    (~20 ms), and the profiler's settings."""
    kinds: dict[str, list[bool]] = {}
    for qualified in torch._C._dispatch_get_all_op_names():
        try:
            composite = torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeImplicitAutograd")
        except RuntimeError:
            continue
        kinds.setdefault(qualified.split(".")[0], []).append(composite)
    composites = frozenset(name for name, each in kinds.items() if all(each))
    return composites, profiler_legacy.profile().config()  # CPU only: no CUPTI, no Kineto


class FallbackDetector:
    """Records every op torch's dispatcher calls on this thread while it is held, and flags, when let
    go, each one that computes (guard ``torch_fallback``).

    The record is torch's CPU profiler's (the legacy one: RecordFunction callbacks in C++ on the
    dispatcher's path, ~3 us an op on the 2-core machine). Kineto's profiler loads CUPTI into the
    process on a GPU, whose callbacks then ran in the candidate's rounds (library samples: four
    legitimate kernels failed as library fallbacks on an H200). A Python dispatch mode (this
    detector until stop 56) ran Python for every op, ~7 us an op, and saw only ops that reached
    the dispatcher's Python key: torch under ``torch._C._DisableTorchDispatch`` went unseen (corpus
    torch_under_disabled_dispatch_cuda).

    Every op recorded is judged, nested ones too (a scope of any name can be opened around torch's
    ops, so an op's callers vouch for nothing): it computes unless it is in ALLOWED_OPS or a
    composite (CompositeImplicitAutograd in every overload: linear, matmul; its callees are
    judged in turn). A session stopped under the detector, or replaced by one without the secret
    marker it opened with, is tampering (guard ``tamper``).
    """

    def __init__(self, state: GuardState):
        self.state = state
        self._marker = ""

    def __enter__(self) -> FallbackDetector:
        self._marker = f"watch-{secrets.token_hex(8)}"
        _PROFILER[0](prepare_detector()[1])
        with torch._C._profiler._RecordFunctionFast(self._marker):
            pass
        return self

    def __exit__(self, *exc: Any) -> bool:
        try:
            records = _PROFILER[1]()
        except RuntimeError:
            self.state.flag("tamper", "the torch profiler that records ModelNew.forward's torch ops was stopped")
            return False
        names = [e.name() for thread in records for e in thread if e.kind() == "push"]
        if self._marker not in names:
            self.state.flag("tamper", "the torch profiler that records ModelNew.forward's torch ops was replaced")
        for name in sorted(torch_fallbacks(names)):
            self.state.flag("torch_fallback", f"ModelNew.forward called torch op {name.replace('::', '.')}: "
                                              "the computation must be the candidate's kernel")
        return False


def torch_fallbacks(names: list[str]) -> set[str]:
    """The ops among a profiler record's scope names that compute (FallbackDetector says which);
    only aten's are allowed by name (an op of the candidate's own library can be named ``copy_``)."""
    composites = prepare_detector()[0]
    return {name for name in names if "::" in name and name not in composites
            and not (name.startswith("aten::") and name[len("aten::"):] in ALLOWED_OPS)}


# What would take the candidate's ops out of the detector's record without stopping its session
# (a red-team review of stop 56): RecordFunction off for the thread, every callback removed, the
# profiler's own switches, and the dispatcher's redispatch, which runs a kernel with no
# RecordFunction. Tripped (trip_switches) before any candidate code runs; from native code they stay
# in reach (at::enableRecordFunction, at::redispatch::), as at::native:: kernels are.
SWITCHES = (
    (torch._C._autograd, "_enable_record_function"),
    (torch._C._autograd, "_clear_callbacks"),
    (torch._C._autograd, "_enable_profiler_legacy"),
    (torch._C._autograd, "_disable_profiler_legacy"),
    (torch._C._DispatchOperatorHandle, "redispatch_boxed"),
    (torch._ops.OpOverload, "redispatch"),
)


def trip_switches(state: GuardState) -> None:
    """Each of SWITCHES replaced, where it is defined and wherever a module holds it by name, by one
    that flags the candidate (guard ``tamper``) and refuses."""
    originals = [getattr(owner, name) for owner, name in SWITCHES]

    def tripwire(name: str):
        def refused(*_: Any, **__: Any) -> None:
            state.flag("tamper", f"called {name}, which would hide torch ops from the fallback detector")
            raise PermissionError(f"{name} is not available to candidates")
        return refused

    for owner, name in SWITCHES:
        setattr(owner, name, tripwire(name))
    for module in list(sys.modules.values()):
        try:
            held = [attr for attr, value in vars(module).items() if any(value is o for o in originals)]
        except TypeError:  # a module object without a __dict__
            continue
        for attr in held:
            setattr(module, attr, tripwire(attr))


def live_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def check_threads(state: GuardState, before: set[int]) -> None:
    """Flags Python threads the candidate left running, checked inside every round's window.

    The count first: listing the threads cost a cpp round 0.02-0.03 ms on the 2-core machine
    (harness.log's sync term), where the count takes a lock. A thread that started as one of
    ``before`` ended keeps the count and goes unflagged: this is a diagnostic, and the code
    sampler and the freeze outside the window are what hold.
    """
    if threading.active_count() <= len(before):
        return
    extra = live_threads() - before
    if extra:
        state.flag("thread", f"{len(extra)} thread(s) started by the candidate were still running after forward returned")
