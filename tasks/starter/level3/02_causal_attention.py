"""Scaled dot-product attention written out as matmul -> scale -> (causal mask) -> softmax -> matmul.

Inputs q, k, v have shape (batch, heads, seq_len, head_dim). With causal=True, query i attends only
to keys j <= i. Returns (batch, heads, seq_len, head_dim).
"""
import math

import torch
import torch.nn as nn

batch_size = 8
num_heads = 16
seq_len = 1024
head_dim = 64
causal = True

PRESETS = {
    "cpp": {"batch_size": 1, "num_heads": 4, "seq_len": 256, "head_dim": 64},
    "cuda": {"batch_size": 8, "num_heads": 16, "seq_len": 1024, "head_dim": 64},
}


class Model(nn.Module):
    def __init__(self, causal: bool = True):
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        if self.causal:
            s_q, s_k = scores.shape[-2], scores.shape[-1]
            mask = torch.ones(s_q, s_k, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.matmul(weights, v)


def get_inputs():
    shape = (batch_size, num_heads, seq_len, head_dim)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return [causal]
