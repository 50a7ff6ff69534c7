"""The learner on real DeepSpeed (CPU, gloo, one process): PPO learns a toy verifiable task,
RFT's loss falls, value pretraining raises explained variance, a resumed run reproduces the
next step exactly, weight export buckets cover the model within their bound (ZeRO-2 and
ZeRO-3), and the exported Hugging Face folder loads in transformers (and, slow, in vLLM)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

from configs.schema import LearnerConfig, LRSchedule, RFTConfig
from tests.dist_teardown import destroy_process_group

try:
    from tests.learner_toy import OBSERVATION, PROMPT, make_trajectory, sample_episodes
except ImportError:  # tests/ is on sys.path itself under pytest's default import mode
    from learner_toy import OBSERVATION, PROMPT, make_trajectory, sample_episodes

DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(scope="module")
def learner_dist():
    """One gloo process group for the module's engines, torn down (with its env) afterwards."""
    import torch.distributed as dist

    from learner.engine import init_distributed

    assert not dist.is_initialized(), "an earlier test left torch.distributed initialised"
    saved = {k: os.environ.get(k) for k in DIST_ENV}
    init_distributed()
    yield
    destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _cfg(**overrides) -> LearnerConfig:
    """Rates for a 2-layer random model (a real one uses the defaults' 1e-6 scale)."""
    base = dict(lr=1e-2, critic_lr=1e-3, warmup_steps=0, lr_schedule=LRSchedule.constant, grad_checkpointing=False,
                micro_batch_tokens=256)
    base.update(overrides)
    return LearnerConfig(**base)


def _timing(capsys, message: str) -> None:
    with capsys.disabled():
        print(f"\n[timing] {message}", flush=True)


# --------------------------------------------------------------------------- PPO


def test_ppo_raises_mean_reward_on_a_toy_verifiable_task(tiny_model_dir, learner_dist, capsys):
    """Two-turn episodes sampled from the policy itself; each batch is trained on twice, the
    second time one version stale (the truncated-importance path), with two mini-batches
    (so the second optimiser step sees clipped ratios) and gradient checkpointing on."""
    from learner.ppo import PPOTrainer

    torch.manual_seed(0)
    trainer = PPOTrainer.create(_cfg(ppo_minibatches=2, grad_checkpointing=True), tiny_model_dir, total_steps=16)
    started = time.perf_counter()
    rewards, stale, weights, clip = [], [], [], []
    version = 0  # the driver owns the version (actors/system.py); here the test plays the driver
    for step in range(16):
        if step % 2 == 0:
            episodes = sample_episodes(trainer.policy.module, 16, version)
            rewards.append(sum(e.reward for e in episodes) / len(episodes))
        m = trainer.step(episodes, version=version)
        version += int(m["policy_trained"])
        assert all(math.isfinite(v) for k, v in m.items() if k != "explained_variance"), m
        stale.append(m["stale_fraction"])
        weights.append(m["importance_weight"])
        clip.append(m["clip_frac"])
    _timing(capsys, f"PPO toy: 16 steps in {time.perf_counter() - started:.1f}s; rewards {[round(r, 2) for r in rewards]}")
    assert stale == [0.0, 1.0] * 8, "every second step trains on the previous version's episodes"
    assert version == 16 and m["micro_batches"] == 2
    assert any(c > 0 for c in clip), "the second mini-batch of a step should clip some ratios"
    assert any(abs(w - 1.0) > 1e-3 for w in weights[1::2]), "stale tokens should carry importance weights != 1"
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.3, f"mean reward did not rise: first batches {rewards[:3]}, last {rewards[-3:]}"


def test_critic_warmup_steps_train_only_the_critic(tiny_model_dir, learner_dist):
    from learner.ppo import PPOTrainer

    torch.manual_seed(1)
    trainer = PPOTrainer.create(_cfg(critic_warmup_steps=1, kl_coef=0.1), tiny_model_dir, total_steps=2)
    before = {n: p.detach().clone() for n, p in trainer.policy.module.named_parameters()}
    episodes = sample_episodes(trainer.policy.module, 4, 0)
    m = trainer.step(episodes, version=0)
    assert m["policy_trained"] == 0.0 and "policy_loss" not in m
    assert all(torch.equal(p, before[n]) for n, p in trainer.policy.module.named_parameters())
    m = trainer.step(episodes, version=0)
    assert m["policy_trained"] == 1.0 and m["kl_ref"] >= 0.0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.policy.module.named_parameters())


def _first_minibatch_losses(trainer, episodes, monkeypatch) -> list[dict[str, torch.Tensor]]:
    """What policy_loss saw on the step's first minibatch (before the first optimiser step)."""
    import learner.ppo as ppo

    real, seen = ppo.policy_loss, []
    optimiser_steps = {"n": 0}
    real_step = trainer.policy.step

    def counted_step(*args, **kwargs):
        optimiser_steps["n"] += 1
        return real_step(*args, **kwargs)

    def spy(logprobs, prox, behaviour, advantages, clip_ratio, cap, clip_high=None):
        loss, info = real(logprobs, prox, behaviour, advantages, clip_ratio, cap, clip_high)
        if optimiser_steps["n"] == 0:
            seen.append({"ratio": info["ratio"].clone(), "weight": info["importance_weight"].clone(),
                         "clipped": info["clipped"].clone(), "prox": prox.detach().clone(),
                         "behaviour": behaviour.detach().clone(), "cap": torch.tensor(cap)})
        return loss, info

    monkeypatch.setattr(ppo, "policy_loss", spy)
    monkeypatch.setattr(trainer.policy, "step", counted_step)
    trainer.step(episodes, version=0)
    monkeypatch.undo()
    assert seen, "the first minibatch never reached policy_loss"
    return seen


def test_the_ratio_starts_at_exactly_one_against_the_learners_logprobs_while_the_weight_keeps_the_samplers(
        tiny_model_dir, learner_dist, monkeypatch):
    """A bf16 sampler's logprobs disagree with the learner's. Perturbed behaviour logprobs stand in
    for that: with the learner's own scoring as the proximal policy, every ratio of the first
    minibatch is exactly 1 (nothing is clipped before an update), while the truncated importance
    weight still compares with the sampler's logprobs. Taking the sampler's logprobs as the
    proximal policy instead (prox_from_learner=false) starts the ratio away from 1."""
    from learner.ppo import PPOTrainer

    torch.manual_seed(4)
    cfg = _cfg(ppo_minibatches=2, micro_batch_tokens=64, importance_cap=1.05)
    trainer = PPOTrainer.create(cfg, tiny_model_dir, total_steps=1)
    episodes = sample_episodes(trainer.policy.module, 8, 0)
    noise = torch.Generator().manual_seed(0)
    for e in episodes:  # the sampler's numerics: each logprob off by up to 0.3 (kept <= 0)
        seg = e.segments[0]
        seg.logprobs = [lp - float(torch.rand(1, generator=noise)) * 0.3 if m else lp
                        for lp, m in zip(seg.logprobs, seg.loss_mask)]
    seen = _first_minibatch_losses(trainer, episodes, monkeypatch)
    for call in seen:
        assert torch.equal(call["ratio"], torch.ones_like(call["ratio"])), \
            f"first-minibatch ratios must be exactly 1, max deviation {(call['ratio'] - 1).abs().max()}"
        assert call["clipped"].sum() == 0
        expected = torch.exp(call["prox"] - call["behaviour"]).clamp(max=float(call["cap"]))
        assert torch.equal(call["weight"], expected), "the importance weight is pi_prox / mu, truncated"
        assert (call["weight"] - 1.0).abs().max() > 1e-2, "the perturbed sampler logprobs must reach the weight"
        assert not torch.equal(call["prox"], call["behaviour"])

    sampler_prox = PPOTrainer.create(_cfg(ppo_minibatches=2, micro_batch_tokens=64, prox_from_learner=False),
                                     tiny_model_dir, total_steps=1)
    seen = _first_minibatch_losses(sampler_prox, episodes, monkeypatch)
    deviation = max(float((c["ratio"] - 1).abs().max()) for c in seen)
    assert deviation > 1e-2, f"with the sampler as the proximal policy the ratio starts off 1 (max deviation {deviation})"


# --------------------------------------------------------------------------- loss weights


def test_loss_weights_of_one_change_nothing_and_half_weights_halve_losses_and_gradients(tiny_model_dir, learner_dist,
                                                                                      capsys):
    """Identical fresh trainers take one step on one batch. The token-mean denominator stays the
    token count, so weight 0.5 on every trajectory halves every loss and gradient (multiplying by
    a power of two is exact in floating point, and the one step's losses are measured before its
    update). Adam would hide the halving in the weights, so the step's metrics are compared."""
    from learner.ppo import PPOTrainer

    started = time.perf_counter()

    def fresh() -> PPOTrainer:
        torch.manual_seed(7)
        # Unwhitened advantages: whitened ones make the first step's surrogate a token mean of ~0.
        return PPOTrainer.create(_cfg(whiten_advantages=False), tiny_model_dir, total_steps=1)

    plain = fresh()
    episodes = sample_episodes(plain.policy.module, 8, 0)
    base = plain.step(episodes, version=0)
    ones = fresh().step(episodes, weights=[1.0] * len(episodes), version=0)
    halved_trainer = fresh()
    halved = halved_trainer.step(episodes, weights=[0.5] * len(episodes), version=0)
    assert base["mean_loss_weight"] == ones["mean_loss_weight"] == 1.0 and halved["mean_loss_weight"] == 0.5
    for key in ("policy_loss", "value_loss", "grad_norm_policy", "grad_norm_critic", "approx_kl", "clip_frac"):
        assert ones[key] == base[key], f"{key}: weights of 1.0 gave {ones[key]!r}, weights=None {base[key]!r}"
    assert abs(base["policy_loss"]) > 1e-3 and base["value_loss"] > 0.0
    for key in ("policy_loss", "value_loss", "grad_norm_policy", "grad_norm_critic"):
        assert halved[key] == pytest.approx(base[key] / 2, rel=1e-5), f"{key}: {halved[key]!r} is not half of {base[key]!r}"
    assert halved["return_mean"] == base["return_mean"], "weights scale the losses, not the targets"
    mixed = fresh().step(episodes, weights=[1.0, 0.5] * (len(episodes) // 2), version=0)
    assert mixed["mean_loss_weight"] == 0.75  # the toy episodes all have the same length
    assert base["value_loss"] / 2 < mixed["value_loss"] < base["value_loss"], "per-token value losses are positive"

    for bad in ([1.0] * (len(episodes) - 1), [0.0] * len(episodes), [1.5] * len(episodes), [math.nan] * len(episodes)):
        with pytest.raises(ValueError, match=r"weights"):
            halved_trainer.step(episodes, weights=bad, version=1)
    assert halved_trainer.steps == 1, "a rejected batch must not count as a step"
    _timing(capsys, f"loss weights: 4 PPO trainers, 4 steps in {time.perf_counter() - started:.1f}s")


# --------------------------------------------------------------------------- resume


def test_resume_reproduces_the_next_step_exactly(tiny_model_dir, learner_dist, tmp_path):
    """Weights, AdamW moments, the warm-up/cosine schedule, the counters and the RNG all come
    back: the step after a resume equals the step the original run took, bit for bit."""
    from learner.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from learner.ppo import PPOTrainer

    cfg = _cfg(ppo_minibatches=2, warmup_steps=2, lr_schedule=LRSchedule.cosine)
    torch.manual_seed(2)
    first = PPOTrainer.create(cfg, tiny_model_dir, total_steps=4)
    batch = sample_episodes(first.policy.module, 16, 0)
    first.step(batch, version=0)
    first.step(batch, version=1)  # stale the second time
    save_checkpoint(tmp_path, 2, first.engines(), {**first.state(), "version": 2})  # the driver saves its version
    assert latest_checkpoint(tmp_path).name == "step_000002"
    next_batch = sample_episodes(first.policy.module, 16, 2)  # consumes the saved RNG stream
    expected = first.step(next_batch, version=2)
    expected_weights = {n: p.detach().clone() for n, p in first.policy.module.named_parameters()}

    torch.manual_seed(12345)  # a different stream: only the checkpoint's RNG state can give the same batch
    second = PPOTrainer.create(cfg, tiny_model_dir, total_steps=4)
    state = load_checkpoint(tmp_path, second.engines())
    second.load_state(state)
    assert state["step"] == 2 and state["version"] == 2 and second.steps == 2
    again = sample_episodes(second.policy.module, 16, state["version"])
    assert [e.segments[0].token_ids for e in again] == [e.segments[0].token_ids for e in next_batch]
    got = second.step(again, version=state["version"])
    for key in ("policy_loss", "value_loss", "grad_norm_policy", "grad_norm_critic", "lr", "critic_lr", "clip_frac"):
        assert got[key] == expected[key], f"{key}: resumed {got[key]!r} != original {expected[key]!r}"
    for name, p in second.policy.module.named_parameters():
        assert torch.equal(p.detach(), expected_weights[name]), f"{name} differs after the resumed step"


def test_pruning_keeps_the_newest_checkpoints_and_never_the_one_latest_names(tmp_path):
    from learner.checkpoint import LATEST, prune_checkpoints

    for step in range(1, 6):
        (tmp_path / f"step_{step:06d}").mkdir()
    (tmp_path / LATEST).write_text("step_000003")  # steps 4 and 5 began after it and never completed
    assert prune_checkpoints(tmp_path, 0) == []
    assert [p.name for p in prune_checkpoints(tmp_path, 2)] == ["step_000001", "step_000002"]
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000003", "step_000004", "step_000005"]


# --------------------------------------------------------------------------- RFT, value pretraining


def _rft_episodes():
    g = torch.Generator().manual_seed(3)
    episodes = []
    for i in range(12):
        turns = [(torch.randint(3, 2000, (4,), generator=g).tolist(), [-7.0] * 4, 0) for _ in range(2)]
        reward = 3.0 if i % 2 == 0 else -1.0
        episodes.append(make_trajectory(f"rft{i}", PROMPT, turns, OBSERVATION, reward, texts=[f"a{i}", f"b{i}"]))
    return episodes


@pytest.fixture(scope="module")
def rft_trainer(tiny_model_dir, learner_dist):
    from learner.rft import RFTTrainer

    torch.manual_seed(4)
    return RFTTrainer.create(_cfg(rft=RFTConfig(lr=3e-3)), tiny_model_dir, total_steps=10)


def test_rft_trains_on_filtered_episodes_and_its_loss_falls(rft_trainer):
    from learner.rft import filter_episodes
    from protocol.trajectory_meta import TrajectoryMeta

    episodes = _rft_episodes()
    kept, dropped = filter_episodes([TrajectoryMeta.of(t) for t in episodes], rft_trainer.cfg.rft)
    assert len(kept) == 6 and dropped == {"low_reward": 6}
    kept_ids = {m.episode_id for m in kept}
    kept = [t for t in episodes if t.episode_id in kept_ids]
    losses = [rft_trainer.step(kept)["nll"] for _ in range(10)]
    assert losses[0] == pytest.approx(math.log(2048), abs=0.3), "a random model starts near uniform"
    assert losses[-1] < losses[0] - 2.0 and losses[-1] < min(losses[:3]), losses


def test_value_pretraining_raises_explained_variance(tiny_model_dir, learner_dist, capsys, tmp_path):
    """Episodes whose reward is decided by one prompt token: the critic must learn to read it."""
    from learner.value_pretrain import ValuePretrainer

    torch.manual_seed(5)
    pretrainer = ValuePretrainer.create(_cfg(critic_lr=3e-3), tiny_model_dir, total_steps=10)
    g = torch.Generator().manual_seed(6)
    variances = []
    for _ in range(10):
        episodes = []
        for i in range(24):
            key = int(torch.randint(0, 2, (1,), generator=g))
            turns = [(torch.randint(3, 2000, (3,), generator=g).tolist(), [-7.0] * 3, 0) for _ in range(2)]
            episodes.append(make_trajectory(f"v{i}", [1, 10 + key, 102, 2, 1, 103], turns, OBSERVATION,
                                            reward=1.0 if key else -1.0))
        variances.append(pretrainer.step(episodes)["explained_variance"])
    _timing(capsys, f"value pretraining: explained variance {[round(v, 2) for v in variances]}")
    assert variances[0] < 0.3, variances
    assert min(variances[-3:]) > 0.8, f"explained variance did not rise: {[round(v, 2) for v in variances]}"

    # The pretrained critic is what agentic PPO starts from (model.critic_path): export and reload it.
    from learner.batching import flatten, pack
    from learner.checkpoint import export_hf
    from learner.models import Critic, score_batch
    from learner.ppo import PPOTrainer

    out = export_hf(pretrainer.critic, tmp_path / "critic")
    reloaded = Critic.from_pretrained(out, torch.float32, "sdpa", grad_checkpointing=False).eval()
    batch = flatten(episodes)
    micro = pack(batch.sequences, 256)
    want = score_batch(pretrainer.critic, micro, batch.num_generated, critic=True, device="cpu")
    got = score_batch(reloaded, micro, batch.num_generated, critic=True, device="cpu")
    assert torch.equal(got, want), "the exported critic must predict what the trained one does"
    # ... and agentic PPO's trainer, given that folder as its critic_path, starts from exactly it
    # (a trainer that ignored critic_path would start from the policy's weights and a fresh head).
    ppo = PPOTrainer.create(_cfg(), tiny_model_dir, critic_path=out, total_steps=1)
    started = score_batch(ppo.critic, micro, batch.num_generated, critic=True, device="cpu")
    assert torch.allclose(started, want, atol=1e-5), (
        f"agentic PPO's critic does not predict what value pretraining exported: max difference "
        f"{float((started - want).abs().max()):.3g}")


def test_rft_and_value_pretraining_weigh_each_trajectorys_tokens_by_its_loss_weight(tiny_model_dir, learner_dist):
    """As for PPO: half weights halve the gradient (RFT) and the value loss (pretraining); RFT's
    ``nll`` stays the unweighted fit; ``mean_loss_weight`` weighs trajectories by their tokens."""
    from learner.rft import RFTTrainer
    from learner.value_pretrain import ValuePretrainer

    episodes = _rft_episodes()[:4]
    rft, pretrain = {}, {}
    for name, weights in (("plain", None), ("half", [0.5] * len(episodes))):
        torch.manual_seed(8)
        rft[name] = RFTTrainer.create(_cfg(rft=RFTConfig(lr=3e-3)), tiny_model_dir, total_steps=2).step(episodes, weights)
        torch.manual_seed(8)
        pretrain[name] = ValuePretrainer.create(_cfg(), tiny_model_dir, total_steps=2).step(episodes, weights=weights)
    assert rft["half"]["nll"] == rft["plain"]["nll"]
    assert rft["half"]["grad_norm_policy"] == pytest.approx(rft["plain"]["grad_norm_policy"] / 2, rel=1e-5)
    assert pretrain["half"]["value_loss"] == pytest.approx(pretrain["plain"]["value_loss"] / 2, rel=1e-5)
    assert pretrain["plain"]["mean_loss_weight"] == 1.0 and pretrain["half"]["mean_loss_weight"] == 0.5

    g = torch.Generator().manual_seed(9)
    long_short = [make_trajectory(f"len{n}", PROMPT, [(torch.randint(3, 2000, (n,), generator=g).tolist(), [-7.0] * n, 0)],
                                  OBSERVATION, reward=3.0) for n in (8, 2)]
    torch.manual_seed(8)
    trainer = RFTTrainer.create(_cfg(rft=RFTConfig(lr=3e-3)), tiny_model_dir, total_steps=2)
    assert trainer.step(long_short, weights=[1.0, 0.5])["mean_loss_weight"] == pytest.approx((8 * 1.0 + 2 * 0.5) / 10)
    with pytest.raises(ValueError, match=r"weights has 1 entries for 2 trajectories"):
        trainer.step(long_short, weights=[1.0])
    with pytest.raises(ValueError, match=r"weights\[1\] is nan"):
        trainer.step(long_short, weights=[1.0, math.nan])
    assert trainer.steps == 1


# --------------------------------------------------------------------------- weights


def _check_buckets(buckets, module, bound, reference):
    names = [n for b in buckets for n, _ in b]
    assert names == [n for n, _ in module.named_parameters()], "every parameter, once, in order"
    for b in buckets:
        size = sum(t.numel() * t.element_size() for _, t in b)
        assert size <= bound or len(b) == 1, f"bucket of {len(b)} tensors is {size} bytes > {bound}"
    for b in buckets:
        for name, tensor in b:
            assert torch.equal(tensor.cpu(), reference[name]), f"{name} exported wrong values"


def test_weight_buckets_cover_every_parameter_within_the_bound(rft_trainer):
    from learner.weights import iter_weight_buckets

    module = rft_trainer.policy.module
    reference = {n: p.detach().cpu().clone() for n, p in module.named_parameters()}
    bound = 200_000  # bytes: the embeddings (1 MB) must go alone, the layers' matrices share buckets
    buckets = list(iter_weight_buckets(rft_trainer.policy, bound))
    _check_buckets(buckets, module, bound, reference)
    assert any(len(b) > 1 for b in buckets) and len(buckets) < len(reference)
    with pytest.raises(ValueError, match="positive"):
        next(iter_weight_buckets(module, 0))


def test_zero3_loads_partitioned_trains_and_gathers_full_weights_for_buckets_and_export(tiny_model_dir, learner_dist,
                                                                                      tmp_path):
    from transformers import AutoModelForCausalLM

    from learner.checkpoint import export_hf
    from learner.rft import RFTTrainer
    from learner.weights import iter_weight_buckets

    on_disk = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).named_parameters())
    trainer = RFTTrainer.create(_cfg(zero_stage=3, rft=RFTConfig(lr=3e-3)), tiny_model_dir, total_steps=2)
    engine = trainer.policy
    assert engine.zero_optimization_stage() == 3
    assert all(p.numel() == 0 and hasattr(p, "ds_id") for p in engine.module.parameters()), \
        "ZeRO-3 keeps only shards outside a gather"
    bound = 300_000
    _check_buckets(list(iter_weight_buckets(engine, bound)), engine.module, bound,
                   {n: p.detach() for n, p in on_disk.items()})

    episodes = _rft_episodes()[::2]
    losses = [trainer.step(episodes)["nll"] for _ in range(2)]
    assert losses[1] < losses[0], losses
    consolidated = engine._zero3_consolidated_16bit_state_dict()  # DeepSpeed's own gather, to compare with
    _check_buckets(list(iter_weight_buckets(engine, bound)), engine.module, bound,
                   {n: t.cpu() for n, t in consolidated.items()})
    assert not torch.equal(consolidated["lm_head.weight"], on_disk["lm_head.weight"].detach())

    out = export_hf(engine, tmp_path / "hf")
    ids = torch.tensor([PROMPT + OBSERVATION])
    with torch.no_grad():
        want = engine(input_ids=ids, use_cache=False).logits
        got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


# --------------------------------------------------------------------------- export


def test_hf_export_loads_in_transformers_with_the_trained_weights(rft_trainer, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learner.checkpoint import export_hf

    rft_trainer.step(_rft_episodes()[:2])  # whatever ran before: the weights have moved
    out = export_hf(rft_trainer.policy, tmp_path / "hf", tokenizer_dir=tiny_model_dir)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT + OBSERVATION])
    with torch.no_grad():
        want = rft_trainer.policy.module(input_ids=ids, use_cache=False).logits
        got = loaded(input_ids=ids).logits
        before = original(input_ids=ids).logits
    assert torch.equal(got, want), "the export must hold the engine's current weights"
    assert not torch.allclose(got, before), "the engine has trained: its export differs from the initial model"
    assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"


VLLM_SCRIPT = r'''
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, max_num_seqs=2, max_num_batched_tokens=256,
          enforce_eager=True, seed=0)
out = llm.generate([TokensPrompt(prompt_token_ids=json.loads(sys.argv[2]))],
                   SamplingParams(max_tokens=4, temperature=0.0, logprobs=0, ignore_eos=True), use_tqdm=False)[0].outputs[0]
print("RESULT " + json.dumps({"token_ids": list(out.token_ids),
                              "logprobs": [next(iter(s.values())).logprob for s in out.logprobs]}), flush=True)
'''


@pytest.mark.slow  # ~40 s: a vLLM engine start in a subprocess
def test_hf_export_loads_in_vllm_and_generates_what_transformers_predicts(rft_trainer, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from learner.checkpoint import export_hf

    out = export_hf(rft_trainer.policy, tmp_path / "hf", tokenizer_dir=tiny_model_dir)
    script = tmp_path / "run_vllm.py"
    script.write_text(VLLM_SCRIPT)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", TORCHDYNAMO_DISABLE="1",
               VLLM_NO_USAGE_STATS="1", TOKENIZERS_PARALLELISM="false")
    for key in DIST_ENV:  # vLLM forms its own process group
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(script), str(out), json.dumps(PROMPT)], env=env,
                          capture_output=True, text=True, timeout=420)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1].removeprefix("RESULT "))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)
    assert result["token_ids"][0] == int(logprobs.argmax())
    assert result["logprobs"][0] == pytest.approx(float(logprobs.max()), abs=1e-3)
