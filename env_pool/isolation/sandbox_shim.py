"""The sandbox's inside: builds one run's isolation from within, then execs the program.

Started by the parent (env_pool/isolation/sandbox.py, ``run_sandboxed``) as
``python -I -S -c <the text of this file> CONFIG``, before anything untrusted exists in the run;
``python -I -S env_pool/isolation/sandbox_shim.py CONFIG`` runs the same code. It is self-contained on
purpose and must stay so: -I leaves PYTHONPATH, the user site and the script's folder off
sys.path and -S skips site-packages, so nothing of this package (or any installed one) can be
imported here, and past pivot_root the checkout is out of view anyway. It imports only a few
light standard modules: its start-up is paid on every evaluation (dataclasses and pathlib
alone would double the cost of a ``python -c pass``). Nothing is shared with the parent's
modules: the one helper both sides need (``_unescape``, for /proc/self/mountinfo) is written
once on each side.

What it accepts (CONFIG: one JSON object in argv[1], written by ``run_sandboxed`` from
SandboxLimits; the candidate does not exist yet, so nothing in it comes from the candidate),
and how each field is checked:

- ``argv`` (list of str): exec'd by the child (``_exec``), last of all; a failure to exec is
  reported as ``exec_error`` (the parent raises SandboxError), never worked around.
- ``scratch`` (str): the one writable folder. Opened O_PATH|O_DIRECTORY before the mounts (an
  error ends the shim: no "isolation" report, the parent raises SandboxError); bound writable
  only where it is the same file as before the mounts (samestat), else re-bound from that fd.
- ``keep`` (list of str): folders under /tmp bound back read-only into the private /tmp; only
  existing folders are bound, and "readonly-root" needs statvfs to show each one read-only.
- ``visible`` (list of str): the only paths of a fresh root; symlinks followed (40 at most,
  then the path is dropped), missing paths dropped; "visible-only" only once the old root is
  detached (if that fails the shim dies and the run is refused).
- ``hidden`` (list of str): covered by an empty read-only tmpfs (folders) or /dev/null
  (files); a path not visible from here is hidden already; "hidden-paths" only when every
  other one was covered.
- ``cpus`` (list of int): the shim's affinity, before any fork; "cpu-affinity" only when
  sched_getaffinity reads back exactly that set.
- ``allow_network``, ``loopback``, ``use_gpu`` (bool): no network namespace; lo up in it;
  /dev/nvidia* in the private /dev.
- ``tmp_mb`` (int): size of the private /tmp and /dev/shm (passed through int()).
- ``rlimits`` (list of [label, RLIMIT_ name, soft, hard]): set in the child with
  ``getattr(resource, name)``; a label is reported only when setrlimit succeeded.
- ``keep_caps`` (list of int): capability numbers the child keeps (the parent maps them from
  a fixed table of names); every other one is dropped from all five sets.
- ``cgroups`` (list of [cgroup.procs path, labels]): the shim writes its pid there; the labels
  are reported only when that write succeeded.
- ``skip`` (list of str): isolation labels not to apply (unknown names change nothing).
- ``required`` (list of str) and ``parent_side`` (list of str): in the child, just before
  exec, every required label must be among those applied (the shim's, the child's, the
  parent's own); one missing: ``required_missing`` is reported, the child exits 125 and
  ``argv`` never runs. This is what makes every isolation fail closed.
- ``result_fd``, ``status_fd`` (int): inherited pipes. The shim closes the result pipe after
  the fork (the child keeps it); the status pipe is close-on-exec before the child is forked,
  so the program never holds it.
- ``parent_pid`` (int): after PR_SET_PDEATHSIG, getppid() must still be it (the worker did not
  die in between), else exit 125.

What it says back, on the status pipe (one JSON line per write, each below PIPE_BUF, written
only by the shim and by the child before exec): ``isolation`` and ``init`` (what the shim
applied, the PID namespace's init), ``child`` (the program's pid, as the shim's namespace
numbers it), ``child_isolation``, ``required_missing`` or ``exec_error`` (the child),
``status`` (the child's wait status).
"""
import ctypes
import errno
import json
import os
import resource
import signal
import stat
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # same number on x86_64 and aarch64 (unified syscall table)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # glibc has no wrapper for it
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


_SKIP: set[str] = set()  # SandboxLimits.skip_isolation, in the shim


def _on(name: str) -> bool:
    return name not in _SKIP


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _Libc:
    """The few libc calls Python 3.11 lacks (unshare, mount, umount2, prctl, capset, syscall)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.unshare_ = libc.unshare
        self.unshare_.argtypes = [ctypes.c_int]
        self.mount_ = libc.mount
        self.mount_.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        self.umount2_ = libc.umount2
        self.umount2_.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.prctl_ = libc.prctl
        self.prctl_.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        self.capset_ = libc.capset
        self.syscall_ = libc.syscall

    @staticmethod
    def _check(ret: int, what: str) -> None:
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def unshare(self, flags: int) -> bool:
        return self.unshare_(flags) == 0

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
        self._check(self.mount_(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

    def umount(self, target: str) -> None:
        self._check(self.umount2_(os.fsencode(target), MNT_DETACH), f"umount {target}")

    def prctl(self, option: int, arg: int = 0, arg3: int = 0) -> bool:
        return self.prctl_(option, arg, arg3, 0, 0) == 0

    def mount_setattr(self, path: str, set_: int, clr: int, recursive: bool = True) -> None:
        attr = _MountAttr(set_, clr, 0, 0)
        ret = self.syscall_(
            ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), ctypes.c_char_p(os.fsencode(path)),
            ctypes.c_uint(AT_RECURSIVE if recursive else 0), ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )
        self._check(ret, f"mount_setattr {path}")

    def pivot_root(self, new_root: str, put_old: str) -> None:
        nr = SYS_PIVOT_ROOT.get(os.uname().machine)
        if nr is None:
            raise OSError(errno.ENOSYS, f"pivot_root: unknown syscall number on {os.uname().machine}")
        ret = self.syscall_(ctypes.c_long(nr), ctypes.c_char_p(os.fsencode(new_root)),
                            ctypes.c_char_p(os.fsencode(put_old)))
        self._check(ret, "pivot_root")

    def drop_all_caps(self, keep: list[int] = ()) -> None:
        """Empty the bounding, ambient, effective, permitted and inheritable sets (except ``keep``).

        The child stays uid 0 (the interpreter lives in /root, mode 0700) but without any
        capability it cannot undo the sandbox: no umount/mount (hidden paths stay hidden, the
        read-only root stays read-only), no writing to cgroups, no ptrace or /proc/PID/root of
        privileged processes, no raw I/O, no module loading. The empty bounding set keeps exec
        from granting root its capabilities back.
        """
        try:
            last = int(open("/proc/sys/kernel/cap_last_cap").read())
        except (OSError, ValueError):
            last = 63
        for cap in range(last + 1):
            if cap in keep:
                continue
            if not self.prctl(PR_CAPBSET_DROP, cap) and ctypes.get_errno() != errno.EINVAL:
                self._check(-1, f"drop capability {cap} from the bounding set")
        self.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        for cap in keep:  # kept in effective, permitted and inheritable: exec as root keeps them
            word, bit = divmod(cap, 32)
            data[word].effective |= 1 << bit
            data[word].permitted |= 1 << bit
            data[word].inheritable |= 1 << bit
        self._check(self.capset_(ctypes.byref(hdr), ctypes.byref(data)), "capset")


def _shim_main(raw_config: str) -> None:
    cfg = json.loads(raw_config)
    status_fd = cfg["status_fd"]

    def report(**msg) -> None:  # one short line per write: atomic on a pipe (< PIPE_BUF)
        os.write(status_fd, (json.dumps(msg) + "\n").encode())

    iso: list[str] = []
    libc = _Libc()
    _SKIP.update(cfg["skip"])
    # Join the run's cgroups first, so every process forked from here on is counted and capped.
    for procs_file, label in cfg["cgroups"]:
        try:
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))
            iso.extend(label.split(","))
        except OSError:
            pass
    # CPUs: set on the shim, before anything is forked, so init, the child and every thread
    # the child starts inherit them (the cpuset cgroup joined above enforces them too).
    if cfg.get("cpus") and _on("cpu-affinity") and _set_affinity(cfg["cpus"]):
        iso.append("cpu-affinity")
    # If the worker dies, the shim dies (and with it init, and with init the whole namespace).
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL):
        if os.getppid() != cfg["parent_pid"]:
            os._exit(125)
        iso.append("pdeathsig")
    # Make the kernel's OOM killer pick the candidate before the worker (the child cannot lower
    # it again without CAP_SYS_RESOURCE).
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        iso.append("oom-score")
    except OSError:
        pass
    # Orphans (double fork) reparent to the shim instead of the machine's init, so they stay
    # in the tree that is killed. Superseded by the PID namespace where that works.
    if _on("subreaper") and libc.prctl(PR_SET_CHILD_SUBREAPER, 1):
        iso.append("subreaper")
    # No network: a new network namespace has only a loopback device, and it is down.
    if not cfg["allow_network"] and _on("netns") and libc.unshare(CLONE_NEWNET):
        iso.append("netns")
        if cfg.get("loopback") and _loopback_up():
            iso.append("loopback")
    # SysV IPC and POSIX message queues private to the run (no talking to host processes).
    if _on("ipcns") and libc.unshare(CLONE_NEWIPC):
        iso.append("ipcns")
    # The filesystem view: see _setup_mounts.
    if _on("mountns") and libc.unshare(CLONE_NEWNS):
        iso.append("mountns")
        iso.extend(_setup_mounts(libc, cfg))
    # Our cwd still points into the original (now read-only) mount: enter the writable one.
    os.chdir(cfg["scratch"])
    # PID namespace: the child sees only its own processes (not the worker's, whose
    # environment and command lines may hold secrets, and none it could signal); killing its
    # init kills every process in it, however it daemonised. unshare(CLONE_NEWPID) applies to
    # the children forked after it; the first one becomes PID 1.
    init_pid = None
    if _on("pidns") and libc.unshare(CLONE_NEWPID):
        try:
            init_pid = os.fork()
        except OSError:
            init_pid = None
        if init_pid == 0:
            _init_main(libc)
        if init_pid is not None:
            iso.append("pidns")
    os.set_inheritable(status_fd, False)  # the child reports once more, then exec closes it
    report(isolation=iso, init=init_pid)
    child = os.fork()
    if child == 0:
        _child_main(libc, cfg, iso, init_pid is not None and "mountns" in iso, status_fd)
    report(child=child)  # the harness reads the program's memory by this pid (env_pool/trusted/readout.py)
    # The child has the payload pipe and the result channel; the shim must not hold them open.
    os.close(cfg["result_fd"])
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status = st
            break
    _teardown(init_pid)
    if status is not None:
        report(status=status)
    code = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL
    os._exit(code if code >= 0 else 128 - code)


def _set_affinity(cpus: list[int]) -> bool:
    """Pin this process to ``cpus``; True only when its affinity is now exactly that set."""
    try:
        os.sched_setaffinity(0, cpus)
        return os.sched_getaffinity(0) == set(cpus)
    except (OSError, ValueError):
        return False


def _loopback_up() -> bool:
    """Set IFF_UP on the new namespace's lo (SIOCGIFFLAGS / SIOCSIFFLAGS on a throwaway socket)."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            req = struct.pack("16sh14x", b"lo", 0)
            flags = struct.unpack("16sh14x", fcntl.ioctl(sock, 0x8913, req))[1]  # SIOCGIFFLAGS
            fcntl.ioctl(sock, 0x8914, struct.pack("16sh14x", b"lo", flags | 0x1))  # SIOCSIFFLAGS, IFF_UP
        return True
    except OSError:
        return False


def _init_main(libc: _Libc) -> None:
    """PID 1 of the run's namespace: reap orphans until the shim SIGKILLs it.

    A separate init keeps the candidate from being PID 1 (which the kernel shields from its
    own signals: os.kill(os.getpid(), SIGSEGV) or abort() would not end it).
    """
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.closerange(0, 1 << 16)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        while True:
            try:
                while os.waitpid(-1, os.WNOHANG)[0] != 0:
                    pass
            except ChildProcessError:
                pass
            signal.sigwait({signal.SIGCHLD})
    finally:
        os._exit(0)


def _child_main(libc: _Libc, cfg: dict, iso: list[str], new_proc: bool, status_fd: int) -> None:
    """The candidate's process before exec: /proc, rlimits, capabilities, then exec."""

    def report(**msg) -> None:
        os.write(status_fd, (json.dumps(msg) + "\n").encode())

    try:
        mine: list[str] = []
        if new_proc and _on("procfs"):
            # A /proc of the new PID namespace: only the run's processes. Writable (libcuda
            # fails with error 304 on a read-only /proc), with its global knobs read-only.
            try:
                libc.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                if _protect_proc(libc):
                    mine.append("procfs")
                else:
                    libc.umount("/proc")  # back to the host's, read-only, /proc
            except OSError:
                pass
        for label, name, soft, hard in cfg["rlimits"]:
            if not _on(label):
                continue
            try:
                resource.setrlimit(getattr(resource, name), (soft, hard))
                mine.append(label)
            except (OSError, ValueError):
                pass
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the shim's death ends it (no PID namespace)
        if _on("no-caps"):
            try:
                libc.drop_all_caps(cfg.get("keep_caps", []))
                mine.append("some-caps-kept" if cfg.get("keep_caps") else "no-caps")
            except OSError:
                pass
        if _on("no-new-privs") and libc.prctl(PR_SET_NO_NEW_PRIVS, 1):
            mine.append("no-new-privs")
        # Python ignores SIGPIPE and SIGXFSZ; ignored signals survive exec: restore defaults.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        have = set(iso) | set(mine) | set(cfg["parent_side"])
        missing = [r for r in cfg["required"] if r not in have]
        if missing:
            report(required_missing=missing)
            os._exit(125)
        report(child_isolation=mine)
        _exec(cfg["argv"], dict(os.environ))
    except BaseException as exc:  # noqa: BLE001 - anything here is the sandbox's failure
        try:
            report(exec_error=f"{type(exc).__name__}: {exc}")
        finally:
            os._exit(127)


def _exec(argv: list[str], env: dict[str, str]) -> None:
    """os.execvpe, less its lazy ``import warnings``: past pivot_root the stdlib is out of view."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    first_error: OSError | None = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory or ".", argv[0]), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:  # found, but not executable: say so rather than "not found"
            first_error = first_error or exc
    raise first_error or FileNotFoundError(errno.ENOENT, f"{argv[0]} not found on PATH")


def _setup_mounts(libc: _Libc, cfg: dict) -> list[str]:
    """Build the child's filesystem view inside its new mount namespace (fails soft).

    - Everything is made private first, so nothing done here propagates back to the host.
    - Visible paths (SandboxLimits.visible_paths): first a fresh root that holds only those
      (_enter_visible_root); the steps below then build /tmp, /dev and scratch inside it.
    - /tmp: a fresh size-limited tmpfs. The shared /tmp holds other runs' files and sockets of
      host services (Ray's plasma store, ...); a candidate must neither read nor leave anything.
      A checkout or venv that lives under /tmp (_paths_to_keep) is bound back into it.
    - /dev: a fresh tmpfs holding only null, zero, full, random, urandom (plus /dev/nvidia* for
      GPU runs) and a private /dev/shm tmpfs. A read-only mount does not stop writes to device
      nodes, and uid 0 may open /dev/vda: the host's /dev must not be visible at all.
    - scratch: bind-mounted onto itself (or, when it lives under the new /tmp, re-bound from a
      descriptor opened beforehand), so it can stay writable.
    - Then every mount is made read-only recursively (mount_setattr AT_RECURSIVE, or one
      remount per mount on older kernels), and write access is given back to the scratch, /tmp
      and /dev/shm mounts themselves only, never to what is mounted below them: the checkout
      or venv bound back under /tmp stays read-only. "readonly-root" is reported only once
      statvfs shows / and every bound-back and visible path read-only.
    - /proc stays writable (libcuda fails with error 304 on a read-only one), its machine-wide
      parts bound read-only (_protect_proc); with a PID namespace the child mounts its own.
    - Hidden paths: an empty read-only tmpfs over each directory, /dev/null over each file;
      "hidden-paths" only when there were some and every one of them is hidden.
    """
    iso: list[str] = []
    try:
        libc.mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError:
        return iso  # mounts would leak to the host: change nothing
    scratch = cfg["scratch"]
    scratch_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)
    writable: list[str] = []
    visible = cfg.get("visible") or []
    fresh_root = bool(visible) and _on("visible-only") and _enter_visible_root(libc, visible)

    tmp_opts = f"size={int(cfg['tmp_mb'])}m,mode=1777"
    if _on("private-tmp"):
        keep = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in cfg.get("keep", []) if os.path.isdir(p)}
        try:
            libc.mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmp_opts)
            iso.append("private-tmp")
            writable.append("/tmp")
            for path, fd in keep.items():  # Python, the venv or the sources living under /tmp: bound back
                os.makedirs(path, exist_ok=True)
                libc.mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        except OSError:
            pass
        finally:
            for fd in keep.values():
                os.close(fd)

    if _on("private-dev") and _private_dev(libc, cfg["use_gpu"], tmp_opts):
        iso.append("private-dev")
    if _on("private-shm") and _private_shm(libc, tmp_opts):
        iso.append("private-shm")
        writable.append("/dev/shm")

    scratch_ok = False
    try:
        try:
            same = os.path.samestat(os.stat(scratch), os.fstat(scratch_fd))
        except OSError:
            same = False
        if same:
            libc.mount(scratch, scratch, None, MS_BIND | MS_REC)
        else:  # covered by the new /tmp (or /dev, or a fresh root): recreate the path, bind the original there
            os.makedirs(scratch, exist_ok=True)
            libc.mount(f"/proc/self/fd/{scratch_fd}", scratch, None, MS_BIND | MS_REC)
        scratch_ok = True
        writable.append(scratch)
    except OSError:
        pass
    finally:
        os.close(scratch_fd)
    if fresh_root:
        # The scratch dir is bound from the old root: only now can that be let go of. Should
        # this fail, the shim ends here and the run is refused: the old root must not stay.
        libc.umount(_OLD_ROOT)
        os.rmdir(_OLD_ROOT)
        iso.append("visible-only")

    must_be_readonly = ["/", *cfg.get("keep", []), *visible]
    if scratch_ok and _on("readonly-root") and _readonly_except(libc, writable, must_be_readonly):
        iso.append("readonly-root")
        # /proc writable again, its global knobs excepted (see _protect_proc): libcuda needs it.
        # Where that cannot be done, it stays read-only (CUDA then fails: a safe failure).
        if _protect_proc(libc):
            try:
                libc.mount_setattr("/proc", 0, MOUNT_ATTR_RDONLY, recursive=False)
            except OSError:
                try:
                    libc.mount(None, "/proc", None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_NOEXEC)
                except OSError:
                    pass

    hidden = cfg["hidden"] if _on("hidden-paths") else []
    hidden_ok = True
    for path in hidden:
        try:
            st = os.stat(path)
        except OSError:
            continue  # not visible from here (absent, or under the private /tmp): hidden already
        try:
            if stat.S_ISDIR(st.st_mode):
                libc.mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
            else:
                libc.mount("/dev/null", path, None, MS_BIND)
                libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError:
            hidden_ok = False
    if hidden and hidden_ok:
        iso.append("hidden-paths")
    return iso


def _enter_visible_root(libc: _Libc, paths: list[str]) -> bool:
    """Make a tmpfs that holds only ``paths`` the root of this mount namespace (pivot_root).

    Each path is bound (recursively) at its real location, and every symlink met on the way
    there is recreated as it is on the host (/lib64 -> usr/lib64, /usr/local/cuda ->
    cuda-13.0 when /usr is not bound whole), so programs and the loader find their files under
    the names they know. The tmpfs is staged over /tmp: whatever the later steps need from
    the old root is held open by descriptor before that (the scratch dir by _setup_mounts, the
    visible paths here). The host's /dev and /proc are bound in only for the steps that
    follow: the private /dev then covers the first, the run's own procfs the second (without
    a PID namespace the host's /proc stays, as in the normal view). The old root waits at
    _OLD_ROOT (a bind source must be a mount of this namespace) until _setup_mounts has bound
    the scratch dir, then it is detached: nothing else of the host is reachable by any path.
    """
    binds, links = _visible_plan(paths)
    fds: dict[str, int] = {}
    stage = "/tmp"
    staged = False
    try:
        for path in binds:
            fds[path] = os.open(path, os.O_PATH)
        libc.mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
        staged = True
        for path, fd in fds.items():
            _make_mountpoint(stage + path, stat.S_ISDIR(os.fstat(fd).st_mode))
            libc.mount(f"/proc/self/fd/{fd}", stage + path, None, MS_BIND | MS_REC)
        for link, dest in links:
            os.makedirs(os.path.dirname(stage + link), exist_ok=True)
            os.symlink(dest, stage + link)
        for name, mode in (("tmp", 0o1777), ("dev", 0o755), ("proc", 0o555)):
            _make_mountpoint(f"{stage}/{name}", True)
            os.chmod(f"{stage}/{name}", mode)
        libc.mount("/dev", f"{stage}/dev", None, MS_BIND | MS_REC)
        libc.mount("/proc", f"{stage}/proc", None, MS_BIND | MS_REC)
        os.mkdir(stage + _OLD_ROOT, 0o700)
        libc.pivot_root(stage, stage + _OLD_ROOT)
        os.chdir("/")
        return True
    except OSError:
        if staged:
            try:
                libc.umount(stage)
            except OSError:
                pass
        return False
    finally:
        for fd in fds.values():
            os.close(fd)


_OLD_ROOT = "/.old-root"  # where pivot_root puts the host's root until it is detached


def _make_mountpoint(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _visible_plan(paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(real paths to bind, none inside another; (link, target) pairs to recreate)."""
    real: set[str] = set()
    links: dict[str, str] = {}
    for path in paths:
        resolved = _follow_links(os.path.normpath(path), links)
        if resolved is not None and os.path.exists(resolved):
            real.add(resolved)
    inside = lambda p, roots: any(p != r and p.startswith(r.rstrip("/") + "/") for r in roots)  # noqa: E731
    binds = sorted(p for p in real if not inside(p, real))
    # A link inside a bound tree is there already (and that tree is read-only).
    return binds, sorted((link, dest) for link, dest in links.items() if not inside(link, binds))


def _follow_links(path: str, links: dict[str, str]) -> str | None:
    """``path`` with every symlink on the way resolved (each one met goes into ``links``); None on a loop."""
    for _ in range(40):
        parts = [p for p in path.split("/") if p]
        here = ""
        for i, part in enumerate(parts):
            step = f"{here}/{part}"
            if os.path.islink(step):
                dest = os.readlink(step)
                links[step] = dest
                base = dest if dest.startswith("/") else os.path.join(here or "/", dest)
                path = os.path.normpath(os.path.join(base, *parts[i + 1:]))
                break
            here = step
        else:
            return here or "/"
    return None


def _private_dev(libc: _Libc, use_gpu: bool, shm_opts: str) -> bool:
    names = ["null", "zero", "full", "random", "urandom"]
    if use_gpu:
        try:
            names += sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
        except OSError:
            pass
    fds: dict[str, int] = {}
    for n in names:
        try:
            fds[n] = os.open(f"/dev/{n}", os.O_PATH)
        except OSError:
            pass
    try:
        try:
            libc.mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,mode=755")
        except OSError:
            return False
        try:
            for n, fd in fds.items():
                target = f"/dev/{n}"
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.mkdir(target)
                else:
                    os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
                libc.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
            for link, dest in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                               ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
                os.symlink(dest, f"/dev/{link}")
            os.mkdir("/dev/shm", 0o1777)
            return True
        except OSError:
            try:
                libc.umount("/dev")  # back to the host's /dev (MNT_DETACH takes the binds too)
            except OSError:
                pass
            return False
    finally:
        for fd in fds.values():
            os.close(fd)


def _private_shm(libc: _Libc, opts: str) -> bool:
    """Mount a private tmpfs on /dev/shm (in the new /dev, or over the host's)."""
    try:
        libc.mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts)
        return True
    except OSError:
        return False


# /proc entries that act on the whole machine: read-only. As uid 0 the child passes the DAC
# checks on them, and most handlers check no capability (a write to /proc/sysrq-trigger can
# reboot the machine, /proc/sys changes kernel settings, /proc/driver/nvidia/suspend suspends
# the GPU). The same list as Docker's read-only paths, plus driver.
_PROC_READONLY = ("sys", "sysrq-trigger", "bus", "fs", "irq", "driver")
# Kernel internals a candidate has no business reading: masked with /dev/null.
_PROC_MASKED = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats")


def _protect_proc(libc: _Libc) -> bool:
    """Bind the machine-wide parts of the /proc mounted now read-only, mask a few files."""
    try:
        for name in _PROC_READONLY:
            path = f"/proc/{name}"
            if os.path.lexists(path):
                libc.mount(path, path, None, MS_BIND | MS_REC)
                libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for name in _PROC_MASKED:
            path = f"/proc/{name}"
            if os.path.isfile(path):
                libc.mount("/dev/null", path, None, MS_BIND)
                libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        return True
    except OSError:
        return False


_MOUNT_FLAG_OPTS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}


def _readonly_except(libc: _Libc, writable: list[str], check: list[str]) -> bool:
    """Every mount read-only but the ``writable`` mounts themselves; True once ``check`` is read-only."""
    try:
        libc.mount_setattr("/", MOUNT_ATTR_RDONLY, 0)  # recursive: every mount in the view
        for path in writable:
            # Not recursive: what is mounted below a writable mount (the checkout or venv bound
            # back under /tmp) keeps its read-only flag.
            libc.mount_setattr(path, 0, MOUNT_ATTR_RDONLY, recursive=False)
    except OSError:
        _remount_readonly(libc, writable)
    return _all_readonly(check)


def _remount_readonly(libc: _Libc, writable: list[str]) -> None:
    """Kernels before 5.12: one bind-remount per mount, keeping each mount's other flags."""
    try:
        with open("/proc/self/mountinfo") as f:
            entries = [line.split() for line in f]
    except OSError:
        return
    # A remount by path reaches the mount on top at that point: the last one listed there.
    # (Remounting an earlier, covered entry's path would hit the top one, /tmp's new tmpfs say.)
    top: dict[str, str] = {}
    for fields in entries:
        top[_unescape(fields[4])] = fields[5]
    for mnt, opts in top.items():
        if mnt in writable:  # exactly: mounts below a writable one stay read-only
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in opts.split(","):
            flags |= _MOUNT_FLAG_OPTS.get(opt, 0)
        try:
            libc.mount(None, mnt, None, flags)
        except OSError:
            pass  # _all_readonly decides whether the view is read-only enough


def _all_readonly(paths: list[str]) -> bool:
    """Whether the mount each existing path lies on is read-only (statvfs: what a write would meet)."""
    for path in paths:
        if not os.path.lexists(path):
            continue  # nothing there to write to; its parent's mount is checked through "/"
        try:
            if not os.statvfs(path).f_flag & os.ST_RDONLY:
                return False
        except OSError:
            return False
    return True


def _teardown(init_pid: int | None) -> None:
    """After the child's exit: nothing it started may outlive it."""
    if init_pid is not None:
        try:
            os.kill(init_pid, signal.SIGKILL)  # the kernel kills every process in the namespace
        except OSError:
            pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if init_pid is None:
            # No PID namespace: kill our descendants (orphans are ours: subreaper) by /proc scan.
            for pid in _descendants(os.getpid()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.002)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            ppid = int(data[data.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _unescape(path: str) -> str:
    """Undo /proc/self/mountinfo's octal escapes (\\040 for a space, ...)."""
    parts = path.split("\\")
    out = [parts[0]]
    for part in parts[1:]:
        if len(part) >= 3 and all(c in "01234567" for c in part[:3]):
            out.append(chr(int(part[:3], 8)) + part[3:])
        else:
            out.append("\\" + part)
    return "".join(out)


if __name__ == "__main__":
    _shim_main(sys.argv[1])
