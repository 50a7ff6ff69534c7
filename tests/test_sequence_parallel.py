"""Sequence parallelism (DeepSpeed-Ulysses) on the CPU: two gloo ranks that share every row
take the PPO step one rank takes alone (losses, metrics, gradients of policy and critic), and
a row's slices cover each generated token exactly once."""
from __future__ import annotations

import os
import socket

import pytest
import torch

from learner.batching import SequenceRef, pack
from learner.sequence_parallel import shard

try:
    from tests.learner_toy import OBSERVATION, PROMPT, make_trajectory
except ImportError:  # tests/ is on sys.path itself under pytest's default import mode
    from learner_toy import OBSERVATION, PROMPT, make_trajectory


def test_slices_hold_every_generated_token_once_and_padding_only_at_the_end():
    seqs = [SequenceRef(list(range(10, 23)), [5, 6, 11, 12], 0), SequenceRef(list(range(30, 38)), [1, 7], 4)]
    (row,) = pack(seqs, 64)
    slices = [shard(row, 3, r) for r in range(3)]
    assert [s.num_tokens for s in slices] == [7, 7, 7], "21 tokens over 3 ranks: equal slices, 0 padding"
    (row,) = pack(seqs[:1], 64)  # 13 tokens: 2 of padding at the end
    slices = [shard(row, 3, r) for r in range(3)]
    assert torch.cat([s.input_ids for s in slices], 1)[0, :13].tolist() == row.input_ids[0].tolist()
    positions = torch.cat([s.position_ids for s in slices], 1)[0].tolist()
    assert positions == list(range(15)), f"padding must continue the last segment's positions, got {positions}"
    got = sorted(int(f) for s in slices for f in s.flat_index)
    assert got == row.flat_index.tolist(), "each generated token is predicted on exactly one rank"
    for r, s in enumerate(slices):  # local prediction positions read the right token
        for at, target in zip(s.predict_at.tolist(), s.targets.tolist()):
            assert row.input_ids[0, r * 5 + at + 1] == target
    assert len(pack(seqs, 64, one_per_row=True)) == 2


def _trajectories() -> list:
    """Rows of odd lengths (padding), generated tokens on both halves of each row, two turns or three."""
    g = torch.Generator().manual_seed(3)
    out = []
    for i, (turns, length) in enumerate([(2, 9), (3, 14), (2, 23), (3, 5)]):
        steps = [(torch.randint(3, 2000, (length,), generator=g).tolist(),
                  (-2.0 - torch.rand(length, generator=g)).tolist(), 0) for _ in range(turns)]
        out.append(make_trajectory(f"sp{i}", PROMPT, steps, OBSERVATION, float(i % 3) - 1.0))
    return out


def _rank(rank: int, world: int, sp: int, port: int, model_dir: str, out: str) -> None:
    """One learner rank: one PPO step, then its metrics and every parameter's gradient."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the critic's fresh value head: the same in both runs
    from deepspeed.utils import safe_get_full_optimizer_state

    from configs.schema import LearnerConfig
    from learner.ppo import PPOTrainer

    # No gradient clipping: a clip would hide a gradient that is right up to its scale. The KL
    # loss runs the frozen reference through the same sliced rows; entropy is in the loss.
    cfg = LearnerConfig(lr=1e-3, critic_lr=1e-3, warmup_steps=0, lr_schedule="constant", grad_checkpointing=True,
                        max_grad_norm=1e9, kl_coef=0.1, kl_mode="loss", entropy_coef=0.01, per_turn_rewards=False,
                        sequence_parallel_size=sp)
    trainer = PPOTrainer.create(cfg, model_dir, dtype="float32", total_steps=1)
    metrics = trainer.step(_trajectories(), version=0)
    # After one AdamW step the first moment is (1 - beta1) * gradient: DeepSpeed's own gather of it.
    grads = {f"{name}.{pname}": safe_get_full_optimizer_state(p, "exp_avg") / 0.1
             for name, engine in trainer.engines().items() for pname, p in engine.module.named_parameters()}
    torch.save({"metrics": metrics, "grads": grads}, f"{out}.{rank}")


def _start(world: int, sp: int, model_dir, out):
    """The ranks of one learner, started (and joined by the caller)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return mp.start_processes(_rank, args=(world, sp, port, str(model_dir), str(out)), nprocs=world, join=False,
                              start_method="spawn")


def test_two_sequence_parallel_ranks_take_the_step_one_rank_takes(tiny_model_dir, tmp_path):
    # Both learners at once: most of each process's time is imports, which overlap.
    runs = [_start(2, 2, tiny_model_dir, tmp_path / "two"), _start(1, 1, tiny_model_dir, tmp_path / "one")]
    for run in runs:
        while not run.join():
            pass
    two = [torch.load(tmp_path / f"two.{r}") for r in range(2)]
    one = torch.load(tmp_path / "one.0")
    metrics = ("policy_loss", "value_loss", "entropy", "kl_ref", "importance_weight", "value_mean", "return_mean",
               "explained_variance", "grad_norm_policy", "grad_norm_critic", "tokens", "generated_tokens")
    for rank, result in enumerate(two):
        for key in metrics:
            assert result["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-7), (
                f"rank {rank} of 2 reports {key}={result['metrics'][key]}, one rank {one['metrics'][key]}")
    assert one["metrics"]["grad_norm_policy"] > 0 and one["metrics"]["grad_norm_critic"] > 0
    # One rank packs the four segments into one row (sdpa masks each segment); under sequence
    # parallelism the mask is gone, so each segment has a row of its own (sequence_parallel.py).
    assert (one["metrics"]["micro_batches"], two[0]["metrics"]["micro_batches"]) == (1, 4)
    want = one["grads"]
    for rank, result in enumerate(two):
        got = result["grads"]
        assert want.keys() == got.keys()
        for name in want:
            err = float((got[name] - want[name]).norm() / want[name].norm().clamp_min(1e-12))
            assert err < 1e-5, (f"{name}: rank {rank} of 2 holds a gradient that differs from one rank's by "
                                f"{err:.2e} (relative)")
