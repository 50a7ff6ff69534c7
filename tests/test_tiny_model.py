"""The tiny random model the tests build (tests/tiny_model.py): it loads in transformers, its tokenizer speaks ChatML."""
from __future__ import annotations

from pathlib import Path

from tests.tiny_model import build_tiny_model
from tests.chat_inputs import CHAT, CODE, EXPECTED_CHATML, chat_ids


def test_tiny_model_loads_in_transformers_with_a_chatml_tokenizer_and_is_deterministic(tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "llama" and config.num_hidden_layers == 2 and not config.tie_word_embeddings
    assert config.hidden_size // config.num_attention_heads == 64
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer) == config.vocab_size

    # ChatML as SmolLM2 writes it, with and without the generation prompt.
    assert tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == EXPECTED_CHATML
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == EXPECTED_CHATML.removesuffix("<|im_start|>assistant\n")
    ids = chat_ids(tokenizer)
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert tokenizer.bos_token == "<|im_start|>" and tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert config.eos_token_id == tokenizer.eos_token_id

    # Byte-level BPE: any text round-trips, and code compresses well below one token per byte.
    code_ids = tokenizer(CODE, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(code_ids) == CODE
    assert len(code_ids) < len(CODE.encode()) / 2
    assert tokenizer.decode(tokenizer("héllo ∑ 🚀\t\n", add_special_tokens=False)["input_ids"]) == "héllo ∑ 🚀\t\n"

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), config.vocab_size) and torch.isfinite(logits).all()

    # Deterministic: a second build is byte-identical.
    again = build_tiny_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (Path(tiny_model_dir) / name).read_bytes(), name
