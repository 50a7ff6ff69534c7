"""SwiGLU gating: silu(x @ W_gate^T) * (x @ W_up^T), two bias-free projections of the same input."""
import torch
import torch.nn as nn
import torch.nn.functional as F

num_tokens = 4096
hidden = 2048
intermediate = 4096

PRESETS = {
    "cpp": {"num_tokens": 256, "hidden": 512, "intermediate": 512},
    "cuda": {"num_tokens": 4096, "hidden": 2048, "intermediate": 4096},
}


class Model(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.gate(x)) * self.up(x)


def get_inputs():
    return [torch.randn(num_tokens, hidden)]


def get_init_inputs():
    return [hidden, intermediate]
