#!/usr/bin/env python
"""The learner's H100 figures of issue 13 (items 2 and 6), in one run; a short table last.

    clip     clip_frac of the first PPO minibatch on episodes that vLLM sampled in bf16, with
             the proximal policy taken from the sampler (learner.prox_from_learner=false) and
             from the learner (true); with the mean gap between the two logprobs of the same token
    longest  the longest trajectory (one segment, ``--turns`` model turns, half its tokens
             generated) that one full PPO step trains (critic and proximal scoring, policy and
             critic forward, backward, AdamW) without running out of GPU memory, with and
             without gradient checkpointing: lengths double until a step fails, then bisect,
             within a time budget per setting; with each trial's step time and peak memory

Each part runs in a subprocess of its own, so vLLM's memory and the debris of an out-of-memory
step never reach the next part.

    . .gpu-stack/bin/activate && python scripts/bench_long_context.py --out $OUT     # H100: 0.5B random model, bf16
    python scripts/bench_long_context.py --shape tiny --start 256 --max-len 2048 --budget-s 60   # CPU: a smoke run
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", nargs="?", default="all", choices=["all", "generate", "clip", "longest"])
    p.add_argument("--shape", default="0.5b", help="tests/tiny_model.py shape: 0.5b, smollm2, or tiny (the 2-layer test model)")
    p.add_argument("--model", default=None, help="a model folder (default: built from --shape into a temp folder)")
    p.add_argument("--episodes", type=int, default=64, help="clip: episodes sampled by vLLM")
    p.add_argument("--prompt-len", type=int, default=256, help="clip: random prompt tokens per episode")
    p.add_argument("--new-tokens", type=int, default=512, help="clip: tokens sampled per episode")
    p.add_argument("--turns", type=int, default=16, help="longest: model turns per trajectory")
    p.add_argument("--start", type=int, default=16384, help="longest: first length tried")
    p.add_argument("--max-len", type=int, default=1 << 20, help="longest: longest length tried")
    p.add_argument("--resolution", type=int, default=4096, help="longest: bisect until the bracket is this narrow")
    p.add_argument("--budget-s", type=float, default=150.0, help="longest: time budget per gradient-checkpointing setting")
    p.add_argument("--grad-checkpointing", choices=["on", "off"], default=None, help="longest: one setting (subprocess use)")
    p.add_argument("--episodes-file", default=None, help="clip: the generate part's output (subprocess use)")
    p.add_argument("--out", default=None, help="folder for the JSON results (default: a temp folder)")
    return p.parse_args()


def gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# --------------------------------------------------------------------------- generate (vLLM)


def generate(args: argparse.Namespace) -> dict:
    """Episodes sampled by the product's VLLMPolicy (bf16 on GPU), msgpack'd to --episodes-file."""
    import torch
    from omegaconf import OmegaConf

    from configs.schema import Config
    from protocol.trajectory import Segment, Trajectory, Turn
    from rollout.policy import GenerationRequest
    from rollout.vllm_policy import VLLMPolicy

    cfg = OmegaConf.merge(OmegaConf.structured(Config), {
        "model": {"dtype": "auto"},
        "rollout": {"max_context_tokens": args.prompt_len + args.new_tokens + 16, "gpu_memory_utilization": 0.3,
                    "enforce_eager": True, "prefix_caching": False, "temperature": 1.0}})
    policy = VLLMPolicy.from_config(args.model, cfg)
    vocab = len(policy.tokenizer)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.episodes)]

    async def run():
        reqs = [GenerationRequest(prompt_ids=p, messages=[], tools=[], max_new_tokens=args.new_tokens) for p in prompts]
        outs = await asyncio.gather(*(policy.generate(r) for r in reqs))
        await policy.close()
        return outs

    started = time.perf_counter()
    outs = asyncio.run(run())
    gen_s = time.perf_counter() - started
    episodes = []
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        seg = Segment()
        seg.extend(prompt, generated=False)
        seg.extend(out.token_ids, generated=True, logprobs=out.logprobs)
        turn = Turn(segment=0, start=len(prompt), end=len(seg), version=0)
        # Rewards of either sign, so that the whitened advantages have both signs.
        episodes.append(Trajectory(episode_id=f"clip{i}", task_id="bench", segments=[seg], turns=[turn],
                                   reward=float(i % 4) - 1.0))
    Path(args.episodes_file).write_bytes(b"".join(len(b).to_bytes(8, "little") + b
                                                 for b in (t.pack() for t in episodes)))
    return {"episodes": len(episodes), "generated_tokens": sum(len(o.token_ids) for o in outs),
            "gen_s": round(gen_s, 1), "engine_start_s": round(policy.start_s, 1)}


def read_episodes(path: str) -> list:
    from protocol.trajectory import Trajectory

    data, out, at = Path(path).read_bytes(), [], 0
    while at < len(data):
        n = int.from_bytes(data[at:at + 8], "little")
        out.append(Trajectory.unpack(data[at + 8:at + 8 + n]))
        at += 8 + n
    return out


# --------------------------------------------------------------------------- clip_frac


def clip(args: argparse.Namespace) -> dict:
    """clip_frac of the first minibatch, prox from the sampler against prox from the learner."""
    import torch

    from configs.schema import LearnerConfig
    from learner.batching import flatten
    from learner.models import row_tokens, score_batch
    from learner.ppo import PPOTrainer
    from learner.sequence_parallel import pack_rows

    episodes = read_episodes(args.episodes_file)
    result = {}
    for prox_from_learner in (False, True):
        # One optimiser step over the whole batch: the step's clip_frac is its first minibatch's.
        cfg = LearnerConfig(lr=1e-6, critic_lr=1e-6, warmup_steps=0, ppo_minibatches=1, ppo_epochs=1,
                            micro_batch_tokens=16384, prox_from_learner=prox_from_learner)
        trainer = PPOTrainer.create(cfg, args.model, dtype="auto", total_steps=1)
        if not prox_from_learner:
            batch = flatten(episodes)
            micro = pack_rows(batch.sequences, row_tokens(cfg))
            learner_lp = score_batch(trainer.policy, micro, batch.num_generated, critic=False, device=_device())
            gap = (learner_lp - batch.behaviour_logprobs).abs()
            ratio = torch.exp(learner_lp - batch.behaviour_logprobs)
            result["logprob_gap_mean"] = round(float(gap.mean()), 5)
            result["logprob_gap_max"] = round(float(gap.max()), 4)
            result["ratio_outside_clip"] = round(float(((ratio < 1 - cfg.clip_ratio) | (ratio > 1 + cfg.clip_ratio)).float().mean()), 5)
            result["sampler_logprob_mean"] = round(float(batch.behaviour_logprobs.mean()), 4)
            result["dtype"] = str(next(trainer.policy.module.parameters()).dtype)
        metrics = trainer.step(episodes, version=0)
        key = "learner" if prox_from_learner else "sampler"
        result[f"clip_frac_prox_{key}"] = round(metrics["clip_frac"], 5)
        result[f"approx_kl_prox_{key}"] = metrics["approx_kl"]
        result[f"importance_weight_prox_{key}"] = round(metrics["importance_weight"], 5)
        result["generated_tokens"] = metrics["generated_tokens"]
        del trainer
        gc.collect()
        _empty_cache()
    return result


# --------------------------------------------------------------------------- longest trajectory


def _device():
    from learner.engine import device

    return device()


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def longest(args: argparse.Namespace) -> dict:
    """Double the length until a PPO step fails for memory, then bisect, within --budget-s."""
    import torch

    from bench_learner import synthetic_trajectories
    from configs.schema import LearnerConfig
    from learner.ppo import PPOTrainer

    ckpt = args.grad_checkpointing == "on"
    cfg = LearnerConfig(lr=1e-6, critic_lr=1e-6, warmup_steps=0, grad_checkpointing=ckpt, micro_batch_tokens=16384)
    state = {"trainer": None}

    def trainer():
        if state["trainer"] is None:
            state["trainer"] = PPOTrainer.create(cfg, args.model, dtype="auto", total_steps=1000)
        return state["trainer"]

    trials, version = [], 0
    started = time.perf_counter()

    def attempt(length: int) -> bool:
        nonlocal version
        t = trainer()
        vocab = t.policy.module.config.vocab_size
        batch = synthetic_trajectories(1, length, args.turns, 0.5, vocab, version)
        _empty_cache()
        t0 = time.perf_counter()
        try:
            t.step(batch, version=version)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            ok, err = True, ""
        except Exception as e:  # noqa: BLE001: only memory failures are an answer; anything else is raised
            if not _is_oom(e):
                raise
            ok, err = False, type(e).__name__
            # Engines that failed mid-step may hold half-accumulated state: start the next trial afresh.
            state["trainer"] = None
            del e
            gc.collect()
            _empty_cache()
        version += 1
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
        trials.append({"tokens": length, "ok": ok, "step_s": round(time.perf_counter() - t0, 2),
                       "peak_gib": round(peak, 2), **({"error": err} if err else {})})
        print(json.dumps({"grad_checkpointing": ckpt, **trials[-1]}), flush=True)
        return ok

    def time_left() -> float:
        return args.budget_s - (time.perf_counter() - started)

    def predicted_s(length: int) -> float:
        """Next step's time from the last success, as if it grew with the square of the length (attention)."""
        done = [t for t in trials if t["ok"]]
        if not done:
            return 0.0
        return done[-1]["step_s"] * (length / done[-1]["tokens"]) ** 2

    good, bad, stopped = 0, None, ""
    length = args.start
    while length <= args.max_len:
        if predicted_s(length) > time_left():
            stopped = f"time budget: {length} tokens would take ~{predicted_s(length):.0f} s"
            break
        if attempt(length):
            good, length = length, length * 2
        else:
            bad = length
            break
    while bad is not None and bad - good > args.resolution:
        mid = (good + bad) // 2 // args.resolution * args.resolution or (good + bad) // 2
        if mid in (good, bad):
            break
        if predicted_s(mid) > time_left():
            stopped = f"time budget, bracket {good}..{bad}"
            break
        if attempt(mid):
            good = mid
        else:
            bad = mid
    result = {"grad_checkpointing": ckpt, "longest_ok": good, "first_failed": bad, "stopped": stopped,
              "trials": trials, "turns": args.turns, "generated_fraction": 0.5}
    # Memory is linear in length (sdpa's fused kernels, no mask for one segment): where the
    # search stopped for time, the two longest successes say where memory would run out.
    ok = [t for t in trials if t["ok"]]
    if torch.cuda.is_available() and len(ok) >= 2 and bad is None:
        (a, b) = ok[-2], ok[-1]
        per_token = (b["peak_gib"] - a["peak_gib"]) / (b["tokens"] - a["tokens"])
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        if per_token > 0:
            result["memory_limit_tokens_est"] = int(b["tokens"] + (total - b["peak_gib"]) / per_token)
    result["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return result


# --------------------------------------------------------------------------- driver


def run_part(args: argparse.Namespace, part: str, out: Path, *extra: str, timeout: float = 590) -> dict:
    """One part in its own process; its JSON result (or its failure) back."""
    cmd = [sys.executable, str(Path(__file__).resolve()), part, "--model", str(args.model), "--out", str(out), *extra]
    for key in ("episodes", "prompt_len", "new_tokens", "turns", "start", "max_len", "resolution", "budget_s"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    started = time.perf_counter()
    name = "_".join([part, *[e for e in extra if not e.startswith("-") and "/" not in e]])
    log = out / f"{name}.log"
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    result_file = out / f"{name}.json"
    if rc == 0 and result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        tail = log.read_text().splitlines()[-15:]
        result = {"failed": rc, "log_tail": tail}
        print(f"{name} failed (rc={rc}):\n  " + "\n  ".join(tail), flush=True)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def main() -> None:
    args = parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if os.path.exists("/dev/nvidia0") else "cpu")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_long_context_"))
    out.mkdir(parents=True, exist_ok=True)
    if args.part != "all":
        if args.part == "generate":
            result = generate(args)
            name = "generate"
        elif args.part == "clip":
            result = clip(args)
            name = "clip"
        else:
            result = longest(args)
            name = f"longest_{args.grad_checkpointing}"
        (out / f"{name}.json").write_text(json.dumps(result, indent=1))
        return
    if args.model is None:
        from tests.tiny_model import build_tiny_model

        args.model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "model", None if args.shape == "tiny" else args.shape))
    episodes = out / "episodes.bin"
    results = {"generate": run_part(args, "generate", out, "--episodes-file", str(episodes), timeout=300)}
    results["clip"] = run_part(args, "clip", out, "--episodes-file", str(episodes), timeout=300)
    for ckpt in ("off", "on"):
        results[f"longest_{ckpt}"] = run_part(args, "longest", out, "--grad-checkpointing", ckpt,
                                              timeout=args.budget_s + 120)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table(results)


def table(results: dict) -> None:
    c, g = results["clip"], results["generate"]
    print("\n== issue 13 figures ==")
    print(f"episodes: {g.get('episodes')} x {g.get('generated_tokens', 0) // max(g.get('episodes', 1), 1)} tokens sampled "
          f"by vLLM, learner dtype {c.get('dtype')}")
    print(f"item 2  clip_frac, first minibatch: prox = sampler {c.get('clip_frac_prox_sampler')}  |  "
          f"prox = learner {c.get('clip_frac_prox_learner')}")
    print(f"        |learner - sampler| logprob: mean {c.get('logprob_gap_mean')}, max {c.get('logprob_gap_max')}; "
          f"tokens whose ratio is outside 1 +- 0.2: {c.get('ratio_outside_clip')}")
    print("item 6  longest trajectory, one PPO step (0.5B, bf16, one GPU):")
    print(f"  {'grad ckpt':10s} {'longest ok':>11s} {'first OOM':>10s} {'step_s':>8s} {'peak GiB':>9s}  note")
    for ckpt in ("on", "off"):
        r = results[f"longest_{ckpt}"]
        last = next((t for t in reversed(r.get("trials", [])) if t["ok"]), {})
        note = r.get("stopped") or ("failed: " + str(r.get("failed")) if "failed" in r else "")
        if "memory_limit_tokens_est" in r:
            note += f"; memory would allow ~{r['memory_limit_tokens_est']}"
        print(f"  {ckpt:10s} {r.get('longest_ok', '-')!s:>11s} {r.get('first_failed') or '-'!s:>10s} "
              f"{last.get('step_s', '-')!s:>8s} {last.get('peak_gib', '-')!s:>9s}  {note}")


if __name__ == "__main__":
    main()
