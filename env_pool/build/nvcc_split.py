"""nvcc with a kernel file's host and device passes side by side: the compile in the time of the longer one.

UNTRUSTED SIDE: like nvcc_light.py, this runs inside the candidate's import child as part of its
own ``load_inline`` build, and decides nothing but how fast that build goes.

nvcc runs a .cu file's passes one after another (``nvcc --dryrun`` lists them):
- the device chain: preprocessing with __CUDA_ARCH__, cicc (to PTX), ptxas, fatbinary;
- the host chain: preprocessing, cudafe++ (the host code with kernel launches made calls);
- last, the host compile of cudafe++'s output, which embeds the fatbinary.
The two chains share one file: the module id, which cudafe++ writes and cicc reads. Written here
first (cudafe++ then only reads it: ``--gen_module_id_file`` dropped), they run at once. With the
same id the object is byte-for-byte nvcc's own, whatever order the chains finish in (checked
with CUDA 13.0 on a small kernel file); a fresh id differs from nvcc's in that name only.
On the H100 machine a kernel file against torch/types.h took 2.6 + 11.1 s on the device chain,
2.1 + 12.9 s on the host chain and 10.3 s in the host compile: 39 s in a row, 25 s this way.

A plan of any other shape (a tool this does not know, no module id to share) runs as nvcc
would run it. Used only where a failed build costs nothing but time (nvcc_light's faster
tiers): the messages of a failed split build are its steps' own, not nvcc's in its order.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

DEVICE_TOOLS = ("cicc", "ptxas", "fatbinary", "nvlink", "rm")
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
FILTER_DEPS = re.compile(r"^-- Filter Dependencies -- > (.+)$")


@dataclass
class Plan:
    """nvcc's steps for one .cu compile, in its order and in the two chains that may overlap."""

    env: dict[str, str]
    steps: list[str]  # every command, in nvcc's order (their output is printed in it)
    host: list[int] = field(default_factory=list)  # host preprocessing, cudafe++
    device: list[int] = field(default_factory=list)  # device preprocessing, cicc, ptxas, fatbinary
    final: int = -1  # the host compile, after both chains
    module_id: str = ""  # the file cudafe++ would write and cicc reads
    deps_out: str = ""  # where nvcc's dependency file goes ("" when none is asked for)


def tool(command: str) -> str:
    try:
        return Path(shlex.split(command)[0]).name
    except (ValueError, IndexError):
        return ""


def parse(dryrun: str, base_env: dict[str, str]) -> Plan | None:
    """The plan in ``nvcc --dryrun``'s listing (its ``#$ `` lines); None where it is not of the known shape."""
    plan = Plan(env=dict(base_env), steps=[])
    deps_after = -1
    for line in (raw[3:] for raw in dryrun.splitlines() if raw.startswith("#$ ")):
        if (assignment := ASSIGNMENT.match(line)) is not None:
            try:
                plan.env[assignment.group(1)] = " ".join(shlex.split(assignment.group(2)))
            except ValueError:
                return None
            continue
        if (deps := FILTER_DEPS.match(line)) is not None:
            plan.deps_out, deps_after = deps.group(1).strip(), len(plan.steps) - 1
            continue
        # nvcc's own removals ignore a file that is not there (with --embedded-fatbin, the .fatbin never is).
        plan.steps.append("rm -f" + line[2:] if tool(line) == "rm" else line)
    if not _assign(plan) or (plan.deps_out and (not plan.host or plan.host[0] != deps_after)):
        return None  # the dependency filter reads the host preprocessing's output: it must be that step
    return plan


def _assign(plan: Plan) -> bool:
    """Put each step in its chain; False for a shape this does not know."""
    for index, command in enumerate(plan.steps):
        words = command.split()
        name = tool(command)
        if index == len(plan.steps) - 1 and "-c" in words and "-E" not in words:
            plan.final = index
        elif name == "cudafe++":
            match = re.search(r'--module_id_file_name\s+"?([^"\s]+)"?', command)
            if match is None or "--gen_module_id_file" not in words:
                return False
            plan.module_id = match.group(1)
            plan.host.append(index)
        elif "-E" in words and not any(w.startswith("-D__CUDA_ARCH__=") for w in words):
            plan.host.append(index)
        elif "-E" in words or name in DEVICE_TOOLS:
            plan.device.append(index)
        else:
            return False
    return plan.final >= 0 and bool(plan.module_id) and len(plan.host) == 2 and bool(plan.device)


def module_id(source: str) -> str:
    """A fresh module id, in nvcc's own form (_hash_length_name)."""
    stem = re.sub(r"\W", "_", Path(source).name)
    return f"_{secrets.token_hex(4)}_{len(stem)}_{stem}"


class Runner:
    """Runs the plan's chains in threads; the first failure stops everything."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.outputs: dict[int, bytes] = {}
        self.failed: int | None = None
        self.running: set[subprocess.Popen] = set()
        self.lock = threading.Lock()

    def chain(self, indices: list[int]) -> None:
        for index in indices:
            if not self.step(index):
                return

    def step(self, index: int) -> bool:
        with self.lock:
            if self.failed is not None:
                return False
            proc = subprocess.Popen(["/bin/sh", "-c", self.plan.steps[index]], env=self.plan.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            self.running.add(proc)
        output, _ = proc.communicate()
        with self.lock:
            self.running.discard(proc)
            self.outputs[index] = output
            if proc.returncode != 0 and self.failed is None:
                self.failed = proc.returncode or 1
                for other in self.running:  # the other chain's step: its result no longer matters
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(other.pid, signal.SIGKILL)
        return proc.returncode == 0

    def run(self) -> int:
        threads = [threading.Thread(target=self.chain, args=(c,)) for c in (self.plan.host, self.plan.device)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.failed is None:
            self.step(self.plan.final)
        for index in sorted(self.outputs):
            sys.stdout.buffer.write(self.outputs[index])
        sys.stdout.flush()
        return self.failed or 0


def prepare(plan: Plan, source: str, target: str) -> None:
    """Write the module id; have the host preprocessing write the dependency file nvcc would filter."""
    Path(plan.module_id).write_text(module_id(source))
    cudafe = next(i for i in plan.host if tool(plan.steps[i]) == "cudafe++")
    plan.steps[cudafe] = plan.steps[cudafe].replace("--gen_module_id_file", "", 1)
    if plan.deps_out:
        pre = plan.host[0]
        flags = f" -MD -MF {shlex.quote(plan.deps_out)} -MT {shlex.quote(target)}"
        plan.steps[pre] += flags


def main(argv: list[str]) -> int:
    """``nvcc_split.py SCRATCH REAL_NVCC ARGS...``: a .cu compile with its chains side by side, or nvcc as usual.

    SCRATCH holds nvcc's intermediate files; the caller removes it (also after killing this).
    """
    scratch, real, args = argv[0], argv[1], argv[2:]
    source = next((a for a in args if a.endswith(".cu")), "")
    target = args[args.index("-o") + 1] if "-o" in args[:-1] else ""
    if not source or not target or "-c" not in args:
        os.execv(real, [real, *args])
    env = {**os.environ, "TMPDIR": scratch}
    dry = subprocess.run([real, *args, "--dryrun"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    plan = parse(dry.stdout, env) if dry.returncode == 0 else None
    if plan is None:
        return subprocess.run([real, *args], env=env).returncode
    prepare(plan, source, target)
    return Runner(plan).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
