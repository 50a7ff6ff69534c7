"""No new processes, no wider CPU set, no unnamed code in the candidate's process: a seccomp filter, installed by its server.

Python's audit hooks (env_pool/candidate/guards.py) see ``subprocess``, ``os.system`` and ``os.fork``
called from Python, but not ``system()``, ``fork()`` or ``execve()`` called from a kernel's
native code; the PID namespace only contains such a process, it does not stop it. This filter
makes the kernel refuse them for every thread of the candidate's process:

- ``execve``, ``execveat``, ``fork``, ``vfork``, and ``clone`` without ``CLONE_THREAD``:
  the process is killed with SIGSYS (``SECCOMP_RET_KILL_PROCESS``). A refusal with EPERM
  would be invisible to the environment: ``system()`` returns -1, the kernel computes the
  right answer anyway and passes. The kill is unmistakable, and evaluate.py reports a
  SIGSYS death of the candidate as a ``subprocess`` violation.
- ``clone3``: fails with ENOSYS. Its flags sit in a struct that a BPF filter cannot read,
  and glibc (2.34+) falls back to ``clone`` on ENOSYS, where the flags are an argument:
  ``pthread_create`` then passes ``CLONE_THREAD`` and goes through, ``posix_spawn`` does not.
- ``sched_setaffinity``: fails with EPERM. The sandbox pins the run to its CPUs
  (SandboxLimits.cpus); without this a kernel could move its threads onto every core of the
  machine (os.sched_setaffinity, pthread_setaffinity_np, OpenMP's proc_bind) and slow the
  evaluations running beside it. A refusal, not a kill: OpenMP runtimes try it and carry on.
- No code that the kernel would not name to the harness's code sampler (env_pool/trusted/code_sampler.py,
  which attributes every sampled instruction to the file mapped there), and no change to the
  code of a file it names: ``mmap`` of anonymous executable memory, and of any memory both
  writable and executable (a private writable and executable mapping of kernel.so, its padding
  filled with a library's code, was sampled as the candidate's own), ``mprotect``/
  ``pkey_mprotect`` to executable, ``memfd_create``, ``mremap`` and ``remap_file_pages`` (which
  would move a library's code under another mapping's name without a record), ``personality``
  (READ_IMPLIES_EXEC makes readable memory executable behind the filter's back), ``unshare``
  and ``setns`` fail with EPERM. So does opening any file for writing (``open``, ``openat``
  with O_WRONLY or O_RDWR, ``creat``; ``openat2``, whose flags a filter cannot read, fails with
  ENOSYS): the one file that writes code, ``/proc/self/mem``, writes through read-only
  mappings, and a server writes no file once candidate code runs (its outputs are read from
  its memory). ``ptrace`` and ``process_vm_writev`` (another way into a process's memory),
  ``userfaultfd`` (a page that stalls the harness's read of an output), ``io_uring_setup``
  (system calls this filter would not see) and ``shmat`` with SHM_EXEC (a SysV segment attached
  executable, written through another attach: corpus rt3_shm_exec_jit) fail with EPERM too. dlopen maps files read-only,
  so ``ctypes.CDLL`` of kernel.so still works; JIT compilers (oneDNN's, in torch's CPU
  fallbacks) fail.
- Every other system call is allowed, so threads (the OpenMP pool, CUDA's own threads,
  ``threading``) keep working. A call through another ABI (i386 ``int 0x80`` or x32 on
  x86-64), where the numbers above mean something else, kills the process too.

Why hand-written BPF and not libseccomp (through pyseccomp or a binding): this is the one
filter we need, about 30 instructions, and it must install on the GPU machines too, whose image we
cannot add packages to (no pyseccomp in the GPU stack) and whose libseccomp.so.2 we cannot
count on. Raw ``seccomp(2)`` through ctypes needs nothing but libc and Linux >= 3.17.

The filter must be installed after the server's own trusted work (torch, CUDA and the
reference are initialised by then) and before any candidate code runs, and never in the
``import`` child: a ``load_inline`` build runs g++, nvcc and ninja.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

# BPF opcodes (linux/bpf_common.h).
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1  # apply to every thread of the process, not just the caller
# Without it the kernel forces speculative-store-bypass mitigation on a filtered process: its
# memory-bound code ran ~1.6x slower on an H100 host, while the baselines' servers (no filter)
# ran at full speed. The candidate's process holds no secret for such an attack to read.
SECCOMP_FILTER_FLAG_SPEC_ALLOW = 4
PR_SET_NO_NEW_PRIVS = 38
CLONE_THREAD = 0x00010000
X32_SYSCALL_BIT = 0x40000000

# The numbers differ per architecture; fork and vfork do not exist on aarch64.
_ARCHES = {
    "x86_64": {"audit_arch": 0xC000003E, "seccomp": 317, "execve": 59, "execveat": 322, "fork": 57,
               "vfork": 58, "clone": 56, "clone3": 435, "sched_setaffinity": 203, "x32": True,
               "mmap": 9, "mprotect": 10, "pkey_mprotect": 329, "mremap": 25, "remap_file_pages": 216,
               "memfd_create": 319, "personality": 135, "unshare": 272, "setns": 308,
               "open": 2, "openat": 257, "creat": 85, "openat2": 437, "ptrace": 101, "process_vm_writev": 311,
               "userfaultfd": 323, "io_uring_setup": 425, "shmat": 30},
    "aarch64": {"audit_arch": 0xC00000B7, "seccomp": 277, "execve": 221, "execveat": 281,
                "clone": 220, "clone3": 435, "sched_setaffinity": 122, "x32": False,
                "mmap": 222, "mprotect": 226, "pkey_mprotect": 288, "mremap": 216, "remap_file_pages": 234,
                "memfd_create": 279, "personality": 92, "unshare": 97, "setns": 268,
                "openat": 56, "openat2": 437, "ptrace": 117, "process_vm_writev": 271, "userfaultfd": 282,
                "io_uring_setup": 425, "shmat": 196},
}
# Refused with EPERM: calls that would let code appear without the kernel naming its file to the
# harness's code sampler (env_pool/trusted/code_sampler.py), or move a mapping under another's name.
_NO_NEW_CODE = ("mremap", "remap_file_pages", "memfd_create", "personality", "unshare", "setns", "creat",
                "ptrace", "process_vm_writev", "userfaultfd", "io_uring_setup")
PROT_WRITE, PROT_EXEC = 0x2, 0x4
MAP_ANONYMOUS = 0x20
O_WRITING = 0x3  # O_WRONLY | O_RDWR: an open for writing
SHM_EXEC = 0o100000  # shmat's flag for an executable attach

# What the harness sees when the filter fires (the server's death signal).
KILL_SIGNAL = signal.SIGSYS.name


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Insn))]


def _program(nums: dict) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k); jumps name labels, which stand as strings before their instruction."""
    prog: list[tuple] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 0, "kill", nums["audit_arch"]),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if nums["x32"]:
        prog.append((_JGE_K, "kill", 0, X32_SYSCALL_BIT))
    for name in ("execve", "execveat", "fork", "vfork"):
        if name in nums:
            prog.append((_JEQ_K, "kill", 0, nums[name]))
    prog += [(_JEQ_K, "eperm", 0, nums["sched_setaffinity"]), (_JEQ_K, "enosys", 0, nums["clone3"])]
    prog += [(_JEQ_K, "eperm", 0, nums[name]) for name in _NO_NEW_CODE if name in nums]
    prog.append((_JEQ_K, "enosys", 0, nums["openat2"]))
    if "open" in nums:
        prog.append((_JEQ_K, "open", 0, nums["open"]))
    prog += [
        (_JEQ_K, "shmat", 0, nums["shmat"]),
        (_JEQ_K, "openat", 0, nums["openat"]),
        (_JEQ_K, "exec_prot", 0, nums["mprotect"]),
        (_JEQ_K, "exec_prot", 0, nums["pkey_mprotect"]),
        (_JEQ_K, "mmap", 0, nums["mmap"]),
        (_JEQ_K, 0, "allow", nums["clone"]),
        (_LD_W_ABS, 0, 0, _ARG0_LOW),  # clone's flags (the first argument on both arches)
        (_JSET_K, "allow", "kill", CLONE_THREAD),
        "mmap",  # executable and writable, or executable and anonymous: code that no file names
        (_LD_W_ABS, 0, 0, _ARG0_LOW + 16),  # prot (the third argument)
        (_JSET_K, 0, "allow", PROT_EXEC),
        (_JSET_K, "eperm", 0, PROT_WRITE),
        (_LD_W_ABS, 0, 0, _ARG0_LOW + 24),  # flags (the fourth)
        (_JSET_K, "eperm", "allow", MAP_ANONYMOUS),
        "open",  # open(path, flags): writing refused
        (_LD_W_ABS, 0, 0, _ARG0_LOW + 8),
        (_JSET_K, "eperm", "allow", O_WRITING),
        "shmat",  # shmat(id, addr, flags): executable SysV shared memory (writable by its other attach) refused
        (_LD_W_ABS, 0, 0, _ARG0_LOW + 16),
        (_JSET_K, "eperm", "allow", SHM_EXEC),
        "openat",  # openat(dirfd, path, flags): writing refused
        (_LD_W_ABS, 0, 0, _ARG0_LOW + 16),
        (_JSET_K, "eperm", "allow", O_WRITING),
        "exec_prot",  # memory made executable after the fact
        (_LD_W_ABS, 0, 0, _ARG0_LOW + 16),
        (_JSET_K, "eperm", "allow", PROT_EXEC),
        "allow", (_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        "kill", (_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        "enosys", (_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS),
        "eperm", (_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
    ]
    labels, insns = {}, []
    for item in prog:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)
    # BPF jumps are relative to the next instruction.
    rel = lambda i, target: target if isinstance(target, int) else labels[target] - i - 1  # noqa: E731
    return [(code, rel(i, jt), rel(i, jf), k) for i, (code, jt, jf, k) in enumerate(insns)]


def forbid_processes() -> None:
    """Install the filter on every thread of this process, for good. Raises OSError when it cannot.

    After it: process creation and exec kill the process (SIGSYS), threads still start, and
    sched_setaffinity fails with EPERM (the CPUs the sandbox gave stay the only ones).
    """
    nums = _ARCHES.get(platform.machine())
    if nums is None:
        raise OSError(errno.ENOSYS, f"no process-blocking seccomp filter for the {platform.machine()} architecture")
    insns = _program(nums)
    array = (_Insn * len(insns))(*[_Insn(*i) for i in insns])
    prog = _Prog(len(insns), ctypes.cast(array, ctypes.POINTER(_Insn)))
    libc = ctypes.CDLL(None, use_errno=True)
    # Required before an unprivileged filter; the sandbox already set it, this is for other callers.
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    ret = libc.syscall(ctypes.c_long(nums["seccomp"]), ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                       ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC | SECCOMP_FILTER_FLAG_SPEC_ALLOW), ctypes.byref(prog))
    if ret != 0:
        err = ctypes.get_errno()
        # With TSYNC a positive return is the id of a thread that could not be synchronised.
        detail = os.strerror(err) if ret < 0 else f"thread {ret} could not take the filter"
        raise OSError(err or errno.EAGAIN, f"seccomp(SET_MODE_FILTER, TSYNC): {detail}")
