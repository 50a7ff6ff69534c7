"""DeepSpeed engines for the policy and the critic.

One configuration for both: ZeRO stage 2 or 3 from ``learner.zero_stage``, bf16 on GPU and
fp32 on CPU (the model's dtype says which), gradient clipping, AdamW, a linear warm-up and
then a constant or cosine learning rate.

Gradient accumulation is the caller's: a batch of trajectories packs into however many
micro-batches its lengths need, so the number per optimiser step varies. DeepSpeed's
``managed_gradient_accumulation: false`` is that contract: ``backward`` only accumulates
and every ``step`` is a boundary (reduce, clip, update). The loss of each micro-batch is
already divided by the step's generated-token count (losses.token_mean), so the
accumulated gradient is the gradient of the step's token-mean loss.

Long sequences (the paper's 128k-token agentic episodes, rollout.max_context_tokens). What
keeps them affordable on one device: a segment is its own row (packing never pads), gradient
checkpointing keeps one layer's activations instead of all of them, and logits are computed
only at positions that predict a generated token (models.score_tokens), so the (tokens x
vocabulary) tensor follows the model's own tokens, not the tool output. Beyond what one device
holds, ``learner.sequence_parallel_size`` ranks share each row (DeepSpeed-Ulysses, ALST:
sequence_parallel.py): the engines get DeepSpeed's sequence-parallel ``mpu``, so that ZeRO
partitions over all ranks and sums gradients over each group's slices of a row.
"""
from __future__ import annotations

import math
import os
import socket
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from configs.schema import LearnerConfig, LRSchedule


def on_gpu() -> bool:
    import deepspeed

    return deepspeed.get_accelerator().device_name() != "cpu"


def device() -> torch.device:
    import deepspeed

    accel = deepspeed.get_accelerator()
    return torch.device("cpu") if accel.device_name() == "cpu" else torch.device(accel.device_name(accel.current_device()))


def init_distributed() -> None:
    """Join (or, alone, form) the learner's process group: nccl on GPU, gloo on CPU.

    Under a launcher (Ray, torchrun, deepspeed) the rank variables are set; a single process
    started by hand gets a one-member group on a free local port.
    """
    import deepspeed

    if dist.is_initialized():
        return
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1").items():
            os.environ.setdefault(key, value)
    if not on_gpu():
        # On the CPU accelerator DeepSpeed would JIT-build a shared-memory all-reduce op (minutes
        # on 2 cores) that only tensor-parallel inference uses; training all-reduces over gloo.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu() else "gloo")


def loss_denominator(local_tokens: float) -> float:
    """What each rank divides its summed token loss by, for the token mean over all ranks.

    ``local_tokens`` counts the generated tokens of this rank's whole rows: under sequence
    parallelism the group's rows, which every rank of the group counts though it back-propagates
    only its slice's tokens. DeepSpeed sums gradients over a sequence-parallel group's ranks
    (their slices add up to the rows' gradient) and averages them over the data-parallel groups
    (divides by their count), so each rank divides by the global token count over the number of
    data-parallel groups: the reduced gradient is then that of the global token-mean loss.
    """
    from learner import sequence_parallel

    group = sequence_parallel.current()
    total = all_reduce_sum(local_tokens) / (group.size if group is not None else 1)
    return total / sequence_parallel.data_parallel_size()


def all_reduce_sum(value: float) -> float:
    """Sum of ``value`` over all the learner's ranks (they share a token-mean denominator)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device())
    dist.all_reduce(t)
    return float(t.item())


def deepspeed_config(cfg: LearnerConfig, bf16: bool) -> dict[str, Any]:
    if cfg.zero_stage not in (2, 3):
        raise ValueError(f"learner.zero_stage must be 2 or 3, got {cfg.zero_stage}")
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage == 3:
        # Full 16-bit weights on save, so a checkpoint's module file is usable on its own.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    sequence_parallel = {"sequence_parallel_size": cfg.sequence_parallel_size} if cfg.sequence_parallel_size > 1 else {}
    return {
        **sequence_parallel,  # for zero.Init under ZeRO-3, which sees no mpu: its data-parallel size
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,  # see the module docstring
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        "gradient_clipping": cfg.max_grad_norm,
        "zero_allow_untested_optimizer": True,  # a torch AdamW: no fused-Adam op build on CPU
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


@contextmanager
def zero3_init(cfg: LearnerConfig, bf16: bool) -> Iterator[None]:
    """Under ZeRO-3, models loaded inside this context are built partitioned (deepspeed.zero.Init
    through transformers' HfDeepSpeedConfig): no rank ever holds the full weights, which is
    what lets a model larger than one device's memory load at all. A no-op under ZeRO-2.
    Only for models that build_engine will wrap: a partitioned model runs only inside an engine."""
    if cfg.zero_stage != 3:
        yield
        return
    from transformers.integrations import HfDeepSpeedConfig

    init_distributed()
    keep_alive = HfDeepSpeedConfig(deepspeed_config(cfg, bf16))  # transformers holds only a weak reference
    try:
        yield
    finally:
        del keep_alive


def init_learner(cfg: LearnerConfig, model_path: str | os.PathLike, attention: str) -> None:
    """The learner's process group, and its sequence-parallel groups when
    ``learner.sequence_parallel_size`` > 1 (before any model runs: it reroutes ``attention``)."""
    from learner import sequence_parallel

    init_distributed()
    sequence_parallel.setup(cfg.sequence_parallel_size, str(model_path), attention)


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, schedule: LRSchedule, min_ratio: float) -> float:
    """Fraction of the peak rate at optimiser step ``step`` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if LRSchedule(schedule) == LRSchedule.constant:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_engine(module: nn.Module, cfg: LearnerConfig, lr: float, total_steps: int):
    """A DeepSpeed engine training ``module`` with AdamW at peak rate ``lr`` for ``total_steps`` optimiser steps."""
    import deepspeed

    from learner import sequence_parallel

    init_distributed()
    group = sequence_parallel.current()
    dtype = next(module.parameters()).dtype
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg.weight_decay)
    warmup, schedule, min_ratio = cfg.warmup_steps, cfg.lr_schedule, cfg.min_lr_ratio
    # A LambdaLR over the client optimizer: DeepSpeed steps it at each boundary and saves its
    # state (the step count; the multiplier is recomputed from the config) in checkpoints.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, warmup, total_steps, schedule, min_ratio))
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=deepspeed_config(cfg, bf16=dtype == torch.bfloat16),
                                           mpu=group.mpu if group is not None else None)
    return engine
