"""The LLM composer: a policy asked to write a KernelBench-format program fusing operators drawn from the catalogue.

Only the prompt and the reading of the answer live here (tasks/ depends on nothing above it);
launch/synth.py asks the policy (``vllm:DIR``, ``openai:URL``: rollout/policy.py). The answer's
first Python code block is the candidate. It then goes through the same filters as a
deterministic one, batch sizing included: the program must keep ``batch_size`` as a module-level
name read by ``get_inputs``, and a ``PRESETS`` line (which the prompt asks for).
"""
from __future__ import annotations

import random
import re

from tasks.synth.catalogue import Op
from tasks.synth.compose import Candidate

SYSTEM = "You write PyTorch reference programs for a GPU-kernel benchmark. Answer with one Python code block only."

PROMPT = """Write a KernelBench-format PyTorch program that applies these operators in sequence, in this order: {ops}.

Rules:
- Define `class Model(nn.Module)` with `__init__(self)` (no arguments) and `forward(self, x)`.
- Module-level `batch_size = 1` and the line `PRESETS = {{"cpp": {{"batch_size": 1}}, "cuda": {{"batch_size": 16}}}}`.
- `def get_inputs(): return [torch.randn(batch_size, {sample})]` and `def get_init_inputs(): return []`.
- Choose layer sizes that fit the input shape (batch_size, {sample}). No randomness in forward, no dropout.
- Import only torch, torch.nn as nn, torch.nn.functional as F and math.
"""

SAMPLES = {"flat": "2048", "seq": "128, 512", "image": "32, 64, 64"}
CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def request(seed: int, ops: list[Op], max_ops: int) -> tuple[list[dict], dict]:
    """(chat messages, provenance) of the seed's prompt: 1 to ``max_ops`` operators drawn from the catalogue."""
    rng = random.Random(seed)
    layout = rng.choice(sorted(SAMPLES))
    usable = [op for op in ops if layout in op.layouts]
    chosen = [rng.choice(usable).name for _ in range(rng.randint(1, max_ops))]
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": PROMPT.format(ops=" -> ".join(chosen), sample=SAMPLES[layout])}]
    sample = [int(v) for v in SAMPLES[layout].split(", ")]
    return messages, {"composer": "llm", "seed": seed, "ops": chosen, "layout": layout, "sample_shape": sample}


def candidate_from(answer: str, provenance: dict) -> Candidate | None:
    """The answer's first code block as a candidate (its id from the seed and the operators asked for); None without one."""
    found = CODE_BLOCK.search(answer)
    source = (found.group(1) if found else "").strip()
    if not source:
        return None
    names = "_".join(op.split(".")[-1].lower()[:10] for op in provenance["ops"])
    return Candidate(id=f"synth/llm{provenance['seed']:08d}_{names}"[:120], source=source + "\n", provenance=provenance)
