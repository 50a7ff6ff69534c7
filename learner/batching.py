"""From trajectories to packed micro-batches.

``flatten`` lays out a batch's generated tokens in one flat order (trajectory by trajectory,
in generation order): every per-token quantity (sampling logprob, version, loss weight, value,
advantage) is a 1-D tensor in that order, and a micro-batch reads its tokens' share through
``flat_index``. ``pack`` puts segments into micro-batches of at most
``token_budget`` tokens by concatenation, with position ids restarting at 0 for each
segment, and no padding. Transformers reads restarting position ids as packed sequences and
keeps attention inside each one: FlashAttention-2 turns them into varlen cu_seqlens, and the
sdpa and eager paths build a block-diagonal causal mask (transformers.masking_utils,
find_packed_sequence_indices); that needs ``attention_mask=None`` and no KV cache, which is
how models.py calls the model.

Each micro-batch says where to read its predictions: the output at position t - 1 predicts
token t, so a generated token at t is scored at t - 1 and the critic's value of the state
before it is read there too. Only those positions reach the LM head (logits_to_keep), which
keeps the (tokens x vocabulary) logits tensor to the generated tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from protocol.trajectory import Trajectory


class BatchError(ValueError):
    """A batch the learner cannot train on; the message says which trajectory and why."""


@dataclass
class SequenceRef:
    """One segment to train as its own sequence."""

    token_ids: list[int]
    generated: list[int]  # positions of its generated tokens, ascending
    flat_start: int  # flat index of its first generated token


@dataclass
class FlatBatch:
    """A batch of trajectories' generated tokens in one flat order."""

    sequences: list[SequenceRef]
    behaviour_logprobs: torch.Tensor  # [n] float32: the sampler's logprobs
    versions: torch.Tensor  # [n] int64: policy version that generated each token
    weights: torch.Tensor  # [n] float32: each token's loss weight, its trajectory's (1.0 unless downweighted)
    spans: list[tuple[int, int]]  # per trajectory, its [start, end) in the flat order
    turn_ends: list[list[int]]  # per trajectory, each turn's end, relative to the trajectory's start
    turn_rewards: list[list[float]]  # per trajectory, each turn's milestone reward
    rewards: list[float]  # per trajectory, the episode reward

    @property
    def num_generated(self) -> int:
        return int(self.behaviour_logprobs.numel())

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.sequences)


@dataclass
class MicroBatch:
    """Segments packed into one row: what one forward pass sees."""

    input_ids: torch.Tensor  # [1, T] int64
    position_ids: torch.Tensor  # [1, T] int64, restarting at 0 per segment
    predict_at: torch.Tensor  # [N] int64: positions whose output predicts a generated token
    targets: torch.Tensor  # [N] int64: those generated tokens
    flat_index: torch.Tensor  # [N] int64: where those tokens sit in the FlatBatch order
    sequence_lengths: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def num_generated(self) -> int:
        return int(self.targets.numel())

    def to(self, device: torch.device | str) -> "MicroBatch":
        return MicroBatch(self.input_ids.to(device), self.position_ids.to(device), self.predict_at.to(device),
                          self.targets.to(device), self.flat_index.to(device), list(self.sequence_lengths))


def check_weights(weights: list[float] | None, count: int) -> list[float]:
    """The trajectories' loss weights (None: all 1.0), each a finite number in (0, 1]."""
    if weights is None:
        return [1.0] * count
    weights = list(weights)
    if len(weights) != count:
        raise BatchError(f"weights has {len(weights)} entries for {count} trajectories: pass one loss weight per "
                         "trajectory, aligned with them, or weights=None for all 1.0")
    checked = []
    for k, w in enumerate(weights):
        try:
            value = float(w)
        except (TypeError, ValueError):
            value = math.nan
        # 0 would train on nothing while still counting the tokens; above 1 would amplify a stale trajectory.
        if not (math.isfinite(value) and 0.0 < value <= 1.0):
            raise BatchError(f"weights[{k}] is {w!r}: each loss weight must be a finite number in (0, 1]; "
                             "drop the trajectory instead of giving it weight 0")
        checked.append(value)
    return checked


def flatten(trajectories: list[Trajectory], weights: list[float] | None = None) -> FlatBatch:
    """Lay out the batch's generated tokens; reject trajectories the learner cannot train on.
    ``weights`` holds each trajectory's loss weight (see check_weights); its tokens inherit it."""
    loss_weights = check_weights(weights, len(trajectories))
    sequences: list[SequenceRef] = []
    logprobs: list[float] = []
    versions: list[int] = []
    token_weights: list[float] = []
    spans, turn_ends, turn_rewards, rewards = [], [], [], []
    for k, traj in enumerate(trajectories):
        if not traj.token_level:
            raise BatchError(f"trajectory {k} ({traj.episode_id}) is chat-only (token_level=False): it has no "
                             "tokens to train on; keep chat-only policies to evaluation")
        if traj.num_generated == 0:
            raise BatchError(f"trajectory {k} ({traj.episode_id}) has no generated tokens; drop it before "
                             f"training (stop_reason={traj.stop_reason!r})")
        start = len(logprobs)
        for i, seg in enumerate(traj.segments):
            generated = [j for j, m in enumerate(seg.loss_mask) if m]
            if generated and generated[0] == 0:
                raise BatchError(f"trajectory {k} ({traj.episode_id}) segments[{i}] starts with a generated token: "
                                 "nothing precedes it to predict it from; a segment must open with its prompt")
            if generated:
                sequences.append(SequenceRef(list(seg.token_ids), generated, len(logprobs)))
            logprobs.extend(seg.logprobs[j] for j in generated)
        ends, turn_r, done = [], [], 0
        for turn in traj.turns:  # turns cover the generated tokens exactly, in order (Trajectory.validate)
            versions.extend([turn.version] * (turn.end - turn.start))
            done += turn.end - turn.start
            ends.append(done)
            turn_r.append(float(turn.reward))
        spans.append((start, len(logprobs)))
        token_weights.extend([loss_weights[k]] * (len(logprobs) - start))
        turn_ends.append(ends)
        turn_rewards.append(turn_r)
        rewards.append(float(traj.reward))
    return FlatBatch(sequences, torch.tensor(logprobs, dtype=torch.float32), torch.tensor(versions, dtype=torch.int64),
                     torch.tensor(token_weights, dtype=torch.float32), spans, turn_ends, turn_rewards, rewards)


def pack(sequences: list[SequenceRef], token_budget: int, one_per_row: bool = False) -> list[MicroBatch]:
    """First-fit-decreasing packing into rows of at most ``token_budget`` tokens (``row_tokens``
    in models.py chooses it per device); ``one_per_row``: every segment in a row of its own
    (sequence parallelism under an attention that cannot see segment boundaries).

    A segment longer than the budget gets a row of its own: it cannot be cut, since every
    token must attend to all before it (splitting one row across devices is sequence
    parallelism's job, sequence_parallel.py, not packing's).
    """
    if token_budget <= 0:
        raise BatchError(f"learner.micro_batch_tokens must be positive, got {token_budget}")
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i].token_ids))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(sequences[i].token_ids)
        for b, free in enumerate(room):
            if n <= free and not one_per_row:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(token_budget - n)
    return [_build(sorted(b), sequences) for b in bins]


def _build(members: list[int], sequences: list[SequenceRef]) -> MicroBatch:
    ids, pos, predict_at, targets, flat = [], [], [], [], []
    lengths = []
    for i in members:
        seq = sequences[i]
        base = len(ids)
        ids.extend(seq.token_ids)
        pos.extend(range(len(seq.token_ids)))
        lengths.append(len(seq.token_ids))
        for k, j in enumerate(seq.generated):
            predict_at.append(base + j - 1)
            targets.append(seq.token_ids[j])
            flat.append(seq.flat_start + k)
    as_long = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    return MicroBatch(as_long(ids)[None], as_long(pos)[None], as_long(predict_at), as_long(targets), as_long(flat), lengths)


def split_minibatches(micro_batches: list[MicroBatch], count: int) -> list[list[MicroBatch]]:
    """``count`` groups of micro-batches with about equal generated tokens (one optimiser step each)."""
    if count <= 0:
        raise BatchError(f"learner.ppo_minibatches must be positive, got {count}")
    if count > len(micro_batches):
        raise BatchError(f"learner.ppo_minibatches={count} but the batch packs into only {len(micro_batches)} "
                         "micro-batches: lower ppo_minibatches or learner.micro_batch_tokens")
    groups: list[list[MicroBatch]] = [[] for _ in range(count)]
    load = [0] * count
    for mb in sorted(micro_batches, key=lambda m: -m.num_generated):
        g = min(range(count), key=lambda i: (load[i], len(groups[i])))
        groups[g].append(mb)
        load[g] += mb.num_generated
    return groups
