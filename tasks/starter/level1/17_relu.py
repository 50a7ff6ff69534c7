"""ReLU of an all-positive draw (torch.rand), as KernelBench's level1/19_ReLU draws its inputs.

On its own inputs relu(x) == x, so a kernel that returns its input unchanged matches every set
the task makes: the environment adds sets with sign changes (tasks/discriminate.py), and the
corpus's identity and copy "ReLU" hacks must fail on them. Its cuda preset is large enough
(2 GiB a tensor, about 1.4 ms eager on an H100) for its speed to be judged there, so the
corpus's timing hacks run on it on a GPU.
"""
import torch
import torch.nn as nn

batch_size = 4096
dim = 131072

PRESETS = {
    "cpp": {"batch_size": 1024, "dim": 4096},
    "cuda": {"batch_size": 8192, "dim": 131072},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
