"""OpenAIPolicy over real HTTP: a local aiohttp server that misbehaves on purpose, and (slow) a real `vllm serve`."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
pytest_asyncio = pytest.importorskip("pytest_asyncio")  # not on the GPU machines; these tests are CPU ones

from rollout.policy import Generation, PolicyError
from tests.chat_inputs import CHAT, TOOLS, free_port, generation_request, report_timing


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
        port = free_port()
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
            g = await policy.generate(generation_request([], max_new_tokens=64, stop=["</tool_call>"]))
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
                await policy.generate(generation_request([]))
            assert len(server.requests) == 1, "a 400 is not retried"
            g = await policy.generate(generation_request([]))
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
                await policy.generate(generation_request([]))
        finally:
            await policy.close()
        assert len(server.requests) == 3 and time.monotonic() - started < 3.0


@pytest.mark.asyncio
async def test_openai_policy_retries_connection_errors_then_fails_clearly():
    policy = _openai(f"http://127.0.0.1:{free_port()}/v1", model="m", retries=2)
    try:
        with pytest.raises(PolicyError, match="after 3 attempts.*connection error"):
            await policy.generate(generation_request([]))
    finally:
        await policy.close()
    assert policy.requests_sent == 3


@pytest.mark.asyncio
async def test_openai_policy_throttles_requests_per_second():
    async with FlakyServer([]) as server:
        policy = _openai(server.url, model="m", requests_per_s=4)
        try:
            await asyncio.gather(*[policy.generate(generation_request([])) for _ in range(6)])
        finally:
            await policy.close()
    spread = server.times[-1] - server.times[0]
    assert len(server.times) == 6 and spread >= 0.9, f"6 requests at 4/s cannot all land within {spread:.2f}s"


# --------------------------------------------------------------------------- OpenAIPolicy, against `vllm serve`


@pytest.fixture
def vllm_server(tiny_model_dir, tmp_path):
    port = free_port()
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
        with_tools = await policy.generate(generation_request([], max_new_tokens=16))
        again = await policy.generate(generation_request([], max_new_tokens=16))
        gen_s = time.perf_counter() - started
        assert policy.model == "tiny", "the served model name comes from /models"
        for g in (with_tools, again):
            assert isinstance(g.text, str) and g.text and g.token_ids == [] and g.logprobs == []
            assert g.finish_reason in ("stop", "length") and g.tool_calls is None  # a random model calls no tools
        assert again.text == with_tools.text, "greedy through the server must be deterministic"

        policy.function_calling = False
        stop = with_tools.text[len(with_tools.text) // 2:][:3]
        stopped = await policy.generate(generation_request([], max_new_tokens=16, stop=[stop]))
        assert stopped.finish_reason == "stop" and stopped.text.endswith(stop), \
            "the matched stop string must come back in the text (from vLLM's stop_reason)"
        assert with_tools.text.startswith(stopped.text)
    finally:
        await policy.close()
    report_timing(capsys, f"vllm serve (tiny model): ready in {start_s:.1f}s; two 16-token chat completions in {gen_s:.2f}s")
