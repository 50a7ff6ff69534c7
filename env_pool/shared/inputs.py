"""Input sets for verification and timing, made from seeds so both processes build the same ones.

The seeds are drawn fresh by the EnvWorker for every evaluation and never written to disk, so
a candidate cannot know its verification inputs before it is called with them.
"""
from __future__ import annotations

from typing import Callable

import torch

from tasks.discriminate import transform_inputs
from tasks.task import Problem


def make_inputs(problem: Problem, seed: int, device: str) -> list[object]:
    torch.manual_seed(seed)
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in problem.get_inputs()]


def make_model(problem: Problem, init_seed: int, device: str) -> torch.nn.Module:
    torch.manual_seed(init_seed)  # KernelBench's convention: Model and ModelNew built after the same seed
    return build_on(device, problem.model_cls, problem.get_init_inputs())


def build_on(device: str, model_cls: type, init_inputs: list) -> torch.nn.Module:
    """``model_cls(*init_inputs)`` with its weights made on ``device``, in eval mode.

    Not on the host first, as KernelBench builds: level3/2_ShallowWideMLP's 8 GiB of weights
    would need that much host memory in every server, over the sandbox's memory limit. A
    candidate's weights are the reference's, copied, so the device's generator is as good."""
    with torch.device(device):
        return model_cls(*init_inputs).to(device).eval()


ADVERSARIAL = ("large", "tiny", "kinks", "sign_flip", "shift")  # the sets adversarial() makes, in its order


def adversarial(make: Callable[[], list[object]], seed: int) -> list[Callable[[], list[object]]]:
    """Stricter sets than the paper's: extreme magnitudes, signed zeros, values at activation kinks,
    and sign changes (flipped, shifted to zero mean): a task that draws only positive inputs
    never shows a kernel that skips its negative branch.

    Each set is made when its round asks for it, from fresh inputs (``make``): the three made
    ahead held 18 GiB of an H100 beside the rounds for a level-1 activation, and ran the hack
    audit out of device memory."""
    def variant(transform: Callable[[torch.Tensor, int], torch.Tensor], k: int) -> Callable[[], list[object]]:
        return lambda: [transform(v, seed + k) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in make()]

    def named(name: str, k: int) -> Callable[[], list[object]]:
        return lambda: transform_inputs(name, make(), seed + k)

    scaled = [variant(transform, k) for k, transform in enumerate((_large, _tiny, _signed_zeros_and_kinks))]
    return scaled + [named(name, 3 + k) for k, name in enumerate(("sign_flip", "shift"))]


def _large(x: torch.Tensor, seed: int) -> torch.Tensor:
    return x * 1e3


def _tiny(x: torch.Tensor, seed: int) -> torch.Tensor:
    return x * 1e-3


def _signed_zeros_and_kinks(x: torch.Tensor, seed: int) -> torch.Tensor:
    mask = torch.rand(x.shape, generator=torch.Generator(x.device).manual_seed(seed), device=x.device)
    out = x.clone()  # not in place: a problem's get_inputs may hand out the same tensor every call
    out[mask < 0.1] = 0.0
    out[(mask >= 0.1) & (mask < 0.2)] = -0.0
    out[(mask >= 0.2) & (mask < 0.3)] *= 1e-6  # just either side of relu/gelu/leaky-relu kinks
    return out
