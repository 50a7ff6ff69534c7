#!/usr/bin/env python
"""Learner throughput and peak memory: tokens per second of full PPO steps (critic scoring,
advantages, policy and critic forward + backward + AdamW) or RFT steps, on synthetic
multi-turn trajectories of a given length.

    # CPU (this machine): the embedded SmolLM2-135M, fp32
    python scripts/bench_learner.py --seqs 2 --seq-len 512 --steps 2
    # GPU (after `. .gpu-stack/bin/activate`): a random-initialised ~0.5B Llama, bf16
    python scripts/bench_learner.py --model random-0.5b --seqs 16 --seq-len 4096 --micro-batch-tokens 16384

Prints one JSON line; --out writes it to a file too. Tokens counted are trajectory tokens
(prompt, tool output and generated) per learner step; a step reads each one in the critic's
scoring pass and in the policy's and the critic's training passes.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# ~0.48B parameters with tied 49k-token embeddings (SmolLM2's vocabulary), head_dim 64.
RANDOM_05B = dict(hidden_size=1280, intermediate_size=3456, num_hidden_layers=24, num_attention_heads=20,
                  num_key_value_heads=4, vocab_size=49152, max_position_embeddings=32768, tie_word_embeddings=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded",
                   help="a Hugging Face folder, 'embedded' (SmolLM2-135M-Instruct) or 'random-0.5b'")
    p.add_argument("--mode", choices=["ppo", "rft"], default="ppo")
    p.add_argument("--seqs", type=int, default=2, help="trajectories per learner step")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per trajectory")
    p.add_argument("--turns", type=int, default=4, help="model turns per trajectory (tool output between them)")
    p.add_argument("--generated-fraction", type=float, default=0.5, help="share of tokens the model generated")
    p.add_argument("--micro-batch-tokens", type=int, default=4096)
    p.add_argument("--cpu-micro-batch-tokens", type=int, default=1024,
                   help="learner.cpu_micro_batch_tokens: the row budget on a CPU learner")
    p.add_argument("--zero-stage", type=int, default=2)
    p.add_argument("--no-grad-checkpointing", action="store_true")
    p.add_argument("--attn", default="auto", help="transformers attention implementation")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--steps", type=int, default=3, help="timed learner steps")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    return p.parse_args()


def model_dir(name: str, tmp: Path) -> Path:
    if name == "embedded":
        from launch.embedded_model import prepare_embedded_model

        return prepare_embedded_model(os.path.expanduser("~/.cache/cuda-agent"))
    if name == "random-0.5b":
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**RANDOM_05B, bos_token_id=1, eos_token_id=2, pad_token_id=2))
        model.to(torch.bfloat16).save_pretrained(tmp / "random-0.5b")
        return tmp / "random-0.5b"
    return Path(name)


def synthetic_trajectories(count: int, length: int, turns: int, generated_fraction: float, vocab: int, version: int):
    """Prompt, then ``turns`` model turns separated by tool output, ``length`` tokens in all."""
    import torch

    from protocol.trajectory import Segment, Trajectory, Turn

    g = torch.Generator().manual_seed(version)
    per_turn = max(1, int(length * generated_fraction) // turns)
    observation = max(1, (length - per_turn * turns) // (turns + 1))
    out = []
    for i in range(count):
        seg, spans = Segment(), []
        rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
        seg.extend(rand(length - turns * (per_turn + observation) + observation), generated=False)
        for k in range(turns):
            if k:
                seg.extend(rand(observation), generated=False)
            start = len(seg)
            seg.extend(rand(per_turn), generated=True, logprobs=[-2.0] * per_turn)
            spans.append(Turn(segment=0, start=start, end=len(seg), version=version))
        out.append(Trajectory(episode_id=f"b{version}-{i}", task_id="bench", segments=[seg], turns=spans,
                              reward=float(i % 2)))
    return out


def peak_memory_gib() -> dict[str, float]:
    import torch

    mem = {"host_max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2}
    if torch.cuda.is_available():
        mem["gpu_max_allocated_gib"] = torch.cuda.max_memory_allocated() / 1024**3
        mem["gpu_max_reserved_gib"] = torch.cuda.max_memory_reserved() / 1024**3
    return mem


def main() -> None:
    args = parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if os.path.exists("/dev/nvidia0") else "cpu")
    import torch

    from configs.schema import LearnerConfig
    from learner.engine import on_gpu

    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(args.model, Path(tmp))
        cfg = LearnerConfig(zero_stage=args.zero_stage, lr=1e-6, critic_lr=1e-6, warmup_steps=0,
                            micro_batch_tokens=args.micro_batch_tokens, cpu_micro_batch_tokens=args.cpu_micro_batch_tokens,
                            grad_checkpointing=not args.no_grad_checkpointing, attn_implementation=args.attn)
        total = args.warmup + args.steps
        started = time.perf_counter()
        if args.mode == "ppo":
            from learner.ppo import PPOTrainer

            trainer = PPOTrainer.create(cfg, path, total_steps=total)
            vocab = trainer.policy.module.config.vocab_size
        else:
            from learner.rft import RFTTrainer

            trainer = RFTTrainer.create(cfg, path, total_steps=total)
            vocab = trainer.policy.module.config.vocab_size
        build_s = time.perf_counter() - started
        batches = [synthetic_trajectories(args.seqs, args.seq_len, args.turns, args.generated_fraction, vocab, v)
                   for v in range(total)]
        # Batch k was generated by policy version k: PPO is told the version its weights carry
        # (the driver owns it in a run), so every batch is on-policy here.
        step = (lambda k, batch: trainer.step(batch, version=k)) if args.mode == "ppo" else (lambda k, batch: trainer.step(batch))
        for k, batch in enumerate(batches[:args.warmup]):
            step(k, batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        metrics = {}
        for k, batch in enumerate(batches[args.warmup:], start=args.warmup):
            metrics = step(k, batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        tokens = args.steps * args.seqs * args.seq_len
        params = sum(getattr(p, "ds_numel", p.numel()) for p in trainer.policy.module.parameters())
        result = {
            "mode": args.mode, "model": args.model, "params_b": round(params / 1e9, 3),
            "device": torch.cuda.get_device_name() if on_gpu() else f"cpu x{torch.get_num_threads()} threads",
            "dtype": str(next(trainer.policy.module.parameters()).dtype), "zero_stage": args.zero_stage,
            "grad_checkpointing": cfg.grad_checkpointing, "attn": cfg.attn_implementation,
            "seqs": args.seqs, "seq_len": args.seq_len, "micro_batch_tokens": args.micro_batch_tokens,
            "cpu_micro_batch_tokens": args.cpu_micro_batch_tokens,
            "micro_batches": metrics.get("micro_batches"), "steps": args.steps,
            "step_s": round(elapsed / args.steps, 3), "tokens_per_s": round(tokens / elapsed, 1),
            "generated_tokens_per_s": round(args.steps * metrics.get("generated_tokens", 0) / elapsed, 1),
            "build_s": round(build_s, 1), **{k: round(v, 2) for k, v in peak_memory_gib().items()},
        }
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
