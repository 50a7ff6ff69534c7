"""3x3 convolution without bias, batch normalization in inference mode (fixed running stats), ReLU."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
in_channels = 64
out_channels = 64
height = 112
width = 112

PRESETS = {
    "cpp": {"batch_size": 4, "in_channels": 32, "out_channels": 32, "height": 56, "width": 56},
    "cuda": {"batch_size": 256, "in_channels": 64, "out_channels": 64, "height": 112, "width": 112},
}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, eps: float = 1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.eps = eps
        self.bn_weight = nn.Parameter(1.0 + 0.1 * torch.randn(out_channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(out_channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(out_channels))
        self.register_buffer("running_var", 0.2 + 0.3 * torch.rand(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = F.batch_norm(
            x, self.running_mean, self.running_var, self.bn_weight, self.bn_bias, training=False, eps=self.eps
        )
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
