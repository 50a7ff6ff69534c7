"""Weight sync: the learner's policy into the running generators, by one of three transports.

    object_store  buckets of CPU tensors through Ray's object store, staged over vLLM's RPC
                  (works everywhere; the CPU path)
    nccl          the learner's rank 0 broadcasts flattened buckets over a NCCL group of
                  itself and one generator's vLLM workers (learner and generator on
                  different GPUs); only bucket layouts travel through Ray
    ipc           the learner shares flattened buckets as CUDA IPC handles that vLLM's
                  workers copy from (learner and generator on the same GPU: colocated)

``auto`` picks: object_store without GPUs, nccl on separate GPUs, ipc when one one-GPU
generator shares the learner's GPU, and object_store for other colocated shapes.

One NCCL group per generator, not one for all: a group cannot take in a restarted member,
so a generator that comes back joins a new group of its own and the others keep theirs.
The cost is one broadcast per generator, each at device-to-device speed.

A broadcast blocks both sides until the other takes part. If a generator dies mid-swap the
learner would wait forever, so the swap has a deadline (``cluster.weight_sync_timeout_s``);
past it, the learner and that generator are restarted (the learner resumes from its last
checkpoint), which costs the steps since then but never a hung run.
"""
from __future__ import annotations

import asyncio
import socket
from typing import Any

import torch

from learner.weights import iter_weight_buckets
from protocol.weights import bucket_layout, flatten_bucket, ipc_handle

TRANSPORTS = ("object_store", "nccl", "ipc")


def resolve_transport(cluster: Any) -> str:
    """The transport ``cluster.weight_sync`` names, or the one ``auto`` picks; checked against the topology."""
    mode = str(cluster.weight_sync)
    gpus = bool(cluster.learner_gpus and cluster.generator_gpus)
    # IPC reaches one GPU: rank 0's, which only a single one-GPU generator shares. Colocated
    # engines on other GPUs share them with other ranks, and NCCL refuses two ranks on one
    # GPU, so those take the object store.
    one_shared_gpu = cluster.colocate and cluster.num_generators == 1 and cluster.generator_gpus == 1
    if mode == "auto":
        return "object_store" if not gpus else "nccl" if not cluster.colocate else "ipc" if one_shared_gpu else "object_store"
    if mode in ("nccl", "ipc") and not gpus:
        raise ValueError(f"cluster.weight_sync={mode} needs GPUs for both learner and generators "
                         f"(cluster.learner_gpus and cluster.generator_gpus >= 1); use object_store or auto")
    if mode == "ipc" and not one_shared_gpu:
        raise ValueError("cluster.weight_sync=ipc needs one generator on one GPU that the learner shares "
                         "(cluster.colocate=true, cluster.num_generators=1, cluster.generator_gpus=1); use auto")
    if mode == "nccl" and cluster.colocate:
        raise ValueError("cluster.weight_sync=nccl cannot join two processes on one GPU (cluster.colocate=true); use auto")
    return mode


class WeightSender:
    """The learner rank's side: NCCL groups per generator and IPC buffers held until released.

    Every rank runs the bucket iteration (ZeRO-3's gathers are collective); only rank 0 sends.
    """

    def __init__(self, rank: int, device: Any = None):
        self.rank = rank
        # The CUDA current device is per thread; a learner rank sees one GPU, a test may pick one.
        self.device = None if device is None else torch.device(device)
        self.comms: dict[int, Any] = {}  # generator index -> PyNcclCommunicator
        self.shared: list[torch.Tensor] = []  # flat buckets whose IPC handles are out
        self._layouts: dict[int, list[tuple[list, int]]] = {}  # per bucket size; the model's shapes do not change

    @staticmethod
    def address() -> tuple[str, int]:
        """This node's address and a free port: a rendezvous for a weight group, or for the learner ranks."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join(self, index: int, host: str, port: int, world_size: int) -> None:
        """Form generator ``index``'s group as rank 0 (the generator's workers join at the same time)."""
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        self.comms.pop(index, None)  # a restarted generator's old group is dead
        group = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world_size)
        with torch.cuda.device(self._device()):
            self.comms[index] = PyNcclCommunicator(group, device=self._device())

    def layouts(self, policy: Any, bucket_bytes: int) -> list[tuple[list, int]]:
        """Each bucket's (layout, byte size), in sending order, for the receiving generator.

        Worked out once per trainer: under ZeRO-3 each walk over the buckets gathers the model."""
        if bucket_bytes not in self._layouts:
            self._layouts[bucket_bytes] = [bucket_layout(b) for b in iter_weight_buckets(policy, bucket_bytes)]
        return self._layouts[bucket_bytes]

    def new_trainer(self) -> None:
        """A stage built new engines: their bucket layouts are worked out again."""
        self._layouts.clear()

    def broadcast(self, index: int, policy: Any, bucket_bytes: int) -> float:
        """Send every bucket to generator ``index``'s group; returns the bytes sent."""
        sent = 0
        with torch.cuda.device(self._device()):  # pynccl sends on the current device's stream
            for bucket in iter_weight_buckets(policy, bucket_bytes):
                if self.rank != 0:
                    continue
                flat, _ = flatten_bucket(bucket)
                self.comms[index].broadcast(flat, src=0)
                sent += flat.numel()
            torch.cuda.synchronize()
        return float(sent)

    def share(self, policy: Any, bucket_bytes: int) -> tuple[str, list[tuple[bytes, list]]]:
        """The GPU's UUID and each bucket's (IPC handle, layout); the buffers stay alive until release()."""
        self.release()
        handles = []
        for bucket in iter_weight_buckets(policy, bucket_bytes):
            if self.rank != 0:
                continue
            flat, layout = flatten_bucket(bucket)
            self.shared.append(flat)
            handles.append((ipc_handle(flat), layout))
        torch.cuda.synchronize(self._device())  # the copies are complete before another process reads them
        return str(torch.cuda.get_device_properties(self._device()).uuid), handles

    def release(self) -> None:
        self.shared.clear()

    def _device(self) -> torch.device:
        return self.device or torch.device("cuda", torch.cuda.current_device())


async def push_weights(system: Any, generators: list[tuple[int, Any]], version: int, transport: str,
                       bucket_mb: int, timeout_s: float) -> list[Any]:
    """Swap the learner's policy into ``generators`` ((index, actor) pairs) as ``version``.

    Returns each generator's result: its swap seconds, or the exception it raised.
    """
    if transport == "object_store":
        buckets = await system.learn("export_weights", bucket_mb)
        return await asyncio.gather(*(g.update_weights.remote(buckets, version) for _, g in generators),
                                    return_exceptions=True)
    if transport == "ipc":
        uuid, handles = await system.learn("share_weights", bucket_mb)
        try:
            return await asyncio.gather(*(g.update_weights_ipc.remote(handles, uuid, version) for _, g in generators),
                                        return_exceptions=True)
        finally:
            await system.learn("release_weights")
    layouts = await system.learn("weight_layouts", bucket_mb)
    results = []
    for index, generator in generators:  # one group each: one broadcast after another
        try:
            results.append(await asyncio.wait_for(_nccl_swap(system, index, generator, layouts, version, bucket_mb),
                                                  timeout_s))
        except _Refused as refused:
            results.append(refused.__cause__)
        except (asyncio.TimeoutError, _BroadcastFailed):
            await system.restart_after_hung_sync(generator)  # raises LearnerDied
    return results


class _Refused(Exception):
    """The generator refused before any broadcast began: nothing is blocked, report it."""


class _BroadcastFailed(Exception):
    """A side failed mid-broadcast: the other may be blocked in NCCL for good."""


async def _nccl_swap(system: Any, index: int, generator: Any, layouts: list, version: int, bucket_mb: int) -> float:
    try:
        if not await generator.weight_group_joined.remote():
            await _join(system, index, generator)
        await generator.check_weight_layouts.remote(layouts)
    except Exception as err:
        raise _Refused() from err
    try:
        _, seconds = await asyncio.gather(system.learn("broadcast_weights", index, bucket_mb),
                                          generator.update_weights_nccl.remote(layouts, version))
    except Exception as err:
        raise _BroadcastFailed() from err
    return seconds


async def _join(system: Any, index: int, generator: Any) -> None:
    host, port = await system.learn("weight_group_address")
    world_size = 1 + await generator.num_workers.remote()
    await asyncio.gather(system.learn("join_weight_group", index, host, port, world_size),
                         generator.join_weight_group.remote(host, port, world_size))
