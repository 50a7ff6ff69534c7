"""Checkpoints that resume exactly, and the policy as a Hugging Face folder vLLM loads.

Layout under a run's checkpoint root:

    step_000010/policy/ds/...   DeepSpeed's files: weights, optimiser, LR scheduler (ZeRO shards)
    step_000010/critic/ds/...
    step_000010/rng_rank0.pt    Python, NumPy and torch (CPU and GPU) generator states, per rank
    step_000010/state.json      the trainer's counters (step, policy version) and the caller's extras
    latest                      the name of the newest complete checkpoint, written last

``latest`` is replaced only after every rank has finished writing, so a crash mid-save
leaves the previous checkpoint as the one to resume from. Where the root is a node's copy of a
run folder on another node (actors/storage.py), a ``Mirror`` sends each rank's files there
before ``latest`` is, and deletes what pruning deletes.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from learner.weights import iter_weight_buckets

LATEST = "latest"
TAG = "ds"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class Mirror(Protocol):
    """Where files written under a checkpoint root must also go, and be deleted from."""

    def publish(self, path: Path) -> None: ...

    def remove(self, path: Path) -> None: ...


def save_checkpoint(root: str | Path, step: int, engines: dict[str, Any], state: dict[str, Any], keep: int = 0,
                    mirror: Mirror | None = None) -> Path:
    """Write checkpoint ``step`` of every engine plus RNG and trainer state; return its folder.
    Then only the newest ``keep`` checkpoints stay (0 keeps all). ``mirror``: this rank sends
    its node's files there (one rank per node passes it)."""
    folder = Path(root) / f"step_{step:06d}"
    for name, engine in engines.items():
        engine.save_checkpoint(str(folder / name), tag=TAG)
    torch.save(_rng_state(), folder / f"rng_rank{_rank()}.pt")
    if mirror is not None:
        mirror.publish(folder)
    _barrier()
    if _rank() == 0:
        (folder / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
        tmp = Path(root) / f".{LATEST}.tmp"
        tmp.write_text(folder.name)
        os.replace(tmp, Path(root) / LATEST)
        if mirror is not None:
            mirror.publish(folder / "state.json")
            mirror.publish(Path(root) / LATEST)
        for old in prune_checkpoints(root, keep):
            if mirror is not None:
                mirror.remove(old)
    _barrier()
    return folder


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (0 keeps all), never the one ``latest``
    names: each holds optimiser states, ~4 GB for a 135M policy and critic in fp32."""
    if keep <= 0:
        return []
    marker = Path(root) / LATEST
    latest = marker.read_text().strip() if marker.exists() else None
    folders = sorted(Path(root).glob("step_*"))  # zero-padded names: name order is step order
    old = [f for f in folders[:-keep] if f.name != latest]
    for folder in old:
        shutil.rmtree(folder, ignore_errors=True)
    return old


def latest_checkpoint(root: str | Path) -> Path | None:
    marker = Path(root) / LATEST
    if not marker.exists():
        return None
    folder = Path(root) / marker.read_text().strip()
    if not (folder / "state.json").exists():
        raise FileNotFoundError(f"{marker} names {folder.name}, which has no state.json: the checkpoint is incomplete; "
                                "delete the marker to start over or point it at an earlier step_* folder")
    return folder


def load_checkpoint(root: str | Path, engines: dict[str, Any]) -> dict[str, Any] | None:
    """Restore the newest checkpoint into ``engines`` and the RNGs; return its state, or None if none."""
    folder = latest_checkpoint(root)
    if folder is None:
        return None
    for name, engine in engines.items():
        path, _ = engine.load_checkpoint(str(folder / name), tag=TAG, load_optimizer_states=True,
                                         load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"checkpoint {folder} has no {name!r} engine state under {folder / name}")
    rng_file = folder / f"rng_rank{_rank()}.pt"
    if rng_file.exists():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    return json.loads((folder / "state.json").read_text())


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def export_hf(policy, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
              bucket_bytes: int = 512 * 1024**2) -> Path:
    """Write the policy (an engine or a model) as a Hugging Face folder: config, safetensors,
    generation config and, from ``tokenizer_dir``, the tokenizer. A critic's engine gives a
    folder that ``Critic.from_pretrained`` (``model.critic_path``) reads. Every rank must call
    it (ZeRO-3 gathers); rank 0 writes."""
    module = getattr(policy, "module", policy)
    out = Path(out_dir)
    state = {}
    for bucket in iter_weight_buckets(module, bucket_bytes):
        if _rank() == 0:
            state.update({name: t.detach().to("cpu", copy=True).contiguous() for name, t in bucket})
    if _rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        module.save_pretrained(str(out), state_dict=state)  # safetensors; a Critic writes its head beside
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(out))
    _barrier()
    return out
