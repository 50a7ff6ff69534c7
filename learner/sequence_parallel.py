"""Sequence parallelism: rows longer than one device holds, split across learner ranks.

DeepSpeed-Ulysses as ALST ships it in DeepSpeed (``UlyssesSPAttentionHF``,
deepspeed.runtime.sequence_parallel): ``learner.sequence_parallel_size`` consecutive learner
ranks form a group that trains the same packed rows. Each rank holds one contiguous slice of
every row (1/n of its tokens: embeddings, MLPs, norms, the logits of its generated tokens);
inside attention an all-to-all trades the sequence slices for head slices, so each rank
attends over the whole row for heads / n heads, and a second all-to-all trades back. Groups
are data-parallel with each other (the actors' LearnerGroup deals the batch per group).

What this module adds to DeepSpeed's parts, and why:

- Rows are padded to a multiple of n at their end (Ulysses slices equal shares). Padding
  comes after every real token, so under causal attention nothing real sees it, and it is
  never a prediction position.
- Under sdpa, DeepSpeed's wrapper drops the attention mask (a 4D mask of a 128k row is
  quadratic) and attention runs plain causal over the row: a row must then hold a single
  segment, or packed segments would see each other. ``pack_rows`` asks ``batching.pack`` for
  one segment per row unless the attention is FlashAttention, whose varlen kernels read the
  segment starts from the position ids that the wrapper all-gathers.
- Losses: a rank's micro-batch slice holds some of the row's generated tokens. Each rank
  back-propagates the token sum of its slice over the step's token-mean denominator, and the
  all-to-all's backward carries the other slices' gradients to it; DeepSpeed sums gradients
  over the group and averages them over the data-parallel groups (it knows the group from the
  ``mpu`` given to ``deepspeed.initialize``). The denominator (engine.loss_denominator) is the
  step's generated tokens over the data-parallel groups, computed from whole rows.
- Scoring without gradients (old values, proximal and reference logprobs) fills each rank's
  slice; ``gather_scores`` sums the slices over the group, so every rank holds every token's
  score for GAE. Step metrics likewise sum over the group (``reduce_sums``).

Registration replaces the process's attention function (transformers' ALL_ATTENTION_FUNCTIONS
entry): once on, every model forward in the process must see sliced rows, which is why the
policy, the critic and the reference all take their micro-batches through ``local_slice``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from learner.batching import MicroBatch, SequenceRef, pack


@dataclass
class Group:
    """This process's sequence-parallel group: its size, this rank's place in it, the process group."""

    size: int
    rank: int
    group: Any
    mpu: Any  # deepspeed.runtime.sequence_parallel.parallel_state_sp, for deepspeed.initialize
    attention: str


_GROUP: Group | None = None  # one per process: registration patches transformers process-wide


def current() -> Group | None:
    """The group set up in this process, or None without sequence parallelism."""
    return _GROUP


def setup(size: int, model_path: str, attention: str) -> Group | None:
    """Form the sequence-parallel groups of ``size`` ranks and route ``attention`` through
    Ulysses (idempotent: a later stage's trainer in the same process reuses the group).
    Needs the learner's process group. ``size`` 1: nothing to do."""
    global _GROUP
    if size < 1:
        raise ValueError(f"learner.sequence_parallel_size must be at least 1, got {size}")
    if size == 1:
        return None
    if _GROUP is not None:
        if (_GROUP.size, _GROUP.attention) != (size, attention):
            raise ValueError(f"this learner process already runs sequence parallelism of size {_GROUP.size} with "
                             f"{_GROUP.attention} attention; it cannot switch to {size} with {attention}")
        return _GROUP
    world = dist.get_world_size()
    if world % size:
        raise ValueError(f"learner.sequence_parallel_size={size} must divide the learner's ranks ({world}): "
                         "cluster.learner_gpus, or cluster.learner_cpu_ranks on the CPU")
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=str(model_path), core_attn_implementation=attention, sequence_parallel_size=size,
        micro_batch_size=1, seq_length_is_variable=True)
    _GROUP = Group(size, mpu.get_sequence_parallel_rank(), mpu.get_sequence_parallel_group(), mpu, attention)
    return _GROUP


def data_parallel_size() -> int:
    """How many groups train different data: the world size over the sequence-parallel size."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    return world // (_GROUP.size if _GROUP is not None else 1)


def pack_rows(sequences: list[SequenceRef], token_budget: int) -> list[MicroBatch]:
    """``batching.pack``, with one segment per row where the attention cannot see segment
    boundaries under sequence parallelism (see the module doc)."""
    if _GROUP is not None and not _GROUP.attention.startswith("flash_attention"):
        return pack(sequences, token_budget, one_per_row=True)
    return pack(sequences, token_budget)


def shard(mb: MicroBatch, size: int, rank: int) -> MicroBatch:
    """Rank ``rank``'s contiguous slice of a row padded to a multiple of ``size``: its tokens,
    and the generated tokens whose prediction position falls in it (positions made local)."""
    length = mb.num_tokens
    local = -(-length // size)
    pad = local * size - length
    ids, pos = mb.input_ids, mb.position_ids
    if pad:
        # Position ids continue the last segment, so it stays one sequence to every attention.
        ids = torch.cat([ids, ids.new_zeros(1, pad)], dim=1)
        pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, pad + 1, dtype=pos.dtype, device=pos.device)[None]], dim=1)
    lo, hi = rank * local, (rank + 1) * local
    mine = (mb.predict_at >= lo) & (mb.predict_at < hi)
    return MicroBatch(ids[:, lo:hi].contiguous(), pos[:, lo:hi].contiguous(), mb.predict_at[mine] - lo,
                      mb.targets[mine], mb.flat_index[mine], list(mb.sequence_lengths))


def local_slice(mb: MicroBatch) -> MicroBatch:
    """This rank's slice of a whole row under sequence parallelism; the row itself otherwise."""
    return mb if _GROUP is None else shard(mb, _GROUP.size, _GROUP.rank)


def gather_scores(scores: torch.Tensor) -> torch.Tensor:
    """Per-token scores of a whole batch, each rank having filled only its slices' tokens (zeros
    elsewhere): summed over the group, every rank holds every token's score."""
    if _GROUP is None:
        return scores
    from learner.engine import device

    out = scores.to(device(), dtype=torch.float64)  # exact: each token is non-zero on one rank only
    dist.all_reduce(out, group=_GROUP.group)
    return out.to(scores.device, dtype=scores.dtype)


def reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """Sums of per-token metrics (or counts) over the group's slices of the same rows."""
    if _GROUP is None or not values:
        return values
    from learner.engine import device

    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device())
    dist.all_reduce(t, group=_GROUP.group)
    return dict(zip(keys, t.tolist()))
