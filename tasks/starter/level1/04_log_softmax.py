"""Log-softmax over dim 1 of a (batch, classes) tensor."""
import torch
import torch.nn as nn

batch_size = 2048
num_classes = 16384

PRESETS = {
    "cpp": {"batch_size": 128, "num_classes": 16384},
    "cuda": {"batch_size": 65536, "num_classes": 16384},
}


class Model(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn(batch_size, num_classes) * 3.0]


def get_init_inputs():
    return [1]
