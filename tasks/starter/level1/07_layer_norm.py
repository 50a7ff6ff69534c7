"""Layer normalization over the last dimension with a learned elementwise affine transform."""
import torch
import torch.nn as nn

batch_size = 8192
hidden = 4096

PRESETS = {
    "cpp": {"batch_size": 4096, "hidden": 1024},
    "cuda": {"batch_size": 131072, "hidden": 4096},
}


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=eps)
        with torch.no_grad():  # non-trivial affine parameters (the defaults are 1 and 0)
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(hidden))
            self.norm.bias.copy_(0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, hidden) * 2.0 + 0.5]


def get_init_inputs():
    return [hidden]
