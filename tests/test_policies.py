"""The policies the episode loop generates through: replay, OpenAI-compatible, and vLLM.

All real: the replay policy tokenizes with the tiny model's tokenizer; OpenAIPolicy talks
HTTP to a local aiohttp server that misbehaves on purpose (and, in the slow test, to a real
`vllm serve`); VLLMPolicy runs vLLM's AsyncLLM on the tiny model, one engine for the module
(its start, ~70-100 s on 2 busy cores, dominates this file).
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time

import pytest
pytest_asyncio = pytest.importorskip("pytest_asyncio")  # not on the GPU machines; these tests are CPU ones
from omegaconf import OmegaConf

from configs.schema import Config
from rollout.policy import Generation, GenerationRequest, Policy, PolicyError, make_policy
from rollout.replay_policy import ReplayExhausted, ReplayPolicy

CHAT = [
    {"role": "system", "content": "You write CUDA kernels."},
    {"role": "user", "content": "Make softmax fast."},
]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "compile",
        "description": "Compile the kernel in the workspace.",
        "parameters": {"type": "object", "properties": {"file": {"type": "string"}}, "required": ["file"]},
    },
}]


def _timing(capsys: pytest.CaptureFixture, message: str) -> None:
    with capsys.disabled():
        print(f"\n[timing] {message}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chat_ids(tokenizer, messages=CHAT) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _request(ids: list[int], max_new_tokens: int = 16, stop: list[str] | None = None) -> GenerationRequest:
    return GenerationRequest(prompt_ids=list(ids), messages=CHAT, tools=TOOLS, max_new_tokens=max_new_tokens,
                             stop=stop or [])


def _config(**rollout) -> Config:
    return OmegaConf.merge(OmegaConf.structured(Config), {"rollout": rollout})


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


# --------------------------------------------------------------------------- replay

SCRIPT = [
    'I will compile first.\n<tool_call>{"name": "compile", "arguments": {"file": "kernel.cpp"}}</tool_call>',
    '<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@pytest.mark.asyncio
async def test_replay_plays_each_turn_tokenized_with_eos_and_zero_logprobs_then_refuses_more(tmp_path, tokenizer, suffix):
    path = tmp_path / f"script{suffix}"
    path.write_text(json.dumps(SCRIPT) if suffix == ".json" else "".join(f"- {json.dumps(t)}\n" for t in SCRIPT))
    policy = ReplayPolicy(path, tokenizer)
    assert isinstance(policy, Policy) and policy.token_level and policy.tokenizer is tokenizer

    for turn in SCRIPT:
        g = await policy.generate(_request([1, 2, 3], max_new_tokens=4096))
        expected = tokenizer(turn, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert g.text == turn and g.token_ids == expected, "replay must tokenize the turn exactly and end it with EOS"
        assert g.logprobs == [0.0] * len(expected) and g.finish_reason == "stop" and g.version == 0
        assert tokenizer.decode(g.token_ids, skip_special_tokens=True) == turn
    with pytest.raises(ReplayExhausted, match="has 2 turns and all were played"):
        await policy.generate(_request([1], max_new_tokens=4096))


@pytest.mark.asyncio
async def test_replay_cuts_a_turn_longer_than_max_new_tokens_like_a_model_would(tmp_path, tokenizer):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCRIPT[:1]))
    g = await ReplayPolicy(path, tokenizer).generate(_request([1], max_new_tokens=5))
    assert len(g.token_ids) == 5 and g.finish_reason == "length"
    assert g.text == tokenizer.decode(g.token_ids) and SCRIPT[0].startswith(g.text)


@pytest.mark.parametrize("content, message", [
    ("[]", "non-empty list of strings"),
    ('{"turns": ["a"]}', "non-empty list of strings"),
    ('["a", 3]', "non-empty list of strings"),
    ("[unclosed", "does not parse"),
])
def test_replay_rejects_a_malformed_script_naming_the_file(tmp_path, tokenizer, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(PolicyError, match=message) as info:
        ReplayPolicy(path, tokenizer)
    assert str(path) in str(info.value)
    with pytest.raises(PolicyError, match="No such file"):
        ReplayPolicy(tmp_path / "missing.json", tokenizer)


# --------------------------------------------------------------------------- make_policy


@pytest.mark.parametrize("spec, message", [
    ("nonsense", "is not KIND:TARGET"),
    ("vllm:", "is not KIND:TARGET"),
    ("gguf:/models/x", "unknown kind 'gguf'"),
    ("openai:localhost:8000/v1", "must start with http"),
    ("vllm:/nonexistent/model", "is not a folder"),
])
def test_make_policy_rejects_bad_specs_saying_which_forms_work(spec, message):
    with pytest.raises(PolicyError, match=message):
        make_policy(spec, _config())


@pytest.mark.asyncio
async def test_make_policy_builds_replay_and_openai_policies_from_specs(tmp_path, tokenizer):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCRIPT))
    replay = make_policy(f"replay:{path}", _config(), tokenizer=tokenizer)
    assert isinstance(replay, ReplayPolicy) and (await replay.generate(_request([1], 4096))).text == SCRIPT[0]

    from rollout.openai_policy import OpenAIPolicy

    remote = make_policy("openai:http://127.0.0.1:9/v1#my-model", _config(openai_retries=2, tool_call_format="openai"))
    assert isinstance(remote, OpenAIPolicy) and not remote.token_level and remote.tokenizer is None
    assert (remote.base_url, remote.model, remote.retries, remote.function_calling) == ("http://127.0.0.1:9/v1", "my-model", 2, True)
    assert make_policy("openai:https://api.example.com/v1", _config()).model is None  # asked from /models later


def test_make_policy_takes_model_folders_and_the_launcher_resolves_the_rest(tmp_path, tiny_model_dir):
    from launch.embedded_model import ModelPrepareError, resolve_policy

    with pytest.raises(PolicyError, match="'embedded' is resolved to one by the launcher"):
        make_policy("vllm:embedded", _config())  # the rollout layer never prepares a model itself
    cfg = _config()  # model.path=embedded: an openai policy does not read it, so nothing is converted
    assert resolve_policy("openai:http://127.0.0.1:9/v1", cfg) == ("openai:http://127.0.0.1:9/v1", cfg)
    assert resolve_policy(f"vllm:{tiny_model_dir}", cfg) == (f"vllm:{tiny_model_dir}", cfg)
    script = tmp_path / "s.json"
    script.write_text(json.dumps(SCRIPT))
    spec, resolved = resolve_policy(f"replay:{script}", OmegaConf.merge(cfg, {"model": {"path": str(tiny_model_dir)}}))
    assert spec == f"replay:{script}" and resolved.model.path == str(tiny_model_dir)
    assert isinstance(make_policy(spec, resolved), ReplayPolicy)  # its tokenizer loaded from the folder
    with pytest.raises(ModelPrepareError, match="is not a folder"):
        resolve_policy(f"replay:{script}", OmegaConf.merge(cfg, {"model": {"path": str(tmp_path / "none")}}))


# --------------------------------------------------------------------------- OpenAIPolicy, against a local server


class FlakyServer:
    """A real HTTP server speaking the chat-completions API, failing on purpose.

    plan: one entry per request, consumed in order ("ok" once it runs out): an HTTP status to
    fail with, "slow" (answers after 1.5 s), or "ok".
    """

    def __init__(self, plan: list):
        self.plan = list(plan)
        self.requests: list[dict] = []
        self.times: list[float] = []

    async def __aenter__(self) -> "FlakyServer":
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        port = _free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()

    async def models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    async def chat(self, request):
        from aiohttp import web

        body = await request.json()
        self.requests.append({"body": body, "auth": request.headers.get("Authorization")})
        self.times.append(time.monotonic())
        step = self.plan.pop(0) if self.plan else "ok"
        if step == "slow":
            await asyncio.sleep(1.5)
        elif step == 429:
            return web.json_response({"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "0"})
        elif isinstance(step, int):
            return web.json_response({"error": {"message": f"planned failure {step}"}}, status=step)
        message = {"role": "assistant", "content": "Compiling now."}
        if body.get("tools"):
            message["tool_calls"] = [{"id": "call_1", "type": "function",
                                      "function": {"name": "compile", "arguments": '{"file": "kernel.cpp"}'}}]
        return web.json_response({
            "id": "cmpl-1", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if body.get("tools") else "stop",
                         "stop_reason": (body.get("stop") or [None])[0]}],
        })


def _openai(url: str, **kw):
    from rollout.openai_policy import OpenAIPolicy

    kw.setdefault("backoff_s", 0.01)
    return OpenAIPolicy(url, **kw)


@pytest.mark.asyncio
async def test_openai_policy_retries_5xx_and_429_then_returns_text_and_structured_tool_calls(monkeypatch):
    monkeypatch.setenv("TEST_ENDPOINT_KEY", "sk-test")
    async with FlakyServer([503, 500, 429]) as server:
        policy = _openai(server.url, api_key_env="TEST_ENDPOINT_KEY", retries=3, function_calling=True)
        try:
            g = await policy.generate(_request([], max_new_tokens=64, stop=["</tool_call>"]))
        finally:
            await policy.close()
    assert len(server.requests) == 4, "three failures, then the answer"
    assert policy.requests_sent == 5, "four chat attempts and one /models listing"
    body = server.requests[-1]["body"]
    assert body["model"] == "served-model", "with no #MODEL the first listed model is used"
    assert body["messages"] == CHAT and body["tools"] == TOOLS and body["max_tokens"] == 64
    assert server.requests[-1]["auth"] == "Bearer sk-test"
    assert isinstance(g, Generation) and g.token_ids == [] and g.logprobs == [] and g.finish_reason == "stop"
    assert g.text == "Compiling now.</tool_call>", "the matched stop string (stop_reason) is put back"
    assert g.tool_calls == [{"id": "call_1", "type": "function",
                             "function": {"name": "compile", "arguments": '{"file": "kernel.cpp"}'}}]


@pytest.mark.asyncio
async def test_openai_policy_sends_no_tools_in_text_format_and_fails_at_once_on_a_client_error():
    async with FlakyServer([400, "ok"]) as server:
        policy = _openai(server.url, model="m", retries=5, function_calling=False)
        try:
            with pytest.raises(PolicyError, match="HTTP 400: planned failure 400"):
                await policy.generate(_request([]))
            assert len(server.requests) == 1, "a 400 is not retried"
            g = await policy.generate(_request([]))
        finally:
            await policy.close()
    assert "tools" not in server.requests[-1]["body"] and g.tool_calls is None and g.text == "Compiling now."
    assert server.requests[-1]["auth"] is None, "no key in the environment: no Authorization header"


@pytest.mark.asyncio
async def test_openai_policy_times_out_retries_and_then_says_why():
    async with FlakyServer(["slow", "slow", "slow"]) as server:
        policy = _openai(server.url, model="m", retries=2, timeout_s=0.3)
        started = time.monotonic()
        try:
            with pytest.raises(PolicyError, match=r"after 3 attempts .*no reply within 0.3 s"):
                await policy.generate(_request([]))
        finally:
            await policy.close()
        assert len(server.requests) == 3 and time.monotonic() - started < 3.0


@pytest.mark.asyncio
async def test_openai_policy_retries_connection_errors_then_fails_clearly():
    policy = _openai(f"http://127.0.0.1:{_free_port()}/v1", model="m", retries=2)
    try:
        with pytest.raises(PolicyError, match="after 3 attempts.*connection error"):
            await policy.generate(_request([]))
    finally:
        await policy.close()
    assert policy.requests_sent == 3


@pytest.mark.asyncio
async def test_openai_policy_throttles_requests_per_second():
    async with FlakyServer([]) as server:
        policy = _openai(server.url, model="m", requests_per_s=4)
        try:
            await asyncio.gather(*[policy.generate(_request([])) for _ in range(6)])
        finally:
            await policy.close()
    spread = server.times[-1] - server.times[0]
    assert len(server.times) == 6 and spread >= 0.9, f"6 requests at 4/s cannot all land within {spread:.2f}s"


# --------------------------------------------------------------------------- weight packing


def test_packed_weights_round_trip_exactly_in_buckets_of_the_asked_size():
    import torch

    from rollout.weight_packing import pack_tensors, unpack_tensors

    tensors = [("scalar", torch.tensor(3.5)), ("bf16", torch.randn(64, 64).to(torch.bfloat16)),
               ("empty", torch.zeros(0, 2)), ("strided", torch.arange(12).view(3, 4).t()),
               ("big", torch.randn(300, 300))]
    buckets = list(pack_tensors(tensors, bucket_bytes=10_000))
    assert [len(b) for b in buckets] == [4, 1], "small tensors share a bucket; one larger than a bucket gets its own"
    out = list(unpack_tensors([p for b in buckets for p in b]))
    assert [n for n, _ in out] == [n for n, _ in tensors]
    for (name, want), (_, got) in zip(tensors, out):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), name


def test_flat_buckets_round_trip_every_dtype_and_shape_at_aligned_offsets():
    import torch

    from learner.weight_wire import bucket_layout, flatten_bucket, unflatten_bucket

    named = [("a", torch.randn(3, 5)), ("b", torch.randn(7).to(torch.bfloat16)), ("c", torch.arange(3)),
             ("d", torch.tensor(2.5)), ("e", torch.empty(0, 4))]
    flat, layout = flatten_bucket(named)
    assert (layout, flat.numel()) == bucket_layout(named)
    assert all(offset % 16 == 0 for *_, offset in layout)
    for (name, original), (back_name, back) in zip(named, unflatten_bucket(flat, layout)):
        assert back_name == name and back.dtype == original.dtype and torch.equal(back, original)


# --------------------------------------------------------------------------- VLLMPolicy, tiny model

on_engine_loop = pytest.mark.asyncio(loop_scope="module")  # the engine's output handler lives on this loop


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_policy(tiny_model_dir):
    from rollout.vllm_policy import VLLMPolicy

    cfg = _config(max_context_tokens=512, kv_cache_gib=0.25, max_num_seqs=8, temperature=1.0, seed=0,
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
        return await policy.generate(_request(ids, max_new_tokens=n, stop=stop))
    finally:
        policy.temperature = old


@on_engine_loop
async def test_vllm_policy_concurrent_samples_carry_the_samplers_logprob_of_each_token(vllm_policy, tokenizer, hf_model, capsys):
    ids = _chat_ids(tokenizer)
    started = time.perf_counter()
    gens = await asyncio.gather(*[vllm_policy.generate(_request(ids, max_new_tokens=24)) for _ in range(6)])
    wall = time.perf_counter() - started
    _timing(capsys, f"VLLMPolicy: 6 concurrent x <=24 tokens in {wall:.2f}s")
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
    ids = _chat_ids(tokenizer)
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
        await vllm_policy.generate(_request([5] * 512))


@on_engine_loop
async def test_vllm_weight_swap_changes_outputs_bumps_the_version_and_swapping_back_restores_them(
        vllm_policy, tokenizer, hf_model, capsys):
    import torch

    ids = _chat_ids(tokenizer)
    v0 = vllm_policy.version
    original = {name: t.detach().clone() for name, t in hf_model.state_dict().items()}
    before = await _greedy(vllm_policy, ids)
    generator = torch.Generator().manual_seed(7)
    other = {name: torch.randn(t.shape, generator=generator) * t.float().std().clamp(min=0.02) + t.float().mean()
             for name, t in original.items()}

    # A generation in flight when the swap starts finishes on the old weights ("wait" mode);
    # one asked for once the swap holds admission waits for it and runs on the new weights.
    inflight = asyncio.create_task(vllm_policy.generate(_request(ids, max_new_tokens=48)))
    await asyncio.sleep(0.05)
    swap = asyncio.create_task(vllm_policy.update_weights(other.items(), version=v0 + 1))
    while vllm_policy.admitting and not swap.done():  # staging first: generation goes on meanwhile
        await asyncio.sleep(0.001)
    during = asyncio.create_task(_greedy(vllm_policy, ids))
    swap_s = await swap
    old_gen, new_gen = await inflight, await during
    _timing(capsys, f"VLLMPolicy weight swap (tiny model, {len(other)} tensors): {swap_s:.2f}s")
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
    ids = _chat_ids(tokenizer)
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

    ids = _chat_ids(tokenizer)
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

    ids = _chat_ids(tokenizer)
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


# --------------------------------------------------------------------------- OpenAIPolicy, against `vllm serve`


@pytest.fixture
def vllm_server(tiny_model_dir, tmp_path):
    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TORCHDYNAMO_DISABLE="1", VLLM_NO_USAGE_STATS="1",
               VLLM_DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
    log = open(tmp_path / "vllm_serve.log", "w")
    # The module, not the `vllm` script: that one asks for the "vllm" distribution's version,
    # and here the distribution is named vllm-cpu.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "512",
           "--max-num-seqs", "4", "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.perf_counter()
    try:
        import httpx

        while True:
            if proc.poll() is not None:
                raise AssertionError(f"vllm serve exited with {proc.returncode}:\n{(tmp_path / 'vllm_serve.log').read_text()[-4000:]}")
            if time.perf_counter() - started > 480:
                raise AssertionError(f"vllm serve did not answer in 480 s:\n{(tmp_path / 'vllm_serve.log').read_text()[-4000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1", time.perf_counter() - started
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow  # vllm serve starts in 60-150 s on 2 cores
@pytest.mark.asyncio
async def test_openai_policy_against_vllm_serve_with_tools_and_text(vllm_server, capsys):
    url, start_s = vllm_server
    policy = _openai(url, function_calling=True, temperature=0.0)
    try:
        started = time.perf_counter()
        with_tools = await policy.generate(_request([], max_new_tokens=16))
        again = await policy.generate(_request([], max_new_tokens=16))
        gen_s = time.perf_counter() - started
        assert policy.model == "tiny", "the served model name comes from /models"
        for g in (with_tools, again):
            assert isinstance(g.text, str) and g.text and g.token_ids == [] and g.logprobs == []
            assert g.finish_reason in ("stop", "length") and g.tool_calls is None  # a random model calls no tools
        assert again.text == with_tools.text, "greedy through the server must be deterministic"

        policy.function_calling = False
        stop = with_tools.text[len(with_tools.text) // 2:][:3]
        stopped = await policy.generate(_request([], max_new_tokens=16, stop=[stop]))
        assert stopped.finish_reason == "stop" and stopped.text.endswith(stop), \
            "the matched stop string must come back in the text (from vLLM's stop_reason)"
        assert with_tools.text.startswith(stopped.text)
    finally:
        await policy.close()
    _timing(capsys, f"vllm serve (tiny model): ready in {start_s:.1f}s; two 16-token chat completions in {gen_s:.2f}s")


@pytest.mark.asyncio
async def test_replay_folder_plays_each_tasks_script_with_a_place_per_episode(tmp_path, tokenizer):
    """replay:DIR (eval sweeps): DIR/<task id>.json or DIR/<name>.yaml per task; episodes do not share a place."""
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "01_gelu.json").write_text(json.dumps(["gelu 1", "gelu 2"]))
    (tmp_path / "03_softmax.yaml").write_text("- softmax 1\n")
    policy = ReplayPolicy(tmp_path, tokenizer)

    def ask(task_id: str, episode_id: str):
        return policy.generate(GenerationRequest(prompt_ids=[1], messages=[], tools=[], max_new_tokens=64,
                                                 episode_id=episode_id, task_id=task_id))

    assert (await ask("level1/01_gelu", "a")).text == "gelu 1"
    assert (await ask("level1/01_gelu", "b")).text == "gelu 1", "a second episode starts at its own first turn"
    assert (await ask("level1/01_gelu", "a")).text == "gelu 2"
    assert (await ask("level1/03_softmax", "c")).text == "softmax 1", "found by the task's name alone"
    with pytest.raises(ReplayExhausted, match="has 1 turns"):
        await ask("level1/03_softmax", "c")
    with pytest.raises(PolicyError, match="no script for task 'level2/07_x'"):
        await ask("level2/07_x", "d")
