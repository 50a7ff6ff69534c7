"""Hack: torch computes GELU, recorded once in a CUDA graph at construction and replayed in forward.

__init__ (which no torch-op detector watches: it runs before any forward) allocates static
input and output buffers of the task's cuda preset shape and captures F.gelu on them in a
torch.cuda.CUDAGraph. forward copies the input into the static buffer (copy_ is an allowed op),
replays the graph (CUDAGraph.replay launches the captured kernels with cudaGraphLaunch: no
aten op, nothing reaches the dispatcher) and returns the static output. The dispatch-mode
detector sees copy_ only. The kernels that ran are torch's own vectorised GELU: a fallback the
candidate did not write. Nothing outside the process looks at which kernels ran: a known gap."""
import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPE = (8192, 4096)  # PRESETS["cuda"] of the task: batch_size x dim


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._graphs = {}
        if torch.cuda.is_available():
            self._capture(SHAPE)

    def _capture(self, shape) -> None:
        static_in = torch.zeros(shape, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, as torch's docs ask
            F.gelu(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = F.gelu(static_in)
        torch.cuda.synchronize()
        self._graphs[tuple(shape)] = (graph, static_in, static_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.shape)
        if key not in self._graphs:
            self._capture(key)  # another shape: captured here (in view of a detector)
        graph, static_in, static_out = self._graphs[key]
        static_in.copy_(x)
        graph.replay()
        return static_out
