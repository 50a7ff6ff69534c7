"""The embedded default model: SmolLM2-135M-Instruct converted once from its GGUF, cached, and generating text."""
from __future__ import annotations

import time

import pytest

from tests.chat_inputs import report_timing


@pytest.mark.slow  # 36-90 s on the 2-core machine; setup runs the same conversion on every fresh machine
def test_embedded_model_converts_once_to_a_folder_that_generates_text_and_is_cached(tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launch.embedded_model import MARKER, embedded_model_dir, is_prepared, prepare_embedded_model

    cache_dir = tmp_path / "cache"
    assert not is_prepared(cache_dir)
    started = time.perf_counter()
    path = prepare_embedded_model(cache_dir)
    convert_s = time.perf_counter() - started
    assert path == embedded_model_dir(cache_dir) and is_prepared(cache_dir)
    assert (path / MARKER).exists() and (path / "model.safetensors").exists()
    assert not path.with_name(path.name + ".partial").exists()

    started = time.perf_counter()
    assert prepare_embedded_model(cache_dir) == path
    again_s = time.perf_counter() - started
    assert again_s < 2.0
    report_timing(capsys, f"embedded model: conversion {convert_s:.1f}s, cached call {again_s * 1000:.1f}ms")

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert model.config.model_type == "llama" and model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(135e6, rel=0.05)
    assert tokenizer.model_max_length == model.config.max_position_embeddings
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is a GPU?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert reply.strip(), "the converted model generated no text"
    assert sum(c.isalpha() for c in reply) > len(reply) / 2, reply  # words, not byte soup
