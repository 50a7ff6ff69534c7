"""Where a load_inline build's time goes: each of its compiler commands timed on its own.

    python scripts/bench_inline_build.py --out DIR [--case legit/gelu_load_inline_cuda] [--pch-dir DIR]

Builds a corpus case's load_inline extension once (its files and ninja commands), then runs each
command again alone: the binding's main.cpp with and without the precompiled torch/extension.h
(env_pool/build/inline_pch.py, built first if needed); the kernel's cuda.cu (nvcc) as written, with
the light and with the lean headers through env_pool/build/nvcc_split.py, and through
env_pool/build/nvcc_light.py (all three at once, the first that builds kept); the link.
Last, the whole build again through nvcc_light, with the precompiled header: what the
environment's import step runs.
Unsandboxed: this measures the compilers, not the environment. Writes DIR/inline_build.json.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from env_pool.build import inline_pch, nvcc_light  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "env_corpus"


def timed(cmd: str, cwd: Path, env: dict) -> tuple[float, int, str]:
    begin = time.perf_counter()
    done = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - begin, done.returncode, done.stdout + done.stderr


def _cuda_home() -> str:
    from torch.utils import cpp_extension

    return cpp_extension.CUDA_HOME


def _whole_build_light(case: str, pch: Path | None) -> dict:
    """The build as the environment's import step runs it: nvcc_light's view, the header precompiled."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(TORCH_EXTENSIONS_DIR=tmp, **({"CPATH": str(pch)} if pch else {}))
        nvcc_light.use_in_torch(Path(tmp) / "nvcc-view")
        begin = time.perf_counter()
        source = (CORPUS / case / "model_new.py").read_text().replace('name="', 'name="light_', 1)  # not torch's loaded module
        exec(compile(source, "model_new.py", "exec"), {"__name__": "light_build"})
        return {"what": f"whole build, nvcc_light{' + pch' if pch else ''}", "s": time.perf_counter() - begin, "rc": 0}


def _kernel_file_rows(cmd: str, build: Path, env: dict, tmp: Path) -> list[dict]:
    """The kernel file through nvcc_split with each faster tier's headers alone, then through nvcc_light (all tiers at once)."""
    rows = []
    words = shlex.split(cmd)
    real, args = words[0], words[1:]
    lean = nvcc_light.lean_headers(args, tmp / "lean")
    tiers = [("light", ["-I", str(nvcc_light.LIGHT)])] + ([("lean", ["-I", str(lean), "-I", str(nvcc_light.LIGHT)])] if lean else [])
    for tier, first in tiers:
        tiered, mine, _ = nvcc_light.tier_args(args, tier, first)
        (tmp / tier).mkdir(exist_ok=True)
        split = [sys.executable, str(nvcc_light.SPLIT), str(tmp / tier), real, *tiered]
        s, rc, log = timed(shlex.join(split), build, env)
        rows.append({"what": f"cuda.cu alone, {tier} headers, split", "s": s, "rc": rc, "log": log[-1500:] if rc else ""})
    view = nvcc_light.install(_cuda_home(), tmp / "nvcc-view")
    s, rc, log = timed(cmd.replace(real, str(view / "bin" / "nvcc"), 1), build, env)
    rows.append({"what": "cuda.cu alone, nvcc_light", "s": s, "rc": rc, "log": log[-1500:] if rc else ""})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", default="legit/gelu_load_inline_cuda")
    parser.add_argument("--pch-dir", type=Path, default=Path("~/.cache/cuda-agent/pch"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    source = (CORPUS / args.case / "model_new.py").read_text()
    cuda = "cuda_sources" in source
    compiler, flags, key = inline_pch.target(cuda)
    pch = args.pch_dir.expanduser() / key
    begin = time.perf_counter()
    pch_ok = (pch / "ok").exists() or inline_pch.build(pch, compiler, flags)
    rows = [{"what": "pch build (once per machine)", "s": time.perf_counter() - begin, "rc": 0 if pch_ok else 1}]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": tmp}
        env.pop("CPATH", None)
        os.environ.update(TORCH_EXTENSIONS_DIR=tmp)
        begin = time.perf_counter()
        runpy.run_path(str(CORPUS / args.case / "model_new.py"))
        rows.append({"what": "whole load_inline build (ninja, parallel)", "s": time.perf_counter() - begin, "rc": 0})
        build = next(p for p in Path(tmp).iterdir() if p.is_dir())
        commands = subprocess.run(["ninja", "-t", "commands"], cwd=build, capture_output=True, text=True).stdout.splitlines()
        for cmd in commands:
            what = next((Path(w).name for w in shlex.split(cmd) if w.endswith((".cpp", ".cu"))), "link")
            s, rc, log = timed(cmd, build, env)
            rows.append({"what": f"{what} alone", "s": s, "rc": rc, "log": log[-1500:] if rc else ""})
            if what == "cuda.cu":
                rows += _kernel_file_rows(cmd, build, env, Path(tmp))
            if what == "main.cpp" and pch_ok:
                s, rc, log = timed(cmd + " -H", build, {**env, "CPATH": str(pch)})
                used = any(line.startswith("! ") for line in log.splitlines())
                rows.append({"what": f"main.cpp alone, pch {'used' if used else 'NOT used'}", "s": s, "rc": rc})
    if cuda:
        rows.append(_whole_build_light(args.case, pch if pch_ok else None))
    (args.out / "inline_build.json").write_text(json.dumps(rows, indent=2))
    print(f"\nload_inline build of {args.case}")
    for row in rows:
        print(f"{row['what']:<45}{row['s']:>8.1f} s  rc {row['rc']}")


if __name__ == "__main__":
    main()
