#!/usr/bin/env python
"""Weight-swap seconds per GB into a running vLLM engine, by transport.

    object_store  CPU tensors (what a generator holds after fetching the learner's buckets
                  from the object store) staged over vLLM's RPC, then loaded
    ipc           learner tensors on the engine's GPU, shared as CUDA IPC handles (GPU only)
    nccl          learner tensors on a second GPU, broadcast over NCCL (two GPUs only)

Each swap is timed whole (stage, pause, load, prefix-cache reset, resume), as a generator pays
it; the median of --repeats swaps is reported, with GB counted in the engine's dtype.

    python scripts/bench_weight_sync.py --shape smollm2                 # CPU
    . .gpu-stack/bin/activate && python scripts/bench_weight_sync.py --shape 0.5b
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="0.5b", help="a tests/tiny_model.py SHAPES key, or tiny (random weights, test tokenizer)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--out", default=None, help="also write the JSON result here")
    return p.parse_args()


async def run(args: argparse.Namespace, folder: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from actors.weight_sync import WeightSender
    from configs.load import load_config
    from rollout.vllm_policy import VLLMPolicy

    gpus = torch.cuda.device_count()
    dtype = torch.bfloat16 if gpus else torch.float32
    cfg = load_config([], ["rollout.max_context_tokens=4096", "rollout.gpu_memory_utilization=0.4",
                           f"model.dtype={'bfloat16' if gpus else 'float32'}", f"rollout.weight_bucket_mb={args.bucket_mb}"])
    policy = VLLMPolicy.from_config(str(folder), cfg)
    bucket = args.bucket_mb * 2**20
    version = 0
    times: dict[str, list[float]] = {}
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=dtype)
        gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
        cpu_named = [(n, p.detach()) for n, p in model.named_parameters()]
        sender = WeightSender(rank=0, device="cuda:0" if gpus else None)
        for _ in range(args.repeats):
            version += 1
            times.setdefault("object_store", []).append(await policy.update_weights(cpu_named, version))
        if gpus:
            model.to("cuda:0")
            for _ in range(args.repeats):
                version += 1
                uuid, handles = sender.share(model, bucket)
                times.setdefault("ipc", []).append(await policy.update_weights_ipc(handles, uuid, version))
                sender.release()
        if gpus >= 2:
            model.to("cuda:1")
            sender = WeightSender(rank=0, device="cuda:1")
            host, port = WeightSender.address()
            await asyncio.gather(asyncio.to_thread(sender.join, 0, host, port, 2), policy.join_weight_group(host, port, 2))
            layouts = sender.layouts(model, bucket)
            for _ in range(args.repeats):
                version += 1
                _, seconds = await asyncio.gather(asyncio.to_thread(sender.broadcast, 0, model, bucket),
                                                  policy.update_weights_nccl(layouts, version))
                times.setdefault("nccl", []).append(seconds)
    finally:
        await policy.close()
    result = {"shape": args.shape, "gb": round(gb, 3), "gpus": gpus}
    for name, ts in times.items():
        median = statistics.median(ts)
        result[name] = {"swap_s": round(median, 3), "s_per_gb": round(median / gb, 3), "all_s": [round(t, 3) for t in ts]}
    return result


if __name__ == "__main__":
    args = parse_args()
    from tests.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(run(args, build_tiny_model(Path(tmp) / "model", None if args.shape == "tiny" else args.shape)))
    print(f"{'transport':14} {'swap s':>8} {'s/GB':>8}   ({result['gb']} GB, shape {result['shape']})")
    for name in ("object_store", "ipc", "nccl"):
        if name in result:
            print(f"{name:14} {result[name]['swap_s']:>8} {result[name]['s_per_gb']:>8}")
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result))
