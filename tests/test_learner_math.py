"""The learner's arithmetic against straightforward reference computations: GAE, PPO's loss
terms, token-mean aggregation, trajectory flattening, sequence packing (packed logits equal
unpacked ones), the RFT filter and the learning-rate schedule. No DeepSpeed here."""
from __future__ import annotations

import math

import pytest
import torch

from configs.schema import LearnerConfig, LRSchedule, RFTConfig
from learner.batching import BatchError, SequenceRef, flatten, pack, split_minibatches
from learner.engine import lr_multiplier
from learner.gae import batch_advantages, explained_variance, gae, token_rewards, whiten
from learner.losses import entropy_from_logits, kl_k3, kl_penalty, policy_loss, token_mean, value_loss
from learner.models import row_tokens
from learner.rft import filter_episodes
from protocol.trajectory_meta import TrajectoryMeta, invalid_call_rate, longest_repeat
from protocol.trajectory import Segment, Trajectory, Turn

try:
    from tests.learner_toy import OBSERVATION, PROMPT, make_trajectory
except ImportError:  # tests/ is on sys.path itself under pytest's default import mode
    from learner_toy import OBSERVATION, PROMPT, make_trajectory


# --------------------------------------------------------------------------- GAE


def test_gae_equals_the_discounted_sum_of_td_errors():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(9, generator=g), torch.randn(9, generator=g)
    gamma, lam = 0.9, 0.8
    adv, ret = gae(rewards, values, gamma, lam)
    nxt = torch.cat([values[1:], torch.zeros(1)])
    delta = rewards + gamma * nxt - values
    for t in range(9):
        expected = sum((gamma * lam) ** (k - t) * float(delta[k]) for k in range(t, 9))
        assert float(adv[t]) == pytest.approx(expected, abs=1e-5), f"advantage at {t}"
        assert float(ret[t]) == pytest.approx(expected + float(values[t]), abs=1e-5), f"return at {t}"


def test_gae_with_gamma_and_lambda_one_gives_monte_carlo_returns_whatever_the_values():
    rewards = torch.tensor([0.0, 0.5, 0.0, 2.0])
    adv, ret = gae(rewards, torch.tensor([3.0, -1.0, 0.2, 7.0]), 1.0, 1.0)
    assert ret.tolist() == pytest.approx([2.5, 2.5, 2.0, 2.0])
    assert adv.tolist() == pytest.approx([2.5 - 3.0, 2.5 + 1.0, 2.0 - 0.2, 2.0 - 7.0])


def test_episode_reward_sits_on_the_last_token_and_turn_credits_pay_each_rise_of_the_best_milestone():
    assert token_rewards(5, 3.0, [2, 5], [1.0, 2.0], per_turn=False).tolist() == [0, 0, 0, 0, 3.0]
    # correct (+1), then faster than eager (+1 more); the outcome 3 minus the best 2 on the last token
    assert token_rewards(5, 3.0, [2, 5], [1.0, 2.0], per_turn=True).tolist() == [0, 1.0, 0, 0, 2.0]


def test_profiling_a_correct_solution_again_and_again_earns_nothing_more():
    """The farming attack: reach 'faster than torch.compile' (3) once, then call profile on it
    nine more times. Every per-turn scheme that pays each turn's milestone would pay 30."""
    ends = list(range(1, 11))
    farmed = token_rewards(10, 3.0, ends, [3.0] * 10, per_turn=True)
    once = token_rewards(10, 3.0, ends, [3.0] + [0.0] * 9, per_turn=True)
    assert farmed.tolist() == once.tolist() == [3.0] + [0.0] * 9, farmed.tolist()
    assert float(farmed.sum()) == 3.0, "the credits of an episode must sum to its outcome"


@pytest.mark.parametrize("turn_rewards, outcome", [
    ([1.0, -1.0, 3.0, 3.0], 3.0),  # progress, a failed attempt, the top milestone, profiled again
    ([3.0, -1.0], -1.0),  # the top milestone reached, then broken: paid back at the end
    ([-1.0, -1.0], -1.0),  # failures only: the outcome alone judges them
    ([0.0, 2.0, 1.0], 2.0),  # a lower milestone after a higher one earns nothing
])
def test_turn_credits_always_sum_to_the_outcome_and_never_go_negative_before_the_end(turn_rewards, outcome):
    n = len(turn_rewards)
    rewards = token_rewards(n, outcome, list(range(1, n + 1)), turn_rewards, per_turn=True)
    assert float(rewards.sum()) == pytest.approx(outcome), rewards.tolist()
    assert all(r >= 0 for r in rewards[:-1].tolist()), f"a turn was charged before the end: {rewards.tolist()}"


def test_batch_advantages_treat_each_trajectory_as_its_own_episode():
    a = make_trajectory("a", PROMPT, [([5, 6], [-1.0, -1.0], 0), ([7], [-1.0], 0)], OBSERVATION, reward=2.0)
    b = make_trajectory("b", PROMPT, [([8, 9], [-1.0, -1.0], 0)], OBSERVATION, reward=-1.0)
    batch = flatten([a, b])
    values = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    adv, ret = batch_advantages(batch, values, 1.0, 1.0, per_turn=False)
    assert ret.tolist() == pytest.approx([2.0, 2.0, 2.0, -1.0, -1.0])  # no reward leaks across episodes
    assert adv.tolist() == pytest.approx([1.9, 1.8, 1.7, -1.4, -1.5])
    bonus = torch.full((5,), -0.1)
    _, ret = batch_advantages(batch, values, 1.0, 1.0, per_turn=False, token_bonus=bonus)
    assert ret.tolist() == pytest.approx([1.7, 1.8, 1.9, -1.2, -1.1])


def test_whitening_gives_zero_mean_unit_variance_and_explained_variance_scores_the_fit():
    x = torch.tensor([1.0, 2.0, 3.0, 10.0])
    w = whiten(x)
    assert float(w.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(w.var(unbiased=False)) == pytest.approx(1.0, abs=1e-5)
    returns = torch.tensor([1.0, -1.0, 1.0, -1.0])
    assert explained_variance(returns, returns) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(4), returns) == pytest.approx(0.0)
    assert explained_variance(-returns, returns) == pytest.approx(-3.0)


# --------------------------------------------------------------------------- losses


def test_policy_loss_matches_the_decoupled_clipped_surrogate_token_by_token():
    logprobs = torch.tensor([-1.0, -1.0, -2.0, -0.5, -3.0])
    prox = torch.tensor([-1.0, -1.5, -1.0, -0.5, -1.0])
    behaviour = torch.tensor([-1.0, -1.5, -3.0, -2.0, -1.0])  # tokens 2 and 3 came from a stale sampler
    adv = torch.tensor([1.0, 1.0, -1.0, 2.0, -0.5])
    eps, cap = 0.2, 2.0
    loss, info = policy_loss(logprobs, prox, behaviour, adv, eps, cap)
    for t in range(5):
        r = math.exp(logprobs[t] - prox[t])
        w = min(math.exp(prox[t] - behaviour[t]), cap)
        a = float(adv[t])
        expected = -w * min(r * a, max(min(r, 1 + eps), 1 - eps) * a)
        assert float(loss[t]) == pytest.approx(expected, rel=1e-5), f"token {t}: r={r:.3f} w={w:.3f} A={a}"
    assert info["importance_weight"].tolist() == pytest.approx([1.0, 1.0, 2.0, 2.0, 1.0])  # e^1 and e^1.5 capped at 2
    assert info["clipped"].tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]  # ratios e^0.5 (A>0), e^-1 and e^-2 (A<0)


def test_clip_higher_lets_a_ratio_with_positive_advantage_rise_to_1_plus_eps_high_and_no_further():
    """The paper's asymmetric clip, 0.2 below and 0.28 above: a token the update made 25% more
    likely keeps its gradient under clip-higher, and is clipped under a symmetric 0.2; below 1
    both clip at 0.8; past 1.28 clip-higher clips too."""
    prox = torch.zeros(4)
    logprobs = torch.log(torch.tensor([1.25, 1.25, 0.75, 1.35]))
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0])
    _, symmetric = policy_loss(logprobs, prox, prox, adv, 0.2, 2.0)
    _, higher = policy_loss(logprobs, prox, prox, adv, 0.2, 2.0, clip_ratio_high=0.28)
    assert symmetric["clipped"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert higher["clipped"].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_the_value_clip_scales_with_the_reward_span():
    from actors.learner_group import reward_span
    from configs.schema import RewardConfig

    assert reward_span(RewardConfig()) == 4.0  # -1 (failure) to 3 (faster than torch.compile)
    assert reward_span(RewardConfig(failure=0.0, correct=0.1, faster_than_eager=0.2, faster_than_compile=0.5)) == 0.5
    assert reward_span(RewardConfig()) * LearnerConfig().value_clip == pytest.approx(0.8)


def test_policy_gradient_vanishes_where_the_ratio_is_clipped_and_is_advantage_times_weight_elsewhere():
    logprobs = torch.tensor([-1.0, -0.5], requires_grad=True)  # ratio 1 and e^0.5 (clipped, A > 0)
    prox = torch.tensor([-1.0, -1.0])
    loss, _ = policy_loss(logprobs, prox, prox, torch.tensor([2.0, 2.0]), 0.2, 2.0)
    loss.sum().backward()
    assert logprobs.grad.tolist() == pytest.approx([-2.0, 0.0])


def test_value_loss_takes_the_larger_of_clipped_and_unclipped_errors():
    values = torch.tensor([1.0, 0.5, -1.0])
    old = torch.tensor([0.0, 0.4, 0.0])
    returns = torch.tensor([1.0, 0.0, 0.0])
    loss, clipped = value_loss(values, old, returns, clip=0.2)
    expected = []
    for v, o, r in zip(values.tolist(), old.tolist(), returns.tolist()):
        vc = o + max(min(v - o, 0.2), -0.2)
        expected.append(0.5 * max((v - r) ** 2, (vc - r) ** 2))
    assert loss.tolist() == pytest.approx(expected)
    assert clipped.tolist() == [1.0, 0.0, 0.0]
    unclipped, _ = value_loss(values, old, returns, clip=0.0)
    assert unclipped.tolist() == pytest.approx([0.0, 0.125, 0.5])


def test_kl_estimators_and_entropy_match_direct_computation():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    p = torch.softmax(logits, -1)
    assert entropy_from_logits(logits).tolist() == pytest.approx((-(p * p.log()).sum(-1)).tolist(), rel=1e-6)
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    assert kl_k3(lp, ref).tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1.0, 0.0])
    assert kl_penalty(lp, ref, 0.1).tolist() == pytest.approx([-0.05, 0.0])
    # k3 is an unbiased estimate of KL(p || q) on samples from p.
    q = torch.softmax(torch.tensor([0.0, 1.0, 0.0]), -1)
    exact = float((p[0] * (p[0].log() - q.log())).sum())
    estimate = float((p[0] * kl_k3(p[0].log(), q.log())).sum())
    assert estimate == pytest.approx(exact, rel=1e-5)


def test_token_mean_over_micro_batches_weighs_every_token_of_the_step_equally():
    per_token = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0])
    # one long sequence split from four short ones: the sum of micro-batch terms is the step's token mean
    total = token_mean(per_token[:4], 5) + token_mean(per_token[4:], 5)
    assert float(total) == pytest.approx(float(per_token.mean()))
    with pytest.raises(ValueError, match="generated-token count"):
        token_mean(per_token, 0)


# --------------------------------------------------------------------------- flattening and packing


def test_flatten_orders_generated_tokens_across_segments_with_their_versions_and_turn_ends():
    s0, s1 = Segment(), Segment()
    s0.extend([1, 2], generated=False)
    s0.extend([10, 11], generated=True, logprobs=[-0.1, -0.2])
    s0.extend([3], generated=False)
    s0.extend([12], generated=True, logprobs=[-0.3])
    s1.extend([1, 4], generated=False)  # the continuation after old observations were elided
    s1.extend([13, 14], generated=True, logprobs=[-0.4, -0.5])
    turns = [Turn(0, 2, 4, version=3, reward=1.0), Turn(0, 5, 6, version=4), Turn(1, 2, 4, version=5, reward=2.0)]
    traj = Trajectory(episode_id="e", task_id="t", segments=[s0, s1], turns=turns, reward=3.0)
    batch = flatten([traj])
    assert batch.behaviour_logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert batch.versions.tolist() == [3, 3, 4, 5, 5]
    assert batch.turn_ends == [[2, 3, 5]] and batch.turn_rewards == [[1.0, 0.0, 2.0]]
    assert [(s.generated, s.flat_start) for s in batch.sequences] == [([2, 3, 5], 0), ([2, 3], 3)]


def test_flatten_rejects_chat_only_and_empty_trajectories_naming_them():
    chat = Trajectory(episode_id="chat", task_id="t", token_level=False)
    with pytest.raises(BatchError, match="chat"):
        flatten([chat])
    seg = Segment()
    seg.extend([1, 2], generated=False)
    empty = Trajectory(episode_id="empty", task_id="t", segments=[seg], stop_reason="error", error="boom")
    with pytest.raises(BatchError, match="empty.*no generated tokens"):
        flatten([empty])


def test_each_generated_token_carries_its_trajectorys_loss_weight_into_every_micro_batch():
    a = make_trajectory("a", PROMPT, [([5, 6], [-1.0, -1.0], 0), ([7], [-1.0], 0)], OBSERVATION, reward=1.0)
    b = make_trajectory("b", PROMPT, [([8, 9], [-1.0, -1.0], 0)], OBSERVATION, reward=0.0)
    c = make_trajectory("c", PROMPT, [([4], [-1.0], 0)], OBSERVATION, reward=0.0)
    batch = flatten([a, b, c], weights=[1.0, 0.25, 0.5])
    assert batch.weights.tolist() == [1.0, 1.0, 1.0, 0.25, 0.25, 0.5]
    assert flatten([a, b, c]).weights.tolist() == [1.0] * 6, "no weights: every token weighs 1"
    for m in pack(batch.sequences, token_budget=16):  # one trajectory per row: the rows come out reordered
        expected = {"a": 1.0, "b": 0.25, "c": 0.5}[{5: "a", 8: "b", 4: "c"}[int(m.targets[0])]]
        assert batch.weights[m.flat_index].tolist() == [expected] * m.num_generated


@pytest.mark.parametrize("weights, message", [
    ([1.0], r"weights has 1 entries for 2 trajectories"),
    ([1.0, 0.0], r"weights\[1\] is 0\.0.*\(0, 1\]"),
    ([1.5, 1.0], r"weights\[0\] is 1\.5.*\(0, 1\]"),
    ([1.0, math.nan], r"weights\[1\] is nan.*finite"),
    ([-0.5, 1.0], r"weights\[0\]"),
    (["heavy", 1.0], r"weights\[0\] is 'heavy'"),
])
def test_flatten_rejects_loss_weights_that_are_not_one_finite_number_in_0_1_per_trajectory(weights, message):
    a = make_trajectory("a", PROMPT, [([5, 6], [-1.0, -1.0], 0)], OBSERVATION, reward=1.0)
    with pytest.raises(ValueError, match=message):
        flatten([a, a], weights=weights)


def _random_sequences(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs, offset = [], 0
    for n in lengths:
        ids = torch.randint(3, 2000, (n,), generator=g).tolist()
        generated = [j for j in range(2, n) if j % 3 != 0]
        seqs.append(SequenceRef(ids, generated, offset))
        offset += len(generated)
    return seqs, offset


def test_packing_respects_the_token_budget_and_scores_every_generated_token_once():
    seqs, total = _random_sequences([30, 7, 12, 25, 5, 19, 40])
    micro = pack(seqs, token_budget=45)
    assert all(m.num_tokens <= 45 for m in micro), [m.num_tokens for m in micro]
    assert sum(m.num_tokens for m in micro) == sum(len(s.token_ids) for s in seqs)  # no padding
    flat = sorted(i for m in micro for i in m.flat_index.tolist())
    assert flat == list(range(total))
    for m in micro:
        assert (m.input_ids[0, m.predict_at + 1] == m.targets).all(), "each target is the token after its predictor"
        assert (m.position_ids[0, m.predict_at + 1] > 0).all(), "no target starts a sequence"
    assert len(pack(seqs, token_budget=10)) == 7  # longer than the budget: one row each
    groups = split_minibatches(micro, 2)
    assert sorted(i for g in groups for m in g for i in m.flat_index.tolist()) == list(range(total))
    with pytest.raises(BatchError, match="ppo_minibatches"):
        split_minibatches(micro, len(micro) + 1)


def test_cpu_rows_stop_at_cpu_micro_batch_tokens():
    assert row_tokens(LearnerConfig(micro_batch_tokens=8192)) == 1024  # this machine trains on its CPU
    assert row_tokens(LearnerConfig(micro_batch_tokens=512)) == 512
    assert row_tokens(LearnerConfig(micro_batch_tokens=8192, cpu_micro_batch_tokens=4096)) == 4096
    with pytest.raises(BatchError, match="learner.cpu_micro_batch_tokens must be positive"):
        row_tokens(LearnerConfig(cpu_micro_batch_tokens=0))


def test_packed_logprobs_equal_unpacked_ones_and_packing_without_restarting_positions_would_not(tiny_model_dir):
    from learner.models import load_policy, score_tokens

    model = load_policy(tiny_model_dir, torch.float32, "sdpa", grad_checkpointing=False).eval()
    seqs, total = _random_sequences([11, 23, 6, 17])
    micro = pack(seqs, token_budget=1000)
    assert len(micro) == 1 and len(micro[0].sequence_lengths) == 4
    with torch.no_grad():
        packed = torch.zeros(total)
        lp, entropy = score_tokens(model, micro[0], with_entropy=True)
        packed[micro[0].flat_index] = lp
        unpacked = torch.zeros(total)
        for s in seqs:
            logp = torch.log_softmax(model(torch.tensor([s.token_ids])).logits[0], -1)
            for k, j in enumerate(s.generated):
                unpacked[s.flat_start + k] = logp[j - 1, s.token_ids[j]]
        diff = (packed - unpacked).abs().max()
        assert diff < 1e-4, f"packed and unpacked logprobs differ by {diff}"
        assert torch.isfinite(entropy).all() and (entropy > 0).all()
        # The same row scored as one long sequence: later segments would attend across boundaries.
        row = micro[0]
        naive = model(input_ids=row.input_ids, use_cache=False).logits[0, row.predict_at]
        naive = torch.log_softmax(naive, -1).gather(-1, row.targets[:, None]).squeeze(-1)
        assert (naive - lp).abs().max() > 1e-2, "the check above would pass without packed attention"


def test_logprobs_and_entropy_made_a_chunk_of_positions_at_a_time_equal_the_whole_logits_values_and_gradients(
        tiny_model_dir, monkeypatch):
    """A 131,072-token row at Qwen's vocabulary held ~200 GiB of logits made whole; chunked, the
    scores and their gradients must be the very same."""
    from learner import models

    model = models.load_policy(tiny_model_dir, torch.float32, "sdpa", grad_checkpointing=False).train()
    seqs, _ = _random_sequences([11, 23, 6, 17])
    (mb,) = pack(seqs, token_budget=1000)

    def scored(chunk: int):
        monkeypatch.setattr(models, "LOGIT_CHUNK", chunk)
        model.zero_grad()
        lp, entropy = models.score_tokens(model, mb, with_entropy=True, entropy_grad=True)
        (lp.sum() + 0.1 * entropy.sum()).backward()
        return lp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    whole_lp, whole_entropy, whole_grads = scored(10**9)
    chunked_lp, chunked_entropy, chunked_grads = scored(5)  # 43 positions in 9 chunks
    assert mb.num_generated > 5 * 4
    assert torch.allclose(whole_lp, chunked_lp, atol=1e-5) and torch.allclose(whole_entropy, chunked_entropy, atol=1e-5)
    assert whole_grads.keys() == chunked_grads.keys()
    for name, grad in whole_grads.items():
        assert torch.allclose(grad, chunked_grads[name], atol=1e-5, rtol=1e-4), name
    monkeypatch.setattr(models, "LOGIT_CHUNK", 5)
    logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, logits_to_keep=mb.predict_at).logits[0]
    direct = torch.log_softmax(logits.float(), -1).gather(-1, mb.targets[:, None]).squeeze(-1)
    assert torch.allclose(direct.detach(), chunked_lp, atol=1e-5)  # the same as Hugging Face's own head


# --------------------------------------------------------------------------- RFT filter


def _episode(name, reward, texts, invalid=None, tools=None, stop="submit", calls=None):
    turns = [([20 + k, 21 + k], [-0.5, -0.5], 0) for k in range(len(texts))]
    traj = make_trajectory(name, PROMPT, turns, OBSERVATION, reward, texts=texts, invalid=invalid, tools=tools, calls=calls)
    traj.stop_reason = stop
    return traj


def test_rft_filter_keeps_successful_clean_episodes_and_says_why_it_dropped_the_others():
    cfg = RFTConfig(reward_threshold=1.0, max_invalid_call_rate=0.25, max_repeated_actions=2)
    good = _episode("good", 3.0, ["write", "compile", "compile", "submit"])
    low = _episode("low", -1.0, ["write", "submit"])
    # a refused compile call, then a call that did not parse: both of the two calls were invalid
    invalid = _episode("invalid", 2.0, ["a", "b"], invalid=[1, 1], tools=[["compile"], []], calls=[1, 1])
    loop = _episode("loop", 3.0, ["write", "compile", "compile", "compile", "submit"])
    error = _episode("error", 3.0, ["write"], stop="error")
    assert invalid_call_rate(invalid) == 1.0
    assert longest_repeat(loop) == 3 and longest_repeat(good) == 2
    kept, dropped = filter_episodes([TrajectoryMeta.of(t) for t in (good, low, invalid, loop, error)], cfg)
    assert [t.episode_id for t in kept] == ["good"]
    assert dropped == {"low_reward": 1, "invalid_calls": 1, "repeated_actions": 1, "error": 1}


def test_one_valid_and_one_refused_call_is_an_invalid_rate_of_one_half():
    # the refused call is in ``tools`` and in ``invalid_calls``: it once counted twice (0.33)
    half = _episode("half", 3.0, ["two calls"], invalid=[1], tools=[["compile", "nosuchtool"]], calls=[2])
    assert invalid_call_rate(half) == 0.5


def test_a_loop_of_two_alternating_actions_is_a_repeat_too():
    cfg = RFTConfig(reward_threshold=1.0, max_invalid_call_rate=0.25, max_repeated_actions=2)
    alternating = _episode("ab", 3.0, ["write", "compile", "write", "compile", "write", "compile", "submit"])
    varied = _episode("varied", 3.0, ["write", "compile", "profile", "write", "submit"])
    assert longest_repeat(alternating) == 3 and longest_repeat(varied) == 1
    kept, dropped = filter_episodes([TrajectoryMeta.of(t) for t in (alternating, varied)], cfg)
    assert [t.episode_id for t in kept] == ["varied"] and dropped == {"repeated_actions": 1}


def test_repeated_actions_fall_back_to_tokens_when_no_text_was_kept():
    same = make_trajectory("same", PROMPT, [([20, 21], [-0.5, -0.5], 0)] * 3, OBSERVATION, 1.0)
    assert longest_repeat(same) == 3


# --------------------------------------------------------------------------- LR schedule


def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    f = lambda s: lr_multiplier(s, warmup_steps=4, total_steps=14, schedule=LRSchedule.cosine, min_ratio=0.1)  # noqa: E731
    assert [f(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f(4) == pytest.approx(1.0) and f(9) == pytest.approx(0.55) and f(14) == pytest.approx(0.1)
    assert f(100) == pytest.approx(0.1)
    assert lr_multiplier(50, 4, 14, LRSchedule.constant, 0.1) == 1.0


def test_value_pretraining_targets_are_monte_carlo_returns_even_with_the_papers_gae_lambda():
    """paper.yaml's gae_lambda 0.95 bootstrapped value pretraining from the critic being trained:
    at the first token of a 2,000-token episode that earned 3, its target was 3 x 0.95^2000, ~1e-44."""
    from configs.load import load_config
    from learner.value_pretrain import value_targets

    learner = load_config(["paper"]).learner
    assert learner.gae_lambda == 0.95 and learner.value_lambda == 1.0
    long = make_trajectory("long", PROMPT, [(list(range(2000)), [-0.5] * 2000, 0)], OBSERVATION, 3.0)
    batch = flatten([long])
    targets = value_targets(batch, torch.zeros(batch.num_generated), learner)
    assert targets[0] == pytest.approx(3.0) and targets[-1] == pytest.approx(3.0)
    ppo_returns = batch_advantages(batch, torch.zeros(batch.num_generated), learner.gamma, learner.gae_lambda, False)[1]
    assert ppo_returns[0] < 1e-40  # what value pretraining used to fit
