"""2-D max pooling, 3x3 window, stride 2, padding 1, on an NCHW tensor."""
import torch
import torch.nn as nn

batch_size = 32
channels = 64
height = 128
width = 128

PRESETS = {
    "cpp": {"batch_size": 4, "channels": 32, "height": 64, "width": 64},
    "cuda": {"batch_size": 512, "channels": 64, "height": 128, "width": 128},
}


class Model(nn.Module):
    def __init__(self, kernel_size: int = 3, stride: int = 2, padding: int = 1):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [3, 2, 1]
