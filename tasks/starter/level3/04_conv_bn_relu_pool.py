"""Two-stage convolutional feature extractor: [conv3x3 -> batch norm (eval) -> ReLU -> maxpool 2x2] x 2.

Batch norm uses fixed running statistics (inference mode), so it is a per-channel affine map.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
in_channels = 3
mid_channels = 64
out_channels = 128
height = 224
width = 224

PRESETS = {
    "cpp": {"batch_size": 2, "in_channels": 3, "mid_channels": 32, "out_channels": 64, "height": 64, "width": 64},
    "cuda": {"batch_size": 32, "in_channels": 3, "mid_channels": 64, "out_channels": 128, "height": 224, "width": 224},
}


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed (non-trivial) running statistics; never updates them."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(channels))
        self.bias = nn.Parameter(0.1 * torch.randn(channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(channels))
        self.register_buffer("running_var", 0.2 + 0.3 * torch.rand(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, training=False, eps=self.eps
        )


class Model(nn.Module):
    def __init__(self, in_channels: int, mid_channels: int, out_channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, mid_channels, 3, padding=1, bias=False)
        self.bn1 = FrozenBatchNorm2d(mid_channels)
        self.conv2 = nn.Conv2d(mid_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = FrozenBatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return x


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, mid_channels, out_channels]
