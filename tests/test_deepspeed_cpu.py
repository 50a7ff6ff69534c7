"""DeepSpeed on this machine: ZeRO-2 on the CPU (gloo) trains the tiny model and lowers its loss."""
from __future__ import annotations

import math
import time

from tests.chat_inputs import CODE, free_port, report_timing
from tests.dist_teardown import destroy_process_group


def test_deepspeed_zero2_cpu_training_steps_reduce_the_loss(tiny_model_dir, monkeypatch, capsys):
    """Single-process ZeRO-2 on CPU over gloo, fp32, torch AdamW."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                           WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(key, value)
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert deepspeed.get_accelerator().device_name() == "cpu"
    # On the CPU accelerator, init_distributed JIT-compiles a shared-memory all-reduce op (1-4 min
    # on 2 cores the first time, then cached in ~/.cache/torch_extensions). Only tensor-parallel
    # inference uses it (TorchBackend.inference_all_reduce); training goes through gloo. DeepSpeed
    # keeps this dict so that edits persist: mark the op unavailable for this test.
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)
    assert not dist.is_initialized(), "an earlier test left torch.distributed initialised"
    started = time.perf_counter()
    deepspeed.init_distributed(dist_backend="gloo")
    try:
        init_dist_s = time.perf_counter() - started
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        model.train()
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 2},
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": False},
            "fp16": {"enabled": False},
            "gradient_clipping": 1.0,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        engine, ds_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        assert engine.zero_optimization_stage() == 2
        assert type(ds_optimizer).__name__ == "DeepSpeedZeroOptimizer"

        ids = tokenizer([CODE, CODE[::-1]], add_special_tokens=False, padding="max_length", max_length=64,
                        truncation=True, return_tensors="pt")["input_ids"]
        before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        losses = []
        t = time.perf_counter()
        for _ in range(6):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        steps_s = time.perf_counter() - t
        report_timing(capsys, f"DeepSpeed ZeRO-2 CPU: init_distributed {init_dist_s:.1f}s, 6 steps of 2x64 tokens "
                        f"in {steps_s:.2f}s ({6 * ids.numel() / steps_s:.0f} tok/s); losses {[round(x, 3) for x in losses]}")
        assert all(math.isfinite(x) for x in losses)
        assert all(b < a for a, b in zip(losses, losses[1:])), losses
        assert losses[-1] < losses[0] - 0.5, losses
        changed = [n for n, p in engine.module.named_parameters() if not torch.equal(p.detach(), before[n])]
        assert len(changed) == len(before)
    finally:
        destroy_process_group()
