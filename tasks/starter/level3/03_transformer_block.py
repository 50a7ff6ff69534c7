"""Pre-norm transformer decoder block on (batch, seq_len, dim):

    x = x + proj(causal_self_attention(layer_norm1(x)))
    x = x + fc2(gelu(fc1(layer_norm2(x))))

Multi-head attention is written out (qkv projection, scaled scores, causal mask, softmax, matmul).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
seq_len = 1024
dim = 768
num_heads = 12
mlp_ratio = 4

PRESETS = {
    "cpp": {"batch_size": 1, "seq_len": 128, "dim": 256, "num_heads": 4, "mlp_ratio": 4},
    "cuda": {"batch_size": 4, "seq_len": 1024, "dim": 768, "num_heads": 12, "mlp_ratio": 4},
}


class Model(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        head_dim = d // self.num_heads
        qkv = self.qkv(x).reshape(b, s, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (b, heads, s, head_dim)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(out.transpose(1, 2).reshape(b, s, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return x


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]


def get_init_inputs():
    return [dim, num_heads, mlp_ratio]
