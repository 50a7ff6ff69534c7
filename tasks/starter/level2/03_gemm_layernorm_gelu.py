"""Linear layer, then LayerNorm over the features, then GELU."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
in_features = 2048
out_features = 4096

PRESETS = {
    "cpp": {"batch_size": 256, "in_features": 512, "out_features": 1024},
    "cuda": {"batch_size": 8192, "in_features": 2048, "out_features": 4096},
}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(out_features))
            self.norm.bias.copy_(0.1 * torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(self.linear(x)))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
