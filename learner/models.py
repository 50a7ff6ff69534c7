"""The learner's networks and how they score packed micro-batches.

- policy: a Hugging Face causal LM, trained by PPO or RFT and exported for vLLM;
- critic: a causal-LM backbone (the policy's architecture, without its LM head) and a scalar
  value head, initialised from the policy's weights or from its own checkpoint;
- reference: an optional frozen copy of the initial policy, for the KL term.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from learner.batching import BatchError, MicroBatch
from learner.losses import entropy_from_logits
from learner.sequence_parallel import gather_scores, local_slice

VALUE_HEAD_FILE = "value_head.safetensors"


def resolve_dtype(dtype: str, on_gpu: bool) -> torch.dtype:
    """``auto``: bfloat16 on GPU, float32 on CPU (these CPUs have no bf16 units)."""
    if dtype == "auto":
        return torch.bfloat16 if on_gpu else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"model.dtype must be auto, float32, bfloat16 or float16, got {dtype!r}") from None


def resolve_attention(name: str, on_gpu: bool) -> str:
    """``auto``: FlashAttention-2 on GPU when installed (varlen kernels, no mask for packed rows),
    otherwise sdpa with the block-diagonal mask transformers builds from the position ids."""
    if name != "auto":
        return name
    if on_gpu and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def row_tokens(cfg: Any) -> int:
    """The token budget of a packed micro-batch row. On a GPU rows fill to ``micro_batch_tokens``:
    on an H100 with sdpa, 16 segments packed into 16k-token rows trained 2.0x (2k-token segments)
    to 5.0x (512) faster than in rows of at most 1k. On the CPU, sdpa under the packed rows'
    block-diagonal mask runs unfused, at the square of the row's length: rows stop at
    ``cpu_micro_batch_tokens`` (a PPO step on two 1.6k-token segments took 1.7x as long in one row)."""
    from learner.engine import on_gpu

    if on_gpu():
        return cfg.micro_batch_tokens
    if cfg.cpu_micro_batch_tokens <= 0:
        raise BatchError(f"learner.cpu_micro_batch_tokens must be positive, got {cfg.cpu_micro_batch_tokens}")
    return min(cfg.micro_batch_tokens, cfg.cpu_micro_batch_tokens)


def load_policy(path: str | Path, dtype: torch.dtype, attention: str, grad_checkpointing: bool) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attention)
    _prepare_for_training(model, grad_checkpointing)
    return model


def load_reference(path: str | Path, dtype: torch.dtype, attention: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attention).eval()
    model.requires_grad_(False)
    return model


def _prepare_for_training(model: nn.Module, grad_checkpointing: bool) -> None:
    model.config.use_cache = False
    if grad_checkpointing:
        # Non-reentrant checkpointing works with inputs that need no grad and with ZeRO-3 hooks.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()


class Critic(nn.Module):
    """Backbone plus a scalar value head: V(state before token t), read at position t - 1."""

    def __init__(self, backbone: nn.Module, value_head: nn.Linear):
        super().__init__()
        self.backbone = backbone
        self.value_head = value_head
        self.config = backbone.config

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype, attention: str, grad_checkpointing: bool) -> "Critic":
        """A critic from a policy folder (fresh value head) or from a saved critic (its head too)."""
        from safetensors.torch import load_file
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(str(path), dtype=dtype, attn_implementation=attention)
        head = nn.Linear(backbone.config.hidden_size, 1, dtype=dtype)
        head_file = Path(path) / VALUE_HEAD_FILE
        if head_file.exists():
            head.load_state_dict(load_file(str(head_file)))
        else:
            # Small weights, zero bias: initial values near 0, so the first advantages are close
            # to the rewards themselves rather than to the noise of a random head.
            nn.init.normal_(head.weight, std=0.02 / backbone.config.hidden_size ** 0.5)
            nn.init.zeros_(head.bias)
        _prepare_for_training(backbone, grad_checkpointing)
        return cls(backbone, head)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, predict_at: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        return self.value_head(hidden[0, predict_at]).squeeze(-1).float()

    def save_pretrained(self, out_dir: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """A folder ``from_pretrained`` reads back: the backbone as a Hugging Face model, the head beside it."""
        from safetensors.torch import save_file

        state = state_dict if state_dict is not None else self.state_dict()
        backbone = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
        head = {k.removeprefix("value_head."): v.contiguous() for k, v in state.items() if k.startswith("value_head.")}
        self.backbone.save_pretrained(str(out_dir), state_dict=backbone)
        save_file(head, str(Path(out_dir) / VALUE_HEAD_FILE))


LOGIT_CHUNK = 4096  # predicting positions whose logits exist at once: 2.5 GB of float32 at Qwen's 151,936-token vocabulary


def score_tokens(policy: nn.Module, mb: MicroBatch, with_entropy: bool = False,
                 entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the micro-batch's generated tokens (float32, [N]) and, if asked, the
    entropy of each predicting distribution (differentiable only with ``entropy_grad``).

    The logits are made LOGIT_CHUNK positions at a time from the decoder's hidden states, and
    under a gradient each chunk's are recomputed in the backward pass instead of kept: made
    whole, a 131,072-token row at a 151,936-token vocabulary held its bf16 logits, a float32
    copy and their log-softmax, about 200 GiB. A model whose logits are more than its output
    embedding of the hidden state (a soft-capped or scaled head) is scored whole."""
    model = getattr(policy, "module", policy)  # a DeepSpeed engine wraps the Hugging Face model
    decoder, head = _decoder_and_head(model)
    if decoder is None:
        return _score_whole(policy, mb, with_entropy, entropy_grad)
    hidden = decoder(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).last_hidden_state[0, mb.predict_at]
    logprobs, entropies = [], []
    for start in range(0, hidden.shape[0], LOGIT_CHUNK):
        h, targets = hidden[start:start + LOGIT_CHUNK], mb.targets[start:start + LOGIT_CHUNK]
        keep_graph = torch.is_grad_enabled()
        if keep_graph:
            logprobs.append(checkpoint(_chunk_logprobs, head, h, targets, use_reentrant=False))
        else:
            logprobs.append(_chunk_logprobs(head, h, targets))
        if with_entropy:
            if entropy_grad and keep_graph:
                entropies.append(checkpoint(_chunk_entropy, head, h, use_reentrant=False))
            else:
                with torch.no_grad():
                    entropies.append(_chunk_entropy(head, h.detach()))
    empty = hidden.new_zeros(0, dtype=torch.float32)
    return (torch.cat(logprobs) if logprobs else empty), ((torch.cat(entropies) if entropies else empty) if with_entropy else None)


def _decoder_and_head(model: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """The model's decoder and output embedding, when its logits are exactly ``head(hidden)``."""
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")):
        return None, None
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    decoder, head = (get_decoder() if get_decoder else None), (get_head() if get_head else None)
    return (decoder, head) if decoder is not None and head is not None else (None, None)


def _chunk_logprobs(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def _chunk_entropy(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    return entropy_from_logits(head(hidden).float())


def _score_whole(policy: nn.Module, mb: MicroBatch, with_entropy: bool, entropy_grad: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = policy(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, logits_to_keep=mb.predict_at)
    logits = out.logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, mb.targets[:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return logprobs, entropy


def critic_values(critic: nn.Module, mb: MicroBatch) -> torch.Tensor:
    """The critic's values of the states before the micro-batch's generated tokens ([N], float32)."""
    return critic(input_ids=mb.input_ids, position_ids=mb.position_ids, predict_at=mb.predict_at)


@torch.no_grad()
def score_batch(model: nn.Module, micro_batches: list[MicroBatch], size: int, critic: bool, device) -> torch.Tensor:
    """Logprobs (policy or reference) or values (critic) for every generated token of a batch, in
    flat order. Under sequence parallelism each rank scores its slices and the group shares them."""
    result = torch.zeros(size, dtype=torch.float32)
    for mb in micro_batches:
        mb = local_slice(mb).to(device)
        values = critic_values(model, mb) if critic else score_tokens(model, mb, with_entropy=False)[0]
        result[mb.flat_index.cpu()] = values.float().cpu()
    return gather_scores(result)
