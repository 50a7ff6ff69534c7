"""What the model-facing tests send (a chat, a tool, a replay script, a code sample) and small helpers around them."""
from __future__ import annotations

import socket
import textwrap

import pytest
from omegaconf import OmegaConf

from configs.schema import Config
from rollout.policy import GenerationRequest

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
SCRIPT = [
    'I will compile first.\n<tool_call>{"name": "compile", "arguments": {"file": "kernel.cpp"}}</tool_call>',
    '<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
]

EXPECTED_CHATML = (
    "<|im_start|>system\nYou write CUDA kernels.<|im_end|>\n"
    "<|im_start|>user\nMake softmax fast.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
CODE = textwrap.dedent(
    '''\
    import torch

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x, dim=-1) * 2.0 + x.mean(dim=0, keepdim=True)
    '''
)


def report_timing(capsys: pytest.CaptureFixture, message: str) -> None:
    with capsys.disabled():
        print(f"\n[timing] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_ids(tokenizer, messages=CHAT) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def generation_request(ids: list[int], max_new_tokens: int = 16, stop: list[str] | None = None) -> GenerationRequest:
    return GenerationRequest(prompt_ids=list(ids), messages=CHAT, tools=TOOLS, max_new_tokens=max_new_tokens,
                             stop=stop or [])


def rollout_config(**rollout) -> Config:
    return OmegaConf.merge(OmegaConf.structured(Config), {"rollout": rollout})
