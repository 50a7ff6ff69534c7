"""The precompiled torch/extension.h (env_pool/inline_pch.py): built on the trusted side, used by load_inline's own builds."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from env_pool import inline_pch
from env_pool.pool import EnvPool
from tasks.loader import load_tasks

REPORTER = '''"""Names torch.utils.cpp_extension, so its import is the build step; it shows what that step was given."""
import os

raise RuntimeError("CPATH=" + os.environ.get("CPATH", "<unset>"))
'''

LOAD_INLINE = r'''
import sys
from torch.utils.cpp_extension import load_inline
load_inline(name="pch_probe_ext", cpp_sources="#include <torch/extension.h>\nint twice(int x) { return 2 * x; }", functions=["twice"],
            extra_cflags=["-O3", "-H"], build_directory=sys.argv[1], verbose=True)
'''


def test_the_flags_are_load_inlines_own_less_the_extensions_name():
    compiler, flags, key = inline_pch.target(False)
    assert compiler and key
    assert "-DTORCH_API_INCLUDE_EXTENSION_H" in flags and any(f.startswith("-std=") for f in flags)
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME") for f in flags)


def test_only_a_checked_build_is_used(tmp_path):
    _, _, key = inline_pch.target(False)
    folder = tmp_path / key
    folder.mkdir()
    (folder / "failed").write_text("the probe did not use it")
    assert inline_pch.ready_dir(tmp_path, "cpp") is None
    assert not (tmp_path / f"{key}.log").exists(), "a failed build is not retried on every evaluation"
    (folder / "failed").unlink()
    (folder / "ok").write_text("checked")
    assert inline_pch.ready_dir(tmp_path, "cpp") == folder


def test_the_import_step_gets_the_ready_folder_on_cpath(tmp_path):
    pch_root = tmp_path / "pch"
    ready = pch_root / inline_pch.target(False)[2]
    ready.mkdir(parents=True)
    (ready / "ok").write_text("checked")
    task = next(t for t in load_tasks()[0] if t.id == "level1/01_gelu")
    for root, expected in ((str(pch_root), f"CPATH={ready}"), ("", "CPATH=<unset>")):
        pool = EnvPool({"work_dir": str(tmp_path / "work"), "pch_dir": root, "infra_retries": 0})
        result = asyncio.run(pool.evaluate(task, {"model_new.py": REPORTER}, "compile"))
        assert result.failure == "compile_error" and expected in result.message + result.compile_log, result.message


@pytest.mark.slow
def test_a_built_header_is_used_by_a_real_load_inline_build(tmp_path):
    compiler, flags, key = inline_pch.target(False)
    folder = tmp_path / key
    assert inline_pch.build(folder, compiler, flags), (folder / "failed").read_text()
    assert {p.name for p in (folder / "torch" / "extension.h.gch").iterdir()} == {"plain.gch", "optimized.gch"}
    build_dir = tmp_path / "ext"
    build_dir.mkdir()
    done = subprocess.run([sys.executable, "-c", LOAD_INLINE, str(build_dir)], capture_output=True, text=True,
                          env={**os.environ, "CPATH": str(folder)}, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    used = f"! {folder / 'torch' / 'extension.h.gch' / 'optimized.gch'}"
    assert used in done.stdout + done.stderr, "GCC's -H marks a precompiled header it used with '!'"
    assert Path(build_dir / "pch_probe_ext.so").exists()
