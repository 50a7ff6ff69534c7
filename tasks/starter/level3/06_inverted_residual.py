"""MobileNetV2 inverted residual block (stride 1, identity shortcut):

    1x1 expand (x6) -> BN -> ReLU6 -> depthwise 3x3 -> BN -> ReLU6 -> 1x1 project -> BN, plus x.

Batch norms are in inference mode with fixed running statistics.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
channels = 32
expansion = 6
height = 112
width = 112

PRESETS = {
    "cpp": {"batch_size": 2, "channels": 16, "expansion": 6, "height": 56, "width": 56},
    "cuda": {"batch_size": 32, "channels": 32, "expansion": 6, "height": 112, "width": 112},
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
    def __init__(self, channels: int, expansion: int):
        super().__init__()
        hidden = channels * expansion
        self.expand = nn.Conv2d(channels, hidden, 1, bias=False)
        self.bn1 = FrozenBatchNorm2d(hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.bn2 = FrozenBatchNorm2d(hidden)
        self.project = nn.Conv2d(hidden, channels, 1, bias=False)
        self.bn3 = FrozenBatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu6(self.bn1(self.expand(x)))
        out = F.relu6(self.bn2(self.depthwise(out)))
        out = self.bn3(self.project(out))
        return x + out


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, expansion]
