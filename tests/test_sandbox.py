"""env_pool.isolation.sandbox: real child processes, each hostile case a small Python program."""
from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import psutil
import pytest

from env_pool.isolation import sandbox
from env_pool.isolation.sandbox import UNTRUSTED_ISOLATION, SandboxError, SandboxLimits, SandboxOutcome, run_sandboxed
from env_pool.isolation.sandbox_channels import HeadTail

REPO = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(REPO)}


def run(code: str, scratch: Path, payload: bytes = b"", **limits) -> SandboxOutcome:
    limits.setdefault("wall_s", 20.0)
    return run_sandboxed(
        [sys.executable, "-c", textwrap.dedent(code)], payload, scratch, SandboxLimits(**limits), env=ENV
    )


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != os.getpid() and marker in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def assert_no_survivors(marker: str) -> None:
    deadline = time.monotonic() + 3.0
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = marked_processes(marker)
    for p in left:  # do not leave them behind even when the test fails
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"processes outlived the evaluation: {left}"


@pytest.fixture
def outside_tmp():
    """A directory on the real root filesystem (not /tmp, which the sandbox replaces)."""
    d = Path(tempfile.mkdtemp(prefix="sandbox-test-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# ---- normal runs ------------------------------------------------------------------------------


def test_normal_child_returns_result_and_output(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_TEST_SECRET", "hunter2")
    out = run(
        """
        import os, sys
        from env_pool.isolation.result_channel import child_result_channel
        channel = child_result_channel()
        data = sys.stdin.buffer.read()
        print("payload", len(data), "home", os.environ["HOME"], "cwd", os.getcwd())
        print("secret" if "CUDA_AGENT_TEST_SECRET" in os.environ else "clean env")
        print("to stderr", file=sys.stderr)
        open("written.txt", "w").write("ok")
        channel.write(data[::-1])
        channel.close()
        """,
        tmp_path,
        payload=b"hello sandbox",
    )
    assert out.failure is None, out
    assert out.returncode == 0 and out.signal_name is None
    assert out.result == b"xobdnas olleh"
    assert f"payload 13 home {tmp_path} cwd {tmp_path}" in out.output
    assert "clean env" in out.output and "to stderr" in out.output
    assert (tmp_path / "written.txt").read_text() == "ok"
    assert {"session", "rss-watchdog", "wall-clock", "tree-kill"} <= set(out.isolation)
    assert 0 < out.wall_s < 20


def test_clean_exit_without_result_is_not_a_failure(tmp_path):
    out = run("print('compiled')", tmp_path)
    assert out.failure is None and out.result is None and "compiled" in out.output


def test_nonzero_exit_without_result_is_a_crash(tmp_path):
    out = run("import sys; print('boom'); sys.exit(3)", tmp_path)
    assert out.returncode == 3 and out.failure == "crash"
    answered = run(
        """
        import sys
        from env_pool.isolation.result_channel import child_result_channel
        child_result_channel().write(b"error report")
        sys.exit(3)
        """,
        tmp_path,
    )
    assert answered.returncode == 3 and answered.result == b"error report" and answered.failure is None


# ---- hangs and crashes ------------------------------------------------------------------------


def test_infinite_loop_times_out(tmp_path):
    t0 = time.monotonic()
    out = run("while True: pass", tmp_path, wall_s=1.0)
    assert out.timed_out and out.failure == "timeout"
    assert out.signal_name == "SIGKILL"
    assert time.monotonic() - t0 < 6


def test_sleeping_child_times_out(tmp_path):
    out = run("import time; time.sleep(60)", tmp_path, wall_s=0.5)
    assert out.timed_out and out.failure == "timeout" and out.wall_s < 3


def test_cpu_limit(tmp_path):
    out = run("while True: pass", tmp_path, wall_s=15.0, cpu_s=1.0)
    assert out.cpu_limited and not out.timed_out, out
    assert out.failure == "timeout" and out.signal_name in ("SIGXCPU", "SIGKILL")


@pytest.mark.parametrize(
    "code",
    [
        "import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGSEGV)",
        "import ctypes; print('before', flush=True); ctypes.string_at(0)",
    ],
    ids=["kill-self", "null-deref"],
)
def test_segfault_is_a_crash(tmp_path, code):
    out = run(code, tmp_path)
    assert out.signal_name == "SIGSEGV" and out.returncode is None
    assert out.failure == "crash" and "before" in out.output
    assert not list(tmp_path.glob("core*"))  # RLIMIT_CORE=0


def test_abort_is_a_crash(tmp_path):
    out = run("import os; os.abort()", tmp_path)
    assert out.signal_name == "SIGABRT" and out.failure == "crash"


# ---- memory -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(20 << 30)",
        "import numpy; x = numpy.ones(20 << 27)",  # 20 GiB of float64
    ],
    ids=["bytearray", "numpy"],
)
def test_memory_bomb_fails_allocation(tmp_path, code):
    """CPU runs: RLIMIT_AS makes the 20 GiB allocation fail at once (MemoryError)."""
    out = run(code, tmp_path, memory_mb=2048)
    assert out.out_of_memory and out.failure == "out_of_memory", out
    assert "MemoryError" in out.output


@pytest.mark.parametrize("use_gpu", [False, True], ids=["cpu", "gpu-mode-no-rlimit-as"])
def test_memory_bomb_killed_by_watchdog(tmp_path, use_gpu):
    """Memory touched step by step (and, in GPU mode, no RLIMIT_AS at all): the watchdog kills."""
    code = """
        chunks = []
        while True:
            chunks.append(b"x" * (64 << 20))
        """
    out = run(code, tmp_path, memory_mb=1024, use_gpu=use_gpu)
    assert out.out_of_memory and out.failure == "out_of_memory", out
    assert out.signal_name == "SIGKILL"
    assert ("rlimit-as" in out.isolation) is (not use_gpu)
    assert psutil.virtual_memory().available > 2 << 30  # the machine is fine


# ---- processes ----------------------------------------------------------------------------------


def test_forked_children_are_all_killed(tmp_path):
    marker = f"sandbox-fork-{uuid.uuid4().hex}"
    out = run(
        f"""
        # {marker}
        import os, time
        pids = []
        for _ in range(50):
            pid = os.fork()
            if pid == 0:
                time.sleep(300)
                os._exit(0)
            pids.append(pid)
        print("forked", len(pids))
        """,
        tmp_path,
    )
    assert "forked 50" in out.output and out.failure is None
    assert_no_survivors(marker)


def test_daemonised_grandchild_does_not_outlive_the_evaluation(tmp_path):
    marker = f"sandbox-daemon-{uuid.uuid4().hex}"
    out = run(
        f"""
        # {marker}
        import os, time
        if os.fork() == 0:
            os.setsid()  # leaves the process group
            if os.fork() == 0:
                open("daemon_started", "w").close()
                time.sleep(300)
            os._exit(0)
        while not os.path.exists("daemon_started"):
            time.sleep(0.01)
        print("daemon running")
        """,
        tmp_path,
    )
    assert "daemon running" in out.output and (tmp_path / "daemon_started").exists()
    assert_no_survivors(marker)


def test_timeout_kills_the_whole_tree(tmp_path):
    marker = f"sandbox-tree-{uuid.uuid4().hex}"
    out = run(
        f"""
        # {marker}
        import os, subprocess, sys, time
        for _ in range(5):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}"],
                             start_new_session=True)
        time.sleep(300)
        """,
        tmp_path,
        wall_s=2.0,
    )
    assert out.timed_out
    assert_no_survivors(marker)


def test_fork_bomb_is_capped_by_pids_cgroup(tmp_path):
    marker = f"sandbox-bomb-{uuid.uuid4().hex}"
    out = run(
        f"""
        # {marker}
        import os, time
        ok = failed = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                failed += 1
                continue
            if pid == 0:
                time.sleep(300)
                os._exit(0)
            ok += 1
        print("forked", ok, "refused", failed)
        """,
        tmp_path,
        max_pids=64,
    )
    if "cgroup-pids" not in out.isolation:
        assert_no_survivors(marker)
        pytest.skip("no pids cgroup on this machine: fork bombs are bounded by memory and wall clock")
    forked = int(out.output.split("forked ")[1].split()[0])
    assert forked < 64 and "refused" in out.output
    assert_no_survivors(marker)


# ---- network ------------------------------------------------------------------------------------


def test_network_is_unreachable(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []

    def serve():
        server.settimeout(15)
        try:
            while True:
                conn, _ = server.accept()
                accepted.append(conn)
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    code = f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
            print("CONNECTED")
        except OSError as e:
            print("BLOCKED", e)
        """
    try:
        allowed = run(code, tmp_path, allow_network=True)
        assert "CONNECTED" in allowed.output  # the server is reachable without isolation
        out = run(code, tmp_path)
        if "netns" not in out.isolation:
            pytest.skip("network namespaces unavailable on this machine")
        assert "BLOCKED" in out.output, out.output
        assert len(accepted) == 1
    finally:
        server.close()


# ---- filesystem -------------------------------------------------------------------------------


def test_filesystem_is_read_only_outside_scratch(tmp_path):
    name = f"should_not_exist_{uuid.uuid4().hex}"
    targets = [REPO / name, Path("/root") / name, Path(sys.executable).parent / name]
    out = run(
        f"""
        import os
        for path in {[str(t) for t in targets]!r}:
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as e:
                print("refused", path, e.strerror)
        open("inside.txt", "w").write("fine")
        os.makedirs(os.environ["TMPDIR"], exist_ok=True)
        open(os.path.join(os.environ["TMPDIR"], "t"), "w").write("fine")
        open("/tmp/{name}", "w").write("private tmp")
        open("/dev/shm/{name}", "w").write("private shm")
        open("/dev/null", "w").write("discarded")
        for path in ["/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname", "/proc/sysrq-trigger",
                     "/proc/irq/default_smp_affinity"]:
            try:
                os.close(os.open(path, os.O_WRONLY))
                print("OPENED", path)
            except OSError as e:
                print("refused", path, e.strerror)
        open("/proc/self/comm", "w").write("renamed")  # libcuda needs its own /proc entries writable
        print("comm:", open("/proc/self/comm").read().strip())
        print("dev:", sorted(os.listdir("/dev")))
        print("caps:", [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0])
        print("procs:", len([p for p in os.listdir("/proc") if p.isdigit()]))
        """,
        tmp_path,
    )
    try:
        assert out.failure is None, out
        if "readonly-root" not in out.isolation:
            pytest.skip("mount namespaces unavailable on this machine")
        assert "WROTE" not in out.output and "OPENED" not in out.output, out.output
        assert all(not t.exists() for t in targets)
        assert (tmp_path / "inside.txt").read_text() == "fine"
        assert (tmp_path / "tmp" / "t").read_text() == "fine"
        assert not Path(f"/tmp/{name}").exists() and not Path(f"/dev/shm/{name}").exists()
        dev = out.output.split("dev: ")[1].splitlines()[0]
        assert "'null'" in dev and "vda" not in dev and "loop0" not in dev
        assert "caps: 0000000000000000" in out.output
        assert "comm: renamed" in out.output
        if "pidns" in out.isolation:
            assert int(out.output.split("procs: ")[1].split()[0]) <= 3  # init, the child, maybe ls
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_scratch_outside_tmp_is_writable(outside_tmp):
    out = run("open('x.txt', 'w').write('ok'); print(open('x.txt').read())", outside_tmp)
    assert out.failure is None and "ok" in out.output
    assert (outside_tmp / "x.txt").read_text() == "ok"


def test_hidden_paths_are_invisible(tmp_path, outside_tmp):
    private = outside_tmp / "private"
    private.mkdir()
    (private / "expected.txt").write_text("the answer is 42")
    secret_file = outside_tmp / "seed.txt"
    secret_file.write_text("1234")
    out = run_sandboxed(
        [sys.executable, "-c", textwrap.dedent(f"""
            import ctypes, os
            print("listing:", os.listdir({str(private)!r}))
            for path in [{str(private / "expected.txt")!r}, {str(secret_file)!r}]:
                try:
                    print("READ", repr(open(path).read()))
                except OSError as e:
                    print("unreadable", e.strerror)
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.umount2({str(private).encode()!r}, 2) == 0:
                print("UNMOUNTED", os.listdir({str(private)!r}))
            else:
                print("umount refused", os.strerror(ctypes.get_errno()))
            """)],
        b"", tmp_path, SandboxLimits(wall_s=20, hidden_paths=[private]), env=ENV,
        hidden_paths=[secret_file],
    )
    if "hidden-paths" not in out.isolation:
        pytest.skip("mount namespaces unavailable on this machine")
    assert "listing: []" in out.output
    assert "the answer" not in out.output and "1234" not in out.output and "READ" not in out.output.replace("READ ''", "")
    assert "UNMOUNTED" not in out.output and "umount refused" in out.output
    assert (private / "expected.txt").read_text() == "the answer is 42"  # untouched outside


def test_required_isolation_missing_refuses_to_run(tmp_path):
    with pytest.raises(SandboxError, match="no-such-protection"):
        run("open('ran', 'w')", tmp_path, required_isolation=("no-such-protection",))
    assert not (tmp_path / "ran").exists()


def test_unexecutable_program_is_a_sandbox_error(tmp_path):
    with pytest.raises(SandboxError, match="could not execute"):
        run_sandboxed(["/nonexistent/program"], b"", tmp_path, SandboxLimits(wall_s=10))


# ---- I/O --------------------------------------------------------------------------------------


def test_large_output_is_trimmed_and_bounded(tmp_path):
    tracemalloc.start()
    try:
        out = run(
            """
            import sys
            sys.stdout.write("FIRST LINE\\n")
            line = "y" * 99 + "\\n"
            for _ in range(100_000):
                sys.stdout.write(line)
            sys.stdout.write("LAST LINE\\n")
            """,
            tmp_path,
            max_output_chars=4000,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.failure is None
    assert out.output.startswith("FIRST LINE") and out.output.rstrip().endswith("LAST LINE")
    assert "bytes of output cut" in out.output and len(out.output) < 4200
    assert peak < 4 << 20, f"parent kept {peak} bytes for 10 MB of output"


def test_child_that_never_reads_stdin_completes(tmp_path):
    out = run("print('not reading')", tmp_path, payload=b"z" * (50 << 20))
    assert out.failure is None and "not reading" in out.output and out.wall_s < 10


def test_large_result_round_trips(tmp_path):
    out = run(
        """
        from env_pool.isolation.result_channel import child_result_channel
        with child_result_channel() as ch:
            ch.write(b"r" * (20 << 20))
        """,
        tmp_path,
    )
    assert out.failure is None and out.result == b"r" * (20 << 20)


def test_concurrent_runs_do_not_mix(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    code = """
        import sys
        from env_pool.isolation.result_channel import child_result_channel
        ch = child_result_channel()
        data = sys.stdin.buffer.read()
        print("run", data.decode())
        ch.write(data * 3)
        """

    def one(i: int) -> SandboxOutcome:
        return run(code, tmp_path / f"run{i}", payload=str(i).encode())

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(one, range(4)))
    for i, out in enumerate(outs):
        assert out.failure is None and out.result == str(i).encode() * 3 and f"run {i}" in out.output


def test_head_tail_buffer():
    buf = HeadTail(10)
    for chunk in [b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"]:
        buf.add(chunk)
    assert buf.text() == "abcde\n[... 16 bytes of output cut ...]\nvwxyz"
    small = HeadTail(100)
    small.add(b"short")
    assert small.text() == "short"


def test_failure_kinds():
    base = dict(returncode=0, signal_name=None, timed_out=False, out_of_memory=False, cpu_limited=False,
                output="", result=b"r", wall_s=1.0)
    assert SandboxOutcome(**base).failure is None
    assert SandboxOutcome(**{**base, "timed_out": True, "signal_name": "SIGKILL"}).failure == "timeout"
    assert SandboxOutcome(**{**base, "cpu_limited": True}).failure == "timeout"
    assert SandboxOutcome(**{**base, "out_of_memory": True}).failure == "out_of_memory"
    assert SandboxOutcome(**{**base, "returncode": None, "signal_name": "SIGSEGV"}).failure == "crash"
    assert SandboxOutcome(**{**base, "returncode": 1, "result": None}).failure == "crash"
    assert SandboxOutcome(**{**base, "returncode": 1}).failure is None


# ---- torch ------------------------------------------------------------------------------------


def test_torch_works_under_default_limits(tmp_path):
    out = run_sandboxed(
        [sys.executable, "-c", "import torch; print('sum', torch.randn(1000, 1000).sum().item())"],
        b"", tmp_path, SandboxLimits(),
    )
    assert out.failure is None, out.output
    assert "sum " in out.output
    assert "rlimit-as" in out.isolation


@pytest.mark.gpu
def test_cuda_works_with_every_isolation(tmp_path):
    code = "import torch; x = torch.randn(1024, 1024, device='cuda'); print('cuda ok', (x @ x).sum().item())"
    out = run_sandboxed([sys.executable, "-c", code], b"", tmp_path, SandboxLimits(wall_s=120, use_gpu=True))
    assert out.failure is None, out.output
    assert "cuda ok" in out.output
    for protection in ("netns", "pidns", "procfs", "readonly-root", "private-dev", "no-caps"):
        assert protection in out.isolation, f"{protection} not applied on this machine: {out.isolation}"
    hidden = run_sandboxed([sys.executable, "-c", code], b"", tmp_path, SandboxLimits(wall_s=120))
    assert hidden.failure == "crash"  # CPU runs see no GPU at all


def test_sources_under_tmp_stay_importable_while_the_rest_of_tmp_is_private(tmp_path):
    # A checkout (CI's, say) or venv under /tmp must survive the child's private /tmp.
    code_dir = Path(tempfile.mkdtemp(prefix="sandbox-src-", dir="/tmp"))
    secret = Path(tempfile.mkdtemp(prefix="sandbox-secret-", dir="/tmp"))
    try:
        (code_dir / "visible_mod.py").write_text("VALUE = 42\n")
        (secret / "s.txt").write_text("secret")
        env = {**ENV, "PYTHONPATH": f"{code_dir}{os.pathsep}{ENV.get('PYTHONPATH', '')}"}
        code = f"import os, visible_mod; print(visible_mod.VALUE, os.path.exists({str(secret)!r}))"
        out = run_sandboxed([sys.executable, "-c", code], b"", tmp_path, SandboxLimits(wall_s=20.0), env=env)
        assert out.returncode == 0, out.output
        assert "42 False" in out.output
    finally:
        shutil.rmtree(code_dir, ignore_errors=True)
        shutil.rmtree(secret, ignore_errors=True)


@pytest.mark.parametrize("method", ["mount_setattr", "remount"])
def test_checkout_and_venv_bound_back_under_tmp_are_read_only(tmp_path, monkeypatch, method):
    # A clone and a venv under /tmp are bound back into the private /tmp (_paths_to_keep): the
    # candidate must be able to import from them and never to change them.
    if method == "remount":  # kernels before 5.12: mount_setattr fails (ENOSYS), one remount per mount
        source = sandbox._shim_source().replace("SYS_MOUNT_SETATTR = 442", "SYS_MOUNT_SETATTR = 99999")
        monkeypatch.setattr(sandbox, "_shim_source", lambda: source)
    checkout = Path(tempfile.mkdtemp(prefix="sandbox-checkout-", dir="/tmp"))
    venv = Path(tempfile.mkdtemp(prefix="sandbox-venv-", dir="/tmp"))
    try:
        (checkout / "pkg_mod.py").write_text("VALUE = 'from the checkout'\n")
        site = venv / "lib" / "site-packages"
        site.mkdir(parents=True)
        (site / "venv_mod.py").write_text("VALUE = 'from the venv'\n")
        (venv / "bin").mkdir()
        python = venv / "bin" / "python"
        python.symlink_to(sys.executable)
        code = textwrap.dedent(f"""
            import os, pkg_mod, venv_mod
            print("read:", pkg_mod.VALUE, "/", venv_mod.VALUE)
            for d in {[str(checkout), str(site), str(venv / "bin")]!r}:
                attempts = [
                    ("write", lambda: open(os.path.join(d, os.listdir(d)[0]), "a").write("x")),
                    ("create", lambda: open(os.path.join(d, "new_file"), "w").write("x")),
                    ("mkdir", lambda: os.mkdir(os.path.join(d, "new_dir"))),
                    ("delete", lambda: os.remove(os.path.join(d, os.listdir(d)[0]))),
                ]
                for what, attempt in attempts:
                    try:
                        attempt()
                        print("CHANGED", what, d)
                    except OSError as e:
                        print("refused", what, e.strerror)
            open("scratch.txt", "w").write("fine")
            """)
        env = {"PYTHONPATH": f"{checkout}{os.pathsep}{site}"}
        out = run_sandboxed([str(python), "-c", code], b"", tmp_path, SandboxLimits(wall_s=20.0), env=env)
        assert out.failure is None, out.output
        assert "read: from the checkout / from the venv" in out.output
        assert "readonly-root" in out.isolation, out.isolation
        assert "CHANGED" not in out.output, out.output
        assert out.output.count("refused ") == 12  # EROFS (ETXTBSY for the running interpreter)
        assert (tmp_path / "scratch.txt").read_text() == "fine"
        assert sorted(p.name for p in checkout.iterdir()) == ["pkg_mod.py"]
        assert sorted(p.name for p in site.iterdir()) == ["venv_mod.py"]
        assert (checkout / "pkg_mod.py").read_text() == "VALUE = 'from the checkout'\n"
        assert python.is_symlink() and sorted(p.name for p in (venv / "bin").iterdir()) == ["python"]
    finally:
        shutil.rmtree(checkout, ignore_errors=True)
        shutil.rmtree(venv, ignore_errors=True)


# ---- what a run requires --------------------------------------------------------------------------


def test_untrusted_isolation_is_there_and_required(tmp_path, outside_tmp):
    secret = outside_tmp / "expected"
    secret.mkdir()
    (secret / "answer.txt").write_text("42")
    code = f"import os; print('listing:', os.listdir({str(secret)!r}))"
    limits = dict(required_isolation=UNTRUSTED_ISOLATION, hidden_paths=[secret])
    out = run(code, tmp_path, **limits)
    assert out.failure is None and "listing: []" in out.output, out.output
    assert set(UNTRUSTED_ISOLATION) <= set(out.isolation)
    for missing in ("pidns", "hidden-paths", "readonly-root", "netns"):
        with pytest.raises(SandboxError, match=f"required isolation unavailable: {missing}"):
            run("open('ran', 'w')", tmp_path, skip_isolation=(missing,), **limits)
    assert not (tmp_path / "ran").exists()


def test_hidden_paths_is_only_reported_when_something_was_hidden(tmp_path, outside_tmp):
    assert "hidden-paths" not in run("pass", tmp_path).isolation  # nothing to hide: nothing reported
    (outside_tmp / "seed.txt").write_text("1234")
    skipped = run(f"print(open({str(outside_tmp / 'seed.txt')!r}).read())", tmp_path,
                  hidden_paths=[outside_tmp], skip_isolation=("hidden-paths",))
    assert "1234" in skipped.output and "hidden-paths" not in skipped.isolation  # not hidden: not reported


# ---- CPUs ---------------------------------------------------------------------------------------


def test_cpus_pin_the_child_and_its_threads(tmp_path):
    out = run(
        """
        import os, threading
        seen = []
        t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
        t.start(); t.join()
        print("main", sorted(os.sched_getaffinity(0)), "thread", seen[0])
        """,
        tmp_path,
        cpus=(0,),
    )
    assert out.failure is None, out.output
    assert "main [0] thread [0]" in out.output
    assert "cpu-affinity" in out.isolation


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to try widening one")
def test_the_candidate_cannot_widen_its_cpus_after_the_seccomp_filter(tmp_path):
    out = run(
        """
        import ctypes, os
        from env_pool.candidate.seccomp import forbid_processes
        forbid_processes()
        try:
            os.sched_setaffinity(0, {0, 1})
            print("WIDENED")
        except PermissionError:
            print("refused")
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_ulong(0b11)
        print("libc", libc.sched_setaffinity(0, ctypes.sizeof(mask), ctypes.byref(mask)), os.strerror(ctypes.get_errno()))
        print("affinity", sorted(os.sched_getaffinity(0)))
        """,
        tmp_path,
        cpus=(0,),
    )
    assert out.failure is None, out.output
    assert "refused" in out.output and "WIDENED" not in out.output
    assert "libc -1 Operation not permitted" in out.output and "affinity [0]" in out.output


# ---- a view of chosen paths only (the compiler's) --------------------------------------------------


def test_visible_paths_are_all_the_child_sees(tmp_path, outside_tmp):
    real = outside_tmp / "toolkit-1.0"
    (real / "bin").mkdir(parents=True)
    (real / "bin" / "tool").write_text("tool\n")
    (outside_tmp / "toolkit").symlink_to("toolkit-1.0")  # as /usr/local/cuda -> cuda-13.0
    (outside_tmp / "beside.txt").write_text("not listed")
    system = [p for p in ("/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache") if os.path.lexists(p)]
    script = f"""
        ls -a /
        for p in /work /root /home /etc/passwd /etc/hostname {REPO} {sys.prefix} {outside_tmp}/beside.txt; do
            test -e "$p" && echo "VISIBLE $p"
        done
        cat {outside_tmp}/toolkit/bin/tool
        echo "link: $(readlink {outside_tmp}/toolkit)"
        for p in /usr/x {outside_tmp}/toolkit/bin/x /x /etc/x; do
            touch "$p" 2>/dev/null && echo "WROTE $p"
        done
        echo scratch > scratch.txt && echo "scratch ok"
        echo tmp > /tmp/t && echo "tmp ok"
        ls /tmp
        """
    out = run_sandboxed(
        ["sh", "-c", textwrap.dedent(script)], b"", tmp_path,
        SandboxLimits(wall_s=20.0, visible_paths=(*system, str(outside_tmp / "toolkit")),
                      required_isolation=("visible-only", "readonly-root", "pidns")),
        env={"PATH": "/usr/bin:/bin"}, inherit_env=False,
    )
    assert out.failure is None, out.output
    assert "VISIBLE" not in out.output and "WROTE" not in out.output, out.output
    assert "tool\n" in out.output and "link: toolkit-1.0" in out.output
    assert "scratch ok" in out.output and "tmp ok" in out.output
    lines = out.output.splitlines()
    root = set(lines[: lines.index("tool")])  # `ls -a /`, up to the tool's output
    assert root <= {".", "..", "usr", "bin", "lib", "lib64", "etc", "var", "tmp", "dev", "proc"}, root
    assert (tmp_path / "scratch.txt").read_text() == "scratch\n"
    assert not (real / "bin" / "x").exists()


# ---- a run started ahead of its payload (WarmStart: env_pool/trusted/server_pool.py's warm servers) -----------


def start_warm(code: str, scratch: Path, **limits) -> tuple[sandbox.WarmStart, dict, threading.Thread]:
    warm, box = sandbox.WarmStart(), {}
    limits.setdefault("wall_s", 20.0)
    thread = threading.Thread(target=lambda: box.setdefault("out", run_sandboxed(
        [sys.executable, "-c", textwrap.dedent(code)], warm, scratch, SandboxLimits(**limits), env=ENV)))
    thread.start()
    return warm, box, thread


def wait_for_members(warm: sandbox.WarmStart, count: int = 3) -> set[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        members = warm.members() if warm.members else set()
        if len(members) >= count:
            return members
        time.sleep(0.05)
    raise AssertionError("the warm run did not start")


def test_a_warm_run_waits_for_its_payload_and_its_wall_clock_starts_when_given(tmp_path):
    warm, box, thread = start_warm("""
        import sys, time
        data = sys.stdin.buffer.read()
        print("got", data.decode())
        if data == b"sleep":
            time.sleep(60)
        """, tmp_path, wall_s=2.0)
    wait_for_members(warm)
    time.sleep(3.0)  # longer than its wall limit: waiting is not running
    warm.give(b"hello")
    thread.join(30)
    out = box["out"]
    assert out.failure is None and "got hello" in out.output, out.output
    assert out.wall_s < 2.0, f"the wall clock ran before the payload was given: {out.wall_s}"

    warm, box, thread = start_warm("import sys, time\nif sys.stdin.buffer.read() == b'sleep': time.sleep(60)\n",
                                   tmp_path / "b", wall_s=2.0)
    warm.give(b"sleep")
    thread.join(30)
    assert box["out"].timed_out and 2.0 <= box["out"].wall_s < 10, box["out"]


def test_a_cancelled_warm_run_ends_without_being_fed(tmp_path):
    warm, box, thread = start_warm("import sys\nprint('fed', len(sys.stdin.buffer.read()))\n", tmp_path)
    wait_for_members(warm)
    begin = time.monotonic()
    warm.cancel()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - begin < 10
    assert "fed 0" in box["out"].output or box["out"].signal_name == "SIGKILL", box["out"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to move a run between them")
def test_given_a_warm_run_moves_every_thread_to_its_cpus_before_it_reads_the_payload(tmp_path):
    first, second = sorted(os.sched_getaffinity(0))[:2]
    warm, box, thread = start_warm("""
        import os, sys, threading, time
        started = threading.Event()
        def idle():  # a thread started during the start-up, on the start-up's CPUs
            started.set()
            time.sleep(30)
        threading.Thread(target=idle, daemon=True).start()
        started.wait()
        print("before", sorted(os.sched_getaffinity(0)))
        sys.stdin.buffer.read()
        tasks = sorted(os.listdir("/proc/self/task"))
        print("after", sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in tasks}), len(tasks))
        """, tmp_path, cpus=(first,))
    wait_for_members(warm)
    time.sleep(1.0)
    warm.give(b"go", cpus=(second,))
    thread.join(30)
    out = box["out"]
    assert out.failure is None, out.output
    assert f"before [{first}]" in out.output and f"after [({second},)] 2" in out.output, out.output


def test_a_paused_warm_run_is_stopped_until_resumed_or_given(tmp_path):
    warm, box, thread = start_warm("import sys\nsys.stdin.buffer.read()\nprint('ran')\n", tmp_path)
    members = wait_for_members(warm)
    warm.pause()
    time.sleep(0.2)
    assert all(psutil.Process(p).status() == psutil.STATUS_STOPPED for p in members if psutil.pid_exists(p))
    warm.give(b"x")  # a given run is resumed first
    thread.join(30)
    assert box["out"].failure is None and "ran" in box["out"].output, box["out"].output
