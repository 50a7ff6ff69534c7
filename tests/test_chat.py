"""ChatFormat: the token glue between turns, with the test model's ChatML template."""
from __future__ import annotations

import random

import pytest

from rollout.chat import ChatFormat


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def full_decode_close(chat: ChatFormat, ids: list[int]) -> str:
    """_close from the whole generation's text (the reference for the tail-only decode)."""
    text = chat.tokenizer.decode(ids, skip_special_tokens=False)
    for k in chat._ends:
        if text.endswith(chat._closing[:k]):
            return chat._closing[k:]
    return chat._closing


def test_one_format_per_tokenizer(tokenizer):
    assert ChatFormat.of(tokenizer) is ChatFormat.of(tokenizer)


def test_the_closing_continues_a_stopped_turn_and_completes_a_cut_one(tokenizer):
    chat = ChatFormat(tokenizer)
    assert chat._closing == "<|im_end|>\n"
    text_ids = tokenizer.encode("x = torch.zeros(4)", add_special_tokens=False)
    assert chat._close(text_ids + [tokenizer.eos_token_id]) == "\n"  # stopped on <|im_end|>
    assert chat._close(text_ids) == "<|im_end|>\n"  # cut by the length limit
    # A cut after a "<" has not begun the end-of-turn token: it needs all of it, not "|im_end|>\n".
    cut = tokenizer.encode("std::vector<", add_special_tokens=False)
    assert tokenizer.decode(cut).endswith("<") and chat._close(cut) == "<|im_end|>\n"


def test_the_tail_decode_agrees_with_the_whole_decode(tokenizer):
    chat = ChatFormat(tokenizer)
    rng = random.Random(0)
    multibyte = tokenizer.encode("ππ → ✓ 😀 λx", add_special_tokens=False)
    special = [tokenizer.eos_token_id, tokenizer.bos_token_id]
    for n in (1, 5, 40, 64, 65, 100, 300):
        for _ in range(30):
            ids = [rng.choice(multibyte + special) if rng.random() < 0.2 else rng.randrange(len(tokenizer))
                   for _ in range(n)]
            if rng.random() < 0.3:
                ids[-1] = tokenizer.eos_token_id
            assert chat._close(ids) == full_decode_close(chat, ids), ids


def test_continuation_is_what_the_template_renders_after_the_turn(tokenizer):
    chat = ChatFormat(tokenizer)
    messages = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "Make GELU fast."}]
    reply = '<tool_call>{"name": "list_files", "arguments": {}}</tool_call>'
    generated = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    observation = chat.observation_message("reference.py  120 bytes", "list_files")
    after = messages + [{"role": "assistant", "content": reply}, observation]
    for _ in range(2):  # the second time from the caches
        assert chat.render(messages) + generated + chat.continuation(generated, [observation]) == chat.render(after)


def test_cached_token_ids_are_copies(tokenizer):
    chat = ChatFormat(tokenizer)
    first = chat.encode("hello <|im_end|>\n")
    assert first == list(tokenizer.encode("hello <|im_end|>\n", add_special_tokens=False))
    first.append(-1)  # a caller extending its list must not change what the next caller gets
    assert chat.encode("hello <|im_end|>\n") == first[:-1]
