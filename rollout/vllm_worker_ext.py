"""Weight loading inside vLLM's workers, reached through `collective_rpc`.

vLLM mixes this class into its worker class when the engine is built with
``worker_extension_cls="rollout.vllm_worker_ext.WeightUpdateExtension"``; its methods then run
in every worker process, next to the model. (vLLM refuses arbitrary callables over RPC
unless pickle is allowed, which is why weight updates go through named methods.)

A swap is two steps. *Stage*: new tensors arrive, in buckets, and wait beside the model,
which keeps serving with its current weights; the policy stages while generation goes on.
*Commit*: with generation paused, all staged tensors go into the model at once through
vLLM's in-place reload (``model_runner.reload_weights``), which restores each layer's
checkpoint-format loaders, loads (fusing q/k/v and gate/up), and re-runs the per-layer
post-processing (the CPU backend repacks linear weights for its GEMM kernels; plain
``model.load_weights`` into an already processed model fails there). Loading everything in
one reload matters: the reload processes a layer from whatever it received, so a layer split
across two reloads would be processed half-loaded.

Transports, each a staging method that ends in ``_cuda_agent_stage``:
- ``cuda_agent_stage_packed``: tensors travel inside the RPC message as raw bytes (the CPU
  path, and a fallback anywhere). The message codec carries bytes natively on every vLLM
  version, whereas its tensor encoding changed between versions.
- Later: a NCCL broadcast from the learner's rank 0 into a process group set up once by an
  ``init`` method (learner on other GPUs), and CUDA IPC handles when the learner shares the
  GPU (colocated). Both add a staging method here and reuse ``cuda_agent_commit``.

Every method returns a status dict instead of raising: an exception inside a worker RPC
can take the engine down with it, and a failed swap must leave a serving engine behind.
"""
from __future__ import annotations

import time
import traceback
from typing import Any, Iterable, Iterator

import torch

# A packed tensor: (name, dtype name as in torch, shape, raw bytes in C order).
PackedTensor = tuple[str, str, list[int], bytes]


def pack_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[PackedTensor]]:
    """Group tensors into buckets of about bucket_bytes (a larger tensor gets a bucket of its own).

    Buckets bound the size of one RPC message, so a large model never has its whole state
    serialised into one message.
    """
    bucket: list[PackedTensor] = []
    size = 0
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""  # the shape travels apart
        if bucket and size + len(data) > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), data))
        size += len(data)
    if bucket:
        yield bucket


def unpack_tensors(packed: Iterable[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, dtype, shape, data in packed:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(f"weight {name!r}: unknown dtype {dtype!r}")
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
        yield name, raw.view(torch_dtype).reshape(shape)


def _failure(what: str, e: BaseException) -> dict:
    return {"ok": False, "error": f"{what}: {type(e).__name__}: {e}", "trace": traceback.format_exc(limit=8)}


class WeightUpdateExtension:
    """Mixed into vLLM's worker (CPU or GPU): self.model_runner is the worker's."""

    def cuda_agent_stage_packed(self, packed: list) -> dict:
        """Stage a bucket of packed tensors (Hugging Face names) for the next commit."""
        try:
            tensors = list(unpack_tensors(packed))
        except Exception as e:
            return _failure("unpacking staged weights", e)
        self._cuda_agent_stage(tensors)
        return {"ok": True, "staged": len(self._cuda_agent_staged)}

    def cuda_agent_commit(self) -> dict:
        """Load every staged tensor into the model in one in-place reload, then drop the stage."""
        staged = self.__dict__.pop("_cuda_agent_staged", [])
        if not staged:
            return {"ok": False, "error": "commit with nothing staged"}
        started = time.perf_counter()
        try:
            runner = self.model_runner
            if hasattr(runner, "reload_weights"):
                runner.reload_weights(weights_iterator=iter(staged), is_checkpoint_format=True)
            else:  # a runner without in-place reload: load straight into the parameters
                with torch.no_grad():
                    self._cuda_agent_model().load_weights(iter(staged))
        except Exception as e:
            return _failure(f"loading {len(staged)} tensors", e)
        return {"ok": True, "loaded": len(staged), "seconds": time.perf_counter() - started}

    def cuda_agent_discard(self) -> dict:
        self.__dict__.pop("_cuda_agent_staged", None)
        return {"ok": True}

    def cuda_agent_weight_names(self) -> list[str]:
        """The model's parameter names as vLLM holds them (fused names such as qkv_proj)."""
        return [name for name, _ in self._cuda_agent_model().named_parameters()]

    def _cuda_agent_stage(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.__dict__.setdefault("_cuda_agent_staged", []).extend(named_tensors)

    def _cuda_agent_model(self) -> torch.nn.Module:
        runner = self.model_runner
        get_model = getattr(runner, "get_model", None)
        # get_model() unwraps CUDA-graph wrappers on GPU; the attribute is the fallback.
        return get_model() if callable(get_model) else runner.model
