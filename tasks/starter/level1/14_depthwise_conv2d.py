"""Depthwise 2-D convolution (groups=channels), 7x7 kernel, padding 3, with bias (ConvNeXt-style)."""
import torch
import torch.nn as nn

batch_size = 16
channels = 128
height = 112
width = 112
kernel_size = 7

PRESETS = {
    "cpp": {"batch_size": 4, "channels": 64, "height": 64, "width": 64},
    "cuda": {"batch_size": 64, "channels": 128, "height": 112, "width": 112},
}


class Model(nn.Module):
    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]
