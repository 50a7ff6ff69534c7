"""Where a candidate's round goes, inside its forward, on a GPU: stamps taken by the candidate itself.

    python scripts/forward_stamps.py --out DIR     # on a GPU machine; writes DIR/forward_stamps.json

Issue 34: in the harness's rounds the candidate's server takes ~0.25 ms more host time from its
wake to its outputs placed than the eager baseline's does (harness.log's split), while outside the
harness (scripts/forward_host_cost.py) the two forwards cost about the same. This evaluates
level1/01_gelu's kernels as diagnostics: each ModelNew reads the server's wake stamp (the round
memory's STAMPS word, found by walking up its own frames, as any candidate could) and takes its
own stamps after each step of its forward. At its CALLS-th call it raises, with the steps' medians
over the calls before it in its message: the evaluation's (a crash), and harness.log's line for it,
where a guard's verdict outranks the crash (the torch variant's). The
variants: the corpus's ctypes kernel (kernel.so, nvcc's static runtime), the same kernel through
load_inline (torch's runtime), and torch's own F.gelu in the candidate's server (a torch fallback:
the same path as the eager baseline's, under the candidate's guards). A benchmark: it asserts
nothing, and a diagnostic: these "kernels" only ever crash. Figures (H200, 2026-11-28): README.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from env_pool.evaluate import evaluate  # noqa: E402
from scripts.bench_integrity import context, env_settings, keep_harness_logs  # noqa: E402
from tasks.loader import load_tasks  # noqa: E402
from tests.corpus_cases import CORPUS, files_of  # noqa: E402

CALLS = 40  # the call that raises; the medians are over the calls from SKIP to it
SKIP = 10

STAMPS = r'''
import statistics as _st
import sys as _sys
import time as _time

_seen = []
_words = []


def _server_words():
    """The server's control words and its STAMPS index, from the round loop's frame."""
    frame = _sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "_serve_rounds":
        frame = frame.f_back
    if frame is None:
        return None, 0
    seen = frame.f_locals  # a snapshot the frame keeps: cleared, or it holds the first round's outputs for good
    words = seen["words"]
    seen.clear()
    return words, frame.f_globals["STAMPS"]


def _stamp(marks):
    """One call's stamps (ns): the server's wake (the harness clears the server's other stamps before
    a round), then each of marks; at the CALLS-th call, raise the steps' medians."""
    if not _words:
        _words.append(_server_words())
    words, at = _words[0]
    _seen.append([words[at] if words is not None else 0] + marks)
    if len(_seen) < __CALLS__:
        return
    rows = _seen[__SKIP__:]
    steps = {"wake>entry": [r[1] - r[0] for r in rows]}
    for k in range(2, len(rows[0])):
        steps[f"s{k - 1}"] = [r[k] - r[k - 1] for r in rows]
    text = " ".join(f"{k}={_st.median(v) / 1e3:.1f}/{sorted(v)[int(0.9 * len(v))] / 1e3:.1f}" for k, v in steps.items() if v)
    text = f"STAMPS us median/p90 over {len(rows)} calls: {text}"
    print(text, file=_sys.stderr, flush=True)  # the run log of a crash keeps it
    raise RuntimeError(text)
'''

CTYPES = '''
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.gelu_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
_lib.gelu_forward.restype = ctypes.c_int
__STAMPS__

class ModelNew(nn.Module):
    def forward(self, x):
        t0 = _time.perf_counter_ns()
        x = x.contiguous()
        t1 = _time.perf_counter_ns()
        y = torch.empty_like(x)
        t2 = _time.perf_counter_ns()
        stream = torch.cuda.current_stream().cuda_stream
        t3 = _time.perf_counter_ns()
        _lib.gelu_forward(x.data_ptr(), y.data_ptr(), x.numel(), stream)
        _stamp([t0, t1, t2, t3, _time.perf_counter_ns()])  # s1 contiguous, s2 empty_like, s3 stream, s4 launch
        return y
'''

TORCH = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
__STAMPS__

class ModelNew(nn.Module):
    def forward(self, x):
        t0 = _time.perf_counter_ns()
        y = F.gelu(x)
        _stamp([t0, _time.perf_counter_ns()])  # s1 F.gelu
        return y
'''


def variants() -> dict[str, dict[str, str]]:
    stamps = STAMPS.replace("__CALLS__", str(CALLS)).replace("__SKIP__", str(SKIP))
    ctypes_files = files_of(CORPUS / "legit" / "gelu_cuda")
    inline = files_of(CORPUS / "legit" / "gelu_load_inline_cuda")
    head, _, _ = inline["model_new.py"].partition("class ModelNew")
    inline_model = head + stamps + '''
class ModelNew(nn.Module):
    def forward(self, x):
        t0 = _time.perf_counter_ns()
        y = _ext.gelu_forward(x)
        _stamp([t0, _time.perf_counter_ns()])  # s1 the extension's call
        return y
'''
    return {"ctypes": {**ctypes_files, "model_new.py": CTYPES.replace("__STAMPS__", stamps)},
            "load_inline": {**inline, "model_new.py": inline_model},
            "torch": {"model_new.py": TORCH.replace("__STAMPS__", stamps)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", nargs="*", default=["ctypes", "load_inline", "torch"],
                        choices=["ctypes", "load_inline", "torch"], help="which forwards to stamp")
    parser.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE", help="EnvConfig settings, as bench_integrity's")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    task = {t.id: t for t in load_tasks()[0]}["level1/01_gelu"]
    work = Path(tempfile.mkdtemp(prefix="forward-stamps-", dir="/var/tmp"))
    ctx = context(work, **env_settings(args.env))
    rows = []
    built = variants()
    for name in args.variants:
        files = built[name]
        for _ in range(args.repeats):
            result = asyncio.run(evaluate(ctx, task, files, "full"))
            found = re.search(r"STAMPS.*", result.message) or re.search(r"STAMPS.*", result.run_log)
            rows.append({"variant": name, "failure": result.failure, "stamps": found.group(0) if found else result.message[:400]})
            print(f"{name:12s} {rows[-1]['failure']}: {rows[-1]['stamps']}", flush=True)
            (args.out / "forward_stamps.json").write_text(json.dumps(rows, indent=1))
            keep_harness_logs(work, args.out)  # a guard's verdict outranks the crash: its message is there
    ctx.close()
    for log in sorted(args.out.glob("harness-*.log")):
        for line in log.read_text().splitlines():
            if "STAMPS" in line or "eager: rounds" in line:
                print(line[:600])


if __name__ == "__main__":
    main()
