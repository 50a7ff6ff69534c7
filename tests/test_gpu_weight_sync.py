"""Weight sync on GPUs: the same new weights, swapped into a running vLLM engine through CUDA
IPC (learner tensors on the engine's GPU) and through a NCCL broadcast (learner tensors on a
second GPU), and from a saved folder read by the workers, give exactly what the object-store path gives; and both differ from the old
weights. The learner side here is this test process holding a model, as a learner rank would."""
from __future__ import annotations

import asyncio

import pytest

from configs.load import load_config
from rollout.policy import GenerationRequest

pytestmark = pytest.mark.gpu


def _perturbed(model_dir, device: str, seed: int):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_weights_swap_through_cuda_ipc_nccl_and_a_folder_as_through_the_object_store(tiny_model_dir, tmp_path):
    import torch

    from actors.weight_sync import WeightSender
    from rollout.vllm_policy import VLLMPolicy

    two_gpus = torch.cuda.device_count() >= 2
    cfg = load_config([], ["rollout.max_context_tokens=4096", "rollout.gpu_memory_utilization=0.3",
                           "rollout.temperature=0"])
    bucket = 2**16  # small buckets: several per model, as a large model would have

    async def scenario() -> dict:
        policy = VLLMPolicy.from_config(str(tiny_model_dir), cfg)
        request = GenerationRequest(prompt_ids=policy.tokenizer.encode("def forward(self, x):"), messages=[],
                                    tools=[], max_new_tokens=24)
        out = {}
        try:
            out["old"] = await policy.generate(request)
            model = _perturbed(tiny_model_dir, "cuda:0", seed=1)
            sender = WeightSender(rank=0, device="cuda:0")
            uuid, handles = sender.share(model, bucket)
            out["ipc_buckets"] = len(handles)
            out["ipc_s"] = await policy.update_weights_ipc(handles, uuid, 1)
            sender.release()
            out["ipc"] = await policy.generate(request)
            await policy.update_weights([(n, p.detach().cpu()) for n, p in model.named_parameters()], 2)
            out["object_store"] = await policy.generate(request)
            model.save_pretrained(tmp_path / "export")  # a stage's export: the workers read the files themselves
            await policy.load_folder(str(tmp_path / "export"), 3)
            out["folder"] = await policy.generate(request)
            if two_gpus:  # the learner's tensors on the second GPU, the engine on the first
                model = _perturbed(tiny_model_dir, "cuda:1", seed=2)
                sender = WeightSender(rank=0, device="cuda:1")
                host, port = WeightSender.address()
                await asyncio.gather(asyncio.to_thread(sender.join, 0, host, port, 2),
                                     policy.join_weight_group(host, port, 2))
                layouts = sender.layouts(model, bucket)
                sent, out["nccl_s"] = await asyncio.gather(asyncio.to_thread(sender.broadcast, 0, model, bucket),
                                                           policy.update_weights_nccl(layouts, 4))
                out["nccl_bytes"] = sent
                out["nccl"] = await policy.generate(request)
                await policy.update_weights([(n, p.detach().cpu()) for n, p in model.named_parameters()], 5)
                out["object_store_2"] = await policy.generate(request)
        finally:
            await policy.close()
        return out

    out = asyncio.run(scenario())
    assert out["ipc_buckets"] > 1
    assert out["ipc"].token_ids != out["old"].token_ids, "the IPC swap changed nothing"
    assert out["ipc"].token_ids == out["object_store"].token_ids
    assert out["ipc"].logprobs == pytest.approx(out["object_store"].logprobs, abs=1e-3)
    assert out["ipc"].version == 1
    assert out["folder"].token_ids == out["object_store"].token_ids
    assert out["folder"].logprobs == pytest.approx(out["object_store"].logprobs, abs=1e-3)
    if not two_gpus:
        pytest.skip("NCCL weight sync needs two GPUs; the CUDA IPC and folder halves passed")
    assert out["nccl_bytes"] > 0
    assert out["nccl"].token_ids != out["object_store"].token_ids, "the NCCL swap changed nothing"
    assert out["nccl"].token_ids == out["object_store_2"].token_ids
    assert out["nccl"].logprobs == pytest.approx(out["object_store_2"].logprobs, abs=1e-3)
    assert out["nccl"].version == 4
