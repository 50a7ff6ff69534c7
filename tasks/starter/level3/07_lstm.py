"""Single-layer LSTM unrolled over time, written from Linear layers and elementwise gates.

x: (batch, seq_len, input_size); h0, c0: (batch, hidden_size). Returns the hidden state at every
step, (batch, seq_len, hidden_size). Gate order in the fused projections: input, forget, cell, output.
"""
import torch
import torch.nn as nn

batch_size = 512
seq_len = 64
input_size = 512
hidden_size = 512

PRESETS = {
    "cpp": {"batch_size": 16, "seq_len": 24, "input_size": 256, "hidden_size": 256},
    "cuda": {"batch_size": 512, "seq_len": 64, "input_size": 512, "hidden_size": 512},
}


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_proj = nn.Linear(input_size, 4 * hidden_size)
        self.hidden_proj = nn.Linear(hidden_size, 4 * hidden_size, bias=False)

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
        gates_x = self.input_proj(x)  # all time steps at once: (batch, seq_len, 4 * hidden)
        h, c = h0, c0
        outputs = []
        for t in range(x.size(1)):
            gates = gates_x[:, t] + self.hidden_proj(h)
            i, f, g, o = gates.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


def get_inputs():
    return [
        torch.randn(batch_size, seq_len, input_size),
        torch.randn(batch_size, hidden_size),
        torch.randn(batch_size, hidden_size),
    ]


def get_init_inputs():
    return [input_size, hidden_size]
