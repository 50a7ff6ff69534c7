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
- ``cuda_agent_stage_packed``: the flat bucket travels inside the RPC message as bytes, beside
  its layout (the CPU path, and a fallback anywhere).
- ``cuda_agent_stage_nccl``: the learner's rank 0 broadcasts each bucket, flattened into one
  byte buffer, over a NCCL group of itself and this engine's workers (``cuda_agent_join_group``
  sets it up once; vLLM's own StatelessProcessGroup and PyNcclCommunicator, which leave
  torch.distributed's global group, the engine's tensor-parallel one, alone). The RPC carries
  only the bucket's layout. For a learner on other GPUs.
- ``cuda_agent_stage_ipc``: the learner shares each flattened bucket as a CUDA IPC handle and
  the worker copies it out of the learner's memory. For a learner on the same GPU (colocated).
All three receive the one wire format of protocol/weights.py: a flat byte buffer and its layout.

Every method returns a status dict instead of raising: an exception inside a worker RPC
can take the engine down with it, and a failed swap must leave a serving engine behind.
"""
from __future__ import annotations

import time
import traceback

import torch

from protocol.weights import open_ipc_handle, unflatten_bucket, unpack_bucket


def _failure(what: str, e: BaseException) -> dict:
    return {"ok": False, "error": f"{what}: {type(e).__name__}: {e}", "trace": traceback.format_exc(limit=8)}


class WeightUpdateExtension:
    """Mixed into vLLM's worker (CPU or GPU): self.model_runner is the worker's."""

    def cuda_agent_stage_packed(self, layout: list, data: bytes) -> dict:
        """Stage a packed bucket (its layout, its flat buffer's bytes; Hugging Face names) for the next commit."""
        try:
            tensors = unpack_bucket(layout, data)
        except Exception as e:
            return _failure("unpacking staged weights", e)
        self._cuda_agent_stage(tensors)
        return {"ok": True, "staged": len(self._cuda_agent_staged)}

    def cuda_agent_stage_file(self, path: str, names: list[str]) -> dict:
        """Stage ``names`` (checked by the policy) from a safetensors file this worker reads itself."""
        try:
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                self._cuda_agent_stage([(name, f.get_tensor(name)) for name in names])
        except Exception as e:
            return _failure(f"reading weights from {path}", e)
        return {"ok": True, "staged": len(self._cuda_agent_staged)}

    def cuda_agent_join_group(self, host: str, port: int, world_size: int) -> dict:
        """Join the learner's weight-broadcast group as rank 1 + this worker's rank."""
        try:
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup

            rank = 1 + self._cuda_agent_rank()
            group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
            self._cuda_agent_comm = PyNcclCommunicator(group, device=self.device)
        except Exception as e:
            return _failure(f"joining the weight group at {host}:{port}", e)
        return {"ok": True, "rank": rank}

    def cuda_agent_stage_nccl(self, layout: list, size: int) -> dict:
        """Receive one flattened bucket from the learner's broadcast and stage its tensors."""
        try:
            comm = self.__dict__.get("_cuda_agent_comm")
            if comm is None:
                return {"ok": False, "error": "no weight group: cuda_agent_join_group first"}
            flat = torch.empty(size, dtype=torch.uint8, device=self.device)
            comm.broadcast(flat, src=0)
            torch.cuda.current_stream(self.device).synchronize()  # the bucket has arrived before we return
            self._cuda_agent_stage(unflatten_bucket(flat, layout))
        except Exception as e:
            return _failure("receiving a weight bucket", e)
        return {"ok": True, "staged": len(self._cuda_agent_staged)}

    def cuda_agent_stage_ipc(self, handle: bytes, layout: list, device_uuid: str) -> dict:
        """Copy one flattened bucket out of the learner's GPU memory (same GPU) and stage it."""
        try:
            own = str(torch.cuda.get_device_properties(self.device).uuid)
            if own != device_uuid:
                return {"ok": False, "error": f"CUDA IPC needs the learner on this worker's GPU ({own}); "
                                              f"the learner is on {device_uuid}: use cluster.weight_sync=nccl"}
            flat = open_ipc_handle(handle, self.device).clone()  # the learner frees its copy after the swap
            torch.cuda.current_stream(self.device).synchronize()
            self._cuda_agent_stage(unflatten_bucket(flat, layout))
        except Exception as e:
            return _failure("opening a CUDA IPC weight bucket", e)
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

    def _cuda_agent_rank(self) -> int:
        from vllm.distributed.parallel_state import get_world_group

        return get_world_group().rank

    def _cuda_agent_stage(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.__dict__.setdefault("_cuda_agent_staged", []).extend(named_tensors)

    def _cuda_agent_model(self) -> torch.nn.Module:
        runner = self.model_runner
        get_model = getattr(runner, "get_model", None)
        # get_model() unwraps CUDA-graph wrappers on GPU; the attribute is the fallback.
        return get_model() if callable(get_model) else runner.model
