"""Group normalization of an NCHW tensor (channels split into groups) with affine parameters."""
import torch
import torch.nn as nn

batch_size = 32
channels = 128
num_groups = 8
height = 64
width = 64

PRESETS = {
    "cpp": {"batch_size": 16, "channels": 64, "num_groups": 8, "height": 64, "width": 64},
    "cuda": {"batch_size": 1024, "channels": 128, "num_groups": 8, "height": 64, "width": 64},
}


class Model(nn.Module):
    def __init__(self, num_groups: int, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(num_groups, channels, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(channels))
            self.norm.bias.copy_(0.1 * torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [num_groups, channels]
