"""The dependency rule holds: launch -> actors -> {rollout | learner | env_pool} -> tasks -> protocol -> configs.

import-linter checks every import in the packages (lazy ones inside functions too) against the
layers contract in pyproject.toml ([tool.importlinter]), which has no exceptions: the siblings
share only what lies in protocol/, below them. A wrong-way import fails here with
import-linter's report, which names the importing line and the chain it opens.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_imports_follow_the_layers_contract():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), f"{lint_imports} is missing: pip install -e '.[dev]' (import-linter)"
    # From the root, so that this checkout's packages are the ones analysed (the linter puts the
    # working directory first on sys.path); no cache, so nothing is written into the tree.
    run = subprocess.run([str(lint_imports), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"a wrong-way import (import-linter's report):\n{run.stdout}{run.stderr}"
