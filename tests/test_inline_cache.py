"""The load_inline build cache (env_pool/evaluate.py inline_cache): the same files are built once per worker.

The cache is filled from a folder the candidate's import child wrote, and read by the trusted
worker, which sees what candidates cannot: a link the build left must travel as a link, never
as the contents of the file it names.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from env_pool.pool import EnvPool
from tasks.loader import load_tasks
from tests.corpus_cases import files_of

CORPUS = Path(__file__).parent / "env_corpus"

LINKER = '''"""Not a real load_inline solution: it only names torch.utils.cpp_extension, so its import is the build step."""
import os

import torch
import torch.nn as nn

_ext = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", ".torch_extensions"), "planted")
_link = os.path.join(_ext, "leak")
if not os.path.lexists(_link):  # the build step: plant a link to a file only the worker can read
    os.makedirs(_ext, exist_ok=True)
    os.symlink({target!r}, _link)
else:  # the server, after a cache hit: what does the link show here?
    try:
        _seen = open(_link).read()
    except OSError:
        _seen = ""
    if _seen:
        raise RuntimeError("LEAKED " + _seen[:60])


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)
'''


@pytest.fixture(scope="module")
def tasks():
    return {t.id: t for t in load_tasks()[0]}


def test_a_link_left_by_the_build_is_cached_as_a_link_not_as_what_it_names(tmp_path, tasks):
    secret = tmp_path / "harness.log"  # hidden from every candidate (EvalContext.private_paths)
    secret.write_text("the worker's own log, which no candidate may read\n")
    pool = EnvPool({"work_dir": str(tmp_path), "infra_retries": 0, "pch_dir": ""})  # no background header build in the suite
    files = {"model_new.py": LINKER.replace("{target!r}", repr(str(secret)))}
    built = asyncio.run(pool.evaluate(tasks["level1/01_gelu"], files, "compile"))
    assert built.failure is None and not built.cache_hit, built.message
    served = asyncio.run(pool.evaluate(tasks["level1/01_gelu"], files, "verify"))
    assert served.cache_hit, "the second evaluation of the same files reuses the build"
    assert "LEAKED" not in served.message + served.run_log, served.message
    assert served.failure == "guard", f"{served.failure}: {served.message}"  # F.gelu: a torch fallback, nothing more


@pytest.mark.slow
def test_a_load_inline_build_is_made_once_for_the_same_files(tmp_path, tasks):
    pool = EnvPool({"work_dir": str(tmp_path), "pch_dir": ""})  # the cache alone: first build cold, second a hit
    files = files_of(CORPUS / "legit" / "swish_load_inline")
    first = asyncio.run(pool.evaluate(tasks["level1/02_swish"], files, "compile"))
    again = asyncio.run(pool.evaluate(tasks["level1/02_swish"], files, "verify"))
    assert first.failure is None and not first.cache_hit and first.compile_s > 5, (first.failure, first.compile_s)
    assert again.failure is None and again.cache_hit and again.compile_s < 1, (again.failure, again.compile_s, again.message)
