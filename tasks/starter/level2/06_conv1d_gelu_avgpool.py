"""1-D convolution (kernel 5, 'same' padding), GELU, then average pooling with window 2, stride 2."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
in_channels = 128
out_channels = 128
length = 4096
kernel_size = 5

PRESETS = {
    "cpp": {"batch_size": 4, "in_channels": 64, "out_channels": 64, "length": 1024},
    "cuda": {"batch_size": 256, "in_channels": 128, "out_channels": 128, "length": 4096},
}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.pool = nn.AvgPool1d(kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.gelu(self.conv(x)))


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
