"""scripts/size_starter_tasks.py rewrites one backend's preset line and leaves the rest of the task alone."""
from __future__ import annotations

import shutil
from pathlib import Path

from scripts.size_starter_tasks import STARTER, rewrite
from tasks.loader import load_task_file


def test_rewrite_changes_only_the_named_backends_preset(tmp_path: Path):
    path = tmp_path / "01_gelu.py"
    shutil.copy(STARTER / "level1" / "01_gelu.py", path)
    before = load_task_file(path)
    assert rewrite(path, "cuda", {"batch_size": 64, "dim": 4096})
    after = load_task_file(path)
    assert after.presets["cuda"] == {"batch_size": 64, "dim": 4096}
    assert after.presets["cpp"] == before.presets["cpp"]
    assert after.source.replace('"batch_size": 64', "") == before.source.replace(
        f'"batch_size": {before.presets["cuda"]["batch_size"]}', "")


def test_rewrite_reports_a_file_without_that_preset(tmp_path: Path):
    path = tmp_path / "plain.py"
    path.write_text("import torch\n")
    assert not rewrite(path, "cuda", {"n": 1})
    assert path.read_text() == "import torch\n"
