"""A tiny random-initialised Llama causal LM with its own byte-level BPE tokenizer.

Built in a few seconds with no network, for tests that need a real model folder (transformers,
vLLM, DeepSpeed) but not a useful one. Deterministic: the same installed torch gives the same
tokenizer (trained on the sorted sources of `torch.nn`) and the same weights (fixed seed).

Token conventions follow SmolLM2-135M-Instruct, the embedded default model, so code paths that
tests exercise with this model see what they will see with the real one: ChatML turns,
bos = <|im_start|>, eos = pad = <|im_end|>, unk = <|endoftext|>.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

VOCAB_SIZE = 2048
HIDDEN_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 2  # head_dim 64: a head size vLLM's CPU attention supports
INTERMEDIATE_SIZE = 256
MAX_POSITIONS = 4096
SEED = 1234
CORPUS_BYTES = 1_500_000

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2

# ChatML, as SmolLM2-Instruct writes it (without its default system message).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    """Local text to train the tokenizer on: the sources of torch.nn, in a fixed order."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed: the tiny model's tokenizer trains on its sources")
    root = Path(list(spec.submodule_search_locations)[0]) / "nn"
    texts: list[str] = []
    total = 0
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= CORPUS_BYTES:
            break
    return texts


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        model_max_length=MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


# Larger random models with the same tokenizer, for GPU runs that need a realistic size and
# cannot download one: layer shapes of SmolLM2-135M, and a ~0.4B model (head_dim 64).
SHAPES = {
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, tie_word_embeddings=True, max_position_embeddings=16384),
    "0.5b": dict(hidden_size=1280, intermediate_size=3456, num_hidden_layers=24, num_attention_heads=20,
                 num_key_value_heads=4, head_dim=64, tie_word_embeddings=True, max_position_embeddings=32768),
}


def build_tiny_model(out_dir: Path, shape: str | None = None) -> Path:
    """Write a tiny Llama model folder (config, safetensors, tokenizer) into out_dir; return it.
    ``shape`` (a SHAPES key) makes it a larger random model with the same tokenizer instead."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if shape is not None and shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {sorted(SHAPES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        head_dim=HIDDEN_SIZE // NUM_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    for key, value in SHAPES.get(shape, {}).items():
        setattr(config, key, value)
    tokenizer.model_max_length = config.max_position_embeddings
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="write a random model folder with the test tokenizer")
    parser.add_argument("out_dir")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a larger shape (default: the tiny one)")
    args = parser.parse_args()
    print(build_tiny_model(Path(args.out_dir), args.shape))
