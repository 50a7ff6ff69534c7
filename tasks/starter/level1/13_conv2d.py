"""2-D convolution, 3x3 kernel, stride 1, padding 1, with bias, on an NCHW tensor."""
import torch
import torch.nn as nn

batch_size = 16
in_channels = 64
out_channels = 128
height = 128
width = 128
kernel_size = 3

PRESETS = {
    "cpp": {"batch_size": 2, "in_channels": 32, "out_channels": 64, "height": 64, "width": 64},
    "cuda": {"batch_size": 128, "in_channels": 64, "out_channels": 128, "height": 128, "width": 128},
}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
