"""Multi-layer perceptron: Linear -> ReLU for each hidden layer, then a final Linear."""
import torch
import torch.nn as nn

batch_size = 2048
input_size = 4096
hidden_sizes = [4096, 4096]
output_size = 1024

PRESETS = {
    "cpp": {"batch_size": 128, "input_size": 512, "hidden_sizes": [1024, 512], "output_size": 256},
    "cuda": {"batch_size": 2048, "input_size": 4096, "hidden_sizes": [4096, 4096], "output_size": 1024},
}


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_sizes: list, output_size: int):
        super().__init__()
        layers = []
        current = input_size
        for size in hidden_sizes:
            layers += [nn.Linear(current, size), nn.ReLU()]
            current = size
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


def get_inputs():
    return [torch.randn(batch_size, input_size)]


def get_init_inputs():
    return [input_size, list(hidden_sizes), output_size]
