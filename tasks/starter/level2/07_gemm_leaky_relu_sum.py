"""Linear layer, LeakyReLU (slope 0.1), then a sum over the output features (one value per row)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
in_features = 4096
out_features = 4096
negative_slope = 0.1

PRESETS = {
    "cpp": {"batch_size": 256, "in_features": 1024, "out_features": 512},
    "cuda": {"batch_size": 4096, "in_features": 4096, "out_features": 4096},
}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, negative_slope: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.leaky_relu(self.linear(x), negative_slope=self.negative_slope)
        # LeakyReLU outputs are mostly positive, so the row sums stay well away from zero.
        return torch.sum(y, dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, negative_slope]
