"""VLLMPolicy: vLLM's AsyncLLM on the tiny model, one engine for the module (its start, ~70-100 s on 2 busy
cores, dominates this file): sampler logprobs, determinism, context limits, weight hot-swaps."""
from __future__ import annotations

import asyncio
import math
import time

import pytest
pytest_asyncio = pytest.importorskip("pytest_asyncio")  # not on the GPU machines; these tests are CPU ones

from rollout.policy import PolicyError
from tests.chat_inputs import chat_ids, generation_request, report_timing, rollout_config


on_engine_loop = pytest.mark.asyncio(loop_scope="module")  # the engine's output handler lives on this loop


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_policy(tiny_model_dir):
    from rollout.vllm_policy import VLLMPolicy

    cfg = rollout_config(max_context_tokens=512, kv_cache_gib=0.25, max_num_seqs=8, temperature=1.0, seed=0,
                  engine_overrides={"max_num_batched_tokens": 512})
    policy = VLLMPolicy.from_config(str(tiny_model_dir), cfg)
    policy.bucket_bytes = 300_000  # the tiny model's 1 MB tensors then span many RPC buckets, as a real model's do
    print(f"\n[timing] VLLMPolicy (AsyncLLM, tiny model) start {policy.start_s:.1f}s", flush=True)
    yield policy
    await policy.close()


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _hf_logprobs(model, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """The model's own log-probability of each token_ids[i] given everything before it."""
    import torch

    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    positions = range(len(prompt_ids) - 1, len(prompt_ids) + len(token_ids) - 1)
    return [float(logprobs[p, t]) for p, t in zip(positions, token_ids)]


async def _greedy(policy, ids, n=24, stop=None):
    old, policy.temperature = policy.temperature, 0.0
    try:
        return await policy.generate(generation_request(ids, max_new_tokens=n, stop=stop))
    finally:
        policy.temperature = old


@on_engine_loop
async def test_vllm_policy_concurrent_samples_carry_the_samplers_logprob_of_each_token(vllm_policy, tokenizer, hf_model, capsys):
    ids = chat_ids(tokenizer)
    started = time.perf_counter()
    gens = await asyncio.gather(*[vllm_policy.generate(generation_request(ids, max_new_tokens=24)) for _ in range(6)])
    wall = time.perf_counter() - started
    report_timing(capsys, f"VLLMPolicy: 6 concurrent x <=24 tokens in {wall:.2f}s")
    assert len({tuple(g.token_ids) for g in gens}) > 1, "six samples at temperature 1 were all identical"
    for g in gens:
        assert g.version == vllm_policy.version and g.finish_reason in ("stop", "length") and g.gen_s > 0
        assert len(g.token_ids) == len(g.logprobs) > 0
        assert all(math.isfinite(x) and x <= 0.0 for x in g.logprobs)
        assert g.finish_reason == "stop" or len(g.token_ids) == 24
        # No re-tokenisation: the text is the decode of the ids the engine sampled.
        assert g.text == tokenizer.decode(g.token_ids, skip_special_tokens=True)
        # The logprobs are the sampled tokens' own, under these weights (temperature 1: processed == raw).
        expected = _hf_logprobs(hf_model, ids, g.token_ids)
        assert g.logprobs == pytest.approx(expected, abs=2e-3), "sampler logprobs differ from the model's"


@on_engine_loop
async def test_vllm_policy_greedy_is_deterministic_and_stop_strings_end_the_turn_included(vllm_policy, tokenizer):
    ids = chat_ids(tokenizer)
    first, second = await asyncio.gather(_greedy(vllm_policy, ids), _greedy(vllm_policy, ids))
    assert first.token_ids == second.token_ids and first.finish_reason == "length"
    # A stop string taken from the middle of the greedy text must end the turn there, kept in the text.
    stop = first.text[len(first.text) // 2:][:3]
    assert stop.strip(), f"greedy text {first.text!r} has no usable stop string"
    stopped = await _greedy(vllm_policy, ids, stop=[stop])
    assert stopped.finish_reason == "stop" and stopped.text.endswith(stop)
    assert first.text.startswith(stopped.text) and len(stopped.token_ids) < len(first.token_ids)
    assert len(stopped.token_ids) == len(stopped.logprobs)


@on_engine_loop
async def test_vllm_policy_refuses_a_context_longer_than_the_engine_allows(vllm_policy):
    with pytest.raises(PolicyError, match="max_model_len is 512"):
        await vllm_policy.generate(generation_request([5] * 512))


def test_vllm_engine_starts_spawned_and_the_environment_is_restored_after(monkeypatch):
    # A fork of a multi-threaded process inherits its threads' locks held: on the H100 a second
    # engine forked in one process, after an episode's, hung at start-up. vLLM spawns in a Ray
    # actor or once CUDA is up; elsewhere it forks unless told (VLLM_WORKER_MULTIPROC_METHOD).
    # (A spawned engine cannot be told from a forked one from outside: vLLM retitles its
    # processes over their argv and environment.)
    import os

    from rollout.vllm_policy import _engine_env

    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    for on_cpu in (True, False):
        with _engine_env(on_cpu=on_cpu, eager=True, flashinfer_sampler=False):
            assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
        assert "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")  # a user's own choice stands
    with _engine_env(on_cpu=True, eager=True, flashinfer_sampler=False):
        assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


@on_engine_loop
async def test_vllm_weight_swap_changes_outputs_bumps_the_version_and_swapping_back_restores_them(
        vllm_policy, tokenizer, hf_model, capsys):
    import torch

    ids = chat_ids(tokenizer)
    v0 = vllm_policy.version
    original = {name: t.detach().clone() for name, t in hf_model.state_dict().items()}
    before = await _greedy(vllm_policy, ids)
    generator = torch.Generator().manual_seed(7)
    other = {name: torch.randn(t.shape, generator=generator) * t.float().std().clamp(min=0.02) + t.float().mean()
             for name, t in original.items()}

    # A generation in flight when the swap starts finishes on the old weights ("wait" mode);
    # one asked for once the swap holds admission waits for it and runs on the new weights.
    inflight = asyncio.create_task(vllm_policy.generate(generation_request(ids, max_new_tokens=48)))
    await asyncio.sleep(0.05)
    swap = asyncio.create_task(vllm_policy.update_weights(other.items(), version=v0 + 1))
    while vllm_policy.admitting and not swap.done():  # staging first: generation goes on meanwhile
        await asyncio.sleep(0.001)
    during = asyncio.create_task(_greedy(vllm_policy, ids))
    swap_s = await swap
    old_gen, new_gen = await inflight, await during
    report_timing(capsys, f"VLLMPolicy weight swap (tiny model, {len(other)} tensors): {swap_s:.2f}s")
    assert vllm_policy.version == v0 + 1
    assert old_gen.version == v0 and new_gen.version == v0 + 1
    assert old_gen.logprobs == pytest.approx(_hf_logprobs(hf_model, ids, old_gen.token_ids), abs=2e-3), \
        "the in-flight request must have run entirely on the old weights"
    assert new_gen.token_ids != before.token_ids, "different weights gave the same greedy output"

    hf_model.load_state_dict(other)
    try:
        assert new_gen.logprobs == pytest.approx(_hf_logprobs(hf_model, ids, new_gen.token_ids), abs=2e-3), \
            "after the swap the engine must compute with exactly the new weights (fused q/k/v and gate/up included)"
    finally:
        hf_model.load_state_dict(original)

    await vllm_policy.update_weights(original.items(), version=v0 + 2)
    after = await _greedy(vllm_policy, ids)
    assert vllm_policy.version == v0 + 2 and after.version == v0 + 2
    assert after.token_ids == before.token_ids, "swapping the original weights back must reproduce the original output"
    assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)


@on_engine_loop
async def test_vllm_weight_swap_refuses_stale_versions_and_wrong_names_or_shapes_and_keeps_serving(
        vllm_policy, tokenizer, hf_model):
    import torch

    with pytest.raises(PolicyError, match="not newer"):
        await vllm_policy.update_weights([], version=vllm_policy.version)
    version = vllm_policy.version
    ids = chat_ids(tokenizer)
    before = await _greedy(vllm_policy, ids, n=8)
    good = list(hf_model.state_dict().items())
    scrambled = [(name, torch.randn(t.shape)) for name, t in good]
    # The bad tensor comes after buckets of good ones have been staged: all of them must be dropped.
    with pytest.raises(PolicyError, match="'model.no_such_layer.weight' is not a weight of the checkpoint"):
        await vllm_policy.update_weights(scrambled + [("model.no_such_layer.weight", torch.zeros(3))], version=version + 1)
    with pytest.raises(PolicyError, match=r"has shape \[3\], the checkpoint's is"):
        await vllm_policy.update_weights([(good[0][0], torch.zeros(3))], version=version + 1)
    assert vllm_policy.version == version, "a failed swap must not bump the version"
    after = await asyncio.wait_for(_greedy(vllm_policy, ids, n=8), 60)
    assert after.version == version, "admission must reopen after a failed swap"
    assert after.token_ids == before.token_ids, "a failed swap must leave the old weights serving"


@on_engine_loop
async def test_vllm_load_folder_serves_a_saved_model_folder_and_refuses_one_of_another_shape(
        vllm_policy, tokenizer, hf_model, tiny_model_dir, tmp_path):
    """A stage's export reaches the engine by path: the workers read the safetensors themselves."""
    import torch
    from safetensors.torch import save_file

    ids = chat_ids(tokenizer)
    version = vllm_policy.version
    before = await _greedy(vllm_policy, ids)
    original = {name: t.detach().clone() for name, t in hf_model.state_dict().items()}
    generator = torch.Generator().manual_seed(5)
    other = {name: torch.randn(t.shape, generator=generator) * 0.5 for name, t in original.items()}
    half = len(other) // 2  # two files, as a sharded export has
    names = sorted(other)
    for k, part in enumerate((names[:half], names[half:])):
        save_file({n: other[n].contiguous() for n in part}, str(tmp_path / f"model-0000{k + 1}.safetensors"))
    await vllm_policy.load_folder(str(tmp_path), version + 1)
    loaded = await _greedy(vllm_policy, ids)
    hf_model.load_state_dict(other)
    try:
        assert loaded.logprobs == pytest.approx(_hf_logprobs(hf_model, ids, loaded.token_ids), abs=2e-3)
    finally:
        hf_model.load_state_dict(original)

    bad = tmp_path / "bad"
    bad.mkdir()
    save_file({names[0]: torch.zeros(3)}, str(bad / "model.safetensors"))
    with pytest.raises(PolicyError, match=r"has shape \[3\], the checkpoint's is"):
        await vllm_policy.load_folder(str(bad), version + 2)
    with pytest.raises(PolicyError, match="holds no"):
        await vllm_policy.load_folder(str(tmp_path / "none"), version + 2)
    await vllm_policy.load_folder(str(tiny_model_dir), version + 2)
    after = await _greedy(vllm_policy, ids)
    assert vllm_policy.version == version + 2 and after.token_ids == before.token_ids


@on_engine_loop
async def test_vllm_keep_mode_swap_freezes_inflight_requests_and_recomputes_them_on_the_new_weights(
        vllm_policy, tokenizer, hf_model):
    """In "keep" mode a request in flight goes on after the swap: every token it samples comes
    from the old weights up to the swap and from the new ones after it, never from a mix
    (the frozen request's KV is recomputed under the new weights)."""
    import torch

    ids = chat_ids(tokenizer)
    original = {name: t.detach().clone() for name, t in hf_model.state_dict().items()}
    generator = torch.Generator().manual_seed(11)
    # Larger than the tiny model's own weights, so the two give clearly different logprobs.
    other = {name: torch.randn(t.shape, generator=generator) * 0.5 for name, t in original.items()}
    version = vllm_policy.version
    vllm_policy.swap_mode = "keep"
    try:
        # Greedy: no early EOS by chance, so the swap lands while the request still runs.
        inflight = asyncio.create_task(_greedy(vllm_policy, ids, n=400))
        await asyncio.sleep(0.1)
        await vllm_policy.update_weights(other.items(), version=version + 1)
        g = await inflight
        assert g.version == version, "a request that started on the old weights reports the old version"
        old_lp = _hf_logprobs(hf_model, ids, g.token_ids)
        hf_model.load_state_dict(other)
        try:
            new_lp = _hf_logprobs(hf_model, ids, g.token_ids)
        finally:
            hf_model.load_state_dict(original)
        source = [{(True, False): "old", (False, True): "new", (True, True): "both", (False, False): "neither"}[
                      (abs(a - x) < 2e-3, abs(b - x) < 2e-3)] for x, a, b in zip(g.logprobs, old_lp, new_lp)]
        assert "old" in source and "new" in source, f"the swap did not land mid-request: {source}"
        assert "neither" not in source, f"tokens sampled from a mix of weights: {source}"
        clear = [x for x in source if x != "both"]
        assert clear == sorted(clear, key=lambda x: x == "new"), f"old weights used after new ones: {source}"
        await vllm_policy.update_weights(original.items(), version=version + 2)
    finally:
        vllm_policy.swap_mode = "wait"
    assert vllm_policy.version == version + 2
