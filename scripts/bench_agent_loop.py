#!/usr/bin/env python
"""Agent-loop overhead: generated tokens per second of the episode loop against raw vLLM.

Three measurements on one engine, at the same concurrency and the same turn lengths:

    raw      N streams, each T sequential AsyncLLM.generate calls of L tokens, starting from an
             episode's first context and growing by what was generated (what the loop asks of
             vLLM, minus everything else)
    policy   the same through VLLMPolicy.generate (token ids in, ids and logprobs out)
    loop     N agent episodes of T turns (EpisodeRunner: chat glue, parsing, tool calls, the
             real environment's list_files/read_file, trajectory recording)

The model is random-initialised with the given model's shape, so it never emits EOS and every
turn runs its full L tokens; a trained model would end turns at different lengths and make the
comparison unequal. Prints a table and one JSON line.

    python scripts/bench_agent_loop.py --streams 16 --turns 4 --tokens 256            # CPU: small
    . .gpu-stack/bin/activate && python scripts/bench_agent_loop.py --streams 64 --turns 8 --tokens 512
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="embedded", help="a Hugging Face folder whose config (shape) to use, 'embedded', or 'smollm2-shape' (SmolLM2-135M's layers with the test tokenizer: no download)")
    p.add_argument("--streams", type=int, default=16, help="concurrent episodes / request streams")
    p.add_argument("--turns", type=int, default=4, help="turns per episode")
    p.add_argument("--tokens", type=int, default=256, help="generated tokens per turn")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    return p.parse_args()


def random_model(shape: str, folder: Path) -> Path:
    """A random-initialised copy of ``shape`` (config and tokenizer), saved to ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if shape == "smollm2-shape":  # no downloads on the GPU machines: SmolLM2-135M's layers, the test tokenizer
        from tests.tiny_model import build_tiny_model
        from transformers import LlamaConfig, LlamaForCausalLM

        build_tiny_model(folder)
        torch.manual_seed(0)
        config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                             num_key_value_heads=3, vocab_size=2048, max_position_embeddings=16384,
                             tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
        LlamaForCausalLM(config).save_pretrained(folder)
        return folder
    if shape == "embedded":
        from launch.embedded_model import prepare_embedded_model

        shape = str(prepare_embedded_model(os.path.expanduser("~/.cache/cuda-agent")))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(shape), torch_dtype=torch.float32)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(shape).save_pretrained(folder)
    return folder


def episode_prompt(policy, cfg) -> list[int]:
    """The token ids of an episode's first context (system prompt, tools, task), so that raw
    generation prefills what the loop prefills."""
    from rollout.chat import ChatFormat
    from rollout.episode import system_prompt, task_prompt
    from rollout.tools import TOOLS, format_tool_prompt
    from tasks.loader import load_tasks

    tasks, _ = load_tasks([])
    task = next(t for t in tasks if t.id == "level1/01_gelu")
    messages = [{"role": "system", "content": system_prompt("", format_tool_prompt([t.schema() for t in TOOLS], "hermes"))},
                {"role": "user", "content": task_prompt(task.source, "cpp")}]
    return ChatFormat(policy.tokenizer).render(messages)


async def raw(policy, prompt: list[int], streams: int, turns: int, tokens: int) -> int:
    from vllm import SamplingParams

    async def stream(k: int) -> int:
        ids = list(prompt)
        for t in range(turns):
            params = SamplingParams(max_tokens=tokens, ignore_eos=True, logprobs=0)
            final = None
            async for final in policy.engine.generate({"prompt_token_ids": ids}, params, request_id=f"raw-{k}-{t}"):
                pass
            ids += list(final.outputs[0].token_ids) + prompt[-8:]  # a little "observation" each turn
        return len(ids) - len(prompt)

    done = await asyncio.gather(*(stream(k) for k in range(streams)))
    return sum(done) - streams * turns * 8


async def through_policy(policy, prompt: list[int], streams: int, turns: int, tokens: int) -> int:
    from rollout.policy import GenerationRequest

    async def stream() -> int:
        ids, generated = list(prompt), 0
        for _ in range(turns):
            gen = await policy.generate(GenerationRequest(prompt_ids=ids, messages=[], tools=[], max_new_tokens=tokens))
            ids += gen.token_ids + prompt[-8:]
            generated += len(gen.token_ids)
        return generated

    return sum(await asyncio.gather(*(stream() for _ in range(streams))))


async def loop(policy, cfg, streams: int) -> int:
    from omegaconf import OmegaConf

    from env_pool.pool import EnvPool
    from launch.episode import episode_runner
    from rollout.env_client import LocalEnvClient
    from rollout.episode_runner import jobs_for
    from tasks.loader import load_tasks

    tasks, _ = load_tasks([])
    task = next(t for t in tasks if t.id == "level1/01_gelu")
    runner = episode_runner(cfg, policy, LocalEnvClient(EnvPool(OmegaConf.to_container(cfg.env, enum_to_str=True))))
    generated = 0
    async for traj in runner.run_many(jobs_for([task], streams), progress=False):
        generated += traj.num_generated
    return generated


async def main() -> dict:
    args = parse_args()
    from configs.load import load_config
    from rollout.vllm_policy import VLLMPolicy

    with tempfile.TemporaryDirectory() as tmp:
        folder = random_model(args.shape, Path(tmp) / "model")
        budget = 4096 + args.turns * (args.tokens + 600)
        cfg = load_config([], [f"rollout.max_context_tokens={budget}", f"rollout.max_turns={args.turns}",
                               f"rollout.max_new_tokens={args.tokens}", f"rollout.min_new_tokens={min(64, args.tokens)}",
                               f"rollout.episodes_in_flight={args.streams}", "rollout.skill_in_prompt=false",
                               f"rollout.max_turns_without_call={args.turns + 1}",
                               f"env.work_dir={Path(tmp) / 'env'}"])
        policy = VLLMPolicy.from_config(str(folder), cfg)
        prompt = episode_prompt(policy, cfg)  # the same first context the loop's episodes start from
        results = {}
        try:
            await raw(policy, prompt, 2, 1, 16)  # warm-up
            for name, run in (("raw", lambda: raw(policy, prompt, args.streams, args.turns, args.tokens)),
                              ("policy", lambda: through_policy(policy, prompt, args.streams, args.turns, args.tokens)),
                              ("loop", lambda: loop(policy, cfg, args.streams))):
                started = time.perf_counter()
                tokens = await run()
                wall = time.perf_counter() - started
                results[name] = {"tokens": tokens, "wall_s": round(wall, 2), "tok_per_s": round(tokens / wall, 1)}
        finally:
            await policy.close()
    base = results["raw"]["tok_per_s"]
    for r in results.values():
        r["vs_raw"] = round(r["tok_per_s"] / base, 3)
    return {"streams": args.streams, "turns": args.turns, "tokens": args.tokens, "shape": args.shape, **results}


if __name__ == "__main__":
    result = asyncio.run(main())
    print(f"{'':8} {'tokens':>8} {'wall s':>8} {'tok/s':>9} {'vs raw':>7}")
    for name in ("raw", "policy", "loop"):
        r = result[name]
        print(f"{name:8} {r['tokens']:>8} {r['wall_s']:>8} {r['tok_per_s']:>9} {r['vs_raw']:>7}")
    print(json.dumps(result))
    out = parse_args().out
    if out:
        Path(out).write_text(json.dumps(result))
