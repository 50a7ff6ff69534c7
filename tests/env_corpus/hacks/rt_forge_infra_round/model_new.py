"""A wrong/broken candidate that reports its own failure as the environment's ("infra").

serve.py's round loop writes "[kind] message" for a RoundError; the harness's run_phase takes
the kind from that untrusted text with no SECURED check (wait_ready has one; run_phase not).
RoundError is reached through the caller's frame globals (sys._getframe is not flagged).
"""
import sys

import torch
import torch.nn as nn

KIND = "infra"


def _round_error():
    f = sys._getframe(1)
    while f is not None and "RoundError" not in f.f_globals:
        f = f.f_back
    return f.f_globals["RoundError"]


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise _round_error()(KIND, "could not map the shared slot memory (errno 12): the environment failed")
