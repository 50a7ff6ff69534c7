"""env_pool.candidate.seccomp: the candidate's process may run threads but never start a process or a program.

Each case is a real child process that installs the filter and then does one thing; the
filter's verdict is the child's fate (SIGSYS kill, or a normal exit).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from env_pool.pool import EnvPool
from tasks.loader import load_tasks

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).parent / "env_corpus"

PRELUDE = """
import ctypes, os, sys, threading
sys.path.insert(0, {repo!r})
from env_pool.candidate.seccomp import forbid_processes
libc = ctypes.CDLL(None)
""".format(repo=str(REPO))


def run_filtered(body: str, before: str = "") -> subprocess.CompletedProcess:
    """Run ``before``, install the filter, run ``body``; the child prints 'survived' if it lives."""
    code = PRELUDE + textwrap.dedent(before) + "\nforbid_processes()\n" + textwrap.dedent(body) + "\nprint('survived', flush=True)\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def assert_killed(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == -signal.SIGSYS, (
        f"{what} was not stopped by the filter: exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr[-2000:]}")
    assert "survived" not in proc.stdout


@pytest.mark.parametrize("what, body", [
    ("libc system()", "libc.system(b'true')"),
    ("libc fork()", "libc.fork()"),
    ("libc vfork()", "libc.vfork()"),
    ("execv of a program", "os.execv('/bin/true', ['true'])"),
    ("posix_spawn", "os.posix_spawn('/bin/true', ['true'], {})"),
    ("subprocess.run", "import subprocess; subprocess.run(['true'])"),
])
def test_process_creation_and_exec_kill_the_process(what: str, body: str):
    assert_killed(run_filtered(body), what)


def test_threads_still_start_after_the_filter():
    proc = run_filtered("""
        out = []
        ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]
        for t in ts: t.start()
        for t in ts: t.join()
        assert sorted(out) == list(range(8)), out
    """)
    assert proc.returncode == 0 and "survived" in proc.stdout, proc.stderr[-2000:]


def test_a_thread_started_before_the_filter_is_covered_too():
    # TSYNC: threads that already exist (an OpenMP pool, CUDA's helpers) get the filter as well.
    proc = run_filtered(before="""
        go = threading.Event()
        def late_fork():
            go.wait()
            libc.fork()
        t = threading.Thread(target=late_fork); t.start()
    """, body="go.set(); t.join()")
    assert_killed(proc, "fork() from a thread that predates the filter")


needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to try widening one")


@needs_two_cpus
def test_the_cpu_set_cannot_be_widened():
    # The sandbox pins a run to its CPUs (SandboxLimits.cpus); the candidate must not undo it,
    # neither from Python nor from native code (pthread_setaffinity_np is the same system call).
    proc = run_filtered(before="os.sched_setaffinity(0, {0})", body="""
        try:
            os.sched_setaffinity(0, {0, 1})
            print("WIDENED from Python")
        except PermissionError:
            print("python refused")
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_ulong(0b11)
        if libc.sched_setaffinity(0, ctypes.sizeof(mask), ctypes.byref(mask)) == 0:
            print("WIDENED from libc")
        else:
            print("libc refused", os.strerror(ctypes.get_errno()))
        def in_thread():
            print("thread refused" if libc.sched_setaffinity(0, ctypes.sizeof(mask), ctypes.byref(mask)) else "WIDENED from a thread")
        t = threading.Thread(target=in_thread); t.start(); t.join()
        print("affinity", sorted(os.sched_getaffinity(0)))
    """)
    assert proc.returncode == 0 and "survived" in proc.stdout, proc.stderr[-2000:]
    assert "WIDENED" not in proc.stdout, proc.stdout
    assert "python refused" in proc.stdout and "libc refused Operation not permitted" in proc.stdout
    assert "thread refused" in proc.stdout and "affinity [0]" in proc.stdout


def test_torch_openmp_threads_work_under_the_filter():
    proc = run_filtered(before="""
        import torch
        torch.set_num_threads(2)
    """, body="""
        a = torch.randn(512, 512)
        assert torch.allclose((a @ a).sum(), (a.double() @ a.double()).sum().float(), rtol=1e-3)
    """)
    assert proc.returncode == 0 and "survived" in proc.stdout, proc.stderr[-2000:]


def test_legitimate_openmp_kernel_passes_with_the_filter_on(tmp_path):
    # Two threads: libgomp starts its pool inside forward, after the filter is installed.
    pool = EnvPool({"work_dir": str(tmp_path), "threads": 2, "run_timeout_s": 60.0})
    assert pool.ctx.cfg.seccomp
    task = {t.id: t for t in load_tasks()[0]}["level1/01_gelu"]
    files = {p.name: p.read_text() for p in (CORPUS / "legit" / "gelu_omp").iterdir() if p.name != "case.json"}
    result = asyncio.run(pool.evaluate(task, files, "verify"))
    assert result.failure is None, f"{result.failure}: {result.message}\n{result.run_log[-2000:]}"
    assert all(c.passed for c in result.checks) and len(result.checks) == 5


def test_code_that_no_file_names_is_refused_and_files_still_load(tmp_path):
    # The harness's code sampler attributes every sampled instruction to the file mapped there;
    # code in anonymous or re-labelled memory must not exist (env_pool/trusted/code_sampler.py).
    source = tmp_path / "k.c"
    source.write_text("int twice(int x) { return 2 * x; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(tmp_path / "k.so")], check=True)
    proc = run_filtered(f"""
        import mmap
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        def refused(name, ret):
            print(name, "refused" if ret in (-1, ctypes.c_void_p(-1).value) and ctypes.get_errno() == 1 else f"ALLOWED {{ret}}")
        refused("anonymous exec mmap", libc.mmap(None, 4096, 7, 0x22, -1, 0))
        page = libc.mmap(None, 4096, 3, 0x22, -1, 0)
        refused("mprotect to exec", libc.mprotect(ctypes.c_void_p(page), 4096, 5))
        refused("memfd_create", libc.memfd_create(b"x", 0))
        libc.mremap.restype = ctypes.c_void_p
        refused("mremap", libc.mremap(ctypes.c_void_p(page), 4096, 8192, 1))
        refused("personality", libc.personality(0x0400000))
        refused("unshare", libc.unshare(0x10000000))
        print("dlopen", ctypes.CDLL({str(tmp_path / 'k.so')!r}).twice(21))
    """)
    assert proc.returncode == 0 and "survived" in proc.stdout, proc.stderr[-2000:]
    for name in ("anonymous exec mmap", "mprotect to exec", "memfd_create", "mremap", "personality", "unshare"):
        assert f"{name} refused" in proc.stdout, proc.stdout
    assert "dlopen 42" in proc.stdout


def test_the_code_of_a_file_cannot_be_changed_in_memory_and_files_still_read(tmp_path):
    # The sampler counts code in kernel.so's mapping as the candidate's own: that code must be
    # the file's. Two routes changed it: a private writable and executable mapping of the file
    # (a library's code copied into its padding) and /proc/self/mem, which writes through a
    # read-only mapping. Reading files, the solution's own imports included, still works.
    source = tmp_path / "k.c"
    source.write_text("int twice(int x) { return 2 * x; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(tmp_path / "k.so")], check=True)
    proc = run_filtered(f"""
        import errno, json
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.syscall.restype = ctypes.c_long
        def refused(name, ret, code=errno.EPERM):
            ok = ret in (-1, ctypes.c_void_p(-1).value) and ctypes.get_errno() == code
            print(name, "refused" if ok else f"ALLOWED {{ret}} errno {{ctypes.get_errno()}}")
        fd = os.open({str(tmp_path / 'k.so')!r}, os.O_RDONLY)
        refused("writable exec mmap of a file", libc.mmap(None, 4096, 7, 0x02, fd, 0))  # PROT_RWX, MAP_PRIVATE
        refused("open /proc/self/mem for writing", libc.open(b"/proc/self/mem", os.O_RDWR))
        refused("openat /proc/self/mem for writing", libc.openat(-100, b"/proc/self/mem", os.O_WRONLY))
        refused("openat2", libc.syscall(437, -100, b"/proc/self/mem", None, 0), errno.ENOSYS)
        refused("ptrace", libc.ptrace(16, os.getppid(), None, None))  # PTRACE_ATTACH
        refused("process_vm_writev", libc.syscall(311, os.getpid(), None, 0, None, 0, 0))
        refused("userfaultfd", libc.syscall(323, 0))
        refused("io_uring_setup", libc.syscall(425, 8, None))
        libc.shmat.restype = ctypes.c_void_p
        refused("shmat executable", libc.shmat(libc.shmget(0, 4096, 0o1600), None, 0o100000))
        print("mapped read-exec", libc.mmap(None, 4096, 5, 0x02, fd, 0) not in (None, ctypes.c_void_p(-1).value))
        print("read", len(open({str(source)!r}).read()), json.dumps(1), ctypes.CDLL({str(tmp_path / 'k.so')!r}).twice(21))
    """)
    assert proc.returncode == 0 and "survived" in proc.stdout, proc.stderr[-2000:]
    for name in ("writable exec mmap of a file", "open /proc/self/mem for writing", "openat /proc/self/mem for writing",
                 "openat2", "ptrace", "process_vm_writev", "userfaultfd", "io_uring_setup", "shmat executable"):
        assert f"{name} refused" in proc.stdout, proc.stdout
    assert "mapped read-exec True" in proc.stdout and "read 35 1 42" in proc.stdout, proc.stdout
