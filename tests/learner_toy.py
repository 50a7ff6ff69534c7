"""Toy episodes for the learner tests: real Trajectory objects sampled from a real policy.

The toy task is verifiable and tiny: after a fixed prompt the policy writes a few tokens,
the "environment" answers with fixed tokens, and the policy writes a few more (two turns,
so the multi-turn code paths run). The reward is the fraction of generated tokens in a
target set, so a policy that learns puts more probability on that set.
"""
from __future__ import annotations

import torch

from protocol.trajectory import Segment, Trajectory, Turn

PROMPT = [1, 100, 101, 102, 2, 1, 103]  # <|im_start|> ... <|im_end|> <|im_start|> ...
OBSERVATION = [2, 1, 104, 105]  # tool output and template glue between the turns
TURN_TOKENS = 3


def in_target(token: int) -> bool:
    return token % 4 == 0


def make_trajectory(episode: str, prompt: list[int], turns: list[tuple[list[int], list[float], int]],
                    observation: list[int], reward: float, turn_rewards: list[float] | None = None,
                    texts: list[str] | None = None, invalid: list[int] | None = None,
                    tools: list[list[str]] | None = None, calls: list[int] | None = None) -> Trajectory:
    """One segment: prompt, then each turn's generated tokens, separated by ``observation``."""
    seg = Segment()
    seg.extend(prompt, generated=False)
    spans = []
    for k, (tokens, logprobs, version) in enumerate(turns):
        if k:
            seg.extend(observation, generated=False)
        start = len(seg)
        seg.extend(tokens, generated=True, logprobs=logprobs)
        spans.append(Turn(segment=0, start=start, end=len(seg), version=version,
                          reward=(turn_rewards or [0.0] * len(turns))[k],
                          text=(texts or [""] * len(turns))[k],
                          invalid_calls=(invalid or [0] * len(turns))[k],
                          tools=(tools or [["compile"]] * len(turns))[k],
                          calls=(calls or [0] * len(turns))[k]))
    return Trajectory(episode_id=episode, task_id="toy", segments=[seg], turns=spans, reward=reward)


@torch.no_grad()
def sample_episodes(model, count: int, version: int, turns: int = 2, prompt: list[int] = PROMPT) -> list[Trajectory]:
    """``count`` episodes sampled from ``model`` at temperature 1 with their sampling logprobs."""
    contexts = torch.tensor([prompt] * count)
    generated: list[list[tuple[list[int], list[float]]]] = [[] for _ in range(count)]
    for k in range(turns):
        if k:
            contexts = torch.cat([contexts, torch.tensor([OBSERVATION] * count)], dim=1)
        tokens, logprobs = [], []
        for _ in range(TURN_TOKENS):
            positions = torch.arange(contexts.shape[1])[None].expand(count, -1)
            logits = model(input_ids=contexts, position_ids=positions, use_cache=False).logits[:, -1].float()
            lp = torch.log_softmax(logits, dim=-1)
            token = torch.multinomial(lp.exp(), 1)
            tokens.append(token)
            logprobs.append(lp.gather(-1, token))
            contexts = torch.cat([contexts, token], dim=1)
        tokens_t, lps_t = torch.cat(tokens, 1), torch.cat(logprobs, 1)
        for i in range(count):
            generated[i].append((tokens_t[i].tolist(), lps_t[i].tolist()))
    episodes = []
    for i in range(count):
        flat = [t for toks, _ in generated[i] for t in toks]
        reward = sum(in_target(t) for t in flat) / len(flat)
        episodes.append(make_trajectory(f"ep{version}-{i}", prompt, [(t, lp, version) for t, lp in generated[i]],
                                        OBSERVATION, reward))
    return episodes
