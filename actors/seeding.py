"""The run's seed (top-level ``seed``): Python, NumPy and torch of the driver and of each actor.

The driver seeds itself where a run starts; each generator and learner rank seeds itself with
a seed derived from the run's and its role and index, so that actors draw different streams
and a rerun draws the same ones (a fresh critic head, anything drawn beside vLLM's sampler,
which ``rollout.seed`` seeds). Env workers are not seeded on purpose: the verifier's inputs
and initial weights come from the OS's entropy (env_pool/trusted/harness.py), and no config may make
them predictable to a candidate.
"""
from __future__ import annotations

import random
import zlib


def derived_seed(seed: int, role: str, index: int = 0) -> int:
    """A seed for one actor: stable across runs and processes (no Python hash randomisation)."""
    return (int(seed) + zlib.crc32(f"{role}:{index}".encode())) % 2**32


def seed_process(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (torch's on every GPU too)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
