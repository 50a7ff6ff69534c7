"""3x3 convolution, ReLU, then global average pooling (mean over H and W): output (batch, channels)."""
import torch
import torch.nn as nn

batch_size = 32
in_channels = 64
out_channels = 128
height = 64
width = 64

PRESETS = {
    "cpp": {"batch_size": 8, "in_channels": 32, "out_channels": 64, "height": 32, "width": 32},
    "cuda": {"batch_size": 512, "in_channels": 64, "out_channels": 128, "height": 64, "width": 64},
}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)).mean(dim=(2, 3))


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
