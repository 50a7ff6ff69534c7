#!/usr/bin/env python
"""Agent-loop overhead: generated tokens per second of the episode loop against raw vLLM.

Measurements on one engine, at the same concurrency and the same turn lengths:

    raw      N streams, each T sequential AsyncLLM.generate calls of L tokens, starting from an
             episode's first context and growing by what was generated (what the loop asks of
             vLLM, minus everything else)
    raw_eos  (--raw-eos) the same, stopping on EOS as the policy and the loop must
    policy   the same through VLLMPolicy.generate (token ids in, ids and logprobs out)
    loop     N agent episodes of T turns (EpisodeRunner: chat glue, parsing, tool calls, the
             real environment's list_files/read_file, trajectory recording)
    host     the loop again, against a policy that answers at once with pre-sampled tokens: what
             the loop itself costs on this process's CPU, with no engine to hide it

Setting up the loop (loading the tasks, the env pool, the runner) happens once per run and is
reported apart ("setup_s"), not inside the loop's wall time.

The model is random-initialised with the given model's shape, so that turns run their full L
tokens (a trained model would end turns at different lengths and make the comparison unequal).
Raw generation ignores EOS; the policy and the loop cannot, and a random model still samples it
(the smollm2-shape model about once in 2,800 tokens: one 512-token turn in six ends early), so the
"eos" column counts the turns that ended on it. Prints tables and one JSON line.

Where the loop's time goes (the phase table, and "phases" in the JSON), from when each stream's
requests were in flight and when its episode called the environment:

    head     arm start to a stream's first request (workspace, first prompt render), mean
    gap      between one request's answer and the stream's next request, per turn: host work
             (parsing, chat glue, tokenising, recording) and tool calls (env), mean
    end      a stream's last answer to its episode's end (the final evaluation), mean
    tail     the last answer of any stream to the arm's end: the engine has nothing to do
    idle     wall time with no request in flight at all (head, tail and any full stalls)
    conc     mean requests in flight (the engine's batch), against the streams asked for
    eos      requests that ended on EOS before their L tokens; shorter turns mean more turn
             boundaries and streams that end at different times (a ragged end). raw_eos is the
             like-for-like base for the policy and the loop when this is not 0
    context  mean tokens in a stream's last context: what each decode step attends to (the
             loop's observations and chat glue make it longer than raw's 8 tokens a turn)

    python scripts/bench_agent_loop.py --shape tiny --streams 8 --turns 4 --tokens 64 # CPU: small
    python scripts/bench_agent_loop.py --shape tiny --host-only --streams 64 --turns 8 --tokens 512
    . .gpu-stack/bin/activate && python scripts/bench_agent_loop.py --shape smollm2-shape --raw-eos \
        --streams 64 --turns 8 --tokens 512
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="embedded", help="a Hugging Face folder whose config (shape) to use, 'embedded', "
                   "'smollm2-shape' (SmolLM2-135M's layers with the test tokenizer: no download), or 'tiny' (the "
                   "test model, tests/tiny_model.py: fast on CPU)")
    p.add_argument("--streams", type=int, default=16, help="concurrent episodes / request streams")
    p.add_argument("--turns", type=int, default=4, help="turns per episode")
    p.add_argument("--tokens", type=int, default=256, help="generated tokens per turn")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    p.add_argument("--raw-eos", action="store_true", help="add the arm raw_eos: raw generation that stops on EOS "
                   "as the policy and the loop must (a like-for-like base when the eos column is not 0)")
    p.add_argument("--host-only", action="store_true", help="only the host arm: no engine, the loop's own CPU cost")
    p.add_argument("--profile", default=None, help="cProfile the loop arm (this process: the event loop, not "
                                                   "the engine core) and write the stats here")
    return p.parse_args()


class Timeline:
    """When each stream's requests were in flight and its environment calls ran, by stream.

    A stream is an asyncio task: one raw stream, one episode (asyncio.as_completed runs each
    in its own task), so the key is the current task unless given."""

    def __init__(self) -> None:
        self.spans: dict[Any, list[tuple[str, float, float]]] = defaultdict(list)
        self.start = self.end = 0.0
        self.contexts: list[int] = []  # each stream's last context, in tokens
        self.eos = 0  # requests that ended on EOS (finish "stop") before their token budget
        self.stops: dict[str, int] = {}  # episodes by stop reason (loop arms)

    def add(self, kind: str, t0: float, key: Any = None) -> None:
        self.spans[key if key is not None else id(asyncio.current_task())].append((kind, t0, time.perf_counter()))

    def phases(self) -> dict[str, float]:
        gens = sorted((t0, t1) for spans in self.spans.values() for kind, t0, t1 in spans if kind == "gen")
        if not gens:
            return {}
        context = round(sum(self.contexts) / len(self.contexts)) if self.contexts else 0
        wall = self.end - self.start
        busy, (lo, hi) = 0.0, gens[0]  # the union of in-flight intervals
        for t0, t1 in gens[1:]:
            if t0 > hi:
                busy, lo = busy + hi - lo, t0
            hi = max(hi, t1)
        busy += hi - lo
        heads, ends, host, env, gaps = [], [], 0.0, 0.0, 0
        for spans in self.spans.values():
            own = sorted((t0, t1) for kind, t0, t1 in spans if kind == "gen")
            if not own:
                continue
            heads.append(own[0][0] - self.start)
            episode = [t1 for kind, _, t1 in spans if kind == "episode"]
            ends.append((episode[0] if episode else own[-1][1]) - own[-1][1])
            for (_, a), (b, _) in zip(own, own[1:]):
                tool = sum(min(t1, b) - max(t0, a) for kind, t0, t1 in spans if kind.startswith("env") and t1 > a and t0 < b)
                env, host, gaps = env + tool, host + (b - a) - tool, gaps + 1
        return {
            "head_s": round(sum(heads) / len(heads), 3),
            "gap_host_ms": round(1000 * host / max(gaps, 1), 2),
            "gap_env_ms": round(1000 * env / max(gaps, 1), 2),
            "end_s": round(sum(ends) / len(ends), 3),
            "tail_s": round(self.end - max(t1 for _, t1 in gens), 3),
            "idle_s": round(wall - busy, 3),
            "concurrency": round(sum(t1 - t0 for t0, t1 in gens) / wall, 2) if wall > 0 else 0.0,
            "context": context,
            "requests": len(gens),
            "eos_turns": self.eos,
            **({"stops": dict(self.stops)} if self.stops else {}),
        }


class TimedPolicy:
    """The policy, with each request's time in flight on the timeline."""

    def __init__(self, policy: Any, timeline: Timeline):
        self.inner, self.timeline = policy, timeline
        self.token_level, self.tokenizer = policy.token_level, policy.tokenizer

    @property
    def version(self) -> int:
        return self.inner.version

    async def generate(self, request: Any) -> Any:
        t0 = time.perf_counter()
        try:
            gen = await self.inner.generate(request)
        finally:
            self.timeline.add("gen", t0)
        self.timeline.eos += gen.finish_reason == "stop"
        return gen


class TimedEnv:
    """The environment client, with each call's time on the timeline."""

    def __init__(self, env: Any, timeline: Timeline):
        self.inner, self.timeline = env, timeline

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                self.timeline.add("env:" + name, t0)

        return timed


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
    if shape == "tiny":
        from tests.tiny_model import build_tiny_model

        build_tiny_model(folder)
        return folder
    if shape == "embedded":
        from launch.embedded_model import prepare_embedded_model

        shape = str(prepare_embedded_model(os.path.expanduser("~/.cache/cuda-agent")))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(shape), torch_dtype=torch.float32)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(shape).save_pretrained(folder)
    return folder


def bench_task() -> Any:
    from tasks.loader import load_tasks

    tasks, _ = load_tasks([])
    return next(t for t in tasks if t.id == "level1/01_gelu")


def episode_prompt(tokenizer, task) -> list[int]:
    """The token ids of an episode's first context (system prompt, the cpp backend's tools, task),
    so that raw generation prefills what the loop prefills."""
    from rollout.chat import ChatFormat
    from rollout.episode import system_prompt, task_prompt
    from rollout.tool_specs import TOOLS, format_tool_prompt

    schemas = [t.schema() for t in TOOLS if not t.cuda_only]
    messages = [{"role": "system", "content": system_prompt("", format_tool_prompt(schemas, "hermes"))},
                {"role": "user", "content": task_prompt(task.source, "cpp")}]
    return ChatFormat(tokenizer).render(messages)


class InstantPolicy:
    """Answers at once with pre-sampled random turns of ``tokens`` tokens (ids, text, logprobs):
    the host arm's stand-in for the engine, so that only the loop's own work takes time."""

    token_level = True
    version = 0

    def __init__(self, tokenizer: Any, tokens: int, samples: int = 16):
        import random

        rng = random.Random(0)
        special = set(tokenizer.all_special_ids)
        vocab = [i for i in range(len(tokenizer)) if i not in special]
        self.tokenizer = tokenizer
        self.turns = []
        for _ in range(samples):
            ids = [rng.choice(vocab) for _ in range(tokens)]
            self.turns.append((ids, tokenizer.decode(ids, skip_special_tokens=True)))
        self.k = 0

    async def generate(self, request: Any) -> Any:
        from rollout.policy import Generation

        ids, text = self.turns[self.k % len(self.turns)]
        self.k += 1
        await asyncio.sleep(0)  # one pass of the event loop, as an engine answer takes
        n = min(len(ids), request.max_new_tokens)
        return Generation(text=text if n == len(ids) else self.tokenizer.decode(ids[:n]), token_ids=list(ids[:n]),
                          logprobs=[-1.0] * n, finish_reason="length", version=0)

    async def close(self) -> None:
        pass


async def raw(policy, prompt: list[int], streams: int, turns: int, tokens: int, timeline: Timeline | None = None,
              ignore_eos: bool = True) -> int:
    from vllm import SamplingParams

    async def stream(k: int) -> int:
        ids = list(prompt)
        for t in range(turns):
            params = SamplingParams(max_tokens=tokens, ignore_eos=ignore_eos, logprobs=0)
            final, t0 = None, time.perf_counter()
            async for final in policy.engine.generate({"prompt_token_ids": ids}, params,
                                                      request_id=f"raw-{'' if ignore_eos else 'eos-'}{k}-{t}"):
                pass
            if timeline is not None:
                timeline.add("gen", t0)
                timeline.eos += final.outputs[0].finish_reason == "stop"
            ids += list(final.outputs[0].token_ids) + prompt[-8:]  # a little "observation" each turn
        if timeline is not None:
            timeline.contexts.append(len(ids) - 8)  # the last context the engine saw
        return len(ids) - len(prompt)

    done = await asyncio.gather(*(stream(k) for k in range(streams)))
    return sum(done) - streams * turns * 8


async def through_policy(policy, prompt: list[int], streams: int, turns: int, tokens: int,
                         timeline: Timeline | None = None) -> int:
    from rollout.policy import GenerationRequest

    policy = TimedPolicy(policy, timeline) if timeline is not None else policy

    async def stream() -> int:
        ids, generated = list(prompt), 0
        for _ in range(turns):
            gen = await policy.generate(GenerationRequest(prompt_ids=ids, messages=[], tools=[], max_new_tokens=tokens))
            ids += gen.token_ids + prompt[-8:]
            generated += len(gen.token_ids)
        if timeline is not None:
            timeline.contexts.append(len(ids) - 8)
        return generated

    return sum(await asyncio.gather(*(stream() for _ in range(streams))))


def build_loop(policy, cfg, task, streams: int, timeline: Timeline) -> Any:
    """The runner and its jobs, built before the clock starts: this is once per run, not per episode."""
    from omegaconf import OmegaConf

    from env_pool.pool import EnvPool
    from rollout.env_client import LocalEnvClient
    from rollout.episode_runner import EpisodeRunner, jobs_for

    env = LocalEnvClient(EnvPool(OmegaConf.to_container(cfg.env, enum_to_str=True)))
    runner = EpisodeRunner.from_config(cfg, TimedPolicy(policy, timeline), TimedEnv(env, timeline))
    run_one = runner.run_one

    async def timed_run_one(job: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await run_one(job)
        finally:
            timeline.add("episode", t0)

    runner.run_one = timed_run_one
    return runner, jobs_for([task], streams)


async def loop(runner, jobs, timeline: Timeline) -> int:
    generated = 0
    async for traj in runner.run_many(jobs, progress=False):
        generated += traj.num_generated
        # The context of the last turn: its segment up to the turn's end (observations after it were never seen).
        last = traj.turns[-1] if traj.turns else None
        timeline.contexts.append(last.end if last else 0)
        timeline.stops[traj.stop_reason] = timeline.stops.get(traj.stop_reason, 0) + 1
    return generated


async def timed(name: str, run: Any, timeline: Timeline, profile: str | None = None) -> dict:
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    timeline.start = time.perf_counter()
    tokens = await run()
    timeline.end = time.perf_counter()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    wall = timeline.end - timeline.start
    return {"tokens": tokens, "wall_s": round(wall, 2), "tok_per_s": round(tokens / wall, 1), "phases": timeline.phases()}


async def host_arm(folder: Path, cfg, task, args, results: dict) -> None:
    """The loop against InstantPolicy: its wall time is the loop's own host work."""
    from transformers import AutoTokenizer

    timeline = Timeline()
    started = time.perf_counter()
    runner, jobs = build_loop(InstantPolicy(AutoTokenizer.from_pretrained(folder), args.tokens), cfg, task,
                              args.streams, timeline)
    setup = time.perf_counter() - started
    r = await timed("host", lambda: loop(runner, jobs, timeline), timeline, args.profile if args.host_only else None)
    turns = sum(1 for spans in timeline.spans.values() for kind, _, _ in spans if kind == "gen")
    r["setup_s"] = round(setup, 3)
    r["ms_per_turn"] = round(1000 * r["wall_s"] / max(turns, 1), 3)  # of the event loop, all the loop's work included
    results["host"] = r


async def main() -> dict:
    args = parse_args()
    from configs.load import load_config

    with tempfile.TemporaryDirectory() as tmp:
        folder = random_model(args.shape, Path(tmp) / "model")
        budget = 4096 + args.turns * (args.tokens + 600)
        cfg = load_config([], [f"rollout.max_context_tokens={budget}", f"rollout.max_turns={args.turns}",
                               f"rollout.max_new_tokens={args.tokens}", f"rollout.min_new_tokens={min(64, args.tokens)}",
                               f"rollout.episodes_in_flight={args.streams}", "rollout.skill_in_prompt=false",
                               f"rollout.max_turns_without_call={args.turns + 1}",
                               f"env.work_dir={Path(tmp) / 'env'}"])
        task = bench_task()
        results: dict[str, Any] = {}
        if args.host_only:
            await host_arm(folder, cfg, task, args, results)
            return {"streams": args.streams, "turns": args.turns, "tokens": args.tokens, "shape": args.shape, **results}
        from rollout.vllm_policy import VLLMPolicy

        policy = VLLMPolicy.from_config(str(folder), cfg)
        prompt = episode_prompt(policy.tokenizer, task)  # the same first context the loop's episodes start from
        try:
            # Warm-up, at full width: the first prompt's prefill is cached once here, for every arm alike.
            await raw(policy, prompt, args.streams, 1, 16)
            arms = [("raw", lambda tl: raw(policy, prompt, args.streams, args.turns, args.tokens, tl))]
            if args.raw_eos:
                arms.append(("raw_eos", lambda tl: raw(policy, prompt, args.streams, args.turns, args.tokens, tl,
                                                       ignore_eos=False)))
            arms.append(("policy", lambda tl: through_policy(policy, prompt, args.streams, args.turns, args.tokens, tl)))
            for name, run in arms:
                timeline = Timeline()
                results[name] = await timed(name, lambda: run(timeline), timeline)
            timeline = Timeline()
            started = time.perf_counter()
            runner, jobs = build_loop(policy, cfg, task, args.streams, timeline)
            setup = time.perf_counter() - started
            results["loop"] = await timed("loop", lambda: loop(runner, jobs, timeline), timeline, args.profile)
            results["loop"]["setup_s"] = round(setup, 3)
        finally:
            await policy.close()
        await host_arm(folder, cfg, task, args, results)
    for base in ("raw", "raw_eos"):
        for name in ("raw", "raw_eos", "policy", "loop"):
            if base in results and name in results:
                results[name]["vs_" + base] = round(results[name]["tok_per_s"] / results[base]["tok_per_s"], 3)
    return {"streams": args.streams, "turns": args.turns, "tokens": args.tokens, "shape": args.shape, **results}


def report(result: dict) -> None:
    arms = [name for name in ("raw", "raw_eos", "policy", "loop", "host") if name in result]
    eos = "raw_eos" in result
    print(f"{'':8} {'tokens':>8} {'wall s':>8} {'tok/s':>9} {'vs raw':>7}" + (f" {'vs raw_eos':>10}" if eos else ""))
    for name in arms:
        r = result[name]
        print(f"{name:8} {r['tokens']:>8} {r['wall_s']:>8} {r['tok_per_s']:>9} {r.get('vs_raw', ''):>7}"
              + (f" {r.get('vs_raw_eos', ''):>10}" if eos else ""))
    print()
    print(f"{'':8} {'head s':>7} {'gap host ms':>12} {'gap env ms':>11} {'end s':>7} {'tail s':>7} {'idle s':>7} "
          f"{'conc':>6} {'context':>8} {'eos':>5}")
    for name in arms:
        ph = result[name].get("phases") or {}
        if ph:
            print(f"{name:8} {ph['head_s']:>7} {ph['gap_host_ms']:>12} {ph['gap_env_ms']:>11} {ph['end_s']:>7} "
                  f"{ph['tail_s']:>7} {ph['idle_s']:>7} {ph['concurrency']:>6} {ph['context']:>8} "
                  f"{ph['eos_turns']:>5}")
    print(f"(of {result['streams']} streams; head: start to first request, gap: per turn between answer and next "
          f"request, end: last answer to episode end, tail: last answer of all to the end, idle: nothing in flight, "
          f"context: mean tokens of the last context, eos: requests ended on EOS)")
    for name in ("loop", "host"):
        if name in result:
            r = result[name]
            extra = f", {r['ms_per_turn']} ms of host work per turn" if "ms_per_turn" in r else ""
            print(f"{name}: setup {r['setup_s']} s (once per run, outside the wall time){extra}; "
                  f"stops {r['phases'].get('stops', {})}")


if __name__ == "__main__":
    args = parse_args()
    result = asyncio.run(main())
    report(result)
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result))
