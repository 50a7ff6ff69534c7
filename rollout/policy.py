"""The policy interface the episode loop generates through, and `make_policy` for specs.

A policy turns a context into the model's next turn. Token-level policies (vLLM, replay) take
the context as token ids and return the sampled ids with their sampling logprobs, so that a
trajectory records exactly what the model saw and did, with no re-tokenisation in between.
Chat-only policies (an OpenAI-compatible endpoint) see chat messages and tool schemas and
return text (and structured tool calls); they serve evaluation, never training.

Specs, as `cuda-agent episode --policy` and `eval.policy` take them:

    vllm:MODEL_DIR          a Hugging Face folder served in-process by vLLM ("vllm:embedded", the
                            SmolLM2-135M-Instruct that launch/embedded_model.py prepares, is
                            resolved to its folder by the launcher before a spec reaches here)
    openai:URL[#MODEL]      an OpenAI-compatible endpoint (URL ends in /v1); MODEL defaults to
                            the first model the endpoint lists
    replay:FILE             scripted assistant turns from a JSON or YAML list (tests, demos)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

FINISH_REASONS = ("stop", "length")


class PolicyError(RuntimeError):
    """A policy that cannot be built or cannot answer; the message says what to fix."""


@dataclass
class GenerationRequest:
    prompt_ids: list[int]  # the full context as token ids (token-level policies)
    messages: list[dict]  # the same context as chat messages (chat-only policies)
    tools: list[dict]  # tool JSON schemas, OpenAI function form (chat-only policies pass them on)
    max_new_tokens: int
    stop: list[str] = field(default_factory=list)  # extra stop strings; included in the output
    episode_id: str = ""  # which episode asks (a replay policy keeps its place in each episode's script)
    task_id: str = ""  # which task the episode works on (a replay policy picks that task's script)


@dataclass
class Generation:
    text: str
    token_ids: list[int]  # sampled ids; empty for chat-only policies
    logprobs: list[float]  # the sampler's logprob of each sampled id (same length)
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    version: int  # policy version that produced it
    tool_calls: list[dict] | None = None  # OpenAI structured calls [{id, function: {name, arguments}}]; None for text formats
    gen_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise PolicyError(f"Generation has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
        if self.finish_reason not in FINISH_REASONS:
            raise PolicyError(f"Generation.finish_reason {self.finish_reason!r} is not one of {FINISH_REASONS}")


@runtime_checkable
class Policy(Protocol):
    token_level: bool  # True: prompt_ids are used and token_ids/logprobs returned
    version: int
    tokenizer: Any  # HF tokenizer (token-level policies), None otherwise

    async def generate(self, request: GenerationRequest) -> Generation: ...

    async def close(self) -> None: ...


SPEC_FORMS = "vllm:MODEL_DIR (or vllm:embedded), openai:URL[#MODEL], replay:FILE"


def make_policy(spec: str, cfg: Any, tokenizer: Any = None) -> Policy:
    """Build the policy a spec names. cfg is the whole Config (model, rollout sections).

    A replay policy needs a tokenizer: pass one, or it loads cfg.model.path's. Model paths
    (vllm:MODEL_DIR, cfg.model.path) must be folders: preparing the embedded model is the
    launcher's job (launch/embedded_model.resolve_policy), done before the spec is passed down.
    """
    kind, sep, target = spec.partition(":")
    if not sep or not target:
        raise PolicyError(f"policy spec {spec!r} is not KIND:TARGET; use one of {SPEC_FORMS}")
    if kind == "vllm":
        from rollout.vllm_policy import VLLMPolicy

        return VLLMPolicy.from_config(_model_dir(target), cfg)
    if kind == "openai":
        from rollout.openai_policy import OpenAIPolicy

        url, _, model = target.partition("#")
        if not url.startswith(("http://", "https://")):
            raise PolicyError(f"policy spec {spec!r}: the URL must start with http:// or https:// (e.g. openai:http://127.0.0.1:8000/v1#MODEL)")
        return OpenAIPolicy.from_config(url, model or None, cfg)
    if kind == "replay":
        from rollout.replay_policy import ReplayPolicy

        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(_model_dir(cfg.model.path))
        return ReplayPolicy(target, tokenizer)
    raise PolicyError(f"policy spec {spec!r}: unknown kind {kind!r}; use one of {SPEC_FORMS}")


def _model_dir(path: str) -> str:
    if not Path(path).expanduser().is_dir():
        raise PolicyError(f"model path {path!r} is not a folder; give a Hugging Face model folder "
                          f"('embedded' is resolved to one by the launcher, not here)")
    return str(Path(path).expanduser())
