"""Shared fixtures and the `slow` / `gpu` markers, both skipped unless asked for."""
from __future__ import annotations

import os

import pytest

# DeepSpeed picks its accelerator at import; on machines without a GPU it must be the CPU one.
os.environ.setdefault("DS_ACCELERATOR", "cpu" if not os.path.exists("/dev/nvidia0") else "cuda")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow (minutes each)")
    parser.addoption("--run-gpu", action="store_true", help="also run tests marked gpu (needs an NVIDIA GPU)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {
        "slow": (config.getoption("--run-slow"), "slow test: run with --run-slow (make test-slow)"),
        "gpu": (config.getoption("--run-gpu"), "needs a GPU: run with --run-gpu (scripts/run_gpu_tests.sh)"),
    }
    for item in items:
        for marker, (enabled, reason) in skips.items():
            if marker in item.keywords and not enabled:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random Llama model folder with its own tokenizer (tests/tiny_model.py), built once."""
    try:
        from tests.tiny_model import build_tiny_model
    except ImportError:  # tests/ is on sys.path itself under pytest's default import mode
        from tiny_model import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    """The tiny model's tokenizer (the policy tests tokenize with it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
