"""PPO with a critic, GAE, rejection fine-tuning, value pretraining, DeepSpeed engines.

    batching.py        trajectories -> flat per-token order -> packed micro-batches (no padding)
    models.py          policy, critic (backbone + value head), frozen reference; scoring micro-batches
    gae.py             per-token rewards, GAE, whitening, explained variance
    losses.py          clipped surrogate with truncated importance weight, value loss, KL, entropy
    engine.py          DeepSpeed engines (ZeRO 2/3, bf16/fp32, caller-owned accumulation, LR schedule)
    sequence_parallel.py  rows shared by learner.sequence_parallel_size ranks (DeepSpeed-Ulysses / ALST)
    ppo.py             PPOTrainer.step: one learner step over a batch of trajectories
    rft.py             the rejection filter and RFTTrainer.step
    value_pretrain.py  ValuePretrainer.step: fit the critic to a fixed policy's returns
    checkpoint.py      save / resume (weights, optimiser, scheduler, RNG, counters), HF export
    weights.py         size-bounded weight buckets for hot-swapping into the generators
"""
