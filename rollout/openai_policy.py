"""OpenAIPolicy: any OpenAI-compatible chat-completions endpoint, for evaluation only.

The endpoint sees chat messages, never our token ids, and returns no sampling logprobs we
could trust as a behaviour policy's; so this policy is chat-only (token_level False) and its
trajectories are not trained on.

Tool calls: with ``function_calling`` the request carries the tool schemas and the reply's
structured ``tool_calls`` come back as they are; without it the model writes calls in its
text (Hermes style) and the episode loop parses them.

Failures: connection errors, timeouts, 429 and 5xx are retried with exponential backoff
(honouring a Retry-After header), up to ``retries`` times; any other status is an error at
once, with the server's message. Every attempt passes the throttle, so retries cannot
exceed the request-rate limit either.

Stop strings: the API drops a matched stop string from the text; where the server says
which one matched (vLLM's ``stop_reason``) it is put back, as the interface promises.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import httpx
from asyncio_throttle import Throttler

from rollout.policy import Generation, GenerationRequest, PolicyError

RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))


class OpenAIPolicy:
    token_level = False
    tokenizer = None

    def __init__(self, base_url: str, model: str | None = None, *, api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 600.0, retries: int = 5, requests_per_s: float = 0.0,
                 temperature: float = 1.0, top_p: float = 1.0, function_calling: bool = True,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0, version: int = 0):
        if retries < 0 or timeout_s <= 0 or requests_per_s < 0:
            raise PolicyError("OpenAIPolicy: retries must be >= 0, timeout_s > 0 and requests_per_s >= 0 "
                              "(rollout.openai_retries, rollout.openai_timeout_s, rollout.generation_rps)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = os.environ.get(api_key_env) or None
        self.timeout_s = timeout_s
        self.retries = retries
        self.temperature = temperature
        self.top_p = top_p
        self.function_calling = function_calling
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.version = version
        self.throttler = _throttler(requests_per_s)
        self.requests_sent = 0  # attempts, retries included
        self._client: httpx.AsyncClient | None = None

    @classmethod
    def from_config(cls, base_url: str, model: str | None, cfg: Any) -> "OpenAIPolicy":
        r = cfg.rollout
        return cls(base_url, model, api_key_env=r.openai_api_key_env, timeout_s=r.openai_timeout_s,
                   retries=r.openai_retries, requests_per_s=r.generation_rps, temperature=r.temperature,
                   top_p=r.top_p, function_calling=str(r.tool_call_format) == "openai")

    async def generate(self, request: GenerationRequest) -> Generation:
        model = self.model or await self._first_model()
        body: dict[str, Any] = {
            "model": model,
            "messages": request.messages,
            "max_tokens": request.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if self.function_calling and request.tools:
            body["tools"] = request.tools
            body["tool_choice"] = "auto"
        started = time.perf_counter()
        reply = await self._request("POST", "/chat/completions", body)
        return _generation(reply, request.stop, self.version, time.perf_counter() - started)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _first_model(self) -> str:
        listing = await self._request("GET", "/models", None)
        models = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict) and m.get("id")]
        if not models:
            raise PolicyError(f"{self.base_url}/models lists no models; name one in the spec: openai:URL#MODEL")
        self.model = models[0]
        return self.model

    async def _request(self, method: str, path: str, body: dict | None) -> dict:
        url = self.base_url + path
        last = ""
        for attempt in range(self.retries + 1):
            retry_after = None
            async with self.throttler:
                self.requests_sent += 1
                try:
                    response = await asyncio.wait_for(self._http().request(method, url, json=body), self.timeout_s)
                except (asyncio.TimeoutError, httpx.TimeoutException):
                    last = f"no reply within {self.timeout_s:g} s (rollout.openai_timeout_s)"
                except httpx.TransportError as e:
                    last = f"connection error: {type(e).__name__}: {e}"
                else:
                    if response.status_code < 300:
                        return _json(response, url)
                    last = f"HTTP {response.status_code}: {_error_text(response)}"
                    if response.status_code not in RETRY_STATUSES:
                        raise PolicyError(f"{method} {url} failed with {last}")
                    retry_after = _retry_after(response)
            if attempt < self.retries:
                await asyncio.sleep(self._backoff(attempt, retry_after))
        raise PolicyError(f"{method} {url} failed after {self.retries + 1} attempts "
                          f"(rollout.openai_retries={self.retries}); last: {last}")

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff_s)
        # Jitter spreads out the retries of many episodes that failed together.
        return min(self.backoff_s * 2**attempt, self.max_backoff_s) * random.uniform(0.5, 1.0)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            # The overall limit is asyncio.wait_for's; httpx's own would only bound each phase.
            self._client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(None),
                                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self._client


def _throttler(requests_per_s: float) -> Throttler:
    if requests_per_s <= 0:
        return _NoThrottle()
    burst = max(1, int(requests_per_s))  # Throttler counts whole requests per period
    return Throttler(rate_limit=burst, period=burst / requests_per_s)


class _NoThrottle:
    async def __aenter__(self) -> None:
        pass

    async def __aexit__(self, *exc: Any) -> None:
        pass


def _generation(reply: dict, stop: list[str], version: int, gen_s: float) -> Generation:
    try:
        choice = reply["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as e:
        raise PolicyError(f"the endpoint's reply has no choices[0].message: {str(reply)[:300]}") from e
    text = message.get("content") or ""
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched in stop and not text.endswith(matched):
        text += matched
    calls = message.get("tool_calls") or None
    if calls is not None:
        # Kept as sent, malformed ones included: the episode loop judges and counts them.
        calls = [{"id": c.get("id", ""), "type": c.get("type", "function"),
                  "function": {"name": (c.get("function") or {}).get("name", ""),
                               "arguments": (c.get("function") or {}).get("arguments", "{}")}}
                 for c in calls if isinstance(c, dict)]
    # "tool_calls" and "content_filter" also end the turn; only "length" means it was cut.
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    return Generation(text=text, token_ids=[], logprobs=[], finish_reason=finish, version=version,
                      tool_calls=calls, gen_s=gen_s)


def _json(response: httpx.Response, url: str) -> dict:
    try:
        data = response.json()
    except ValueError as e:
        raise PolicyError(f"{url} answered {response.status_code} with a body that is not JSON: {response.text[:300]!r}") from e
    if not isinstance(data, dict):
        raise PolicyError(f"{url} answered with JSON that is not an object: {str(data)[:300]}")
    return data


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
    except (ValueError, AttributeError):
        pass
    return response.text[:500] or response.reason_phrase


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None
